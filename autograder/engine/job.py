"""Grade one submission notebook: the unit of work.

``grade_submission(job, sandbox, judges) -> Result`` reads only the ``Job``
(the submission's bytes and a snapshot of everything the grader knows about
its notebook, ``AssignmentSpec``) and returns a picklable ``Result``: the
autograded notebook, its scores and comments by nbgrader's ``SaveAutoGrades``
rules, its feedback page (``finish``), the checks' verdicts and the flags. It
writes nothing but sandbox scratch files, so it runs wherever a runner puts it
(``runners``: this machine's processes or a Dask cluster), in a warm sandbox
(``bubblewrap.WarmSandbox``) with one ``judge.Judge`` per assignment kept for the
worker's life. The single writer (``writer.Writer``) commits the result.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

import nbformat

from ..judging.cells import error_output, graded_id
from ..judging.flags import GRADING_FAILED, NOT_GRADED
from ..judging.tamper import GradebookView, Inspection, inspect, restore_grading_metadata, sanitize
from ..messages import mistake_of, tagged, tampering_message
from ..sandboxing.bubblewrap import Limits, WarmSandbox, kernel_environment


@dataclass
class AssignmentSpec:
    """All the grader needs to know about one notebook of an assignment (a snapshot)."""

    assignment: str
    notebook: str
    view: GradebookView  # the gradebook's source cells
    released: str  # the released student notebook (JSON)
    reference_cells: list  # (grade_id, source) from solutions/, for the judge only
    expected: dict  # grade cell id -> [(assignment, exercise)]
    files: dict = field(default_factory=dict)  # other released files: relative path -> hex
    kernel_arguments: list = field(default_factory=list)
    fingerprint: str = ""  # changes when anything that affects grading changes
    config: object = None  # the course's nbgrader configuration (the feedback exporter's)


@dataclass
class Job:
    student: str
    assignment: str
    notebook: str
    data: bytes | None  # the submitted file, None when there is none
    source_name: str  # where it came from, for messages
    digest: str  # of the submitted bytes (and timestamp)
    spec: AssignmentSpec
    limits: Limits
    timestamp: str | None = None
    notes: list = field(default_factory=list)  # from collection (e.g. renamed file)
    flags: list = field(default_factory=list)


@dataclass
class CheckRecord:
    cell: str
    exercise: str
    passed: bool
    message: str | None
    mistake: str | None
    mistake_name: str | None = None


@dataclass
class Result:
    student: str
    assignment: str
    notebook: str
    digest: str
    fingerprint: str
    graded: bool  # False: rejected (bad input), graded as an empty submission
    notebook_json: str  # the autograded notebook
    feedback_html: str = ""  # its feedback page (the worker's own grades; "" when not rendered)
    messages: list = field(default_factory=list)  # for the instructor
    flags: list = field(default_factory=list)
    checks: list = field(default_factory=list)  # CheckRecord
    scores: dict = field(default_factory=dict)  # grade id -> [score, max]: SaveAutoGrades' auto scores
    comments: dict = field(default_factory=dict)  # answer cell id -> SaveAutoGrades' auto comment (or None)
    cell_seconds: float = 0.0
    cell_cpu_seconds: float = 0.0
    kernel_seconds: float = 0.0
    seconds: float = 0.0
    kernels: int = 0
    faults: list = field(default_factory=list)
    timestamp: str | None = None
    worker: str = ""
    sandbox_launch: int = 0  # which of its worker's sandboxes it ran in (a new one after one was retired)
    started: float = 0.0  # when its worker began it (epoch seconds)


# ---------------------------------------------------------------- reading the file


class Rejected(Exception):
    """The submission cannot be graded; the message says why, for the instructor and the student."""


def read_submission(data: bytes | None, name: str, spec: AssignmentSpec) -> tuple[nbformat.NotebookNode, list[str]]:
    """The notebook in ``data`` (nbformat 4), with notes; or ``Rejected``."""
    if data is None:
        raise Rejected(f"no {spec.notebook}.ipynb was submitted")
    if not data.strip():
        raise Rejected(f"{name} is empty")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise Rejected(f"{name} is not a notebook (not UTF-8 text)") from None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as error:
        raise Rejected(
            f"{name} is not valid JSON ({error.msg} at line {error.lineno}); was it saved completely?"
        ) from None
    except (ValueError, RecursionError) as error:
        raise Rejected(f"{name} is not valid JSON ({type(error).__name__})") from None
    if not isinstance(raw, dict) or "nbformat" not in raw:
        raise Rejected(f"{name} is JSON but not a Jupyter notebook")
    notes = []
    version = raw.get("nbformat")
    cells = raw.get("cells")
    if isinstance(cells, list) and any(isinstance(c, dict) and not isinstance(c.get("metadata"), dict) for c in cells):
        for cell in cells:  # a cell that lost its metadata is an ordinary cell, not an unreadable notebook
            if isinstance(cell, dict) and not isinstance(cell.get("metadata"), dict):
                cell["metadata"] = {}
        text = json.dumps(raw)
    try:
        nb = nbformat.reads(text, as_version=4)
    except Exception as error:
        raise Rejected(f"{name} is a notebook that cannot be read (nbformat {version}: {error})") from None
    if version != 4:
        notes.append(f"{name} was in notebook format {version}; converted to format 4 and graded")
    ours = {c.name for c in spec.view.notebook.source_cells}
    present = {_grade_id_of(c) for c in nb.cells}
    if not ours & present:
        raise Rejected(f"{name} is not the {spec.notebook} notebook: none of its exercise or check cells are in it")
    return nb, notes


def _grade_id_of(cell) -> str | None:
    metadata = cell.get("metadata") if isinstance(cell, dict) else None
    meta = metadata.get("nbgrader") if isinstance(metadata, dict) else None
    found = meta.get("grade_id") if isinstance(meta, dict) else None
    return found if isinstance(found, str) else None


def rejected_notebook(spec: AssignmentSpec, message: str) -> nbformat.NotebookNode:
    """The released notebook, marked as not graded, every check failing with ``message``."""
    nb = nbformat.reads(spec.released, as_version=4)
    nb.cells.insert(0, nbformat.v4.new_markdown_cell(f"**This submission could not be graded:** {message}."))
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = []
            if cell.metadata.get("nbgrader", {}).get("grade"):
                cell.outputs = [error_output("NotGraded", f"This submission could not be graded: {message}.")]
    return nb


WORKERS_DIED = (
    "grading this notebook stopped the grading worker {tries} times, so it was not graded; "
    "the instructor will look at it"
)


def failed_result(job: Job, message: str) -> Result:
    """The record of a submission whose grading kept failing (its workers died): no points,
    ``message`` for the student and the instructor, flagged for review. Its empty
    fingerprint makes the next run try it again."""
    nb = rejected_notebook(job.spec, message)
    scores, comments = grades_of(nb)
    return Result(
        job.student,
        job.assignment,
        job.notebook,
        job.digest,
        "",
        False,
        nbformat.writes(nb),
        messages=[*job.notes, message],
        flags=[*job.flags, NOT_GRADED, GRADING_FAILED],
        scores=scores,
        comments=comments,
        timestamp=job.timestamp,
    )


# ---------------------------------------------------------------- verdicts into outputs


def apply_verdicts(nb, server, expected: dict, execution, forged=()) -> tuple[list, list]:
    """Make each grade cell's outputs agree with the grader's own record of its checks.

    A check that failed, did not finish or never reported gets its error output
    (if the notebook swallowed it), so nbgrader's scoring gives the cell no
    points. Returns (CheckRecords, flags).
    """

    records, flags = [], []
    faulty = {f.cell for f in execution.faults if f.kind in ("hung", "died", "memory", "not-run")}
    for index, cell in enumerate(nb.cells):
        gid = graded_id(cell)
        if gid not in expected:
            continue
        verdicts = {v.exercise: v for v in server.cell_verdicts(gid)}
        errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
        for assignment, exercise in expected[gid]:
            verdict = verdicts.get(exercise)
            if verdict is None:
                message = f"The hidden checks of `{exercise}` did not run."
                if index not in faulty:
                    message = tagged(
                        message + " The notebook stopped them (it replaced or broke the grading helpers), "
                        "so they give no points; it is flagged for review.",
                        "tampering",
                    )
                    flags.append("hidden-checks-missing")
            elif not verdict.finished:
                message = f"The hidden checks of `{exercise}` did not finish (the cell was stopped)."
            else:
                message = verdict.message
            if forged and message is None:
                # The notebook changes the grading helpers: what its kernel reported cannot be trusted.
                message = tampering_message([f"code that {f}" for f in forged])
            if verdict is not None and verdict.tampered:
                flags.append("patched-functions")
            if message and mistake_of(message) == "tampering" and verdict is not None:
                flags.append("patched-functions")
            if message and not any(o.get("evalue") == message for o in errors):
                cell.outputs.append(error_output("CheckFailed", message))
            mistake = mistake_of(message)
            judge = server.judges.get(assignment)
            records.append(
                CheckRecord(
                    gid,
                    exercise,
                    message is None,
                    message,
                    mistake,
                    judge.mistake_name(exercise, mistake) if judge and mistake else None,
                )
            )
    return records, flags


def grades_of(nb) -> tuple[dict, dict]:
    """What nbgrader's ``SaveAutoGrades`` writes for this autograded notebook, by its rules:
    ({grade cell id: [auto score, max points]}, {answer or task cell id: auto comment})."""
    from nbgrader.utils import compute_checksum, determine_grade, is_grade, is_solution, is_task

    scores, comments = {}, {}
    for cell in nb.cells:
        if is_grade(cell):
            score, maximum = determine_grade(cell)
            scores[cell.metadata["nbgrader"]["grade_id"]] = [score, maximum]
        if is_solution(cell) or is_task(cell):
            untouched = cell.metadata.nbgrader.get("checksum", None) == compute_checksum(cell)
            comments[cell.metadata["nbgrader"]["grade_id"]] = (
                "No response." if untouched and not is_task(cell) else None
            )
    return scores, comments


_pages: dict = {}


def finish(result: Result, nb, spec: AssignmentSpec, started: float) -> Result:
    """Everything that is a function of the graded notebook, done here where it was graded:
    its JSON, nbgrader's scores and comments, and the feedback page rendered from them."""
    result.notebook_json = nbformat.writes(nb)
    result.scores, result.comments = grades_of(nb)
    if spec.config is not None:
        from ..judging.feedback import FeedbackPages

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


