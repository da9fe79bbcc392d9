"""Where the reference answers are written, and where they must not turn up.

An answer line is a line of a reference solution (between nbgrader's solution markers in
``solutions/``) that students do not get anyway: a line such as ``)`` or ``d = q.shape[-1]``
that a demo, a stub or the students' own package (the widgets, the check helper) also holds
gives nothing away. The released
notebooks' ``setup_from_<assignment>`` cells are the one place where answers are released on
purpose: they carry the earlier assignments' reference functions, so that notebook N+1 works
for a learner whose N does not. They count as answers of the assignment they come from.

Used by ``./course export-class`` (the students' copy), by nbgrader's release through
``nbgrader_config.py`` (``release_guard``), and by the site's test (the built pages hold none).
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Iterable
from pathlib import Path

SOLUTION = re.compile(r"### BEGIN SOLUTION\n(.*?)### END SOLUTION", re.S)
SETUP_FROM = "setup_from_"


def _cells(notebook: Path) -> list[dict]:
    return json.loads(notebook.read_text(encoding="utf-8"))["cells"]


def _source(cell: dict) -> str:
    source = cell.get("source", "")
    return source if isinstance(source, str) else "".join(source)


def _lines(text: str) -> set[str]:
    return {line.strip() for line in text.splitlines() if line.strip()}


def files_under(paths: Iterable[Path]) -> list[Path]:
    """The files of ``paths``, folders walked (bytecode and checkpoints left out)."""
    found = []
    for path in paths:
        candidates = sorted(path.rglob("*")) if path.is_dir() else [path]
        found += [p for p in candidates if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"]
    return found


def setup_origin(cell: dict) -> str | None:
    """The assignment whose answers a released ``setup_from_<assignment>`` cell carries, else None."""
    grade_id = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id", "")
    return grade_id[len(SETUP_FROM) :] if grade_id.startswith(SETUP_FROM) else None


def answer_lines(solutions: Path, release: Path, public_files: Iterable[Path] = ()) -> dict[str, set[str]]:
    """{assignment: its answer lines}: its solution lines less those the released notebooks show
    outside the setup cells that carry earlier answers, less the lines of ``public_files`` (what
    students install), and less those an earlier assignment's solution writes too (08's
    ``generate_cached`` shares lines with 07's ``generate``: they are 07's)."""
    public: set[str] = set()
    for path in public_files:
        public |= _lines(path.read_text(encoding="utf-8", errors="replace"))
    for notebook in sorted(release.glob("*/*.ipynb")):
        for cell in _cells(notebook):
            if setup_origin(cell) is None:
                public |= _lines(_source(cell))
    answers, earlier = {}, set()
    for notebook in sorted(solutions.glob("*/*.ipynb")):  # in course order
        written = set()
        for cell in _cells(notebook):
            for block in SOLUTION.findall(_source(cell)):
                written |= _lines(block)
        answers[notebook.parent.name] = written - public - earlier
        earlier |= written
    return answers


def found_in(text: str, answers: dict[str, set[str]]) -> dict[str, set[str]]:
    """{assignment: its answer lines that occur, as whole lines, in ``text``}."""
    present = _lines(text)
    return {assignment: lines & present for assignment, lines in answers.items() if lines & present}


def notebook_text(raw: str) -> str:
    """The cells' sources and text outputs of a notebook's JSON, or ``raw`` itself when it is none."""
    try:
        cells = json.loads(raw)["cells"]
    except (ValueError, KeyError, TypeError):
        return raw
    parts = []
    for cell in cells:
        parts.append(_source(cell))
        for output in cell.get("outputs", []):
            text = output.get("text") or output.get("data", {}).get("text/plain", "")
            parts.append(text if isinstance(text, str) else "".join(text))
    return "\n".join(parts)


def html_text(page: str) -> str:
    """What a browser shows of an HTML page, line by line: tags dropped, entities decoded."""
    page = re.sub(r"<(script|style)\b.*?</\1>", "", page, flags=re.S | re.I)
    return html.unescape(re.sub(r"<[^>]+>", "", page))


def scan(texts: Iterable[tuple[str, str]], answers: dict[str, set[str]]) -> list[tuple[str, str, str]]:
    """(where, assignment, line) for every answer line found in the named texts."""
    return [
        (where, assignment, line)
        for where, text in texts
        for assignment, lines in found_in(text, answers).items()
        for line in sorted(lines)
    ]
