"""Self-study mode in the learner's kernel (course_checks/selfstudy.py), with the real catalogue and reference.

Every catalogued mistake that the grading suites write as a learner would is
diagnosed by ``self_assess`` with its name and hint, as the grader's feedback
says it; the learner's own functions stay in place for the visible checks; the
reference solution needs a check run first; progress goes from "not tried" to
"fails" to "passes" and is read back by another process; class mode (no
``solutions/`` above the notebooks) runs nothing hidden and shows no solution; while nbgrader runs,
nothing happens at all. The last test runs a student notebook in a real kernel.
"""

import contextlib
import importlib
import io
import json
import re
import shutil
import subprocess
import sys
import textwrap

import nbformat
import pytest
from notebook_runner import REPOSITORY, execute

from autograder import reference
from autograder.exercises import exercise, module_for
from course_checks import course, selfstudy

COURSE = sorted(p.name for p in (REPOSITORY / "solutions").iterdir() if p.is_dir())
NO_MAX_SOFTMAX = """
def softmax(x, dim=-1):
    e = torch.exp(x)
    return e / e.sum(dim=dim, keepdim=True)
"""


def course_copy(root, solutions: bool = True):
    """A course folder as a learner has it: ``notebooks/NN_topic/NN_topic.ipynb`` for every notebook,
    and in a clone (self-study) ``solutions/`` beside them."""
    notebooks = root / "notebooks"
    for assignment in COURSE:
        (notebooks / assignment).mkdir(parents=True)
        name = f"{assignment}.ipynb"
        shutil.copy(REPOSITORY / "notebooks" / assignment / name, notebooks / assignment / name)
    if solutions:
        (root / "solutions").symlink_to(REPOSITORY / "solutions")
    return notebooks


@pytest.fixture
def notebooks_folder(tmp_path, monkeypatch):
    """Work as a kernel does in a clone: in a notebook's folder inside the folder that holds them all."""
    notebooks = course_copy(tmp_path)
    monkeypatch.chdir(notebooks / "01_attention")
    return notebooks


def test_the_notebooks_grade_exactly_the_catalogued_exercises():
    """Progress counts the check cells a notebook holds (all a class student has); the grader checks the
    catalogue's exercises: the two lists are the same, in the same order."""
    for assignment in COURSE:
        assert course.exercise_names(assignment, REPOSITORY / "notebooks" / assignment) == list(
            module_for(assignment).EXERCISES
        ), assignment


def learner_namespace(assignment: str, answer: str = "") -> dict:
    """The names a learner's kernel holds: every reference cell, then ``answer`` run over them."""
    namespace = dict(vars(reference.load(assignment)))
    exec(textwrap.dedent(answer), namespace)
    return namespace


def printed(function, *args) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        function(*args)
    return out.getvalue()


def grading_suite(assignment: str):
    """The GradingSuite subclass of ``assignment`` (imported here, so pytest does not collect it twice)."""
    module = importlib.import_module(f"test_grading_{assignment}")
    [suite] = [value for name, value in vars(module).items() if name.startswith("Test")]
    return suite


@pytest.mark.parametrize("assignment", COURSE)
def test_every_catalogued_mistake_is_named_by_the_self_check_as_the_grader_names_it(assignment, notebooks_folder):
    suite = grading_suite(assignment)
    tried = 0
    for student, (name, source, mistake_id) in suite.mistakes.items():
        if suite.checked_by.get(mistake_id, name) != name:
            continue  # caught by another exercise's check: the grading suite covers it
        namespace = learner_namespace(assignment, source)
        learners = namespace[name]
        mistake = next(m for m in exercise(assignment, name).mistakes if m.id == mistake_id)
        text = printed(selfstudy.self_assess, assignment, name, namespace)
        assert f"`{name}` fails a hidden check" in text, (student, text)
        assert mistake.name in text and mistake.hint in text, (student, text)
        assert "[mistake:" not in text and "HIDDEN TESTS" not in text and "check(" not in text
        assert namespace[name] is learners  # the visible checks still see the learner's code
        tried += 1
    assert tried >= 1
    statuses = selfstudy.read_progress()[assignment]
    assert set(statuses.values()) == {selfstudy.FAILS}


def test_a_passing_check_leaves_the_learners_other_functions_in_place(notebooks_folder):
    namespace = learner_namespace("01_attention", NO_MAX_SOFTMAX)
    wrong_softmax = namespace["softmax"]
    # attention_weights is checked with the reference softmax (each exercise on its own) ...
    text = printed(selfstudy.self_assess, "01_attention", "attention_weights", namespace)
    assert text.strip() == "Self-check: `attention_weights` passes the grader's hidden checks."
    # ... but afterwards the visible checks run on the learner's own softmax
    assert namespace["softmax"] is wrong_softmax


def test_the_solution_is_refused_before_a_check_run_and_shown_after_one(notebooks_folder):
    from IPython.display import Markdown

    shown = []
    namespace = learner_namespace("01_attention", NO_MAX_SOFTMAX)
    refusal = printed(selfstudy.show_solution, "01_attention", "softmax")
    assert "run its check cell once" in refusal
    printed(selfstudy.self_assess, "01_attention", "softmax", namespace)
    import IPython.display

    original = IPython.display.display
    IPython.display.display = lambda *objects, **kwargs: shown.extend(objects)
    try:
        selfstudy.show_solution("01_attention", "softmax")
    finally:
        IPython.display.display = original
    [markdown] = shown
    assert isinstance(markdown, Markdown)
    [answer] = [source for grade_id, source in reference.source_cells("01_attention") if grade_id == "softmax"]
    for line in answer.splitlines():
        if "### " in line:
            assert line.strip() not in markdown.data
        else:
            assert line in markdown.data


