"""Grade one submission notebook on a grading worker: the unit of work, as a declared list of steps.

``grade_submission(job, sandbox, judges) -> Result`` reads only the ``Job`` (the submission's
bytes and ``AssignmentSpec``, a snapshot of everything the grader knows about its notebook) and
returns a picklable ``Result``: the autograded notebook, its scores (each test cell's from the
judge's verdicts) and comments as nbgrader's ``SaveAutoGrades`` writes them, its feedback page, the
checks' verdicts and the flags. It writes
nothing but sandbox scratch files, so it runs wherever a runner puts it (``engine.runners``: this
machine's processes, or a Dask cluster), in a warm sandbox with one ``judge.Judge`` per
assignment kept for the worker's life. The single writer (``engine.writer``) commits the result.

The steps run in the order of ``STEPS``, each a function of the notebook's ``Grading`` (what the
steps before it left), as nbgrader declares its converters' preprocessors: a step is added by
adding a line. A step that finds the submission cannot be graded raises ``Rejected``; the
released notebook then stands in for it and only ``finish`` runs. No step before ``execute``
runs student code; after it, ``inert`` leaves the graded notebook nothing a browser would run.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass, field

import nbformat
from nbgrader.preprocessors import IgnorePattern, LimitOutput

from ..flags import CELL_EDITED, NOT_GRADED, OUTPUT_TRUNCATED, OUTPUTS_DISAGREE, fault
from ..records import Job, Rejected, Result
from ..sandboxing.bubblewrap import WarmSandbox, kernel_environment
from . import judge, referee, tamper
from .execute import ContainedExecute
from .feedback import FeedbackPages, inert_notebook
from .phases import add, timed
from .read import read_submission, rejected_notebook, released_notebook
from .sanitize import sanitize
from .verdicts import apply_verdicts, decided_scores, disagreements, grades_of


@dataclass
class Grading:
    """One notebook on its way through the steps: what each step reads and leaves for the next."""

    job: Job
    sandbox: WarmSandbox
    judges: dict  # (assignment, fingerprint) -> judge.Judge, kept for the worker's life
    result: Result
    started: float
    nb: nbformat.NotebookNode | None = None
    resources: dict = field(default_factory=dict)
    forged: list = field(default_factory=list)  # code that reaches for the grading helpers
    server: judge.VerdictServer | None = None
    execution: object = None  # execute.Execution
    decided: dict | None = None  # each autograded test cell's points, from the verdicts

    def flag(self, flags, details=()) -> None:
        self.result.flags += [f for f in dict.fromkeys(flags) if f not in self.result.flags]
        self.result.messages += list(details)


# ---------------------------------------------------------------- the steps


def read(g: Grading) -> None:
    """The submitted bytes as a notebook (or ``Rejected``: empty, not JSON, another notebook)."""
    g.nb, notes = read_submission(g.job.data, g.job.source_name, g.job.spec)
    g.result.messages += notes


def restore(g: Grading) -> None:
    """The instructor's grading metadata back on every cell that claims another kind or points."""
    try:
        restored = tamper.restore_grading_metadata(g.nb, g.job.spec.view)
    except Exception as error:  # a notebook no rule foresaw: graded as far as sanitizing can take it
        g.flag([CELL_EDITED], [f"cells the grader could not restore ({type(error).__name__})"])
        return
    g.flag(restored.flags, restored.details)


def inspect(g: Grading) -> None:
    """Flags for what the submission did to the graded cells and the functions the checks use."""
    released = released_notebook(g.job.spec.released)
    try:
        found = tamper.inspect(g.nb, released, g.job.spec.view)
    except Exception as error:  # as above
        g.flag([CELL_EDITED], [f"cells the grader could not inspect ({type(error).__name__})"])
        return
    g.flag(found.flags, found.details)
    g.forged = found.forged


def sanitize_cells(g: Grading) -> None:
    """nbgrader's sanitizing (outputs cleared, read-only and test cells restored, deleted ones back)."""
    try:
        g.nb, g.resources = sanitize(g.nb, g.job.spec.view, g.resources)
    except Exception as error:
        raise Rejected(f"{g.job.source_name}'s grading metadata is damaged beyond repair ({error})") from None


def execute(g: Grading) -> None:
    """Cell by cell in the sandbox, the verdict server answering the checks."""
    spec, sandbox = g.job.spec, g.sandbox
    key = (spec.assignment, spec.fingerprint)
    with timed(g.result.phases, "referee"):
        answers = referee.for_slot(sandbox.slot, g.job.limits.memory_mb)
        if key not in g.judges:
            g.judges[key] = judge.Judge(spec.assignment, spec.reference_cells)
        answers.prepare([g.judges[key]])  # the reference's own process, ready before any cell runs
    socket_path = str(sandbox.run_dir / "verdicts.sock")
    with timed(g.result.phases, "judge"):
        g.server = judge.VerdictServer(
            socket_path, {spec.assignment: g.judges[key]}, spec.expected, answers, g.job.limits.cell_seconds
        )
    executor = ContainedExecute(
        sandbox,
        g.job.limits,
        str(sandbox.work_dir(g.job.assignment)),
        kernel_environment(socket_path),
        list(spec.kernel_arguments),
        spec.files,
        server=g.server,
    )
    g.execution = execution = executor.run(g.nb)
    result = g.result
    if execution.faults:
        kinds = sorted({f.kind for f in execution.faults})
        g.flag([fault(k) for k in kinds], [f"cell {f.cell}: {f.kind}: {f.message}" for f in execution.faults])
    if execution.truncated:
        g.flag([OUTPUT_TRUNCATED])
    if execution.stray_processes:
        result.messages.append(f"killed {execution.stray_processes} processes the notebook left running")
    result.faults = [f.__dict__ for f in execution.faults]
    result.cell_seconds = execution.cell_seconds
    result.cell_cpu_seconds = execution.cell_cpu_seconds
    result.kernel_seconds = execution.kernel_seconds
    result.kernels = execution.kernels
    # the judge, the substitutes and the checks ran while a cell waited: they are not the cells' own time
    during = {**g.server.phases, "checks": g.server.checking}
    for name, seconds in [*execution.phases.items(), *during.items()]:
        add(result.phases, name, seconds)
    add(result.phases, "cells", max(0.0, execution.cell_seconds - sum(during.values())))


