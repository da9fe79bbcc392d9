"""nbgrader's own commands in a fresh clone, as an instructor types them, with no step before.

A fresh clone has no ``coursework/`` (nbgrader's course root, ignored by git) and no
gradebook, and its ``notebooks/`` (the release) is already there. Each test copies the
repository as ``git clone`` would give it (the tracked and unignored files, as they are
on disk now) into a temporary folder and runs the venv's ``nbgrader`` there:

* each command an instructor may type first (the gradebook's lists, generate_assignment,
  release_assignment to a configured exchange, export, formgrader's start-up) is that
  clone's very first command, and works (generate_assignment also registers the
  assignment in the gradebook, which autograde needs later);
* the whole class cycle in one clone, command after command in nbgrader's documented
  order with nothing in between: generate, release, a student fetches and submits,
  collect, autograde, formgrader shows the grade, generate and release feedback (inert:
  the student's script in a markdown cell does not reach the page).

The exchange is configured as on a hub, in a Jupyter configuration folder beside the
course (``c.Exchange.root``), not on the command line.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.request
from pathlib import Path

import nbformat
import pytest
from browser_harness import JupyterLab
from grading_harness import REPOSITORY, answer_cells, grade_cells, nbgrader, reference_answers

COURSE_ID = "attention-transformers"  # nbgrader_config.py's CourseDirectory.course_id
ASSIGNMENT = "00_start_here"  # the smallest notebook: the cycle grades it for real


def fresh_clone(destination: Path) -> Path:
    """The repository as a fresh clone of the current tree has it: tracked and unignored files."""
    listed = subprocess.run(
        ["git", "-C", str(REPOSITORY), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        check=True,
        capture_output=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = REPOSITORY / name
        if source.is_file():  # a file deleted but not yet committed is listed too
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, destination / name)
    assert not (destination / "coursework").exists()
    assert (destination / "notebooks" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb").is_file()
    return destination


@pytest.fixture
def instructor(tmp_path, monkeypatch):
    """A fresh clone, and a Jupyter configuration folder that sets the exchange (as a hub's does)."""
    exchange = tmp_path / "exchange"
    exchange.mkdir()
    exchange.chmod(0o777)  # as nbgrader's docs create it: every user may write there
    config = tmp_path / "jupyter-config"
    config.mkdir()
    (config / "nbgrader_config.py").write_text(f"c = get_config()\nc.Exchange.root = {str(exchange)!r}\n")
    monkeypatch.setenv("JUPYTER_CONFIG_DIR", str(config))
    clone = tmp_path / "clone"
    clone.mkdir()
    return fresh_clone(clone), exchange


def formgrader(clone: Path, path: str):
    """Start the course's Jupyter server in the clone (formgrader with it) and GET one formgrader API path."""
    with JupyterLab(clone) as server:
        url = f"http://127.0.0.1:{server.port}/formgrader/api/{path}?token={server.token}"
        with urllib.request.urlopen(url, timeout=60) as answer:
            assert answer.status == 200
            return json.loads(answer.read())


FIRST_COMMANDS = {
    "db student list": (("db", "student", "list"), "There are 0 students in the database"),
    "db assignment list": (("db", "assignment", "list"), "There are 0 assignments in the database"),
    "release_assignment": (("release_assignment", "01_attention"), "Released as: attention-transformers 01_attention"),
    "export": (("export",), "Exporting grades to"),
}


@pytest.mark.parametrize("name", FIRST_COMMANDS)
def test_an_instructors_first_nbgrader_command_works_in_a_fresh_clone(instructor, name):
    clone, _ = instructor
    arguments, says = FIRST_COMMANDS[name]
    result = nbgrader(*arguments, cwd=clone)
    assert says in result.stdout + result.stderr, result.stdout + result.stderr
    assert (clone / "coursework").is_dir()


def test_generate_assignment_registers_the_assignment_and_rewrites_the_release_unchanged(instructor):
    """notebooks/ is committed: nbgrader would skip an existing release (and leave the gradebook without
    the assignment, so autograde would later refuse); the course's configuration regenerates it."""
    clone, _ = instructor
    before = (clone / "notebooks" / "01_attention" / "01_attention.ipynb").read_bytes()
    nbgrader("generate_assignment", "01_attention", cwd=clone)
    listed = nbgrader("db", "assignment", "list", cwd=clone).stdout
    assert "There are 1 assignments in the database" in listed and "01_attention" in listed, listed
    assert (clone / "notebooks" / "01_attention" / "01_attention.ipynb").read_bytes() == before


def test_formgrader_starts_in_a_fresh_clone(instructor):
    clone, _ = instructor
    # every assignment of solutions/, none in the gradebook yet (no id): as formgrader's page lists them
    listed = formgrader(clone, "assignments")
    assert sorted(a["name"] for a in listed) == sorted(p.name for p in (clone / "solutions").iterdir() if p.is_dir())
    assert {a["id"] for a in listed} == {None}
    assert (clone / "coursework" / "gradebook.db").is_file()


def test_the_class_cycle_runs_in_a_fresh_clone_with_nbgraders_own_commands(instructor, tmp_path):
    clone, exchange = instructor
    cloned = {path.name for path in clone.iterdir()}
    nbgrader("generate_assignment", ASSIGNMENT, cwd=clone)
    nbgrader("release_assignment", ASSIGNMENT, cwd=clone)
    assert (exchange / COURSE_ID / "outbound" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb").is_file()

    # a student, in their own folder with their own submission cache (on a hub: their own account)
    home = tmp_path / "alice"
    home.mkdir()
    as_alice = (f"--course={COURSE_ID}", f"--Exchange.cache={home / '.nbgrader_cache'}", "--student=alice")
    nbgrader("fetch_assignment", ASSIGNMENT, *as_alice, cwd=home)
    fetched = home / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"
    notebook = nbformat.read(fetched, as_version=4)
    for grade_id, cell in answer_cells(notebook).items():
        cell.source = reference_answers(ASSIGNMENT)[grade_id]
    notes = 'My notes <script>window.pwned = 1</script><img src="missing.png" onerror="window.pwned = 2">'
    notebook.cells.append(nbformat.v4.new_markdown_cell(notes))
    nbformat.write(notebook, fetched)
    nbgrader("submit", ASSIGNMENT, *as_alice, cwd=home)

    nbgrader("collect", ASSIGNMENT, cwd=clone)
    assert (clone / "coursework" / "submitted" / "alice" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb").is_file()
    nbgrader("autograde", ASSIGNMENT, cwd=clone)
    assert "alice" in nbgrader("db", "student", "list", cwd=clone).stdout

    [submission] = formgrader(clone, f"submissions/{ASSIGNMENT}")
    full = sum(grade_cells(nbformat.read(clone / "notebooks" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb", 4)).values())
    assert (submission["student"], submission["score"], submission["max_score"]) == ("alice", full, full)

    nbgrader("generate_feedback", ASSIGNMENT, cwd=clone)
    nbgrader("release_feedback", ASSIGNMENT, cwd=clone)
    nbgrader("fetch_feedback", ASSIGNMENT, *as_alice, cwd=home)
    [page] = (home / ASSIGNMENT / "feedback").glob(f"*/{ASSIGNMENT}.html")
    text = page.read_text(encoding="utf-8")
    assert "BEGIN HIDDEN TESTS" not in text
    # inert, from nbgrader's own autograde and generate_feedback too (nbgrader_config.py's exporter): the
    # learner's notes shown, their script and event handler gone, and a policy that runs no script
    assert "My notes" in text and "<script" not in text.lower() and "onerror" not in text, text[-3000:]
    assert "script-src 'none'" in text
    # everything the cycle wrote went into the course root, which git ignores
    assert {path.name for path in clone.iterdir()} - cloned == {"coursework"}
