"""``./course grade`` end to end: the real command, the real bwrap sandbox, a real SQLite gradebook.

One class-scoped run grades the whole hostile catalogue (``tests/hostile/catalogue.yml``)
together with ordinary students; each test then reads the gradebook, the CSV,
the ledger, the feedback and the report. The expectations sit in the catalogue.
"""

from __future__ import annotations

import csv
import html
import json
import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from browser_harness import CHROMIUM
from grading_harness import UNTOUCHED, Course, grade, grade_cells, sandbox_works
from hostile_submissions import ASSIGNMENT, assignment_of, load_catalogue, submit_all, verify

from autograder.flags import REVIEW_FLAGS

REPOSITORY = Path(__file__).resolve().parent.parent
EVERY_ENTRY = load_catalogue()
CATALOGUE = [entry for entry in EVERY_ENTRY if not entry.get("separate_run")]
SEPARATE = [entry for entry in EVERY_ENTRY if entry.get("separate_run")]
LIMITS = ("--cell-timeout", "5", "--notebook-timeout", "120")  # short, so hanging fixtures cost seconds
NO_MAX_SOFTMAX = "def softmax(x, dim=-1):\n    e = torch.exp(x)\n    return e / e.sum(dim=dim, keepdim=True)\n"


def coursework(course: Course) -> Path:
    return course.root / "coursework"


def ledger(course: Course) -> dict:
    db = sqlite3.connect(coursework(course) / ".work" / "grading.sqlite")
    try:
        return {(s, a): json.loads(x) for s, a, x in db.execute("SELECT student, assignment, summary FROM graded")}
    finally:
        db.close()


def feedback_text(course: Course, student: str, assignment: str = ASSIGNMENT) -> str:
    return course.feedback_text(student, assignment)


pytestmark = pytest.mark.skipif(not sandbox_works(), reason="bubblewrap cannot start a sandbox here")


@pytest.fixture(scope="module")
def course_template(tmp_path_factory) -> Path:
    """A course copy with every notebook released and registered, no submissions (made once)."""
    return Course.create(tmp_path_factory.mktemp("template") / "course").root


def copy_course(template: Path, target: Path) -> Course:
    import shutil

    shutil.copytree(template, target)
    return Course(target)


def assert_no_hidden_code(course: Course, pages: list[Path]) -> None:
    """No feedback page shows a line of any hidden test, or the grading helpers' code."""
    hidden_lines = set()
    for notebook_path in (course.root / "solutions").glob("*/*.ipynb"):
        for cell in json.loads(notebook_path.read_text(encoding="utf-8"))["cells"]:
            source = "".join(cell["source"])
            for region in re.findall(r"### BEGIN HIDDEN TESTS\n(.*?)### END HIDDEN TESTS", source, re.S):
                hidden_lines |= {line.strip() for line in region.splitlines() if line.strip()}
    assert hidden_lines and pages
    for page in pages:
        text = html.unescape(re.sub(r"<[^>]+>", "", page.read_text(encoding="utf-8")))
        for secret in ("BEGIN HIDDEN TESTS", "END HIDDEN TESTS", "_check_outside", "def check(", *hidden_lines):
            assert secret not in text, f"{page.relative_to(course.root)} shows {secret!r}"


# ---------------------------------------------------------------- the hostile class


