"""The words of a check's verdict: the ``[mistake:<id>]`` tag, the tampering message, the learner's form.

A message about a catalogued mistake ends with ``[mistake:<id>]``: the class report
counts mistakes by it, the learner reads the rest. It is written (``tagged``) and read
(``mistake_of``, ``without_tag``) here only. No torch: the grade command's own process
reads verdicts without importing it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

MISTAKE_TAG = re.compile(r"\s*\[mistake:([a-z0-9][a-z0-9_-]{0,59})\]\s*$")


def tagged(message: str, mistake_id: str) -> str:
    return f"{message} [mistake:{mistake_id}]"


def mistake_of(message: str | None) -> str | None:
    """The ``[mistake:<id>]`` a check's message ends with, if any."""
    found = MISTAKE_TAG.search(message or "")
    return found.group(1) if found else None


def without_tag(message: str | None) -> str | None:
    """The message as the learner reads it: without its ``[mistake:<id>]``."""
    return None if message is None else MISTAKE_TAG.sub("", message)


def tampering_message(tampered: Sequence[str]) -> str:
    shown = ", ".join(tampered[:5]) + (" ..." if len(tampered) > 5 else "")
    return tagged(
        f"This notebook replaced functions the checks rely on ({shown}), so no check "
        "in it can be trusted and it gets no points for them; it is flagged for review.",
        "tampering",
    )


def interference_message(name: str, why: str) -> str:
    return tagged(
        f"The check of `{name}` was interfered with: the notebook {why}. It gives no points; the "
        "notebook is flagged for review.",
        "tampering",
    )


def finish(name: str, problem: str | None) -> str | None:
    """The learner-facing message for a failed check (None when it passed)."""
    if not problem:
        return None
    return problem if problem.startswith("`") else f"`{name}`: {problem}"