# ---------------------------------------------------------------- the unit of work


def prepare(job: Job, result: Result, resources: dict):
    """The submission read, its grading metadata restored, inspected and sanitized, ready to run:
    (notebook, resources, forged), ``forged`` naming the code that reaches for the grading helpers
    (no check gets credit then); ``Rejected`` with the reason when nothing of it can be graded.
    Flags and messages go to ``result``. Runs no student code."""
    spec = job.spec
    nb, notes = read_submission(job.data, job.source_name, spec)
    result.messages += notes
    released = nbformat.reads(spec.released, as_version=4)
    try:
        restored = restore_grading_metadata(nb, spec.view)  # the instructor's version of the rules
        found = inspect(nb, released, spec.view)
    except Exception as error:  # a notebook no rule foresaw: graded as far as sanitizing can take it
        restored, found = Inspection(), Inspection()
        found.add("graded-cell-edited", f"cells the grader could not inspect ({type(error).__name__})")
    result.flags += [flag for flag in restored.flags + found.flags if flag not in result.flags]
    result.messages += restored.details + found.details
    try:
        nb, resources = sanitize(nb, spec.view, resources)
    except Exception as error:
        raise Rejected(f"{job.source_name}'s grading metadata is damaged beyond repair ({error})") from None
    return nb, resources, found.forged