class TestHostileClass:
    @pytest.fixture(scope="class")
    @classmethod
    def run(cls, tmp_path_factory, course_template):
        course = copy_course(course_template, tmp_path_factory.mktemp("hostile") / "course")
        submit_all(course, only=lambda entry: not entry.get("separate_run"))
        course.submit("reference", ASSIGNMENT)
        course.submit("reference", "00_start_here")
        course.submit("one-mistake", ASSIGNMENT, {"softmax": NO_MAX_SOFTMAX})
        course.submit("untouched", ASSIGNMENT, UNTOUCHED)
        submitted = {
            path: path.read_bytes() for path in (coursework(course) / "submitted").rglob("*") if path.is_file()
        }
        result = grade(course.root, *LIMITS)
        return course, result, submitted

    def scores(self, course: Course, student: str, assignment: str = ASSIGNMENT) -> dict:
        return {cell[len("test_") :]: score for cell, score in course.scores(student, assignment).items()}

    def full(self, course: Course, assignment: str = ASSIGNMENT) -> dict:
        return {cell[len("test_") :]: points for cell, points in course.max_scores(assignment).items()}

    def test_the_run_completes(self, run):
        _, result, _ = run
        assert result.returncode == 0, result.stderr[-3000:] + result.stdout[-3000:]
        assert "Graded " in result.stdout and "Report:" in result.stdout

    @pytest.mark.parametrize("entry", CATALOGUE, ids=[e["id"] for e in CATALOGUE])
    def test_hostile_submission(self, run, entry):
        course, _, _ = run
        verify(course, entry, ledger(course)[(entry["id"], ASSIGNMENT)])

    def test_other_students_are_unaffected(self, run):
        course, _, _ = run
        assert self.scores(course, "reference") == self.full(course)
        assert course.scores("reference", "00_start_here") == course.max_scores("00_start_here")
        assert self.scores(course, "one-mistake") == {**self.full(course), "softmax": 0.0}
        assert set(self.scores(course, "untouched").values()) == {0.0}
        assert not ledger(course)[("reference", ASSIGNMENT)]["flags"]

    def test_submitted_files_are_never_modified(self, run):
        course, _, submitted = run
        now = {path: path.read_bytes() for path in (coursework(course) / "submitted").rglob("*") if path.is_file()}
        assert now == submitted

    def test_feedback_shows_outcome_points_and_message(self, run):
        course, _, _ = run
        page = feedback_text(course, "one-mistake")
        assert "[mistake:softmax-no-max-subtraction]" in page
        assert "no max subtraction" in page
        assert "Score: 0.0 / 3.0" in page, "the failed check's points"
        assert "Score: 4.0 / 4.0" in page, "a passed check's points"

    def test_no_feedback_shows_hidden_test_code(self, run):
        course, _, _ = run
        pages = list((coursework(course) / "feedback").rglob("*.html"))
        assert len(pages) == len(CATALOGUE) + 4
        assert_no_hidden_code(course, pages)

    def test_csv_agrees_with_gradebook(self, run):
        course, _, _ = run
        path = coursework(course) / "reports" / "grades.csv"
        rows = list(csv.DictReader(path.open(encoding="utf-8")))
        assert rows and set(rows[0]) >= {"student", "assignment", "exercise", "points", "max_points", "flags"}
        seen = set()
        for row in rows:
            cell = f"test_{row['exercise']}"
            assert float(row["points"]) == course.scores(row["student"], row["assignment"])[cell], row
            assert float(row["max_points"]) == course.max_scores(row["assignment"])[cell], row
            seen.add((row["student"], row["assignment"], cell))
        expected = {(s, a, c) for s, a in ledger(course) for c in grade_cells(course.released(a))}
        assert seen == expected
        flagged = {row["student"] for row in rows if "patched-functions" in row["flags"]}
        assert {"patches-allclose", "patches-numpy-testing"} <= flagged
        rejected = {row["student"] for row in rows if "not-graded" in row["flags"].split(";")}
        assert rejected == {e["id"] for e in CATALOGUE if e.get("expect", {}).get("graded") is False}

    def test_report_shows_distribution_misconceptions_and_flags(self, run):
        course, _, _ = run
        report = (coursework(course) / "reports" / "class-report.html").read_text(encoding="utf-8")
        assert report.count("data:image/png;base64,") >= 3
        for text in (
            "Score distribution",
            "pass rate per exercise",
            "Most common misconceptions",
            "softmax-no-max-subtraction",
            "Flagged for review",
            "redefines-check",
            "graded-cell-deleted",
            "Could not be graded",
            "invalid-json",
        ):
            assert text in report, text
        misconceptions = report.split("Most common misconceptions", 1)[1].split("Flagged for review", 1)[0]
        assert "tampering" not in misconceptions, "tampering is a flag, not a misconception"
        assert "Most common misconceptions:" in run[1].stdout
        assert "tampering" not in run[1].stdout.split("Most common misconceptions:", 1)[1].splitlines()[0]

    @pytest.mark.browser
    @pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed")
    def test_feedback_pages_run_nothing_from_the_submission(self, run, browser):
        """The hostile markup of ``scripts-in-feedback`` (a markdown script, an img onerror, javascript: links,
        a raw HTML cell, HTML, JavaScript, SVG and markdown outputs) opened in chromium: the page shows the
        learner's text and outputs, and nothing of the submission ran, even when its links are clicked."""
        course, _, _ = run
        page = browser.new_page()
        try:
            page.set_content("<script>window.pwned = 'probe'</script>")  # the probe sees a script that runs
            assert page.evaluate("window.pwned") == "probe"
            feedback = coursework(course) / "feedback" / "scripts-in-feedback" / ASSIGNMENT / f"{ASSIGNMENT}.html"
            page.goto(feedback.as_uri())
            page.wait_for_load_state("load")
            for text in ("read more", "this", "a link"):
                for link in page.get_by_text(text, exact=True).all():
                    link.click(timeout=2000)
            page.wait_for_timeout(500)  # an onerror of a missing image would have fired by now
            assert page.evaluate("window.pwned") is None
            assert page.title() == ASSIGNMENT
            assert page.url == feedback.as_uri(), "a link navigated away"
            policy = page.locator('meta[http-equiv="Content-Security-Policy"]').get_attribute("content")
            assert "script-src 'none'" in policy, policy
            shown = page.inner_text("body")
            for text in ("My notes", "raw notes", "bold output", "outputs shown"):
                assert text in shown, text
        finally:
            page.close()

    def test_nbgrader_generate_feedback_makes_the_same_inert_page(self, run):
        """nbgrader's own ``generate_feedback`` (after grading by hand) uses the same inert template
        (``nbgrader_config.py``): the policy, no script, the learner's text still there."""
        from grading_harness import nbgrader

        course, _, _ = run
        student = "scripts-in-feedback"
        nbgrader("generate_feedback", ASSIGNMENT, "--force", "--student", student, cwd=course.root)
        page = (coursework(course) / "feedback" / student / ASSIGNMENT / f"{ASSIGNMENT}.html").read_text()
        assert "script-src 'none'" in page and "<script" not in page.lower()
        assert "My notes" in page and "bold output" in page

    def test_rerun_grades_only_new_or_changed_submissions(self, run):
        """Last in the class: it changes the class."""
        course, _, _ = run
        again = grade(course.root, *LIMITS)
        assert again.returncode == 0, again.stderr[-2000:]
        assert "Graded 0 notebook(s)" in again.stdout, again.stdout
        assert f"{len(CATALOGUE) + 4} unchanged" in again.stdout
        course.submit("one-mistake", ASSIGNMENT)  # fixed: now the reference answers
        course.submit("late-joiner", "00_start_here")
        third = grade(course.root, *LIMITS)
        assert third.returncode == 0, third.stderr[-2000:]
        assert "Graded 2 notebook(s)" in third.stdout, third.stdout
        assert self.scores(course, "one-mistake") == self.full(course)
        assert course.scores("late-joiner", "00_start_here") == course.max_scores("00_start_here")


