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


def student_stubs(assignment: str) -> dict:
    """A learner's namespace before any work: every reference cell, then each answer cell as released (the stubs)."""
    notebook = nbformat.read(REPOSITORY / "notebooks" / assignment / f"{assignment}.ipynb", as_version=4)
    stubs = "\n\n".join(c.source for c in notebook.cells if c.metadata.get("nbgrader", {}).get("solution"))
    return learner_namespace(assignment, stubs)


def shown_by(function, *args, **kwargs) -> list:
    """What ``function`` displays (self-study's ``display``, IPython's), in order."""
    shown = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(selfstudy, "display", lambda *objects, **_: shown.extend(objects))
        function(*args, **kwargs)
    return shown


def test_every_exercise_still_the_stub_is_not_tried_and_offers_no_solution(notebooks_folder):
    """Every check of the course on the released stubs (the no-head-loop check too): "not tried", not "fails"."""
    for assignment in COURSE:
        namespace = student_stubs(assignment)
        for name in course.exercise_names(assignment):
            text = printed(selfstudy.self_assess, assignment, name, namespace)
            assert text.startswith("Self-check: not tried yet, nothing to check: `"), (name, text)
            assert text.rstrip().endswith("is not implemented yet."), (name, text)
            [refusal] = shown_by(selfstudy.show_solution, assignment, name, now=True)
            assert refusal.data.startswith(f"Try `{name}` first"), refusal.data
        assert set(selfstudy.read_progress()[assignment].values()) == {selfstudy.NOT_TRIED}, assignment
    assert "0 of" in selfstudy._view(None)[1] and "fail" not in selfstudy._view(None)[1]
    # a name the learner never defined (its cell not run) is not a try either
    namespace = learner_namespace("01_attention")
    del namespace["softmax"]
    text = printed(selfstudy.self_assess, "01_attention", "softmax", namespace)
    assert text == "Self-check: not tried yet, nothing to check: `softmax` is not defined.\n"


def solution_code(assignment: str, name: str) -> list[str]:
    """The lines of ``name``'s reference answer that the stub does not hold (between nbgrader's markers)."""
    [answer] = [source for grade_id, source in reference.source_cells(assignment) if grade_id == name]
    inside = answer.split("### BEGIN SOLUTION")[1:]
    lines = [line for part in inside for line in part.split("### END SOLUTION")[0].splitlines()]
    return [line for line in lines if len(line.strip()) > 8]


def test_the_reveal_cell_shows_a_button_only_and_the_solution_needs_a_real_try(notebooks_folder):
    """Running the reveal cell (as Run All does) never shows the solution, tried or not: it shows a
    button. The solution itself (the button's act, or ``now=True`` typed by hand) needs a check run
    on the learner's own code."""
    import ipywidgets
    from IPython.display import Markdown

    code = solution_code("01_attention", "softmax")
    for attempt in (None, NO_MAX_SOFTMAX):
        if attempt:
            printed(selfstudy.self_assess, "01_attention", "softmax", learner_namespace("01_attention", attempt))
        [offer] = shown_by(selfstudy.show_solution, "01_attention", "softmax")
        assert isinstance(offer, ipywidgets.VBox)
        note, button, shown = offer.children
        assert "course-show-solution" in button._dom_classes and shown.outputs == ()
        assert not any(line in note.value for line in code)
    printed(selfstudy.self_assess, "01_attention", "softmax", student_stubs("01_attention"))  # back to the stub
    [refusal] = shown_by(selfstudy.show_solution, "01_attention", "softmax", now=True)
    assert "first" in refusal.data and not any(line in refusal.data for line in code)
    printed(selfstudy.self_assess, "01_attention", "softmax", learner_namespace("01_attention", NO_MAX_SOFTMAX))
    [markdown] = shown_by(selfstudy.show_solution, "01_attention", "softmax", now=True)
    assert isinstance(markdown, Markdown) and "your check still fails" in markdown.data
    assert all(line in markdown.data for line in code) and "BEGIN SOLUTION" not in markdown.data


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


# ---------------------------------------------------------------- a check cell in a real kernel

WRONG_AXIS_SOFTMAX = """
def softmax(x, dim=-1):
    e = torch.exp(x - x.amax(dim=0, keepdim=True))
    return e / e.sum(dim=0, keepdim=True)
"""
RIGHT_ATTENTION_WEIGHTS = """
def attention_weights(q, k, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return softmax(scores, dim=-1)
"""


def grade_id(cell) -> str:
    return cell.metadata.get("nbgrader", {}).get("grade_id", "")


def learner_notebook(root, assignment: str, answers: dict | None = None, only: tuple = (), solutions=True):
    """``assignment``'s released notebook in a learner's course folder, with ``answers`` ({grade_id: source})
    written in; with ``only``, just those cells and the set-up cells above them (quicker than the demos)."""
    path = course_copy(root, solutions) / assignment / f"{assignment}.ipynb"
    notebook = nbformat.read(path, as_version=4)
    for cell in notebook.cells:
        cell.source = (answers or {}).get(grade_id(cell), cell.source)
    if only:
        notebook.cells = [c for c in notebook.cells if grade_id(c) in only or grade_id(c).startswith("setup_")]
    nbformat.write(notebook, path)
    return path


def outputs(run, wanted: str) -> list:
    [cell] = [c for c in run.notebook.cells if grade_id(c) == wanted]
    return cell.outputs


