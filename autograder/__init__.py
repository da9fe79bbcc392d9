"""Grading around nbgrader. Code only: the class's data (nbgrader's course root) is ``coursework/``.

Laid out by where the code runs and whom it trusts.

In the learner's kernel (imported by every graded kernel; under ``./course grade``
no solution is there), at the top so notebooks and nbgrader find them:

- ``trusted``: the snapshot of torch/numpy/builtins taken before student code runs;
- ``checks``: the helper every hidden test calls (``check``): it runs the
  learner's code on the exercise's cases (``observe``); under stock nbgrader it
  also compares with the reference in the kernel itself;
- ``compare``: the comparison (``close``, ``disagreement``: which catalogued
  mistake reproduces the differences), run by ``checks`` under stock nbgrader
  and by ``judging.judge`` outside the kernel under ``./course grade``;
- ``verdict``: the wire between a sandboxed ``check`` and the grader outside;
- ``reference``: where the reference solutions come from (``solutions/``, the one source).

``exercises/``: the catalogues, per notebook the inputs each exercise is
checked on and its catalogue of known mistakes, written in ``catalogue``'s
types (``Exercise``, ``Case``, ``ModuleCase``, ``Mistake``).

``judging/``: judging and writing, outside the kernel (trusted):
``judge`` (the reference side of every check, answering ``verdict``),
``tamper`` (sanitizes with nbgrader's preprocessors, flags tampering),
``cells`` (nbgrader metadata access, the error outputs the grader writes),
``flags`` (the flag vocabulary), ``feedback`` (the feedback page's
preprocessors and exporter), ``writer`` (the single writer of gradebook,
files and ledger), ``report`` (the grades CSV, the class report, the summary).

``sandboxing/``: where student notebooks run: ``bubblewrap`` (the sandbox,
``Limits``, ``WarmSandbox``, ``probe``; as root, ``SandboxHost``: one warm
interpreter forking every local worker's), ``zygote`` (the warm interpreter
inside it, forking a kernel per notebook; and the host's loop, which forks a
worker's interpreter into namespaces of its own), ``execute`` (cell by cell,
with fault containment).

``engine/``: the orchestration of ``./course grade``: ``course``
(``CourseFolder``: configuration, folders, gradebook, each notebook's
snapshot), ``runs`` (one run at a time per course, its scratch, its outputs
checked first), ``collect`` (finds submissions), ``job`` (the unit of work: one
notebook in, one result out, feedback included), ``runners`` (the runner
contract, the warm-sandbox ``Station`` both runners grade with, the local
pool), ``pool_preload`` (what the local pool's fork server imports once, so
its processes share it), ``distributed`` (the Dask runner), ``identity`` (the
one digest of the grading code).

Entry points: ``grade`` (``./course grade``: ``main`` reads as its steps),
``release`` (``./course generate``). In the learner's own kernel, outside any
grading: ``selfstudy`` (the grader's diagnosis, solutions after trying,
progress). The benchmark (``tests/bench_grading.py``) and the tests' local
Dask cluster (``tests/local_cluster.py``) live with the tests.
"""

from pathlib import Path

# The checkout this grader runs from (an editable install): the default course folder, and the
# folder beside which grading workers find assets/.
REPOSITORY = Path(__file__).resolve().parent.parent