# ---------------------------------------------------------------- entries graded in a run of their own

CONTROL_CHARACTERS = ("\x1b", "\x07", "\u202e", "\u2066", "\u2069")


class TestSeparateRun:
    """The catalogue's ``separate_run`` entries, graded through the real command among a correct class with
    the default limits (a call of about 60 MB each way takes seconds on a busy machine: more than the
    hostile class's 5 s cells) and a submission folder whose extra notebooks' names carry terminal control
    sequences (the run then ends with 1, for the files it skipped)."""

    @pytest.fixture(scope="class")
    @classmethod
    def run(cls, tmp_path_factory, course_template):
        course = copy_course(course_template, tmp_path_factory.mktemp("separate") / "course")
        submit_all(course, only=lambda entry: entry.get("separate_run"))
        course.submit("reference", ASSIGNMENT)
        course.submit("one-mistake", ASSIGNMENT, {"softmax": NO_MAX_SOFTMAX})
        return course, grade(course.root)

    @pytest.mark.parametrize("entry", SEPARATE, ids=[e["id"] for e in SEPARATE])
    def test_separate_entry(self, run, entry):
        course, _ = run
        verify(course, entry, ledger(course)[(entry["id"], assignment_of(entry))])

    def test_the_others_are_unaffected(self, run):
        course, _ = run
        full = course.max_scores(ASSIGNMENT)
        assert course.scores("reference", ASSIGNMENT) == full
        assert course.scores("one-mistake", ASSIGNMENT) == {**full, "test_softmax": 0.0}

    def test_no_control_character_of_a_submitted_name_reaches_the_terminal(self, run):
        """What the command printed names each skipped notebook, its control characters escaped."""
        _, result = run
        assert result.returncode == 1, result.stderr[-3000:] + result.stdout[-3000:]
        printed = result.stdout + result.stderr
        for character in CONTROL_CHARACTERS:
            assert character not in printed, repr(character)
        for shown in (r"notes\x1b]0;all grades are final\x07\x1b[2K.ipynb", r"report\u202egnp.ipynb", r"\u2066"):
            assert shown in printed, (shown, printed[-3000:])


