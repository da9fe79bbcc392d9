"""From and to a learning platform: ``./course grade --from download.zip --lms canvas|moodle`` and
``./course grade export --lms canvas``, through the real command, a real gradebook and the sandbox.

The zips are built here in each platform's documented naming (its own source code: Canvas's
``lib/content_zipper.rb``, Moodle's ``mod/assign/locallib.php``; see ``autograder/engine/lms.py``),
not taken from a real export. The export is read back against the layout of Canvas's own
gradebook export (``lib/gradebook_exporter.rb``), which its import reads.
"""

from __future__ import annotations

import csv
import io
import shutil
import sqlite3
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from grading_harness import Course, grade, sandbox_works

ASSIGNMENT = "00_start_here"
WRONG = {"dot_scores": "def dot_scores(q, k):\n    return k @ q.transpose(-2, -1)\n"}

pytestmark = pytest.mark.skipif(not sandbox_works(), reason="bubblewrap cannot start a sandbox here")


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    """A course copy with 00_start_here registered, and a right and a wrong notebook (made once)."""
    course = Course.create(tmp_path_factory.mktemp("lms") / "course", [ASSIGNMENT])
    notebooks = course.root / "answers"
    notebooks.mkdir()
    shutil.move(course.submit("_right", ASSIGNMENT), notebooks / "right.ipynb")
    shutil.move(course.submit("_wrong", ASSIGNMENT, answers=WRONG), notebooks / "wrong.ipynb")
    shutil.rmtree(course.root / "coursework" / "submitted")
    return course.root


@pytest.fixture
def course(template, tmp_path) -> Course:
    shutil.copytree(template, tmp_path / "course")
    return Course(tmp_path / "course")


def answer(course: Course, which: str) -> bytes:
    return (course.root / "answers" / f"{which}.ipynb").read_bytes()


