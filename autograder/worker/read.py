"""Read a submission's bytes into a notebook, or say why they cannot be graded: the pipeline's first step.

Any bytes at all: an empty file, another format, broken JSON, a notebook of another assignment
each become a ``Rejected`` with a message for the student and the instructor
(``rejected_notebook`` then stands in for the submission, every check failing with it). A
submission whose grading kept killing its workers gets the same treatment (``failed_result``,
made where the results arrive: no torch, no kernel needed).
"""

from __future__ import annotations

import functools
import json

import nbformat

from ..cells import error_output, nbgrader_of
from ..flags import GRADING_FAILED, NOT_GRADED
from ..records import AssignmentSpec, Job, Rejected, Result
from .verdicts import grades_of


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
    found = nbgrader_of(cell).get("grade_id")
    return found if isinstance(found, str) else None


@functools.lru_cache(maxsize=4)
def released_notebook(released: str) -> nbformat.NotebookNode:
    """The released notebook (``AssignmentSpec.released``), parsed once a process for every notebook of
    its assignment that the tamper inspection and the feedback's allow-list compare with it: shared,
    so read, never changed (``rejected_notebook`` makes its own)."""
    return nbformat.reads(released, as_version=4)


def rejected_notebook(spec: AssignmentSpec, message: str) -> nbformat.NotebookNode:
    """The released notebook, marked as not graded, every check failing with ``message``."""
    nb = nbformat.reads(spec.released, as_version=4)
    nb.cells.insert(0, nbformat.v4.new_markdown_cell(f"**This submission could not be graded:** {message}."))
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = []
            if nbgrader_of(cell).get("grade"):
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
