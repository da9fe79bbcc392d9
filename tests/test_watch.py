"""``course-grade --watch`` (docs/feedback-on-submit.md) on one machine, with nbgrader's real exchange.

One Unix user plays every part here (nbgrader's ``--student`` option, a home folder per student);
``tests/test_jupyterhub_cycle.py`` runs the watcher as the instructor's own Unix user against
students who are users of their own, and under a real JupyterHub. Each test runs real passes
(``--watch --once``: one pass, as the documented timer runs it, or the loop itself): nbgrader's
collect, the sandboxed grader, nbgrader's release_feedback, ``nbgrader fetch_feedback`` as the student.
"""

from __future__ import annotations

import html
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
from grading_harness import REPOSITORY, Course, sandbox_works
from nbgrader.utils import parse_utc

ASSIGNMENT = "00_start_here"
COURSE_ID = "attention-transformers"
WRONG = {"dot_scores": "def dot_scores(q, k):\n    return k @ q.transpose(-2, -1)\n"}
DIAGNOSIS = "CheckFailed: `dot_scores`: the table is transposed: keys against queries."

pytestmark = pytest.mark.skipif(not sandbox_works(), reason="bubblewrap cannot start a sandbox here")


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    """A course copy with 00_start_here registered (made once)."""
    return Course.create(tmp_path_factory.mktemp("watch") / "course", [ASSIGNMENT]).root


class Class:
    """A course copy, an exchange and a Jupyter configuration naming it (as a hub's /etc/jupyter does)."""

    def __init__(self, template: Path, base: Path):
        self.base = base
        self.course = Course(base / "course")
        shutil.copytree(template, self.course.root)
        self.exchange = base / "exchange"
        self.exchange.mkdir()
        self.config = base / "jupyter"
        self.config.mkdir()
        (self.config / "nbgrader_config.py").write_text(
            f"c = get_config()\nc.Exchange.root = {str(self.exchange)!r}\nc.CourseDirectory.course_id = {COURSE_ID!r}\n"
        )
        self.env = {**os.environ, "JUPYTER_CONFIG_DIR": str(self.config)}
        self.nbgrader("release_assignment", ASSIGNMENT)

    def nbgrader(self, *args: str, home: Path | None = None, check: bool = True) -> subprocess.CompletedProcess:
        env = self.env | ({"HOME": str(home)} if home else {})
        command = [str(Path(sys.executable).parent / "nbgrader"), *args]
        result = subprocess.run(command, cwd=home or self.course.root, env=env, capture_output=True, text=True)
        assert not check or result.returncode == 0, result.stdout + result.stderr
        return result

    def watch(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "autograder.grade", "--watch", "--once", "--cell-timeout", "20", *args]
        result = subprocess.run(
            command, cwd=self.course.root, env=self.env, capture_output=True, text=True, timeout=900
        )
        assert "Traceback" not in result.stdout + result.stderr, result.stderr[-3000:]
        assert not check or result.returncode == 0, result.stdout + result.stderr
        return result

    def student(self, name: str) -> Student:
        return Student(self, name)

    def due(self, when: str) -> None:
        self.nbgrader("db", "assignment", "add", ASSIGNMENT, f"--duedate={when}")


class Student:
    def __init__(self, klass: Class, name: str):
        self.klass, self.name = klass, name
        self.home = klass.base / name
        self.home.mkdir()
        klass.nbgrader("fetch_assignment", ASSIGNMENT, "--student", name, home=self.home)

    def submit(self, answers: dict | None = None) -> None:
        notebook = self.klass.course.submit("_work", ASSIGNMENT, answers=answers)
        shutil.move(notebook, self.home / ASSIGNMENT / f"{ASSIGNMENT}.ipynb")
        self.klass.nbgrader("submit", ASSIGNMENT, "--student", self.name, home=self.home)

    def feedback(self) -> dict:
        """nbgrader fetch_feedback as the student: {submission time: page text}."""
        self.klass.nbgrader("fetch_feedback", ASSIGNMENT, "--student", self.name, home=self.home, check=False)
        pages = (self.home / ASSIGNMENT / "feedback").glob(f"*/{ASSIGNMENT}.html")
        return {p.parent.name: html.unescape(re.sub(r"<[^>]+>", "", p.read_text(encoding="utf-8"))) for p in pages}


@pytest.fixture
def klass(template, tmp_path) -> Class:
    return Class(template, tmp_path)


def graded_lines(result: subprocess.CompletedProcess, student: str) -> list[str]:
    return [line for line in result.stdout.splitlines() if f" {student} " in line and "graded" in line]


def test_the_default_hands_back_the_diagnosis_then_the_full_page_at_the_due_date(klass):
    klass.due("2099-01-01 00:00:00 UTC")
    alice = klass.student("alice")
    alice.submit(WRONG)
    result = klass.watch()
    assert "diagnosis released (no points yet)" in result.stdout
    [page] = alice.feedback().values()
    assert DIAGNOSIS in page and "Score:" not in page
    assert "points after the due date, 2099-01-01 00:00 UTC" in page
    klass.due("2000-01-01 00:00:00 UTC")
    result = klass.watch()
    assert "full page released" in result.stdout and not graded_lines(result, "alice")  # released, not regraded
    [page] = alice.feedback().values()
    assert DIAGNOSIS in page and re.search(r"Score:\s*0(\.0)?\s*/\s*2", page)


