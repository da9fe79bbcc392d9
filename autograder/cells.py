"""What the grader reads from a notebook cell's nbgrader metadata, and the error outputs it writes.

One place for both, so the sanitizer, the executor, the verdicts and the
spec read a cell the same way.
"""

from __future__ import annotations


def nbgrader_of(cell) -> dict:
    """The cell's nbgrader metadata ({} for a cell nbgrader does not know, or whose metadata is
    not the mapping it should be: a submission's cells are read before anything is repaired)."""
    metadata = cell.get("metadata") if isinstance(cell, dict) else None
    meta = metadata.get("nbgrader") if isinstance(metadata, dict) else None
    return meta if isinstance(meta, dict) else {}


def grade_id(cell) -> str | None:
    """The cell's nbgrader id, whatever its kind."""
    return nbgrader_of(cell).get("grade_id")


def graded_id(cell) -> str | None:
    """The id of a grade (test) cell; None for any other cell."""
    meta = nbgrader_of(cell)
    return meta.get("grade_id") if meta.get("grade") else None


def tracked_id(cell) -> str | None:
    """The id of a cell nbgrader keeps from the release (grade, answer, read-only or task cell)."""
    meta = nbgrader_of(cell)
    if meta.get("grade") or meta.get("solution") or meta.get("locked") or meta.get("task"):
        return meta.get("grade_id")
    return None


def error_output(ename: str, evalue: str):
    """An error output as nbgrader scores it (no points for its cell) and the feedback shows it:
    its name and message, no traceback to hide."""
    from nbformat.v4 import new_output  # here: reading metadata (reference, local_judge) needs no nbformat

    return new_output("error", ename=ename, evalue=evalue, traceback=[f"{ename}: {evalue}"])
