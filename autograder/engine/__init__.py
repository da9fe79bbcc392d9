"""The orchestration of ``./course grade``: see ``autograder/__init__.py``."""
