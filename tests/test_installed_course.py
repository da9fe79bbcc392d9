"""The course as pip installs it, used away from the checkout: a learner runs notebook 07 top to
bottom, and an instructor grades a small class with the installed ``course-grade``.

The two wheels are built from this checkout and installed (not editable) into a fresh venv
(tests/installed_course.py: the dependencies come from this checkout's venv, at the lock's
versions, through a path entry). Then, in folders outside the checkout:

- a learner's copy of the course's notebooks (``notebooks/`` alone, no ``solutions/``: class
  mode): 07 runs top to bottom in a kernel of that venv, with the reference answers written in and
  nothing of nbgrader's grading set, so it trains on the corpus, which comes from the wheel
  (``importlib.resources``), and draws every widget;
- a course folder as the grading page (docs/grading.md) describes it (``nbgrader_config.py``,
  ``solutions/``, ``notebooks/``, copied): ``course-grade`` grades a class of three notebooks,
  the learner's own run of 07 among them, in the sandbox, with the installed packages;
- anywhere else, ``course-grade`` says in one line that it needs a course folder.
"""

from __future__ import annotations

import json
import shutil
import time
import zipfile
from pathlib import Path

import nbformat
import pytest
from grading_harness import answer_cells, grade_cells, reference_answers, sandbox_works
from installed_course import COURSE, GRADER, REPOSITORY, build_wheels, environment, run

LEARNER_NOTEBOOK = "07_llama"
WRONG_SOFTMAX = "def softmax(x, dim=-1):\n    return torch.exp(x) / torch.exp(x).sum()\n"


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    base = tmp_path_factory.mktemp("installed")
    (base / "dist").mkdir()
    wheels = build_wheels(base / "dist")
    python = environment(base / "venv", [wheels[COURSE], wheels[GRADER]])
    return python, wheels, base


