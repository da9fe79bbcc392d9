"""A real Postgres gradebook, and what stock nbgrader pays a submission that rebinds the check helper.

One small class of notebook 01 (a right submission, one with a wrong softmax, and the
hostile catalogue's ``redefines-check``: ``course_checks.checks.check`` rebound to a no-op,
with wrong answers) is graded four times, each in its own copy of the course:
``./course grade`` and stock ``nbgrader autograde``, each into SQLite and into a
throwaway PostgreSQL server (Debian's, which ``./course test`` installs where it can,
started here on a unix socket in a temporary folder, as an unprivileged user). Every
grade must be the same in both databases. The SQLite runs also show the difference
the grading page (docs/grading.md) states: stock nbgrader pays the rebinding submission, ``./course grade``
gives it nothing and flags it.
"""

from __future__ import annotations

import csv
import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from grading_harness import Course, grade, nbgrader, sandbox_works
from hostile_submissions import ASSIGNMENT, load_catalogue, submit

REBINDS = next(entry for entry in load_catalogue() if entry["id"] == "redefines-check")
WRONG_SOFTMAX = "def softmax(x, dim=-1):\n    return x / x.sum(dim=dim, keepdim=True)\n"


@dataclass
class GradebookAt(Course):
    """A course copy whose gradebook is at ``url`` (nbgrader's SQLite file by default)."""

    url: str = ""

    @property
    def db_url(self) -> str:
        return self.url or super().db_url


# ---------------------------------------------------------------- a throwaway server


def postgres_bin() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parent.parent.name))
    return Path(found[-1]).parent if found else None


class Postgres:
    """initdb + pg_ctl in a temporary folder; the server listens on a unix socket only."""

    def __init__(self, bin_dir: Path):
        self.bin = bin_dir
        self.folder = Path(tempfile.mkdtemp(prefix="course-pg-", dir="/tmp"))  # short: a socket path
        self.data = self.folder / "data"
        self.prefix: list[str] = []
        if os.getuid() == 0:  # the server refuses to run as root: as nobody, then
            nobody = pwd.getpwnam("nobody")
            os.chown(self.folder, nobody.pw_uid, nobody.pw_gid)
            os.chmod(self.folder, 0o700)
            self.prefix = ["setpriv", f"--reuid={nobody.pw_uid}", f"--regid={nobody.pw_gid}", "--clear-groups", "--"]

    def run(self, *command: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [*self.prefix, *command],
            cwd=self.folder,
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "HOME": str(self.folder), "LC_ALL": "C"},
        )

    def start(self) -> str | None:
        """None when the server runs, else why not."""
        steps = [
            [
                str(self.bin / "initdb"),
                "-D",
                str(self.data),
                "-U",
                "course",
                "--auth=trust",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
            ],
            [
                str(self.bin / "pg_ctl"),
                "-D",
                str(self.data),
                "-l",
                str(self.folder / "log"),
                "-w",
                "start",
                "-o",
                f"-k {self.folder} -c listen_addresses='' -F",
            ],
        ]
        for step in steps:
            result = self.run(*step)
            if result.returncode != 0:
                log = self.folder / "log"
                return f"{Path(step[0]).name} failed: {result.stderr.strip()[-800:]} " + (
                    log.read_text()[-800:] if log.exists() else ""
                )
        return None

    def create_database(self, name: str) -> str:
        result = self.run(str(self.bin / "createdb"), "-h", str(self.folder), "-U", "course", name)
        assert result.returncode == 0, result.stderr
        return f"postgresql://course@/{name}?host={self.folder}"

    def stop(self) -> None:
        self.run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "stop")
        shutil.rmtree(self.folder, ignore_errors=True)


@pytest.fixture(scope="module")
def postgres():
    bin_dir = postgres_bin()
    if bin_dir is None:
        pytest.skip("PostgreSQL is not installed (./course test installs Debian's postgresql where it can)")
    try:
        server = Postgres(bin_dir)
        why_not = server.start()
    except (KeyError, OSError) as error:  # no user nobody, no setpriv, ...
        pytest.skip(f"a PostgreSQL server cannot start here: {error}")
    if why_not:
        server.stop()
        pytest.skip(f"a PostgreSQL server cannot start here: {why_not}")
    yield server
    server.stop()


# ---------------------------------------------------------------- the class, graded four ways


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    course = Course.create(tmp_path_factory.mktemp("pg-template") / "course", [ASSIGNMENT])
    course.submit("reference", ASSIGNMENT)
    course.submit("wrong-softmax", ASSIGNMENT, {"softmax": WRONG_SOFTMAX})
    submit(course, REBINDS)
    return course.root