def grade_submission(job: Job, sandbox: WarmSandbox, judges: dict) -> Result:
    """Grade ``job`` in ``sandbox``'s sandbox; never raises for anything the submission does."""
    from nbgrader.preprocessors import IgnorePattern, LimitOutput

    from ..judging import judge as judging
    from ..sandboxing.execute import ContainedExecute

    started = time.monotonic()
    spec = job.spec
    result = Result(
        job.student,
        job.assignment,
        job.notebook,
        job.digest,
        spec.fingerprint,
        True,
        "",
        messages=list(job.notes),
        flags=list(job.flags),
        timestamp=job.timestamp,
        worker=f"w{sandbox.slot}",
        sandbox_launch=sandbox.launches,
        started=time.time(),
    )
    resources = {
        "nbgrader": {"student": job.student, "assignment": job.assignment, "notebook": job.notebook, "db_url": None}
    }
    try:
        nb, resources, forged = prepare(job, result, resources)
    except Rejected as rejection:
        nb = rejected_notebook(spec, str(rejection))
        result.graded = False
        result.flags.append(NOT_GRADED)
        if not any(str(rejection) in message for message in result.messages):
            result.messages.append(str(rejection))
        return finish(result, nb, spec, started)

    key = (spec.assignment, spec.fingerprint)
    if key not in judges:
        judges[key] = judging.Judge(spec.assignment, spec.reference_cells)
    socket_path = str(sandbox.run_dir / "verdicts.sock")
    server = judging.VerdictServer(socket_path, {spec.assignment: judges[key]}, spec.expected)
    try:
        executor = ContainedExecute(
            sandbox,
            job.limits,
            str(sandbox.work_dir(job.assignment)),
            kernel_environment(socket_path),
            list(spec.kernel_arguments),
            spec.files,
            server=server,
        )
        execution = executor.run(nb)
        records, flags = apply_verdicts(nb, server, spec.expected, execution, forged)
    finally:
        server.close()
        if not sandbox.sandboxed:
            import shutil

            shutil.rmtree(sandbox.work_dir(job.assignment), ignore_errors=True)
    nb, resources = IgnorePattern().preprocess(nb, resources)
    nb, resources = LimitOutput().preprocess(nb, resources)
    result.checks = records
    result.flags += [f for f in dict.fromkeys(flags) if f not in result.flags]
    if execution.faults:
        kinds = sorted({f.kind for f in execution.faults})
        result.flags += [f"fault:{k}" for k in kinds if f"fault:{k}" not in result.flags]
        result.messages += [f"cell {f.cell}: {f.kind}: {f.message}" for f in execution.faults]
    if execution.truncated:
        result.flags.append("output-truncated")
    if execution.stray_processes:
        result.messages.append(f"killed {execution.stray_processes} processes the notebook left running")
    result.faults = [f.__dict__ for f in execution.faults]
    result.cell_seconds = execution.cell_seconds
    result.cell_cpu_seconds = execution.cell_cpu_seconds
    result.kernel_seconds = execution.kernel_seconds
    result.kernels = execution.kernels
    return finish(result, nb, spec, started)