# ---------------------------------------------------------------- a student after a hostile one


WORKER_CHANGING = [entry for entry in CATALOGUE if entry.get("worker_changing")]
FINDS_IPC = next(entry for entry in CATALOGUE if entry["id"] == "finds-ipc-objects")


def submit_after_each_other(course: Course) -> list[tuple[str, dict | None]]:
    """Each notebook that tries to change its worker, then a correct student and the probe that looks for
    what an earlier notebook left: (student, catalogue entry or None), in the order one worker grades them."""
    from hostile_submissions import submit

    order = []
    for number, entry in enumerate(WORKER_CHANGING):
        for suffix, follower in ((entry["id"], entry), ("reference", None), (FINDS_IPC["id"], FINDS_IPC)):
            student = f"{number}{len(order) % 3}-{suffix}"
            if follower is None:
                course.submit(student, ASSIGNMENT)
            else:
                submit(course, {**follower, "id": student})
            order.append((student, follower))
    return order


def sandbox_runs(course: Course, order: list) -> list[dict]:
    summaries = ledger(course)
    return [summaries[(student, ASSIGNMENT)] for student, _ in order]


class TestAStudentAfterAHostileOne:
    """One worker (``--workers 1``) grades each notebook that tries to change the interpreter forking its
    kernels (its process limit, priority, CPUs, its out-of-memory score) or to leave IPC objects behind,
    then a correct student, then a probe that looks for what was left: the followers get every point and
    find nothing, and the worker's interpreter is never touched (so it stays warm)."""

    @pytest.fixture(scope="class")
    @classmethod
    def run(cls, tmp_path_factory, course_template):
        course = copy_course(course_template, tmp_path_factory.mktemp("after") / "course")
        order = submit_after_each_other(course)
        result = grade(course.root, *LIMITS, "--workers", "1")
        return course, result, order

    def test_the_run_completes_on_one_worker_in_order(self, run):
        course, result, order = run
        assert result.returncode == 0, result.stderr[-3000:] + result.stdout[-3000:]
        runs = sandbox_runs(course, order)
        assert len({summary["worker"] for summary in runs}) == 1
        assert [summary["started"] for summary in runs] == sorted(summary["started"] for summary in runs)

    def test_each_gets_what_its_answers_earn_and_finds_nothing(self, run):
        course, _, order = run
        for student, entry in order:
            if entry is None:
                assert course.scores(student, ASSIGNMENT) == course.max_scores(ASSIGNMENT), student
                assert not ledger(course)[(student, ASSIGNMENT)]["flags"]
            else:
                verify(course, {**entry, "id": student}, ledger(course)[(student, ASSIGNMENT)])

    def test_the_interpreter_is_never_changed_so_never_replaced(self, run):
        course, _, order = run
        runs = sandbox_runs(course, order)
        assert {summary["sandbox_launch"] for summary in runs} == {1}, [s["messages"] for s in runs]


# ---------------------------------------------------------------- every notebook's own catalogue