def error_text(run, wanted: str) -> str:
    """The error output of cell ``wanted`` as the learner reads it (without the terminal colours)."""
    [error] = [o for o in outputs(run, wanted) if o.output_type == "error"]
    return re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(error.traceback))


def recorded(root, assignment: str) -> dict:
    data = json.loads((root / "notebooks" / ".progress.json").read_text())["assignments"][assignment]
    return {name: entry["status"] for name, entry in data.items()}


def test_an_untouched_notebook_run_cell_by_cell_tries_nothing_and_reveals_nothing(tmp_path):
    """Every cell of the released 01 run in order, errors and all (more than Run All, which stops at the
    first error): each check says in one line that its exercise is not written yet, no traceback; the
    progress stays "not tried"; each reveal cell shows its button and no line of any solution."""
    run = execute(learner_notebook(tmp_path, "01_attention"))
    names = course.exercise_names("01_attention", REPOSITORY / "notebooks" / "01_attention")
    assert recorded(tmp_path, "01_attention") == dict.fromkeys(names, selfstudy.NOT_TRIED)
    for name in names:
        [error] = [o for o in outputs(run, f"test_{name}") if o.output_type == "error"]
        assert error.traceback == [
            f"NotImplementedError: `{name}` is not written yet: replace `raise NotImplementedError()` in its "
            "cell above with your code, run that cell, then this one."
        ]
        [offer] = outputs(run, f"reveal_{name}")
        assert "application/vnd.jupyter.widget-view+json" in offer.data
    saved = json.dumps(run.notebook)
    for name in names:
        for line in solution_code("01_attention", name):
            assert json.dumps(line)[1:-1] not in saved, line
    [view] = outputs(run, "progress")  # updated in place by every check run
    assert "0 of 3 exercises pass" in view.data["text/plain"] and "fails" not in view.data["text/plain"]


def test_in_class_mode_the_stub_is_not_tried_either(tmp_path):
    run = execute(learner_notebook(tmp_path, "00_start_here", only=("dot_scores", "test_dot_scores"), solutions=False))
    assert "Class mode: this cell runs the visible checks only" in run.stream_text()
    assert "`dot_scores` is not written yet" in error_text(run, "test_dot_scores")
    assert recorded(tmp_path, "00_start_here") == {"dot_scores": selfstudy.NOT_TRIED}


def test_a_check_that_fails_because_of_an_earlier_exercise_names_that_exercise(tmp_path):
    """attention_weights is right and passes the hidden checks (run with the reference softmax); its
    visible checks run the learner's softmax, which sums over the wrong axis: the cell says so, with
    softmax's own diagnosis, instead of the visible assert's traceback."""
    answers = {"softmax": WRONG_AXIS_SOFTMAX, "attention_weights": RIGHT_ATTENTION_WEIGHTS}
    only = ("softmax", "attention_weights", "test_attention_weights")
    run = execute(learner_notebook(tmp_path, "01_attention", answers, only))
    text = error_text(run, "test_attention_weights")
    wrong_axis = next(m for m in exercise("01_attention", "softmax").mistakes if m.id == "softmax-wrong-axis")
    assert text.startswith(
        "Your `attention_weights` passes on its own: the grader's hidden checks pass (they run it with the "
        "reference `softmax`). This check also runs your `softmax`, which fails its check:\n"
    )
    assert wrong_axis.name in text and wrong_axis.hint in text and "[mistake:" not in text
    assert "Traceback" not in text and "assert " not in text  # no line of the check's code
    assert "(The visible checks stopped at AssertionError: " in text
    assert recorded(tmp_path, "01_attention") == {"attention_weights": selfstudy.FAILS}


def test_a_check_whose_own_set_up_raises_shows_the_diagnosis_not_a_traceback(tmp_path):
    """08: a KVCache whose update forgets its `return` fails its hidden check (which says what it
    raised, and where), and the visible check's own first step, `full_k, full_v = cache.update(...)`,
    then raises a TypeError inside the check: the learner sees the diagnosis, not that traceback."""
    [source] = [s for g, s in reference.source_cells("08_kv_cache") if g == "KVCache"]
    source = "\n".join(line for line in source.splitlines() if "### " not in line)
    assert source.count("        return k, v\n") == 1
    forgets = source.replace("        return k, v\n", "")
    run = execute(learner_notebook(tmp_path, "08_kv_cache", {"KVCache": forgets}, ("KVCache", "test_KVCache")))
    text = error_text(run, "test_KVCache")
    assert text.startswith("The visible checks could not run to the end (TypeError: "), text
    assert "The self-check above says why: `KVCache` raised TypeError" in text, text
    assert "Traceback" not in text and "full_k, full_v" not in text


def test_while_graded_a_check_cell_is_left_as_nbgrader_runs_it(tmp_path):
    """Under nbgrader (NBGRADER_EXECUTION set) no handler is set: the stub's check shows Python's own
    traceback, and nothing is recorded or offered."""
    path = learner_notebook(tmp_path, "01_attention", only=("softmax", "test_softmax", "reveal_softmax"))
    run = execute(path, env={"NBGRADER_EXECUTION": "autograde"})
    text = error_text(run, "test_softmax")
    assert "Traceback" in text and "raise NotImplementedError()" in text and "not written yet" not in text
    assert outputs(run, "reveal_softmax") == [] and run.stream_text() == ""
    assert not (tmp_path / "notebooks" / ".progress.json").exists()
