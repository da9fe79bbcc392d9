"""The site's "Teaching a graded class" page (docs/teaching.md), run as written.

- ``./course export-class DIR 00_start_here 01_attention`` writes the students' copy: a git
  repository with those released notebooks and the students' package, no ``solutions/`` and no
  grader, and no line of a reference answer in its files or in any object of its history;
- adding 02 while 01 is not yet due warns that 02's set-up cells carry 01's answers (the copy is
  still written); once 01's due date has passed in the gradebook, adding 03 says nothing;
- ``nbgrader release_assignment 02_causal_masking`` (the course's nbgrader_config.py) warns the
  same way before it releases into the exchange, and not once 01 is due;
- a notebook submitted a day after its due date, graded by ``./course grade`` with nbgrader's
  ``zero`` late policy, gets its penalty in the gradebook and on its feedback page; one on time
  does not.
"""

from __future__ import annotations

import csv
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from grading_harness import Course, grade, nbgrader, sandbox_works

from autograder.answers import notebook_text, scan
from autograder.classcopy import MARKER, PACKAGE, course_answers, git_objects_text
from autograder.engine.course import CourseFolder
from autograder.engine.lms import assignment_totals

REPOSITORY = Path(__file__).resolve().parent.parent
PAST, FUTURE = "2026-01-01 00:00:00 UTC", "2099-01-01 00:00:00 UTC"


@pytest.fixture
def course(tmp_path) -> Path:
    """A course folder as an instructor's clone holds it (the released notebooks as committed)."""
    root = tmp_path / "course"
    root.mkdir()
    shutil.copy2(REPOSITORY / "nbgrader_config.py", root)
    for name in ("solutions", "notebooks", *PACKAGE):
        source = REPOSITORY / name
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, root / name, ignore=shutil.ignore_patterns("__pycache__", ".ipynb_checkpoints"))
        else:
            shutil.copy2(source, root / name)
    return root


def export_class(course: Path, *args: str) -> subprocess.CompletedProcess:
    """``./course export-class ...`` (the command runs exactly this, from the course folder)."""
    return subprocess.run(
        [sys.executable, "-m", "autograder.classcopy", *args], cwd=course, capture_output=True, text=True, timeout=300
    )


def set_due_date(course: Path, assignment: str, when: str) -> None:
    nbgrader("db", "assignment", "add", assignment, f"--duedate={when}", cwd=course)


def files_text(folder: Path) -> list[tuple[str, str]]:
    return [
        (str(path), notebook_text(path.read_text(encoding="utf-8", errors="replace")))
        for path in sorted(folder.rglob("*"))
        if path.is_file() and ".git" not in path.relative_to(folder).parts
    ]


def test_the_students_copy_holds_no_answer_in_its_files_or_its_history(course, tmp_path):
    copy = tmp_path / "class-copy"
    result = export_class(course, str(copy), "00_start_here", "01_attention")
    assert result.returncode == 0, result.stderr
    assert "warning" not in result.stderr
    assert sorted(p.name for p in (copy / "notebooks").iterdir()) == ["00_start_here", "01_attention"]
    for absent in ("solutions", "autograder", "tests", "nbgrader_config.py", "coursework"):
        assert not (copy / absent).exists(), absent
    assert (copy / "course_checks" / "checks.py").is_file() and (copy / "README.md").is_file()
    answers = course_answers(course)
    assert sum(map(len, answers.values())) > 100
    assert scan(files_text(copy), answers) == []
    history = git_objects_text(copy)
    files = [p for p in copy.rglob("*") if p.is_file() and ".git" not in p.relative_to(copy).parts]
    assert len(history) == len({p.read_bytes() for p in files})  # one commit: a blob per distinct file
    assert scan(history, answers) == []
    # the scan can fail: the instructor's own course folder holds every answer
    assert scan(files_text(course / "solutions"), answers)
    # the copy's package builds without the grader (what a student or Binder installs)
    build = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path / "w")]
    wheel = subprocess.run([*build, "."], cwd=copy, capture_output=True, text=True, timeout=300)
    assert wheel.returncode == 0, wheel.stderr[-2000:]


def test_a_release_whose_setup_cells_carry_answers_not_yet_due_warns(course, tmp_path):
    copy = tmp_path / "class-copy"
    assert export_class(course, str(copy), "00_start_here", "01_attention").returncode == 0
    set_due_date(course, "01_attention", FUTURE)
    result = export_class(course, str(copy), "02_causal_masking")
    assert result.returncode == 0, result.stderr
    assert "warning: 02_causal_masking's read-only set-up cells hold the reference answers" in result.stderr
    assert "01_attention is due 2099-01-01 00:00 UTC" in result.stderr
    assert "holds 00_start_here, 01_attention, 02_causal_masking (committed)" in result.stdout
    found = {assignment for _, assignment, _ in scan(files_text(copy), course_answers(course))}
    assert found == {"01_attention"}  # only what 02's set-up cells carry

    set_due_date(course, "01_attention", PAST)
    result = export_class(course, str(copy), "03_multi_head_attention")
    assert result.returncode == 0, result.stderr
    assert "warning" not in result.stderr  # 03 carries 01's answers only, and 01 is past due
    log = subprocess.run(["git", "-C", str(copy), "log", "--format=%s"], capture_output=True, text=True).stdout
    assert len(log.splitlines()) == 3
    assert '"03_multi_head_attention"' in (copy / MARKER).read_text()


