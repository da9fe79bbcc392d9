"""Build the hostile and broken submissions of ``tests/hostile/catalogue.yml`` into a course.

Each entry starts from notebook 01 with the reference answers (``Course.submit``)
and applies its changes; the student id is the entry's id. Used by
``test_grade_command.py``, and handy by hand:

    python tests/hostile_submissions.py /tmp/course     # a course copy with every fixture submitted
"""
from __future__ import annotations

import copy
import sys
import textwrap
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


def submit(course: Course, entry: dict) -> Path:
    """Write the submission ``entry`` describes for student ``entry['id']``."""
    student = entry["id"]
    folder = course.submission_path(student, ASSIGNMENT).parent
    if entry.get("no_notebook"):
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "notes.txt").write_text("I could not finish.\n")
        return folder
    if "raw" in entry:
        path = course.submission_path(student, ASSIGNMENT)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(entry["raw"], encoding="utf-8")
        return path

    def edit(notebook):
        if "code" in entry:
            notebook.cells.insert(_index(notebook, entry["insert_after"]) + 1,
                                  nbformat.v4.new_code_cell(fill(entry["code"], course)))
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
    path = course.submit(student, ASSIGNMENT, answers, edit=edit, filename=entry.get("filename"))
    if entry.get("nbformat") == 3:
        notebook = nbformat.read(path, as_version=4)
        path.write_text(nbformat.writes(nbformat.convert(notebook, 3), version=3), encoding="utf-8")
    return path


def submit_all(course: Course) -> list[dict]:
    entries = load_catalogue()
    for entry in entries:
        submit(course, entry)
    return entries


if __name__ == "__main__":
    target = Path(sys.argv[1])
    course = Course.create(target, [ASSIGNMENT])
    submit_all(course)
    course.submit("reference", ASSIGNMENT)
    print(f"{len(load_catalogue())} hostile submissions in {target}/coursework/submitted")
