"""Build the hostile and broken submissions of ``tests/hostile/catalogue.yml`` into a course.

Each entry starts from notebook 01 with the reference answers (``Course.submit``)
and applies its changes; the student id is the entry's id. Used by
``test_grade_command.py``, and handy by hand:

    python tests/hostile_submissions.py /tmp/course     # a course copy with every fixture submitted
"""

from __future__ import annotations

import copy
import re
import sys
import textwrap
from html.parser import HTMLParser
from pathlib import Path

import nbformat
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from grading_harness import UNTOUCHED, Course  # noqa: E402

CATALOGUE = Path(__file__).resolve().parent / "hostile" / "catalogue.yml"
ASSIGNMENT = "01_attention"


def load_catalogue() -> list[dict]:
    return yaml.safe_load(CATALOGUE.read_text(encoding="utf-8"))


def wrong_answers() -> dict:
    """Plausible wrong answers for notebook 01 (the grading suite's own)."""
    from test_grading_01_attention import TestAttentionGrading

    return {name: textwrap.dedent(source) for name, source in TestAttentionGrading.wrong_answers.items()}


def _grade_id(cell) -> str | None:
    return cell.metadata.get("nbgrader", {}).get("grade_id")


def _index(notebook, grade_id: str) -> int:
    return next(i for i, cell in enumerate(notebook.cells) if _grade_id(cell) == grade_id)


REPOSITORY = Path(__file__).resolve().parent.parent


def fill(text: str, course: Course) -> str:
    return text.replace("{course}", str(course.root)).replace("{repository}", str(REPOSITORY))


def assignment_of(entry: dict) -> str:
    """The assignment an entry submits (notebook 01 unless it says another)."""
    return entry.get("assignment", ASSIGNMENT)


def submit(course: Course, entry: dict) -> Path:
    """Write the submission ``entry`` describes for student ``entry['id']``."""
    student, assignment = entry["id"], assignment_of(entry)
    folder = course.submission_path(student, assignment).parent
    if entry.get("no_notebook"):
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "notes.txt").write_text("I could not finish.\n")
        return folder
    if "raw" in entry:
        path = course.submission_path(student, assignment)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(entry["raw"], encoding="utf-8")
        return path

    def edit(notebook):
        added = [
            maker(fill(entry[key], course))
            for key, maker in (
                ("markdown", nbformat.v4.new_markdown_cell),
                ("raw_cell", nbformat.v4.new_raw_cell),
                ("code", nbformat.v4.new_code_cell),
            )
            if key in entry
        ]
        if "raw_cell" in entry:  # rendered as HTML by nbconvert, like JupyterLab's "raw HTML" cells
            added[-2 if "code" in entry else -1].metadata["raw_mimetype"] = "text/html"
        at = _index(notebook, entry["insert_after"]) + 1 if added else 0
        notebook.cells[at:at] = added
        for grade_id, source in (entry.get("edit") or {}).items():
            notebook.cells[_index(notebook, grade_id)].source = source
        for grade_id in entry.get("delete") or []:
            del notebook.cells[_index(notebook, grade_id)]
        for grade_id in entry.get("duplicate") or []:
            notebook.cells.append(copy.deepcopy(notebook.cells[_index(notebook, grade_id)]))
        if entry.get("move"):
            moved, after = entry["move"]
            cell = notebook.cells.pop(_index(notebook, moved))
            notebook.cells.insert(_index(notebook, after) + 1, cell)

    if entry.get("untouched"):
        answers = UNTOUCHED
    elif entry.get("wrong_answers"):
        answers = wrong_answers()
    else:
        answers = {name: fill(source, course) for name, source in (entry.get("answers") or {}).items()}
    path = course.submit(student, assignment, answers, edit=edit, filename=entry.get("filename"))
    for name, content in (entry.get("extra_files") or {}).items():
        (path.parent / name).write_text(content, encoding="utf-8")
    if entry.get("nbformat") == 3:
        notebook = nbformat.read(path, as_version=4)
        path.write_text(nbformat.writes(nbformat.convert(notebook, 3), version=3), encoding="utf-8")
    return path


def submit_all(course: Course, only=None) -> list[dict]:
    """Submit every entry of the catalogue (or those ``only(entry)`` keeps)."""
    entries = [entry for entry in load_catalogue() if only is None or only(entry)]
    for entry in entries:
        submit(course, entry)
    return entries


