"""Open in Colab: every notebook's first code cell sets the course up where it is missing, and the
README's badges open each notebook from the repository.

The cell is run as Colab would run it, but for Colab itself: in a kernel of a fresh venv that
holds none of the course's code (its other dependencies come from this checkout's venv through a
path entry, as Colab has torch, numpy, matplotlib and ipywidgets already), in a folder that holds
only the notebook, with ``COURSE_REPOSITORY`` naming a local git repository of this checkout's
files in place of the course's GitHub address. The cell clones it, pip builds and installs the two
packages from the clone (the wheels are built here, from the clone), and the notebook then runs
from the clone's copy of its folder: the check cells diagnose in self-study mode, with the clone's
solutions and the installed grader's in-kernel judge. Run again, the cell does nothing more. What
is not tested here: Colab (``google.colab``'s widget manager, its preinstalled packages' versions),
and the clone from GitHub.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import nbformat
import pytest
from grading_harness import answer_cells, reference_answers
from installed_course import REPOSITORY, environment, run

ASSIGNMENT = "01_attention"
COURSE = sorted(p.name for p in (REPOSITORY / "solutions").iterdir() if (p / f"{p.name}.ipynb").is_file())
GITHUB = "https://github.com/attention-transformers/course"


def colab_cell(notebook) -> nbformat.NotebookNode:
    [cell] = [c for c in notebook.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "open_in_colab"]
    return cell


@pytest.mark.parametrize("assignment", COURSE)
def test_the_colab_cell_is_each_notebooks_first_code_cell_and_read_only(assignment):
    notebook = nbformat.read(REPOSITORY / "notebooks" / assignment / f"{assignment}.ipynb", as_version=4)
    cell = colab_cell(notebook)
    assert next(c for c in notebook.cells if c.cell_type == "code") is cell
    assert cell.metadata["nbgrader"]["locked"] and not cell.metadata["nbgrader"]["solution"]
    assert f'os.path.join(course, "notebooks", "{assignment}")' in cell.source
    assert f'"{GITHUB}.git"' in cell.source and "enable_custom_widget_manager()" in cell.source


def test_the_readme_has_a_colab_badge_per_notebook():
    readme = (REPOSITORY / "README.md").read_text()
    for assignment in COURSE:
        path = f"notebooks/{assignment}/{assignment}.ipynb"
        link = f"https://colab.research.google.com/github/attention-transformers/course/blob/main/{path}"
        assert link in readme, assignment


def local_repository(folder: Path) -> Path:
    """A git repository of this checkout's files (what a clone of the course holds, less tests and tools)."""
    folder.mkdir()
    for name in ("pyproject.toml", "LICENSE", "LICENSE-CC-BY-4.0", "nbgrader_config.py"):
        shutil.copy2(REPOSITORY / name, folder)
    ignore = shutil.ignore_patterns(".*", "*.pt", "__pycache__", "build", "*.egg-info")
    for name in ("course_checks", "course_widgets", "autograder", "solutions", "notebooks"):
        shutil.copytree(REPOSITORY / name, folder / name, ignore=ignore)
    git = ("git", "-C", str(folder), "-c", "user.name=course", "-c", "user.email=course@localhost")
    for command in (("init", "--quiet"), ("add", "."), ("commit", "--quiet", "-m", "the course")):
        subprocess.run([*git, *command], check=True, capture_output=True)
    return folder


@pytest.fixture(scope="module")
def colab(tmp_path_factory):
    """The released notebook, its answers written in, run in a fresh venv with no course code."""
    from nbclient import NotebookClient

    base = tmp_path_factory.mktemp("colab")
    python = environment(base / "venv", [])
    home, content = base / "home", base / "content"
    home.mkdir()
    content.mkdir()
    origin = local_repository(base / "origin")
    spec = base / "jupyter" / "kernels" / "fresh"
    spec.mkdir(parents=True)
    kernel_env = {"HOME": str(home), "COURSE_REPOSITORY": str(origin)}
    argv = [str(python), "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(json.dumps({"argv": argv, "language": "python", "env": kernel_env}))
    before = run(python, "-c", "import importlib.util as u; print(u.find_spec('course_checks'))", cwd=base).stdout
    notebook = nbformat.read(REPOSITORY / "notebooks" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb", as_version=4)
    answers = reference_answers(ASSIGNMENT)
    for grade_id, cell in answer_cells(notebook).items():
        cell.source = answers[grade_id]
    where = nbformat.v4.new_code_cell("import os; print(os.getcwd())")  # where the cell left the kernel
    notebook.cells.insert(notebook.cells.index(colab_cell(notebook)) + 1, where)
    previous = os.environ.get("JUPYTER_PATH")
    os.environ["JUPYTER_PATH"] = str(base / "jupyter")
    try:
        client = NotebookClient(
            notebook, timeout=600, kernel_name="fresh", allow_errors=True, resources={"metadata": {"path": content}}
        )
        with client.setup_kernel():
            for index, cell in enumerate(notebook.cells):
                client.execute_cell(cell, index)
            again = nbformat.v4.new_code_cell(colab_cell(notebook).source + "\nprint(os.getcwd())")
            notebook.cells.append(again)  # the cell run once more, at the end
            client.execute_cell(again, len(notebook.cells) - 1)
    finally:
        if previous is None:
            os.environ.pop("JUPYTER_PATH")
        else:
            os.environ["JUPYTER_PATH"] = previous
    return python, base, notebook, again, before


def text_of(cells) -> str:
    return "".join(o.get("text", "") for c in cells for o in c.get("outputs", []) if o.output_type == "stream")


def test_the_cell_installs_the_course_from_its_repository_and_works_from_the_clone(colab):
    python, base, notebook, again, before = colab
    assert before.strip() == "None"  # the fresh venv had no course code
    outputs = [o for c in notebook.cells for o in c.get("outputs", [])]
    errors = [f"{o.ename}: {o.evalue}" for o in outputs if o.output_type == "error"]
    assert errors == []
    clone = base / "home" / "attention-transformers-course"
    working = clone / "notebooks" / ASSIGNMENT
    cwd_cell = notebook.cells[notebook.cells.index(colab_cell(notebook)) + 1]
    assert text_of([cwd_cell]).strip() == str(working)
    where = "import autograder, course_checks, course_widgets as w; print(autograder.__file__, w.__file__)"
    for module_file in run(python, "-c", where, cwd=base).stdout.split():
        assert Path(module_file).is_relative_to(base / "venv"), module_file  # installed, not the clone's folder
    # run again: nothing fetched or installed again, the same working folder
    assert text_of([again]).strip() == str(working) and not [o for o in again.outputs if o.output_type == "error"]


def test_the_notebook_then_runs_in_self_study_mode(colab):
    _, base, notebook, _, _ = colab
    text = text_of(notebook.cells)
    assert "Class mode" not in text
    passes = re.findall(r"Self-check: `(\w+)` passes the grader's hidden checks", text)
    assert passes == ["softmax", "attention_weights", "attention"], text[-2000:]
    clone = base / "home" / "attention-transformers-course"
    progress = json.loads((clone / "notebooks" / ".progress.json").read_text())
    assert set(progress["assignments"][ASSIGNMENT]) == set(passes)
