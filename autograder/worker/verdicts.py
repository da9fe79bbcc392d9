"""Scores from the grader's own verdicts: the pipeline's step after execution, and nbgrader's scoring rules.

The verdict server (``judge.VerdictServer``) holds a record of every check a notebook's kernel
asked for. ``apply_verdicts`` makes each grade cell's outputs agree with those records;
``grades_of`` then scores the notebook by nbgrader's ``SaveAutoGrades`` rules.
"""

from __future__ import annotations

from nbgrader.utils import compute_checksum, determine_grade, is_grade, is_solution, is_task

from ..cells import error_output, graded_id
from ..flags import CHECKS_MISSING, PATCHED_FUNCTIONS
from ..messages import mistake_of, tagged, tampering_message
from ..records import CheckRecord


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
                    flags.append(CHECKS_MISSING)
            elif not verdict.finished:
                message = f"The hidden checks of `{exercise}` did not finish (the cell was stopped)."
            else:
                message = verdict.message
            if forged and message is None:
                # The notebook changes the grading helpers: what its kernel reported cannot be trusted.
                message = tampering_message([f"code that {f}" for f in forged])
            if verdict is not None and verdict.tampered:
                flags.append(PATCHED_FUNCTIONS)
            if message and mistake_of(message) == "tampering" and verdict is not None:
                flags.append(PATCHED_FUNCTIONS)
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