class _LiveMarkup(HTMLParser):
    """What in a piece of HTML a browser would run: script elements, event handlers, javascript: URLs."""

    def __init__(self):
        super().__init__()
        self.found = []

    def handle_starttag(self, tag, attrs):
        if tag == "script":
            self.found.append("<script>")
        for name, value in attrs:
            if name.lower().startswith("on"):
                self.found.append(f"<{tag} {name}>")
            if re.sub(r"\s", "", value or "").lower().startswith(("javascript:", "vbscript:")):
                self.found.append(f"<{tag} {name}={value!r}>")


def live_markup(notebook: dict) -> list[str]:
    """What in a graded notebook's markdown, raw cells and outputs a browser would run once rendered (the
    formgrader shows the instructor these): script elements, event handlers, ``javascript:`` URLs,
    JavaScript outputs."""
    from nbconvert.filters.markdown_mistune import markdown2html_mistune

    found = []
    for index, cell in enumerate(notebook["cells"]):
        source = "".join(cell["source"])
        pages = {"markdown": [markdown2html_mistune(source)], "raw": [source]}.get(cell["cell_type"], [])
        for output in cell.get("outputs", []):
            for kind, value in output.get("data", {}).items():
                text = "".join(value) if isinstance(value, list) else str(value)
                if "javascript" in kind:
                    found.append(f"cell {index}: a {kind} output")
                elif kind == "text/markdown":
                    pages.append(markdown2html_mistune(text))
                elif kind in ("text/html", "image/svg+xml"):
                    pages.append(text)
        for page in pages:
            parser = _LiveMarkup()
            parser.feed(page)
            found += [f"cell {index}: {what}" for what in parser.found]
    return found


def near(page: str, text: str) -> list[str]:
    """The page's lines that begin as ``text`` does (what the cell printed instead), else its last ones."""
    head = text[:12]
    lines = [line.strip() for line in page.splitlines() if head in line]
    return lines or [line.strip() for line in page.splitlines() if line.strip()][-25:]


def verify(course: Course, entry: dict, summary: dict) -> None:
    """Assert what ``entry['expect']`` says about its graded submission (``summary``: its ledger row)."""
    from autograder.flags import REVIEW_FLAGS

    expect = entry.get("expect", {})
    student, assignment = entry["id"], assignment_of(entry)
    scores = {cell[len("test_") :]: score for cell, score in course.scores(student, assignment).items()}
    full = {cell[len("test_") :]: points for cell, points in course.max_scores(assignment).items()}
    wanted = (
        {name: 0.0 for name in full}
        if expect.get("all_zero")
        else {name: (0.0 if name in expect.get("zero", []) else points) for name, points in full.items()}
    )
    assert scores == wanted, (f"{student}: {entry['what']}", summary.get("messages"))
    assert summary["graded"] == expect.get("graded", True), summary["messages"]
    assert ("not-graded" in summary["flags"]) == (not summary["graded"]), summary["flags"]
    for flag in expect.get("flags", []):
        assert flag in summary["flags"], (flag, summary["flags"], summary["messages"])
    if expect.get("flags_any"):
        assert set(expect["flags_any"]) & set(summary["flags"]), (expect["flags_any"], summary["flags"])
    if "flags" not in expect:  # nothing to review in what it did
        assert not set(summary["flags"]) & REVIEW_FLAGS, summary
    for text in expect.get("messages", []):
        assert any(text in message for message in summary["messages"]), (text, summary["messages"])
    page = course.feedback_text(student, assignment)
    for text in expect.get("feedback", []):
        assert fill(text, course) in page, (text, near(page, fill(text, course)))
    for text in expect.get("feedback_absent", []):
        assert fill(text, course) not in page, text
    for relative in expect.get("host_untouched", []):
        assert not (course.root / relative).exists(), relative
    if expect.get("autograded_inert"):
        live = live_markup(course.autograded(student, assignment))
        assert not live, live
    if expect.get("autograded_max_mb"):
        path = course.root / "coursework" / "autograded" / student / assignment / f"{assignment}.ipynb"
        assert path.stat().st_size < expect["autograded_max_mb"] * 2**20, path.stat().st_size


if __name__ == "__main__":
    target = Path(sys.argv[1])
    course = Course.create(target, [ASSIGNMENT])
    submit_all(course)
    course.submit("reference", ASSIGNMENT)
    print(f"{len(load_catalogue())} hostile submissions in {target}/coursework/submitted")
