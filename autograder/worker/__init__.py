"""One notebook on a grading worker: ``pipeline`` (its steps, in order), and what they use: ``read``,
``tamper``, ``sanitize``, ``execute``, ``judge``, ``verdicts``, ``feedback``. See ``autograder/__init__.py``."""
