"""The learner's set as pip installs it: the root's wheel (course_checks, course_widgets) in a fresh venv.

It is what a class student installs: it must run the released notebooks' check cells (class mode:
visible checks and the progress view), hold no grader (``import autograder.exercises`` fails), and
hold nothing that computes a reference answer. For the last, every exercise's reference outputs on
its own cases are computed here (the grader side), and in the fresh venv every function of every
module of the installed packages is called on every function-exercise's cases: none may reproduce
the reference. Classes and functions named after an exercise are refused outright.

The fresh venv gets its third-party dependencies from this checkout's venv as a plain path entry
(installing torch again would cost minutes and a gigabyte): its ``.pth`` files, the editable
installs of this checkout's two packages among them, are not read, so only the wheel's packages
are importable.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import zipfile
from pathlib import Path

import nbformat
import pytest
import torch

from autograder import reference
from autograder.exercises import module_for
from course_checks.cases import Case

REPOSITORY = Path(__file__).resolve().parent.parent
COURSE = sorted(p.name for p in (REPOSITORY / "solutions").iterdir() if (p / f"{p.name}.ipynb").is_file())


def run(*command, cwd: Path, timeout: float = 600, **extra_env) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    result = subprocess.run(
        [str(part) for part in command], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env | extra_env
    )
    assert result.returncode == 0, f"{command}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


@pytest.fixture(scope="module")
def student_set(tmp_path_factory):
    """(python, wheel, environment) of the fresh venv that holds only the learner's set."""
    base = tmp_path_factory.mktemp("student-set")
    run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", base / "dist", REPOSITORY, cwd=base)
    [wheel] = (base / "dist").glob("*.whl")
    run(sys.executable, "-m", "venv", base / "venv", cwd=base)
    python = base / "venv" / "bin" / "python"
    run(python, "-m", "pip", "install", "--quiet", "--no-deps", "--no-compile", wheel, cwd=base)
    dependencies = run(
        sys.executable, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", cwd=base
    ).stdout.strip()
    return python, wheel, {"PYTHONPATH": dependencies}


def test_the_wheel_holds_the_kernel_side_and_the_widgets_and_no_grader(student_set):
    _, wheel, _ = student_set
    names = zipfile.ZipFile(wheel).namelist()
    assert "course_checks/checks.py" in names and "course_widgets/base.py" in names
    assert not [name for name in names if name.startswith("autograder/")]


def test_the_grader_cannot_be_imported_there(student_set, tmp_path):
    python, _, env = student_set
    code = (
        "import importlib.util, course_checks.kernel_boot, course_widgets\n"
        "for name in ('autograder', 'autograder.exercises', 'autograder.local_judge'):\n"
        "    try:\n"
        "        spec = importlib.util.find_spec(name)\n"
        "    except ModuleNotFoundError:\n"
        "        spec = None\n"
        "    print(name, spec is not None)\n"
        "import course_checks; print(course_checks.__file__)"
    )
    lines = run(python, "-c", code, cwd=tmp_path, **env).stdout.splitlines()
    assert lines[:3] == ["autograder False", "autograder.exercises False", "autograder.local_judge False"]
    assert Path(lines[3]).is_relative_to(python.parent.parent)  # the wheel's copy, not this checkout's


MISSING_GRADER_CHECK = """
from course_checks.checks import CheckFailed, check
try:
    check("01_attention", "softmax", {})
except CheckFailed as failure:
    print(failure)
"""


def test_autograding_beside_solutions_without_the_grader_names_the_missing_package(student_set, tmp_path):
    """The instructor's own stock ``nbgrader autograde`` in an environment set up for students (the
    course's wheel only) with ``solutions/`` present: every hidden check fails and says the grader
    package is missing, not that the checks "run when your instructor grades". Outside autograde (a
    student's Validate, self-study without the grader) the class-mode message stays."""
    python, _, env = student_set
    (tmp_path / "solutions" / "01_attention").mkdir(parents=True)
    source = REPOSITORY / "solutions" / "01_attention" / "01_attention.ipynb"
    (tmp_path / "solutions" / "01_attention" / "01_attention.ipynb").write_bytes(source.read_bytes())
    folder = tmp_path / "autograded" / "alice" / "01_attention"
    folder.mkdir(parents=True)
    graded = run(python, "-c", MISSING_GRADER_CHECK, cwd=folder, NBGRADER_EXECUTION="autograde", **env).stdout
    assert (
        "this environment lacks the grader package (attention-transformers-grader): install it where you grade"
        in graded
    ), graded
    assert "when your instructor grades" not in graded
    validated = run(python, "-c", MISSING_GRADER_CHECK, cwd=folder, NBGRADER_EXECUTION="validate", **env).stdout
    assert "run when your instructor grades" in validated and "lacks the grader" not in validated