def verdicts(g: Grading) -> None:
    """Each grade cell's outputs made to agree with the grader's own record of its checks, and each
    test cell's points decided by that record alone."""
    records, flags = apply_verdicts(g.nb, g.server, g.job.spec.expected, g.execution, g.forged)
    g.result.checks = records
    details = [f"interfered with its hidden checks: {what}" for what in g.server.interference]
    for grade_id in g.job.spec.expected:
        details += [f"{v.exercise}: {note}" for v in g.server.cell_verdicts(grade_id) for note in v.review]
    g.flag(flags, details)
    g.decided = decided_scores(g.nb, records, g.execution)


def limit_outputs(g: Grading) -> None:
    """nbgrader's output limits, as its autograde applies them."""
    g.nb, g.resources = IgnorePattern().preprocess(g.nb, g.resources)
    g.nb, g.resources = LimitOutput().preprocess(g.nb, g.resources)


def inert(g: Grading) -> None:
    """Nothing of the submission that a browser would run in the graded notebook (the formgrader shows
    it, the feedback page is made from it): markdown and outputs kept to an allow-list."""
    inert_notebook(g.nb, g.job.spec.released)


STEPS = [read, restore, inspect, sanitize_cells, execute, verdicts, limit_outputs, inert]
# Each step's phase (``worker.phases``); ``execute`` times its own parts.
PHASE_OF = {
    read: "sanitize",
    restore: "sanitize",
    inspect: "sanitize",
    sanitize_cells: "sanitize",
    verdicts: "judge",
    limit_outputs: "sanitize",
    inert: "sanitize",
}


# ---------------------------------------------------------------- the unit of work


_pages: dict = {}


def finish(result: Result, nb, spec, started: float, decided: dict | None = None) -> Result:
    """Everything that is a function of the graded notebook, done here where it was graded:
    its JSON, its scores (``decided``'s for the test cells) and comments as nbgrader's
    ``SaveAutoGrades`` writes them, and the feedback page rendered from them."""
    with timed(result.phases, "feedback"):
        result.notebook_json = nbformat.writes(nb)
        result.scores, result.comments = grades_of(nb, decided)
        disagreeing = disagreements(nb, decided or {})
        if disagreeing:
            result.flags += [] if OUTPUTS_DISAGREE in result.flags else [OUTPUTS_DISAGREE]
            result.messages += disagreeing
        if spec.config is not None:
            key = json.dumps(spec.config, sort_keys=True, default=repr)
            if key not in _pages:
                _pages[key] = FeedbackPages(spec.config)
            result.feedback_html = _pages[key].render(
                result.notebook_json,
                result.student,
                result.assignment,
                result.notebook,
                grades=result.scores,
                comments=result.comments,
            )
    result.seconds = time.monotonic() - started
    return result


def grade_submission(job: Job, sandbox: WarmSandbox, judges: dict) -> Result:
    """Grade ``job`` in ``sandbox``'s sandbox; never raises for anything the submission does."""
    result = Result(
        job.student,
        job.assignment,
        job.notebook,
        job.digest,
        job.spec.fingerprint,
        True,
        "",
        messages=list(job.notes),
        flags=list(job.flags),
        timestamp=job.timestamp,
        worker=f"w{sandbox.slot}",
        sandbox_launch=sandbox.launches,
        started=time.time(),
    )
    g = Grading(job, sandbox, judges, result, time.monotonic())
    g.resources = {
        "nbgrader": {"student": job.student, "assignment": job.assignment, "notebook": job.notebook, "db_url": None}
    }
    try:
        for step in STEPS:
            with timed(result.phases if step in PHASE_OF else None, PHASE_OF.get(step, "")):
                step(g)
    except Rejected as rejection:
        with timed(result.phases, "sanitize"):
            g.nb = rejected_notebook(job.spec, str(rejection))
        result.graded = False
        g.flag([NOT_GRADED], [] if any(str(rejection) in m for m in result.messages) else [str(rejection)])
    finally:
        if g.server is not None:
            with timed(result.phases, "judge"):
                g.server.close()
        if not sandbox.sandboxed:
            shutil.rmtree(sandbox.work_dir(job.assignment), ignore_errors=True)
    return finish(result, g.nb, job.spec, g.started, g.decided if result.graded else None)