def kernel_spec(python: Path, folder: Path) -> dict:
    """A Jupyter data folder whose kernel ``installed`` is the venv's Python, started as graded
    kernels start (the trusted snapshot first), and the environment that selects it."""
    spec = folder / "kernels" / "installed"
    spec.mkdir(parents=True)
    argv = [str(python), "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(json.dumps({"argv": argv, "language": "python", "display_name": "installed"}))
    return {"JUPYTER_PATH": str(folder)}


@pytest.fixture(scope="module")
def learner_run(installed, tmp_path_factory, monkeypatch_module):
    """Notebook 07 run top to bottom in a learner's copy of the notebooks, outside the checkout."""
    from nbclient import NotebookClient

    python, _, _ = installed
    home = tmp_path_factory.mktemp("learner")
    shutil.copytree(REPOSITORY / "notebooks", home / "notebooks", ignore=shutil.ignore_patterns(".*", "*.pt"))
    for key, value in kernel_spec(python, home / "jupyter").items():
        monkeypatch_module.setenv(key, value)
    monkeypatch_module.delenv("NBGRADER_EXECUTION", raising=False)
    path = home / "notebooks" / LEARNER_NOTEBOOK / f"{LEARNER_NOTEBOOK}.ipynb"
    notebook = nbformat.read(path, as_version=4)
    answers = reference_answers(LEARNER_NOTEBOOK)
    for grade_id, cell in answer_cells(notebook).items():
        cell.source = answers[grade_id]
    client = NotebookClient(
        notebook,
        timeout=900,
        kernel_name="installed",
        allow_errors=True,
        resources={"metadata": {"path": str(path.parent)}},
        extra_arguments=["--IPKernelApp.exec_lines=import course_checks.kernel_boot"],
    )
    started = time.perf_counter()
    client.execute()
    seconds = time.perf_counter() - started
    print(f"notebook {LEARNER_NOTEBOOK}, top to bottom with the installed wheels: {seconds:.0f} s")
    nbformat.write(notebook, path)
    return notebook, path, seconds


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


def outputs_text(notebook) -> str:
    return "".join(
        output.get("text", "") + "".join(str(v) for v in output.get("data", {}).values())
        for cell in notebook.cells
        for output in cell.get("outputs", [])
    )


def test_the_wheels_hold_the_code_the_corpus_and_the_grade_command(installed):
    _, wheels, _ = installed
    for wheel in wheels.values():
        listing = sorted(zipfile.ZipFile(wheel).namelist())
        print(f"{wheel.name}: {len(listing)} files\n  " + "\n  ".join(listing))
    course = zipfile.ZipFile(wheels[COURSE])
    assert "course_widgets/data/tiny_tales.txt" in course.namelist()
    assert (
        course.read("course_widgets/data/tiny_tales.txt")
        == (REPOSITORY / "course_widgets" / "data" / "tiny_tales.txt").read_bytes()
    )
    grader = zipfile.ZipFile(wheels[GRADER])
    [entry_points] = [n for n in grader.namelist() if n.endswith(".dist-info/entry_points.txt")]
    assert "course-grade = autograder.grade:main" in grader.read(entry_points).decode()


def test_the_installed_packages_are_the_wheels_not_the_checkout(installed, tmp_path):
    python, _, base = installed
    code = "import autograder, course_checks, course_widgets as w; print(autograder.__file__, w.__file__)"
    for module_file in run(python, "-c", code, cwd=tmp_path).stdout.split():
        assert Path(module_file).is_relative_to(base / "venv"), module_file
    assert (base / "venv" / "bin" / "course-grade").is_file()


def test_notebook_07_runs_top_to_bottom_outside_the_checkout(learner_run):
    notebook, path, _ = learner_run
    errors = [
        f"{o.ename}: {o.evalue}" for c in notebook.cells for o in c.get("outputs", []) if o.output_type == "error"
    ]
    assert errors == []
    text = outputs_text(notebook)
    assert "Class mode: this cell runs the visible checks only" in text  # no solutions/ beside this copy
    corpus = (REPOSITORY / "course_widgets" / "data" / "tiny_tales.txt").read_text(encoding="utf-8")
    assert f"{len(corpus):,} characters, {len(set(corpus))} distinct" in text  # the wheel's corpus
    # it trained on it and kept the model for 08, beside its notebook folders
    assert "saved for notebook 08: " in text and (path.parent.parent / "07_llama_trained.pt").is_file()


def course_folder(root: Path) -> Path:
    """A course folder outside the checkout, as the grading page describes one."""
    root.mkdir()
    shutil.copy2(REPOSITORY / "nbgrader_config.py", root)
    for folder in ("solutions", "notebooks"):
        shutil.copytree(REPOSITORY / folder, root / folder, ignore=shutil.ignore_patterns(".*", "*.pt"))
    return root


def submit(course: Path, student: str, assignment: str, notebook) -> None:
    folder = course / "coursework" / "submitted" / student / assignment
    folder.mkdir(parents=True)
    nbformat.write(notebook, folder / f"{assignment}.ipynb")


def answered(assignment: str, **answers) -> nbformat.NotebookNode:
    notebook = nbformat.read(REPOSITORY / "notebooks" / assignment / f"{assignment}.ipynb", as_version=4)
    chosen = {**reference_answers(assignment), **answers}
    for grade_id, cell in answer_cells(notebook).items():
        cell.source = chosen[grade_id]
    return notebook


@pytest.mark.skipif(not sandbox_works(), reason="bubblewrap cannot start a sandbox here")
def test_course_grade_grades_a_class_in_a_course_folder_outside_the_checkout(installed, learner_run, tmp_path):
    from nbgrader.api import Gradebook

    python, _, base = installed
    notebook_07, _, _ = learner_run
    course = course_folder(tmp_path / "course")
    submit(course, "alice", "01_attention", answered("01_attention"))
    submit(course, "bob", "01_attention", answered("01_attention", softmax=WRONG_SOFTMAX))
    submit(course, "alice", LEARNER_NOTEBOOK, notebook_07)  # the learner's own run, outputs and all
    started = time.perf_counter()
    graded = run(base / "venv" / "bin" / "course-grade", "--quiet", cwd=course, timeout=1500, check=False)
    print(f"course-grade, installed, 3 notebooks: {time.perf_counter() - started:.0f} s\n{graded.stdout}")
    assert graded.returncode == 0, graded.stdout[-3000:] + graded.stderr[-3000:]
    scores = {}
    with Gradebook(f"sqlite:///{course / 'coursework' / 'gradebook.db'}") as gradebook:
        for student, assignment in (("alice", "01_attention"), ("bob", "01_attention"), ("alice", LEARNER_NOTEBOOK)):
            submission = gradebook.find_submission(assignment, student)
            scores[student, assignment] = {g.name: g.score for nb in submission.notebooks for g in nb.grades}
    for assignment in ("01_attention", LEARNER_NOTEBOOK):
        released = nbformat.read(REPOSITORY / "notebooks" / assignment / f"{assignment}.ipynb", as_version=4)
        assert scores["alice", assignment] == grade_cells(released), assignment
    full = grade_cells(nbformat.read(REPOSITORY / "notebooks" / "01_attention" / "01_attention.ipynb", as_version=4))
    assert scores["bob", "01_attention"]["test_softmax"] == 0.0
    assert sum(scores["bob", "01_attention"].values()) < sum(full.values())
    csv = (course / "coursework" / "reports" / "grades.csv").read_text()
    assert "alice" in csv and "bob" in csv
    assert (course / "coursework" / "feedback" / "bob" / "01_attention" / "01_attention.html").is_file()


def test_course_grade_outside_a_course_folder_says_so_in_one_line(installed, tmp_path):
    _, _, base = installed
    result = run(base / "venv" / "bin" / "course-grade", cwd=tmp_path, check=False)
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0, result.stderr
    assert result.stderr.startswith(f"grade: {tmp_path} is not a course folder (no nbgrader_config.py)")
    assert "Traceback" not in result.stderr and not list(tmp_path.iterdir())  # nothing written there


def test_course_grade_without_the_solutions_says_so(installed, tmp_path):
    _, _, base = installed
    shutil.copy2(REPOSITORY / "nbgrader_config.py", tmp_path)
    result = run(base / "venv" / "bin" / "course-grade", cwd=tmp_path, check=False)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"{tmp_path / 'solutions'} does not exist" in result.stderr
