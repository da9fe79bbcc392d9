"""The grader around nbgrader: installed only where grading happens. Code only: the class's data
(nbgrader's course root) is ``coursework/``; what runs in a learner's kernel is ``course_checks``.

Laid out by the process each part runs in, lowest floor first:

- ``records`` (Job, Result, AssignmentSpec, GradebookView, Refused), ``flags`` (the flag
  vocabulary), ``cells`` (nbgrader metadata and the error outputs the grader writes),
  ``messages`` (the ``[mistake:]`` tag, the tampering message): the shared vocabulary;
- ``exercises/``: per notebook, the cases each exercise is checked on and its catalogue of
  known mistakes (``catalogue``: Exercise, Mistake, module_case); ``reference``: the
  reference solutions from the solution notebooks; ``compare``: comparing outputs and naming
  the mistake; ``local_judge``: the judge a learner's kernel uses where no sandbox is (stock
  nbgrader, self-study);
- ``sandboxing/``: where student notebooks run, pure OS (``bubblewrap``: the sandbox,
  ``Limits``, ``WarmSandbox``, ``SandboxHost``; ``zygote``: the warm interpreter inside it);
- ``worker/``: one notebook on a grading worker: ``pipeline`` (its steps, in order: read,
  restore, inspect, sanitize, execute, verdicts, limit outputs; then finish), with ``read``,
  ``tamper``, ``sanitize``, ``execute`` (cell by cell, faults contained), ``judge`` (the
  trusted half of every check, answering the kernel's wire), ``verdicts`` (scores from the
  grader's own records), ``feedback`` (the feedback page);
- ``engine/``: ``./course grade``'s orchestration, in the command's process and its runners:
  ``course`` (CourseFolder), ``collect`` (submissions in), ``runs`` (one run at a time, its
  scratch, outputs checked first), ``plan`` (everything before grading), ``runners`` (the
  runner contract, ``Station``, ``LocalPool``), ``pool_preload``, ``distributed`` (Dask),
  ``identity`` (the code digest), ``writer`` (the one writer and its commit loop),
  ``report`` (CSV, class report, summary);
- ``grade`` (``./course grade``: the command line; ``main`` reads as its steps), ``release``
  (``./course generate``).
"""

from pathlib import Path

# The checkout this grader runs from (an editable install): ./course generate's course, the
# default solutions/ of ``reference``, and a Dask worker's course root (assets/). The grade command
# grades the course folder it runs in (``engine.plan.read_course``), installed or not.
REPOSITORY = Path(__file__).resolve().parent.parent
