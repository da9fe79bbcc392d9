"""The orchestration of ``./course grade``: see ``autograder/__init__.py``."""

from .. import compat  # noqa: F401  (first: it keeps nbformat's schema checks from a slow import)
