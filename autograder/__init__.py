"""Grading around nbgrader. Code only: the class's data (nbgrader's course root) is ``coursework/``.

In the learner's kernel (imported by every graded kernel; under ``./course grade``
no solution is there):

- ``trusted``: the snapshot of torch/numpy/builtins taken before student code runs;
- ``checks``: the helper every hidden test calls (``check``), and the exercise
  types the catalogues use (``Case``, ``ModuleCase``, ``Mistake``, ``Exercise``);
  under stock nbgrader it compares with the reference in the kernel itself;
- ``verdict``: the wire between a sandboxed ``check`` and the grader outside;
- ``reference``: where the reference solutions come from (``solutions/``, the one source).

The exercise catalogues: ``exercises/<topic>.py``, per notebook the inputs
each exercise is checked on and its catalogue of known mistakes.

Judging and writing, outside the kernel (trusted):

- ``judge``: the reference side of every check, answering ``verdict`` requests;
- ``tamper``: sanitizes with nbgrader's preprocessors, flags tampering;
- ``cells``: nbgrader metadata access and the error outputs the grader writes;
- ``flags``: the flag vocabulary (which flags ask for review);
- ``feedback``: the feedback page's preprocessors (hidden tests out, the
  worker's own grades in) and its exporter;
- ``writer``: the single writer of gradebook, files and ledger;
- ``report``: the grades CSV, the class report, the summary.

Running notebooks: ``sandbox`` (bubblewrap, limits, ``WarmSandbox``),
``zygote`` (the warm interpreter inside it, forking a kernel per notebook),
``execute`` (cell by cell, with fault containment).

Orchestration of ``./course grade``: ``grade`` (the command: ``main`` as its
steps), ``course`` (``CourseFolder``: configuration, folders, gradebook, each
notebook's snapshot), ``collect`` (finds submissions), ``job`` (the unit of
work: one notebook in, one result out, feedback included), ``runners`` (the
runner contract, the warm-sandbox ``Station`` both runners grade with, and the
local pool), ``distributed`` (the Dask runner), ``identity`` (the one digest of
the grading code).

``release`` regenerates ``notebooks/`` from ``solutions/``. The benchmark
(``tests/bench_grading.py``) and the tests' local Dask cluster
(``tests/local_cluster.py``) live with the tests.
"""
