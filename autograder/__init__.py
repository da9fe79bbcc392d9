"""Grading around nbgrader.

- ``trusted``: the snapshot of torch/numpy/builtins taken before student code runs;
- ``reference``: where the reference solutions come from (``solutions/``, the one source);
- ``checks``: the helper every hidden test calls, comparing a learner's function
  with the reference and naming known mistakes;
- ``exercises``: per notebook, the inputs each exercise is checked on and its
  catalogue of known mistakes;
- ``feedback``: the nbgrader preprocessor that keeps hidden test code out of feedback;
- ``release``: regenerates ``notebooks/`` from ``solutions/``.

``./course grade`` (``grade``) grades a whole class around nbgrader's own pieces:
``collect`` finds submissions, ``sandbox`` starts bubblewrap around a warm
interpreter (``zygote``) that forks a kernel per notebook, ``execute`` runs
cells with fault containment, ``verdict`` carries the checks' outputs out of
the sandbox to ``judge`` (the reference side), ``tamper`` sanitizes with
nbgrader's preprocessors and flags tampering, ``job`` is the unit of work (one
notebook in, one result out), ``writer`` the single writer of gradebook,
feedback and ledger, ``report`` the CSV, class report and summary; ``bench``
compares it with stock nbgrader.

This folder is also nbgrader's course root: its work folders (``submitted/``,
``autograded/``, ``feedback/``) and ``gradebook.db`` are ignored by git.
"""