def _plain(value):
    """``value`` if it is made of tensors, numbers and strings only (what a plain function takes)."""
    if isinstance(value, (torch.Tensor, int, float, str, bool)) or value is None:
        return True
    if isinstance(value, (tuple, list)):
        return all(_plain(item) for item in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    return False


def function_exercises() -> dict:
    """{assignment/exercise: [(args, kwargs, expected)]}: every exercise whose cases are plain calls."""
    found = {}
    for assignment in COURSE:
        ref = reference.load(assignment)
        for name, exercise in module_for(assignment).EXERCISES.items():
            target = getattr(ref, exercise.target or name)
            cases = [c for c in exercise.cases(ref) if type(c) is Case and _plain((c.args, c.kwargs))]
            if isinstance(target, type) or not cases:
                continue
            found[f"{assignment}/{name}"] = [(c.args, c.kwargs, c.run(target)) for c in cases]
    return found


SCAN = r"""
import importlib, inspect, pickle, pkgutil, sys, warnings
import torch

warnings.simplefilter("ignore")
exercises, names = pickle.load(open(sys.argv[1], "rb"))
modules = []
for package in ("course_checks", "course_widgets"):
    root = importlib.import_module(package)
    modules.append(root)
    for info in pkgutil.walk_packages(root.__path__, package + "."):
        modules.append(importlib.import_module(info.name))
callables, named = {}, []
for module in modules:
    for attribute, value in vars(module).items():
        if getattr(value, "__module__", None) != module.__name__:
            continue  # imported from elsewhere (torch, the standard library)
        if attribute in names:
            named.append(f"{module.__name__}.{attribute}")
        if inspect.isfunction(value):
            callables[f"{module.__name__}.{attribute}"] = value
        elif inspect.isclass(value):
            for member, function in vars(value).items():
                if member in names:
                    named.append(f"{module.__name__}.{attribute}.{member}")


def same(a, b):
    if isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and a.shape == b.shape and a.dtype == b.dtype and bool(
            torch.allclose(a.double(), b.double(), atol=1e-6, rtol=1e-5, equal_nan=True))
    if isinstance(b, (tuple, list)):
        return isinstance(a, (tuple, list)) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


reproduced = []
for label, function in callables.items():
    for exercise, cases in exercises.items():
        try:
            if all(same(function(*args, **kwargs), expected) for args, kwargs, expected in cases):
                reproduced.append(f"{label} computes {exercise}")
        except Exception:
            pass
print(f"modules {len(modules)} functions {len(callables)} exercises {len(exercises)}")
print("named " + repr(named))
print("reproduced " + repr(reproduced))
"""


def test_nothing_in_it_computes_a_reference_answer(student_set, tmp_path):
    python, _, env = student_set
    exercises = function_exercises()
    names = {name.split("/")[1] for name in exercises} | {
        exercise.target or name for a in COURSE for name, exercise in module_for(a).EXERCISES.items()
    }
    data = tmp_path / "exercises.pkl"
    data.write_bytes(pickle.dumps((exercises, names)))
    (tmp_path / "scan.py").write_text(SCAN)
    out = run(python, tmp_path / "scan.py", data, cwd=tmp_path, MPLBACKEND="Agg", **env).stdout.splitlines()
    counts, named, reproduced = out[-3], out[-2], out[-1]
    print(counts)  # e.g. modules 20 functions 120 exercises 25: the scan did reach them all
    assert len(exercises) >= 15 and int(counts.split()[3]) >= 30, counts
    assert named == "named []", named
    assert reproduced == "reproduced []", reproduced


def kernel_spec(python: Path, env: dict, folder: Path) -> dict:
    """A Jupyter data folder whose kernel ``student-set`` is the fresh venv's Python."""
    spec = folder / "kernels" / "student-set"
    spec.mkdir(parents=True)
    argv = [str(python), "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(json.dumps({"argv": argv, "language": "python", "env": env}))
    return {"JUPYTER_PATH": str(folder)}


@pytest.mark.parametrize("assignment", ["01_attention", "08_kv_cache"])
def test_released_check_cells_run_in_class_mode_there(student_set, tmp_path, assignment, monkeypatch):
    """A class student's folder: the released notebook (answers written in from the reference), no
    solutions/, the wheel's packages: every check cell runs its visible checks and says so."""
    from nbclient import NotebookClient

    python, _, env = student_set
    for key, value in kernel_spec(python, env, tmp_path / "jupyter").items():
        monkeypatch.setenv(key, value)
    folder = tmp_path / "notebooks" / assignment
    folder.mkdir(parents=True)
    notebook = nbformat.read(REPOSITORY / "notebooks" / assignment / f"{assignment}.ipynb", as_version=4)
    answers = dict(reference.source_cells(assignment))
    for cell in notebook.cells:
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if cell.metadata.get("nbgrader", {}).get("solution") and grade_id in answers:
            cell.source = answers[grade_id]
    # nothing of the checkout beside it: the data a notebook reads (08's corpus) comes with the wheel
    client = NotebookClient(
        notebook,
        timeout=300,
        kernel_name="student-set",
        allow_errors=True,
        resources={"metadata": {"path": str(folder)}},
    )
    client.execute()
    errors = [
        f"{o.ename}: {o.evalue}" for c in notebook.cells for o in c.get("outputs", []) if o.output_type == "error"
    ]
    text = "".join(o.get("text", "") for c in notebook.cells for o in c.get("outputs", []) if o.output_type == "stream")
    assert errors == []
    checked = module_for(assignment).EXERCISES
    assert text.count("Class mode: this cell runs the visible checks only") == len(checked)
    progress = json.loads((tmp_path / "notebooks" / ".progress.json").read_text())["assignments"][assignment]
    assert {name: record["status"] for name, record in progress.items()} == dict.fromkeys(checked, "passes")
