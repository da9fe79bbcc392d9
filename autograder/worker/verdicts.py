"""Scores from the grader's own verdicts: the pipeline's step after execution.

The verdict server (``judge.VerdictServer``) holds a record of every check a notebook's kernel
asked for. ``apply_verdicts`` makes each grade cell's outputs agree with those records (so the
feedback shows why), and ``decided_scores`` gives each autograded test cell its points from the
records alone. ``grades_of`` writes what nbgrader's ``SaveAutoGrades`` would, with those points in
place of nbgrader's own rule (``determine_grade``: a test cell's first ``execute_result`` decides,
and a number there is read as points), which any code the cell calls can satisfy through IPython's
display hook; ``disagreements`` names the cells where that rule would have scored differently.
"""

from __future__ import annotations

from nbgrader.utils import compute_checksum, determine_grade, is_grade, is_solution, is_task

from ..cells import error_output, graded_id, nbgrader_of
from ..flags import CHECK_INTERFERED, CHECKS_MISSING, OBSERVED_IN_KERNEL, PATCHED_FUNCTIONS
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
    stopped = {f.cell for f in execution.faults} | set(execution.errored)  # cells known to have ended in error
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
                if index not in stopped and not errors:
                    # stopped, and yet its cell reported no error: the notebook hid how it ended
                    message = tagged(
                        message + " Yet the cell reported no error: the notebook stopped the check and hid "
                        "it, so it gives no points; it is flagged for review.",
                        "tampering",
                    )
                    flags.append(CHECK_INTERFERED)
            else:
                message = verdict.message
            if forged and message is None:
                # The notebook changes the grading helpers: what its kernel reported cannot be trusted.
                message = tampering_message([f"code that {f}" for f in forged])
            if verdict is not None and verdict.tampered:
                flags.append(PATCHED_FUNCTIONS)
            if verdict is not None and verdict.review:
                flags.append(OBSERVED_IN_KERNEL)
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
    if server.interference:
        flags.append(CHECK_INTERFERED)
    return records, flags


def _autograded_tests(nb):
    """(index, cell) of each test cell nbgrader would score from its outputs (a code grade cell that is
    not an answer)."""
    for index, cell in enumerate(nb.cells):
        meta = nbgrader_of(cell)
        if meta.get("grade") and not meta.get("solution") and cell.get("cell_type") == "code":
            yield index, cell


def decided_scores(nb, records: list[CheckRecord], execution) -> dict[str, float]:
    """The points of every autograded test cell, from what the grader knows itself: all or nothing.

    A cell earns its points when the judge's record of every check in it says passed (``records``,
    from ``apply_verdicts``) and the cell finished without an error; what it printed or returned
    counts for nothing. Of a cell's error the executor knows by itself only that it hung, was
    interrupted, stopped its kernel, kept all its memory or never ran (``execution.faults``); that a
    visible assert failed it learns from the kernel, where student code runs (the execute_reply's
    status, ``execution.errored``, and the error outputs). So a notebook can hide the failure of its
    own visible asserts, but only in a cell whose hidden checks the judge has passed; a test cell
    without hidden checks rests on the visible asserts alone.
    """
    passed: dict[str, bool] = {}
    for record in records:
        passed[record.cell] = passed.get(record.cell, True) and record.passed
    faulty = {fault.cell for fault in execution.faults} | set(execution.errored)
    scores = {}
    for index, cell in _autograded_tests(nb):
        meta = nbgrader_of(cell)
        erred = index in faulty or any(o.get("output_type") == "error" for o in cell.get("outputs", []))
        scores[meta["grade_id"]] = float(meta["points"]) if passed.get(meta["grade_id"], True) and not erred else 0.0
    return scores


def disagreements(nb, decided: dict[str, float]) -> list[str]:
    """The test cells that nbgrader's own rule would score differently from the verdicts, and why."""
    found = []
    for _, cell in _autograded_tests(nb):
        gid = nbgrader_of(cell).get("grade_id")
        if gid not in decided:
            continue
        try:
            stock = f"{determine_grade(cell)[0]:g} point(s)"
        except (KeyError, TypeError, ValueError) as error:  # a result it cannot read: its autograde would stop
            stock = f"no score but an error ({error})"
        if stock != f"{decided[gid]:g} point(s)":
            found.append(
                f"{gid}: by nbgrader's own rule its outputs give {stock} ({_what_decides(cell)}); "
                f"its checks give {decided[gid]:g}, which count"
            )
    return found


def _what_decides(cell) -> str:
    """The output nbgrader's ``determine_grade`` reads first, in words."""
    for output in cell.get("outputs", []):
        if output.get("output_type") == "error":
            return f"an error, {output.get('ename', '')}"
        if output.get("output_type") == "stream" and output.get("name") == "stderr":
            return "it wrote to stderr"
        if output.get("output_type") == "execute_result":
            text = str(output.get("data", {}).get("text/plain", ""))[:60]
            return f"its first result is {text!r}"
    return "no error and no result"


def grades_of(nb, decided: dict[str, float] | None = None) -> tuple[dict, dict]:
    """What nbgrader's ``SaveAutoGrades`` writes for this autograded notebook, with the points of
    ``decided`` (``decided_scores``) for the test cells it holds, nbgrader's rules for any other:
    ({grade cell id: [auto score, max points]}, {answer or task cell id: auto comment})."""

    scores, comments = {}, {}
    for cell in nb.cells:
        if is_grade(cell):
            gid = cell.metadata["nbgrader"]["grade_id"]
            if decided is not None and gid in decided:
                scores[gid] = [decided[gid], float(cell.metadata["nbgrader"]["points"])]
            else:
                scores[gid] = list(determine_grade(cell))
        if is_solution(cell) or is_task(cell):
            untouched = cell.metadata.nbgrader.get("checksum", None) == compute_checksum(cell)
            comments[cell.metadata["nbgrader"]["grade_id"]] = (
                "No response." if untouched and not is_task(cell) else None
            )
    return scores, comments
