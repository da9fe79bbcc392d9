"""The grading package as an instructor's JupyterHub installs it: `pip install ./autograder` (and the course).

Into a fresh venv (no system packages): pip, from its configured sources and the two built wheels
(the grader's and the learner's kernel side it depends on), resolves the grader, constrained to the
grader lock (`-c`), to exactly the lock's versions (a dry run: installing them all again would cost
minutes and a gigabyte here). With the lock as constraints the result never depends on what the
index publishes later: it fails when the grader's pins disagree with the lock or the resolution
needs a package the lock lacks. torch comes from where ./course takes it (tools/torch_source.py).
The wheels are built with the dev lock's setuptools (no build isolation, so no index either), and
installed; and
from a folder outside the checkout the installed `autograder` (not the checkout's) imports
every part of ``./course grade``, with those same versions (this checkout's .venv) on its path,
and runs its command line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parent.parent
# every module ./course grade imports, in each layer, and the Postgres driver
IMPORTS = (
    "autograder.grade, autograder.release, autograder.local_judge, course_checks.kernel_boot, course_checks.verdict, "
    "autograder.engine.course, autograder.engine.collect, autograder.engine.runners, "
    "autograder.engine.distributed, autograder.engine.writer, autograder.engine.report, "
    "autograder.worker.pipeline, autograder.sandboxing.bubblewrap, autograder.sandboxing.zygote, "
    "autograder.exercises.attention, course_widgets, nbgrader.apps, dask.distributed, psycopg, torch"
)


def run(*command, cwd: Path, timeout: float = 900, **extra_env) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    result = subprocess.run(
        [str(part) for part in command], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env | extra_env
    )
    assert result.returncode == 0, f"{command}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


def site_packages(python: Path) -> str:
    return run(
        python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", cwd=python.parent
    ).stdout.strip()


def lock_as_constraints(set_name: str, path: Path) -> Path:
    """The lock's `name==version ; marker` lines without their hashes: a hash in a constraints file
    turns on pip's hash-checking mode for everything, which the freshly built wheel cannot satisfy."""
    from test_environment import lock

    path.write_text("".join(f"{requirement}\n" for requirement in lock(set_name)))
    return path


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    from installed_course import COURSE, GRADER, build_wheels

    from tools import torch_source

    base = tmp_path_factory.mktemp("package")
    # built from a copy of the sources with the dev lock's setuptools (no build isolation: no index asked)
    (base / "dist").mkdir()
    wheels = build_wheels(base / "dist")
    wheel, course_wheel = wheels[GRADER], wheels[COURSE]
    run(sys.executable, "-m", "venv", base / "venv", cwd=base)
    python = base / "venv" / "bin" / "python"
    pip = (python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check")
    torch = torch_source.choose(torch_source.pip_report(str(python), torch_source.torch_pin()))
    cpu_index = ("--extra-index-url", torch_source.CPU_INDEX) if torch.use_cpu_index else ()
    constraints = lock_as_constraints("grader", base / "grader-constraints.txt")
    report = base / "report.json"
    run(
        *pip,
        "--dry-run",
        "--ignore-installed",
        "--report",
        report,
        "-c",
        constraints,
        "--find-links",
        base / "dist",
        *cpu_index,
        wheel,
        cwd=base,
    )
    report = json.loads(report.read_text())
    run(*pip, "--no-deps", "--no-compile", wheel, course_wheel, cwd=base)
    outside = base / "elsewhere"
    outside.mkdir()
    return python, wheel, report, outside


def test_pip_install_grader_extra_resolves_to_the_grader_lock(installed):
    from test_environment import course_version, locked_versions, pins

    _, _, report, _ = installed
    resolved = {
        item["metadata"]["name"].lower().replace("_", "-"): item["metadata"]["version"] for item in report["install"]
    }
    assert resolved.pop("attention-transformers-course") == course_version()
    assert resolved.pop("attention-transformers-grader") == course_version()
    assert resolved.pop("torch").split("+")[0] == pins("grader")["torch"]  # the lock leaves torch out
    assert resolved == {name.replace("_", "-"): version for name, version in locked_versions("grader").items()}


def test_the_wheel_holds_every_grading_subpackage(installed):
    _, wheel, _, _ = installed
    names = zipfile.ZipFile(wheel).namelist()
    for package in (
        "autograder",
        "autograder/engine",
        "autograder/worker",
        "autograder/sandboxing",
        "autograder/exercises",
    ):
        assert f"{package}/__init__.py" in names, package
    # every folder of the package is in the wheel (autograder/pyproject.toml lists them by hand)
    for init in (REPOSITORY / "autograder").rglob("__init__.py"):
        if "build" in init.relative_to(REPOSITORY / "autograder").parts:
            continue  # what a build in place leaves
        assert f"autograder/{init.relative_to(REPOSITORY / 'autograder')}" in names, init
    assert not [name for name in names if name.startswith(("course_widgets/", "course_checks/"))]


def test_the_installed_package_imports_every_part_of_the_grader(installed):
    python, _, _, outside = installed
    # the dependencies: this checkout's .venv, at the lock's versions (a plain path entry: its .pth
    # files, the editable install of the checkout among them, are not read)
    result = run(
        python,
        "-c",
        f"import {IMPORTS}; import autograder; print(autograder.__file__)",
        cwd=outside,
        PYTHONPATH=site_packages(Path(sys.executable)),
    )
    assert Path(result.stdout.strip()).is_relative_to(python.parent.parent), result.stdout  # not the checkout's


def test_the_installed_grade_command_runs(installed):
    python, _, _, outside = installed
    result = run(
        python, "-m", "autograder.grade", "--help", cwd=outside, PYTHONPATH=site_packages(Path(sys.executable))
    )
    assert "--db" in result.stdout and "--scheduler" in result.stdout