def course_copy(template: Path, tmp_path_factory, name: str, url: str = "") -> GradebookAt:
    root = tmp_path_factory.mktemp(name) / "course"
    shutil.copytree(template, root)
    return GradebookAt(root, url)


def course_grade(course: GradebookAt) -> GradebookAt:
    result = grade(course.root, *(["--db", course.url] if course.url else []))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return course


def stock_grade(course: GradebookAt) -> GradebookAt:
    """nbgrader's own commands; with a Postgres URL, the assignment is registered there first."""
    on_db = [f"--CourseDirectory.db_url={course.url}"] if course.url else []
    if course.url:
        nbgrader("generate_assignment", ASSIGNMENT, "--force", *on_db, cwd=course.root)
    nbgrader("autograde", ASSIGNMENT, "--force", *on_db, cwd=course.root)
    return course


needs_sandbox = pytest.mark.skipif(not sandbox_works(), reason="bubblewrap cannot start a sandbox here")


@pytest.fixture(scope="module")
def ours_sqlite(template, tmp_path_factory):
    if not sandbox_works():
        pytest.skip("bubblewrap cannot start a sandbox here")
    return course_grade(course_copy(template, tmp_path_factory, "ours-sqlite"))


@pytest.fixture(scope="module")
def stock_sqlite(template, tmp_path_factory):
    return stock_grade(course_copy(template, tmp_path_factory, "stock-sqlite"))


@pytest.fixture(scope="module")
def ours_postgres(template, tmp_path_factory, postgres, ours_sqlite):
    return course_grade(course_copy(template, tmp_path_factory, "ours-pg", postgres.create_database("ours")))


@pytest.fixture(scope="module")
def stock_postgres(template, tmp_path_factory, postgres):
    return stock_grade(course_copy(template, tmp_path_factory, "stock-pg", postgres.create_database("stock")))


STUDENTS = ("reference", "wrong-softmax", REBINDS["id"])


def all_scores(course: Course) -> dict:
    return {student: course.scores(student, ASSIGNMENT) for student in STUDENTS}


# ---------------------------------------------------------------- the rebinding submission


def test_stock_nbgrader_pays_a_submission_that_rebinds_the_check_helper(stock_sqlite):
    """The grading page's warning, reproduced: with check() a no-op, wrong answers get full points."""
    assert stock_sqlite.scores(REBINDS["id"], ASSIGNMENT) == stock_sqlite.max_scores(ASSIGNMENT)
    # the same wrong answers without the rebinding get nothing
    assert stock_sqlite.scores("wrong-softmax", ASSIGNMENT)["test_softmax"] == 0.0


@needs_sandbox
def test_course_grade_gives_the_rebinding_submission_nothing_and_flags_it(ours_sqlite):
    assert set(ours_sqlite.scores(REBINDS["id"], ASSIGNMENT).values()) == {0.0}
    with open(ours_sqlite.root / "coursework" / "reports" / "grades.csv", newline="") as handle:
        rows = [row for row in csv.DictReader(handle) if row["student"] == REBINDS["id"]]
    assert rows and all(row["flags"] for row in rows), rows
    flags = {flag for row in rows for flag in row["flags"].replace(",", " ").replace(";", " ").split()}
    assert set(REBINDS["expect"]["flags"]) <= flags, flags


@needs_sandbox
def test_course_grade_and_stock_nbgrader_agree_on_honest_submissions(ours_sqlite, stock_sqlite):
    for student in ("reference", "wrong-softmax"):
        assert ours_sqlite.scores(student, ASSIGNMENT) == stock_sqlite.scores(student, ASSIGNMENT)


# ---------------------------------------------------------------- Postgres against SQLite


@needs_sandbox
def test_course_grade_into_postgres_writes_every_grade_it_writes_into_sqlite(ours_postgres, ours_sqlite):
    assert ours_postgres.db_url.startswith("postgresql://")
    postgres_dump, sqlite_dump = ours_postgres.gradebook_dump(), ours_sqlite.gradebook_dump()
    assert {key[:2] for key in postgres_dump} == {(student, ASSIGNMENT) for student in STUDENTS}
    assert postgres_dump == sqlite_dump
    assert all_scores(ours_postgres) == all_scores(ours_sqlite)


def test_stock_nbgrader_into_postgres_writes_every_grade_it_writes_into_sqlite(stock_postgres, stock_sqlite):
    postgres_dump, sqlite_dump = stock_postgres.gradebook_dump(), stock_sqlite.gradebook_dump()
    assert {key[:2] for key in postgres_dump} == {(student, ASSIGNMENT) for student in STUDENTS}
    assert postgres_dump == sqlite_dump
