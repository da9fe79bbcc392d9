"""Grading around nbgrader.

- ``trusted``: the snapshot of torch/numpy/builtins taken before student code runs;
- ``reference``: where the reference solutions come from (``solutions/``, the one source);
- ``checks``: the helper every hidden test calls, comparing a learner's function
  with the reference and naming known mistakes;
- ``exercises``: per notebook, the inputs each exercise is checked on and its
  catalogue of known mistakes;
- ``feedback``: the nbgrader preprocessor that keeps hidden test code out of feedback;
- ``release``: regenerates ``notebooks/`` from ``solutions/``.

This folder is also nbgrader's course root: its work folders (``submitted/``,
``autograded/``, ``feedback/``) and ``gradebook.db`` are ignored by git.
"""
