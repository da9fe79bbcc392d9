"""The class cycle of the README's JupyterHub section, on one machine, with nbgrader's own exchange.

The instructor releases notebook 00 into a temporary exchange folder; two students
fetch it into their own folders, answer (alice right, bob with a wrong ``dot_scores``)
and submit; the instructor collects, grades with ``./course grade`` (the command the
script runs), releases the feedback, and each student fetches their own page. Every
step is the real nbgrader command line, as the README writes it; each student has their own
folder and their own submission cache (on a hub, their own account and home).
"""

from __future__ import annotations

import html
import re
import textwrap
from pathlib import Path

import nbformat
import pytest
from grading_harness import Course, answer_cells, grade, nbgrader, reference_answers, sandbox_works

ASSIGNMENT = "00_start_here"
COURSE_ID = "attention-transformers"  # nbgrader_config.py's CourseDirectory.course_id
WRONG = textwrap.dedent("""
    def dot_scores(q, k):
        return torch.zeros(*q.shape[:-1], k.shape[-2])
    """)

pytestmark = pytest.mark.skipif(not sandbox_works(), reason="bubblewrap cannot start a sandbox here")


def answer(path: Path, answers: dict) -> None:
    """What a student does in JupyterLab: write their answers into the fetched notebook."""
    notebook = nbformat.read(path, as_version=4)
    for grade_id, cell in answer_cells(notebook).items():
        cell.source = answers[grade_id]
    nbformat.write(notebook, path)


@pytest.fixture(scope="module")
def cycle(tmp_path_factory):
    base = tmp_path_factory.mktemp("hub")
    exchange = base / "exchange"
    exchange.mkdir()
    on_exchange = f"--Exchange.root={exchange}"
    course = Course.create(base / "course", [ASSIGNMENT])  # runs nbgrader generate_assignment
    nbgrader("release_assignment", ASSIGNMENT, on_exchange, cwd=course.root)

    homes = {}
    for student, answers in {
        "alice": reference_answers(ASSIGNMENT),
        "bob": {**reference_answers(ASSIGNMENT), "dot_scores": WRONG},
    }.items():
        home = homes[student] = base / student
        home.mkdir()
        as_student = (
            f"--course={COURSE_ID}",
            on_exchange,
            f"--Exchange.cache={home}/.nbgrader_cache",
            f"--student={student}",
        )
        nbgrader("fetch_assignment", ASSIGNMENT, *as_student, cwd=home)
        answer(home / ASSIGNMENT / f"{ASSIGNMENT}.ipynb", answers)
        nbgrader("submit", ASSIGNMENT, *as_student, cwd=home)

    nbgrader("collect", ASSIGNMENT, on_exchange, cwd=course.root)
    graded = grade(course.root, ASSIGNMENT)
    assert graded.returncode == 0, graded.stdout[-3000:] + graded.stderr[-3000:]
    nbgrader("release_feedback", ASSIGNMENT, on_exchange, cwd=course.root)
    for student, home in homes.items():
        nbgrader(
            "fetch_feedback",
            ASSIGNMENT,
            f"--course={COURSE_ID}",
            on_exchange,
            f"--Exchange.cache={home}/.nbgrader_cache",
            f"--student={student}",
            cwd=home,
        )
    return course, exchange, homes


def fetched_feedback(home: Path) -> str:
    [page] = (home / ASSIGNMENT / "feedback").glob(f"*/{ASSIGNMENT}.html")
    return html.unescape(re.sub(r"<[^>]+>", "", page.read_text(encoding="utf-8")))


def test_collect_files_each_students_submission_in_the_course(cycle):
    course, _, _ = cycle
    for student in ("alice", "bob"):
        folder = course.root / "coursework" / "submitted" / student / ASSIGNMENT
        assert (folder / f"{ASSIGNMENT}.ipynb").is_file()
        assert (folder / "timestamp.txt").is_file()  # the exchange's submission time


def test_course_grade_grades_what_the_exchange_collected(cycle):
    course, _, _ = cycle
    full = course.max_scores(ASSIGNMENT)
    assert course.scores("alice", ASSIGNMENT) == full
    assert course.scores("bob", ASSIGNMENT) == {**full, "test_dot_scores": 0.0}


def test_each_student_fetches_their_own_feedback(cycle):
    course, _, homes = cycle
    alice, bob = fetched_feedback(homes["alice"]), fetched_feedback(homes["bob"])
    assert alice != bob
    points = course.max_scores(ASSIGNMENT)["test_dot_scores"]
    assert re.search(rf"Score:\s*{points}(\.0)?\s*/\s*{points}", alice), alice[:2000]
    assert re.search(rf"Score:\s*0(\.0)?\s*/\s*{points}", bob), bob[:2000]
    assert "BEGIN HIDDEN TESTS" not in alice + bob


def test_nbgrader_generate_feedback_after_manual_grading_rebuilds_the_pages(cycle):
    """After a look in formgrader, nbgrader's own generate_feedback remakes the pages from
    what ./course grade wrote (autograded/ and the gradebook), still without hidden tests."""
    course, exchange, _ = cycle
    page = course.root / "coursework" / "feedback" / "bob" / ASSIGNMENT / f"{ASSIGNMENT}.html"
    page.unlink()
    nbgrader("generate_feedback", ASSIGNMENT, "--force", cwd=course.root)
    text = course.feedback_text("bob", ASSIGNMENT)
    assert "BEGIN HIDDEN TESTS" not in text and "dot_scores" in text
    nbgrader("release_feedback", ASSIGNMENT, f"--Exchange.root={exchange}", cwd=course.root)
