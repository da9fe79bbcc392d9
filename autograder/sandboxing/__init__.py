"""Where student notebooks run (bubblewrap, the warm zygote, the executor): see ``autograder/__init__.py``."""