def grading_suites() -> list:
    """Every notebook's ``GradingSuite`` (``tests/test_grading_<NN>_<topic>.py``)."""
    import importlib

    from grading_suite import GradingSuite

    found = []
    for path in sorted(Path(__file__).parent.glob("test_grading_[0-9]*.py")):
        module = importlib.import_module(path.stem)
        found += [
            value
            for value in vars(module).values()
            if isinstance(value, type)
            and issubclass(value, GradingSuite)
            and value is not GradingSuite
            and value.assignment
        ]
    return found


SUITES = grading_suites()
SUITE_STUDENTS = [
    (suite, student)
    for suite in SUITES
    for student in [
        "reference",
        "untouched",
        *suite.mistakes,
        *suite.alternatives,
        "patches-allclose",
        "patches-numpy-testing",
    ]
]


class TestEveryNotebooksCatalogue:
    """Each notebook's grading catalogue (its catalogued mistakes, answers written differently, patched
    checks, the untouched release), all graded by one run of the real command: the points its own
    nbgrader tests expect, the mistake named in the feedback. Checks judged outside the sandbox must
    agree with checks judged inside nbgrader's kernel, notebook by notebook."""

    @pytest.fixture(scope="class")
    @classmethod
    def run(cls, tmp_path_factory, course_template):
        course = copy_course(course_template, tmp_path_factory.mktemp("catalogues") / "course")
        expected = {}
        for suite in SUITES:
            for student, points in suite.submit_class(course).items():
                expected[(student, suite.assignment)] = points
        result = grade(course.root)  # the default limits: some checks take seconds on a busy machine
        return course, result, expected

    def test_every_notebook_has_a_catalogue(self):
        released = sorted(p.name for p in (REPOSITORY / "solutions").iterdir() if p.is_dir())
        assert {suite.assignment for suite in SUITES} == set(released)

    def test_the_run_completes(self, run):
        _, result, expected = run
        assert result.returncode == 0, result.stderr[-3000:] + result.stdout[-3000:]
        assert f"Graded {len(expected)} notebook(s)" in result.stdout, result.stdout

    @pytest.mark.parametrize(
        "suite, student", SUITE_STUDENTS, ids=[f"{suite.assignment}/{student}" for suite, student in SUITE_STUDENTS]
    )
    def test_same_points_as_the_notebooks_own_grading(self, run, suite, student):
        course, _, expected = run
        assert course.scores(student, suite.assignment) == expected[(student, suite.assignment)]
        summary = ledger(course)[(student, suite.assignment)]
        if student in suite.mistakes:
            _, _, mistake_id = suite.mistakes[student]
            assert f"[mistake:{mistake_id}]" in course.feedback_text(student, suite.assignment)
            assert not set(summary["flags"]) & REVIEW_FLAGS, summary["flags"]
        elif student.startswith("patches-"):
            assert "patched-functions" in summary["flags"], summary["flags"]
        else:
            assert not set(summary["flags"]) & REVIEW_FLAGS, summary["flags"]

    @pytest.mark.parametrize("suite", SUITES, ids=[suite.assignment for suite in SUITES])
    def test_reference_runs_in_the_sandbox_without_an_error(self, run, suite):
        """Not only the points: every cell of a correct submission runs in the sandbox
        as on the learner's machine (the course's data in assets/ included)."""
        import nbformat

        course, _, _ = run
        [graded] = (coursework(course) / "autograded" / "reference" / suite.assignment).glob("*.ipynb")
        errors = [
            f"cell {i}: {output.get('ename')}: {output.get('evalue')}"
            for i, cell in enumerate(nbformat.read(graded, as_version=4).cells)
            for output in cell.get("outputs", [])
            if output.get("output_type") == "error"
        ]
        assert errors == []

    def test_no_feedback_shows_hidden_test_code(self, run):
        course, _, expected = run
        pages = list((coursework(course) / "feedback").rglob("*.html"))
        assert len(pages) == len(expected)
        assert_no_hidden_code(course, pages)

    def test_a_notebook_that_faults_nowhere_leaves_its_sandbox_warm(self, run):
        """The next notebook on the same worker runs in the same warm sandbox: its clean-up proved
        it clean. (A sandbox retired after every notebook would cost its start-up, seconds, each time.)"""
        course, _, _ = run
        by_worker: dict = {}
        for summary in ledger(course).values():
            by_worker.setdefault(summary["worker"], []).append(summary)
        reused = 0
        for summaries in by_worker.values():
            summaries.sort(key=lambda summary: summary["started"])
            for before, after in zip(summaries, summaries[1:]):
                if before["faults"] or not before["graded"]:
                    continue
                assert after["sandbox_launch"] == before["sandbox_launch"], (before["messages"], after["messages"])
                reused += 1
        assert reused >= len(ledger(course)) // 2