def test_full_hands_back_points_at_once_and_after_due_nothing_before_the_date(klass):
    klass.due("2099-01-01 00:00:00 UTC")
    alice = klass.student("alice")
    alice.submit(WRONG)
    klass.watch("--feedback", "after-due")
    assert alice.feedback() == {}  # graded, held until the due date
    assert (klass.course.root / "coursework" / "feedback" / "alice" / ASSIGNMENT / f"{ASSIGNMENT}.html").is_file()
    result = klass.watch("--feedback", "full")
    assert "full page released" in result.stdout
    [page] = alice.feedback().values()
    assert re.search(r"Score:\s*0(\.0)?\s*/\s*2", page)


def test_fifty_submissions_between_two_passes_are_graded_once_for_the_latest(klass):
    """Fifty submissions of one student in the exchange since the last pass: nbgrader's own two (the
    first and the last), and 48 copies of the first's folder at times between them (what 48 more
    ``nbgrader submit`` would have left)."""
    bob = klass.student("bob")
    bob.submit(WRONG)
    inbound = klass.exchange / COURSE_ID / "inbound"
    [first] = inbound.iterdir()
    student, assignment, stamp, _ = first.name.split("+")
    for number in range(48):
        later = (parse_utc(stamp) + timedelta(milliseconds=number + 1)).strftime("%Y-%m-%d %H:%M:%S.%f UTC")
        copy = inbound / f"{student}+{assignment}+{later}+copy{number}"
        shutil.copytree(first, copy)
        (copy / "timestamp.txt").write_text(later)
    time.sleep(1.1)
    bob.submit()  # the 50th, the right answer
    assert len(list(inbound.iterdir())) == 50
    result = klass.watch("--feedback", "full")
    assert len(graded_lines(result, "bob")) == 1, result.stdout
    assert sum(klass.course.scores("bob", ASSIGNMENT).values()) == 2.0
    pages = bob.feedback()
    assert len(pages) == 1 and re.search(r"Score:\s*2(\.0)?\s*/\s*2", next(iter(pages.values())))


def test_a_second_watcher_refuses_naming_the_first(klass):
    first = subprocess.Popen(
        [sys.executable, "-m", "autograder.grade", "--watch", "--interval", "600"],
        cwd=klass.course.root, env=klass.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        lock = klass.course.root / "coursework" / ".work" / "watch.lock"
        deadline = time.monotonic() + 120
        while not (lock.is_file() and str(first.pid) in lock.read_text()) and time.monotonic() < deadline:
            time.sleep(0.2)
        second = klass.watch(check=False)
        assert second.returncode == 2
        assert f"another watcher is working on this course (process {first.pid} on" in second.stderr
    finally:
        first.send_signal(signal.SIGTERM)  # as a hub or systemd stops it
        out, _ = first.communicate(timeout=120)
    assert first.returncode == 0
    assert "course-grade --watch: attention-transformers" in out  # its one line per event, off a terminal


def test_the_log_rotates_at_a_megabyte(klass):
    log = klass.course.root / "coursework" / ".work" / "watch.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("x" * 999_990 + "\n")
    klass.student("carol").submit()
    klass.watch()
    assert (log.parent / "watch.log.1").stat().st_size >= 999_990
    assert log.stat().st_size < 100_000 and "carol/00_start_here" in log.read_text()


def test_a_broken_notebook_gets_its_page_and_costs_nobody_else(klass):
    alice, bob = klass.student("alice"), klass.student("bob")
    alice.submit()
    (bob.home / ASSIGNMENT / f"{ASSIGNMENT}.ipynb").write_text('{"cells": [ not JSON')
    klass.nbgrader("submit", ASSIGNMENT, "--student", "bob", home=bob.home)
    klass.watch("--feedback", "full")
    [page] = bob.feedback().values()
    assert "This submission could not be graded" in page
    [page] = alice.feedback().values()
    assert re.search(r"Score:\s*2(\.0)?\s*/\s*2", page)


def page_blocks(language: str) -> list[str]:
    page = (REPOSITORY / "docs" / "feedback-on-submit.md").read_text()
    return re.findall(rf"```{language}\n(.*?)```", page, flags=re.DOTALL)


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="no systemd-analyze here")
def test_the_timer_units_of_the_guide_are_valid_systemd_units(tmp_path):
    """The guide's two user units, verified by systemd's own checker (in its system mode: no user
    manager runs here), with the grading environment's course-grade as the command."""
    units = {}
    for block in page_blocks("ini"):
        name = block.splitlines()[0].lstrip("# ").strip()
        units[name] = block.replace("/opt/grading/bin/course-grade", str(Path(sys.executable).parent / "course-grade"))
    assert set(units) == {"course-grade-watch.service", "course-grade-watch.timer"}
    for name, text in units.items():
        (tmp_path / name).write_text(text)
    assert "--watch --once" in units["course-grade-watch.service"]
    result = subprocess.run(
        ["systemd-analyze", "verify", *(str(tmp_path / n) for n in units)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr


def test_on_a_terminal_it_draws_one_screen(klass):
    """Its output on a terminal (a pseudo-terminal here): the screen cleared, the setting, the pass."""
    import pty

    primary, secondary = pty.openpty()
    command = [sys.executable, "-m", "autograder.grade", "--watch", "--once"]
    process = subprocess.Popen(command, cwd=klass.course.root, env=klass.env, stdout=secondary, stderr=subprocess.PIPE)
    os.close(secondary)
    shown = b""
    while True:
        try:
            chunk = os.read(primary, 65536)
        except OSError:  # the other end is closed: the command ended
            break
        if not chunk:
            break
        shown += chunk
    assert process.wait(timeout=300) == 0, process.stderr.read()
    os.close(primary)
    text = shown.decode(errors="replace")
    assert text.startswith("\x1b[H\x1b[2J"), text[:200]
    assert "course-grade --watch: attention-transformers" in text and "last pass" in text
    assert "0 collected, 0 graded, 0 released" in text