def test_a_folder_that_is_not_a_students_copy_is_refused(course, tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    result = export_class(course, str(tmp_path / "mine"), "00_start_here")
    assert result.returncode == 2
    assert "is not a students' copy made by this command" in result.stderr
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep"
    result = export_class(course, str(tmp_path / "new"), "99_nothing")
    assert result.returncode == 2 and "no released notebook for 99_nothing" in result.stderr


def test_nbgrader_release_assignment_warns_the_same_way(course, tmp_path):
    config = tmp_path / "jupyter"
    config.mkdir()
    (config / "nbgrader_config.py").write_text(f"c = get_config()\nc.Exchange.root = {str(tmp_path / 'exchange')!r}\n")
    environment = {**os.environ, "JUPYTER_CONFIG_DIR": str(config)}

    def release(assignment: str) -> subprocess.CompletedProcess:
        command = [str(Path(sys.executable).parent / "nbgrader"), "release_assignment", assignment, "--force"]
        return subprocess.run(command, cwd=course, env=environment, capture_output=True, text=True, timeout=300)

    set_due_date(course, "01_attention", FUTURE)
    result = release("02_causal_masking")
    assert result.returncode == 0, result.stderr
    assert "02_causal_masking's read-only set-up cells hold the reference answers" in result.stderr
    assert "01_attention is due 2099-01-01 00:00 UTC" in result.stderr
    assert (tmp_path / "exchange" / "attention-transformers" / "outbound" / "02_causal_masking").is_dir()
    set_due_date(course, "01_attention", PAST)
    result = release("02_causal_masking")
    assert result.returncode == 0 and "set-up cells hold" not in result.stderr
    result = release("01_attention")  # carries no earlier answers
    assert result.returncode == 0 and "set-up cells hold" not in result.stderr


@pytest.mark.skipif(not sandbox_works(), reason="bubblewrap cannot start a sandbox here")
def test_a_late_submission_gets_its_penalty_in_the_gradebook_and_on_its_page(tmp_path):
    from nbgrader.api import Gradebook

    course = Course.create(tmp_path / "course", ["00_start_here"])
    with open(course.root / "nbgrader_config.py", "a") as config:
        config.write('\nc.LateSubmissionPlugin.penalty_method = "zero"\n')
    set_due_date(course.root, "00_start_here", "2026-03-01 12:00:00 UTC")
    for student, submitted in (("late", "2026-03-02 12:00:00 UTC"), ("ontime", "2026-03-01 11:00:00 UTC")):
        course.submit(student, "00_start_here")
        (course.submission_path(student, "00_start_here").parent / "timestamp.txt").write_text(submitted)
    result = grade(course.root, "--cell-timeout", "60")
    assert result.returncode == 0, result.stdout + result.stderr
    full = sum(course.max_scores("00_start_here").values())
    with Gradebook(course.db_url) as gradebook:
        late = gradebook.find_submission_notebook("00_start_here", "00_start_here", "late")
        ontime = gradebook.find_submission_notebook("00_start_here", "00_start_here", "ontime")
        assert late.late_submission_penalty == full > 0
        assert ontime.late_submission_penalty is None
        assert ontime.score == full
    assert f"Late submission penalty (Score: -{full:.1f})" in course.feedback_text("late", "00_start_here")
    assert "Late submission penalty" not in course.feedback_text("ontime", "00_start_here")
    # the grades CSV (its points add up to the score after the penalty), the class report, and what
    # goes back to a learning platform agree with nbgrader's own export
    with open(course.root / "coursework" / "reports" / "grades.csv", newline="") as stream:
        rows = list(csv.DictReader(stream))
    points = {
        student: sum(float(row["points"]) for row in rows if row["student"] == student)
        for student in ("late", "ontime")
    }
    assert points == {"late": 0.0, "ontime": full}
    assert [(row["exercise"], float(row["points"])) for row in rows if row["exercise"] == "late penalty"] == [
        ("late penalty", -full)
    ]
    report = (course.root / "coursework" / "reports" / "class-report.html").read_text(encoding="utf-8")
    assert f"2 submissions; mean {full / 2:.2f} / {full:g}" in report
    assert ">late penalty<" not in report  # not an exercise: no pass rate of its own
    totals, _ = assignment_totals(CourseFolder(course.root))
    assert totals == {("late", "00_start_here"): 0.0, ("ontime", "00_start_here"): full}
    nbgrader("export", "--to", str(tmp_path / "nbgrader.csv"), cwd=course.root)
    with open(tmp_path / "nbgrader.csv", newline="") as stream:
        theirs = {row["student_id"]: float(row["score"]) for row in csv.DictReader(stream)}
    assert theirs == {"late": 0.0, "ontime": full}