def test_progress_goes_from_not_tried_to_fails_to_passes_and_another_process_reads_it(notebooks_folder):
    def view(assignment=None):
        return selfstudy._view(assignment)[1]

    assert "softmax: not tried" in view("01_attention")
    assert "0 of 3 exercises pass" in view("01_attention")
    printed(selfstudy.self_assess, "01_attention", "softmax", learner_namespace("01_attention", NO_MAX_SOFTMAX))
    assert "softmax: fails" in view("01_attention")
    printed(selfstudy.self_assess, "01_attention", "softmax", learner_namespace("01_attention"))
    assert "softmax: passes" in view("01_attention") and "1 of 3 exercises pass" in view("01_attention")
    assert course.assignments() == COURSE  # every notebook, found from the notebooks beside this one
    n = sum(len(module_for(a).EXERCISES) for a in COURSE)
    assert f"1 of {n} exercises pass" in view() and "01_attention: 1 of 3 pass" in view()
    # a notebook reopened later (a new kernel, in another notebook's folder) reads the same file
    other = notebooks_folder / "00_start_here"
    other.mkdir(exist_ok=True)
    script = "from course_checks import selfstudy; print(selfstudy._view(None)[1])"
    later = subprocess.run([sys.executable, "-c", script], cwd=other, capture_output=True, text=True, check=True)
    assert "01_attention: 1 of 3 pass" in later.stdout
    data = json.loads((notebooks_folder / ".progress.json").read_text())
    assert data["assignments"]["01_attention"]["softmax"]["status"] == "passes"
    assert not list(notebooks_folder.glob(".*.partial"))  # the scratch file was renamed into place


def test_a_damaged_progress_file_counts_as_nothing_tried(notebooks_folder):
    (notebooks_folder / ".progress.json").write_text("{not json")
    assert "softmax: not tried" in selfstudy._view("01_attention")[1]
    printed(selfstudy.self_assess, "01_attention", "softmax", learner_namespace("01_attention"))
    assert "softmax: passes" in selfstudy._view("01_attention")[1]


def test_class_mode_runs_no_hidden_check_and_shows_no_solution(notebooks_folder, tmp_path):
    (tmp_path / "solutions").unlink()  # a class student's folder: the released notebooks only
    namespace = {"softmax": lambda x, dim=-1: x}  # wrong, and no reference to compare with here
    text = printed(selfstudy.self_assess, "01_attention", "softmax", namespace)
    assert text == (
        "Class mode: this cell runs the visible checks only; the hidden checks run when your instructor grades.\n"
    )
    refusal = printed(selfstudy.show_solution, "01_attention", "softmax")
    assert "stay with your instructor" in refusal and "amax" not in refusal
    assert "visible checks only" in selfstudy._view("01_attention")[1]


def test_while_nbgrader_grades_or_validates_nothing_happens(notebooks_folder, grading_env):
    namespace = learner_namespace("01_attention", NO_MAX_SOFTMAX)
    assert printed(selfstudy.self_assess, "01_attention", "softmax", namespace) == ""
    assert printed(selfstudy.show_solution, "01_attention", "softmax") == ""
    assert printed(selfstudy.progress, "01_attention") == ""
    assert not (notebooks_folder / ".progress.json").exists()


def test_a_student_notebook_in_a_real_kernel_records_the_whole_check_cell(tmp_path):
    """The visible asserts count too: an answer that passes the hidden checks but not the
    visible ones is recorded as failing; the diagnosis and the class-mode line show in the outputs."""
    path = course_copy(tmp_path) / "00_start_here" / "00_start_here.ipynb"
    notebook = nbformat.read(path, as_version=4)
    [answer] = [c for c in notebook.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "dot_scores"]
    answer.source = "def dot_scores(q, k):\n    return q @ k.T\n"  # ignores batch dimensions
    nbformat.write(notebook, path)
    run = execute(path)
    assert "`dot_scores` fails a hidden check" in run.stream_text()
    assert len(run.errors()) == 1  # the visible checks fail as they always did
    progress = json.loads((tmp_path / "notebooks" / ".progress.json").read_text())
    assert progress["assignments"]["00_start_here"]["dot_scores"]["status"] == "fails"
    shown = [
        o for c in run.notebook.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "progress" for o in c.outputs
    ]
    assert shown and any("dot_scores" in json.dumps(o.get("data", {})) for o in shown)

    answer.source = "def dot_scores(q, k):\n    return torch.einsum('...td,...sd->...ts', q, k)\n"
    nbformat.write(notebook, path)
    (tmp_path / "solutions").unlink()  # class mode
    run = execute(path)
    assert run.errors() == []
    assert "Class mode: this cell runs the visible checks only" in run.stream_text()
    assert "hidden checks pass" not in run.stream_text()
    progress = json.loads((tmp_path / "notebooks" / ".progress.json").read_text())
    assert progress["assignments"]["00_start_here"]["dot_scores"]["status"] == "passes"
    assert not re.search(r"q @ k\.transpose", json.dumps(run.notebook))
