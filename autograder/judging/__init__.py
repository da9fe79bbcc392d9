"""Judging and writing, outside the learner's kernel: see ``autograder/__init__.py``."""
