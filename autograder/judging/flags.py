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

REVIEW_FLAGS = frozenset(
    {
        "graded-cell-edited",
        "graded-cell-deleted",
        "graded-cell-duplicated",
        "cells-reordered",
        "suspicious-code",
        "patched-functions",
        "grading-metadata-forged",
        "hidden-checks-missing",
        "wrong-file-name",
        GRADING_FAILED,
    }
)


def for_review(flags) -> list[str]:
    """The flags among ``flags`` that ask for a human's look, in their order."""
    return [flag for flag in flags if flag in REVIEW_FLAGS]


def is_fault(flag: str) -> bool:
    return flag.startswith(FAULT_PREFIX) or flag == OUTPUT_TRUNCATED