# ---------------------------------------------------------------- crash, resume, unsandboxed


def running_for(course: Course) -> list[str]:
    """Command lines of processes still working on ``course`` (the grader, its workers, sandboxes)."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != os.getpid():
            try:
                command = Path(f"/proc/{name}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if str(course.root) in command:
                found.append(command[:200])
    return found


class TestCrashAndResume:
    @pytest.fixture(scope="class")
    @classmethod
    def courses(cls, tmp_path_factory, course_template):
        import shutil

        import nbformat

        base = tmp_path_factory.mktemp("resume")
        killed = copy_course(course_template, base / "killed")
        slow = nbformat.v4.new_code_cell("import time\ntime.sleep(1.5)")  # a window to kill in
        for number, student in enumerate(["ann", "ben", "cid", "dee", "eve"]):
            answers = {"softmax": NO_MAX_SOFTMAX} if number % 2 else None
            killed.submit(student, ASSIGNMENT, answers, edit=lambda nb: nb.cells.append(slow))
        killed.submit("fay", ASSIGNMENT, UNTOUCHED)
        shutil.copytree(killed.root, base / "clean")
        clean = Course(base / "clean")
        result = grade(clean.root, *LIMITS)
        assert result.returncode == 0, result.stderr[-2000:]
        return killed, clean

    def test_killed_at_any_moment_then_rerun_gives_the_clean_gradebook(self, courses):
        import signal
        import time

        killed, clean = courses
        command = [sys.executable, "-m", "autograder.grade", "--quiet", *LIMITS]
        process = subprocess.Popen(
            command, cwd=killed.root, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )
        ledger_path = coursework(killed) / ".work" / "grading.sqlite"
        deadline = time.monotonic() + 600
        committed = 0
        while time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.2)
            if ledger_path.exists():
                try:
                    db = sqlite3.connect(ledger_path)
                    committed = db.execute("SELECT COUNT(*) FROM graded").fetchone()[0]
                    db.close()
                except sqlite3.Error:
                    continue
                if committed >= 2:
                    break
        assert process.poll() is None, "the run ended before it could be killed"
        os.killpg(process.pid, signal.SIGKILL)  # kill -9, the command and everything in its group
        process.wait()
        for _ in range(100):
            if not running_for(killed):
                break
            time.sleep(0.1)
        assert not running_for(killed), "workers or sandboxes outlived the killed command"
        db = sqlite3.connect(ledger_path)
        committed = db.execute("SELECT COUNT(*) FROM graded").fetchone()[0]
        db.close()
        assert 2 <= committed < 6
        resumed = grade(killed.root, *LIMITS)
        assert resumed.returncode == 0, resumed.stderr[-2000:]
        assert f"{committed} unchanged" in resumed.stdout, resumed.stdout
        assert killed.gradebook_dump() == clean.gradebook_dump()
        for student in ("ann", "ben", "cid", "dee", "eve", "fay"):
            assert (coursework(killed) / "feedback" / student / ASSIGNMENT / f"{ASSIGNMENT}.html").is_file()

    def test_refuses_without_the_sandbox_unless_told(self, courses):
        _, clean = courses
        env = {**os.environ, "PATH": str(Path(sys.executable).parent)}  # no bwrap on it
        refused = grade(clean.root, *LIMITS, env=env)
        assert refused.returncode == 2
        assert "bubblewrap is not installed" in refused.stderr and "--unsandboxed" in refused.stderr
        before = clean.gradebook_dump()
        unsandboxed = grade(clean.root, *LIMITS, "--unsandboxed", "--force", env=env)
        assert unsandboxed.returncode == 0, unsandboxed.stderr[-2000:]
        assert "Graded 6 notebook(s)" in unsandboxed.stdout
        assert clean.gradebook_dump() == before  # the same grades without the sandbox
