"""The flags a graded notebook can carry: one vocabulary for the grader, the gradebook and the reports.

A flag costs no points by itself. ``REVIEW_FLAGS`` are those that mark the
notebook ``flagged`` in the gradebook (nbgrader's formgrader shows it) and list
it under "Flagged for review" in the class report and the summary; the others
describe what happened (``fault:<kind>`` for a cell that hung, crashed or ran
out of memory, ``output-truncated``, ``not-graded``).
"""

NOT_GRADED = "not-graded"  # rejected (not a notebook, empty, ...): graded as an empty submission
GRADING_FAILED = "grading-failed"  # its grading workers kept dying
OUTPUT_TRUNCATED = "output-truncated"
FAULT_PREFIX = "fault:"  # + hung, died, memory, not-run

# what the submission did (worker.tamper, collect), each asking for a look
CELL_EDITED = "graded-cell-edited"
CELL_DELETED = "graded-cell-deleted"
CELL_DUPLICATED = "graded-cell-duplicated"
CELLS_REORDERED = "cells-reordered"
SUSPICIOUS_CODE = "suspicious-code"
PATCHED_FUNCTIONS = "patched-functions"
FORGED_METADATA = "grading-metadata-forged"
CHECKS_MISSING = "hidden-checks-missing"
# a check's invocation broken into: a result from outside it (another connection, another caller),
# a message out of its order, or a check stopped in a cell that then reported no error (worker.judge)
CHECK_INTERFERED = "hidden-check-interfered"
# a property that could be observed only inside the notebook's kernel (where it could be forged), so it
# decided no points: e.g. 08's forward passes made without the substitutes the grader counts
OBSERVED_IN_KERNEL = "observed-in-kernel"
WRONG_FILE_NAME = "wrong-file-name"
# a test cell whose outputs would score differently by nbgrader's own rule (its first execute_result, a
# number read as points, stderr) than its checks' verdicts do: the verdicts count (worker.verdicts)
OUTPUTS_DISAGREE = "outputs-disagree-with-checks"

REVIEW_FLAGS = frozenset(
    {
        CELL_EDITED,
        CELL_DELETED,
        CELL_DUPLICATED,
        CELLS_REORDERED,
        SUSPICIOUS_CODE,
        PATCHED_FUNCTIONS,
        FORGED_METADATA,
        CHECKS_MISSING,
        CHECK_INTERFERED,
        OBSERVED_IN_KERNEL,
        WRONG_FILE_NAME,
        OUTPUTS_DISAGREE,
        GRADING_FAILED,
    }
)


def for_review(flags) -> list[str]:
    """The flags among ``flags`` that ask for a human's look, in their order."""
    return [flag for flag in flags if flag in REVIEW_FLAGS]


def is_fault(flag: str) -> bool:
    return flag.startswith(FAULT_PREFIX) or flag == OUTPUT_TRUNCATED


def fault(kind: str) -> str:
    """The flag of a cell fault of ``kind`` (hung, died, memory, not-run, timeout)."""
    return FAULT_PREFIX + kind