def download(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return path


def run(course: Course, *args: str):
    result = grade(course.root, "--cell-timeout", "20", *args)
    assert "Traceback" not in result.stdout + result.stderr, result.stderr[-3000:]
    return result


def students(course: Course) -> set[str]:
    db = sqlite3.connect(course.root / "coursework" / "gradebook.db")
    try:
        return {row[0] for row in db.execute("SELECT id FROM student")}
    finally:
        db.close()


def total(course: Course, student: str) -> float:
    return sum(course.scores(student, ASSIGNMENT).values())


def full(course: Course) -> float:
    return sum(course.max_scores(ASSIGNMENT).values())


def test_canvas_names_give_the_user_id_and_a_resubmission_replaces_the_grade(course, tmp_path):
    """Canvas: <sortable name>[_LATE]_<user id>_<attachment id>_<file name>; the attachment id and a
    re-upload's -1 differ between downloads, the user id does not."""
    first = download(tmp_path / "week1.zip", {
        f"smithjohn_12345_67890_{ASSIGNMENT}.ipynb": answer(course, "wrong"),
        f"doejane_LATE_23456_67891_{ASSIGNMENT}.ipynb": answer(course, "right"),
        f"anon_Xy7z2_67892_{ASSIGNMENT}.ipynb": answer(course, "right"),
    })  # fmt: skip
    result = run(course, "--from", str(first), "--lms", "canvas")
    assert result.returncode == 0, result.stdout + result.stderr
    assert students(course) == {"12345", "23456", "anon_Xy7z2"}
    assert total(course, "12345") == 0.0 and total(course, "23456") == full(course)
    second = download(
        tmp_path / "week2.zip", {f"smithjohn_LATE_12345_70001_{ASSIGNMENT}-1.ipynb": answer(course, "right")}
    )
    result = run(course, "--from", str(second), "--lms", "canvas", "--replace")
    assert result.returncode == 0, result.stdout + result.stderr
    assert students(course) == {"12345", "23456", "anon_Xy7z2"}  # no new student
    assert total(course, "12345") == full(course)


def test_without_the_platform_canvas_names_read_as_three_part_ids(course, tmp_path):
    """What the issue reported, kept as the contrast: the course's flat-name pattern reads the user
    and attachment ids into the student id."""
    first = download(tmp_path / "week1.zip", {f"smithjohn_12345_67890_{ASSIGNMENT}.ipynb": answer(course, "wrong")})
    run(course, "--from", str(first))
    assert students(course) == {"smithjohn_12345_67890"}


def test_a_roster_maps_platform_ids_to_the_classes_student_ids(course, tmp_path):
    roster = tmp_path / "roster.csv"
    roster.write_text("lms_id,student_id,name\n12345,jsmith,John Smith\n23456,jdoe,Jane Doe\n")
    zipped = download(tmp_path / "class.zip", {
        f"smithjohn_12345_67890_{ASSIGNMENT}.ipynb": answer(course, "right"),
        f"doejane_23456_67891_{ASSIGNMENT}.ipynb": answer(course, "wrong"),
        f"newstudent_34567_67892_{ASSIGNMENT}.ipynb": answer(course, "wrong"),
    })  # fmt: skip
    result = run(course, "--from", str(zipped), "--lms", "canvas", "--roster", str(roster))
    assert result.returncode == 0, result.stdout + result.stderr
    assert students(course) == {"jsmith", "jdoe", "34567"}  # one not on the roster keeps the platform's id


def test_a_broken_roster_is_refused_before_anything_is_graded(course, tmp_path):
    roster = tmp_path / "roster.csv"
    roster.write_text("id,name\n12345,John\n")
    zipped = download(tmp_path / "class.zip", {f"smithjohn_12345_67890_{ASSIGNMENT}.ipynb": answer(course, "right")})
    result = run(course, "--from", str(zipped), "--lms", "canvas", "--roster", str(roster))
    assert result.returncode == 2
    assert "has no lms_id or student_id column" in result.stderr
    assert students(course) == set()
    roster.write_text("lms_id,student_id\n12345,../etc\n")
    result = run(course, "--from", str(zipped), "--lms", "canvas", "--roster", str(roster))
    assert result.returncode == 2 and "cannot be an nbgrader student id" in result.stderr


def test_moodle_folders_and_flat_names_give_the_participant_id(course, tmp_path):
    """Moodle: <full name>_<participant id>_assignsubmission_file_/<file> (a folder each, the default),
    or the same prefix on a flat file name; blind marking names everyone "Participant"."""
    zipped = download(tmp_path / "moodle.zip", {
        f"John Smith_1234567_assignsubmission_file_/{ASSIGNMENT}.ipynb": answer(course, "right"),
        f"Participant_1234568_assignsubmission_file_/{ASSIGNMENT} (1).ipynb": answer(course, "wrong"),
        f"Jane Doe_1234569_assignsubmission_file_{ASSIGNMENT}.ipynb": answer(course, "right"),
        "Jane Doe_1234569_assignsubmission_onlinetext_/onlinetext.html": b"<p>hello</p>",
    })  # fmt: skip
    result = run(course, "--from", str(zipped), "--lms", "moodle")
    assert students(course) == {"1234567", "1234568", "1234569"}, result.stdout + result.stderr
    assert total(course, "1234567") == full(course) and total(course, "1234568") == 0.0
    assert "onlinetext.html: skipped, not a notebook" in result.stdout + result.stderr


def test_canvas_export_is_canvas_gradebook_layout_with_the_gradebooks_totals(course, tmp_path):
    roster = tmp_path / "roster.csv"
    roster.write_text(
        "lms_id,student_id,name,sis_user_id,sis_login_id,section\n"
        '12345,jsmith,"Smith, John",S001,jsmith,Section 1\n23456,jdoe,"Doe, Jane",S002,jdoe,Section 1\n'
    )
    zipped = download(tmp_path / "class.zip", {
        f"smithjohn_12345_67890_{ASSIGNMENT}.ipynb": answer(course, "right"),
        f"doejane_23456_67891_{ASSIGNMENT}.ipynb": answer(course, "wrong"),
    })  # fmt: skip
    run(course, "--from", str(zipped), "--lms", "canvas", "--roster", str(roster))
    command = [sys.executable, "-m", "autograder.grade", "export", "--lms", "canvas", "--roster", str(roster)]
    result = subprocess.run(command, cwd=course.root, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    path = course.root / "coursework" / "reports" / "canvas-grades.csv"
    assert str(path) in result.stdout
    rows = list(csv.reader(io.StringIO(path.read_text())))
    assert rows[0] == ["Student", "ID", "SIS User ID", "SIS Login ID", "Section", ASSIGNMENT]
    assert rows[1][0].strip() == "Points Possible" and float(rows[1][5]) == full(course)
    body = {row[1]: row for row in rows[2:]}
    assert body["12345"] == ["Smith, John", "12345", "S001", "jsmith", "Section 1", f"{full(course):g}"]
    assert body["23456"][5] == "0"


def test_nbgraders_own_zip_collect_takes_the_canvas_collector(course, tmp_path):
    """The collectors are nbgrader collector plugins: ``nbgrader zip_collect`` files a Canvas download
    by the user id when nbgrader_config.py names the plugin."""
    from grading_harness import nbgrader

    downloaded = course.root / "coursework" / "downloaded" / ASSIGNMENT / "archive"
    downloaded.mkdir(parents=True)
    (downloaded / f"smithjohn_LATE_12345_67890_{ASSIGNMENT}-2.ipynb").write_bytes(answer(course, "right"))
    config = course.root / "nbgrader_config.py"
    config.write_text(
        config.read_text() + '\nc.ZipCollectApp.collector_plugin = "autograder.engine.lms.CanvasCollector"\n'
    )
    nbgrader("zip_collect", ASSIGNMENT, cwd=course.root)
    filed = course.root / "coursework" / "submitted" / "12345" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"
    assert filed.read_bytes() == answer(course, "right")
