"""The course as pip installs it, away from this checkout: its two wheels, built from this checkout,
installed (not editable) into fresh virtual environments.

Used by tests/test_installed_course.py (a learner's notebook 07 and a class graded from a folder
outside the checkout) and tests/test_jupyterhub_cycle.py (the site's hub guide, docs/jupyterhub.md, with real Unix
users). ``environment(base, wheels)`` makes one such environment: the named wheels with
``pip install --no-deps``, the distributions of the commands the course runs from the lock with
``--no-deps`` (``nbgrader``, which the guide runs, and ``alembic``, which nbgrader runs when it
opens a gradebook), and every other dependency from this checkout's venv,
at the lock's versions, through a path entry (a ``.pth`` file naming its site-packages), with a
copy of the data files that nbconvert keeps beside the environment (its templates, in
``share/jupyter/nbconvert``, which the feedback pages need): installing them again would cost
a minute or two and about 1.5 GB per environment. A path entry
is not a site folder, so the ``.pth`` files there, the editable installs of this checkout's two
packages among them, are not read: the wheels' packages are the only course code importable.
tests/test_grader_package.py checks that pip resolves the wheels' dependencies to the locks.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parent.parent
COURSE, GRADER = "attention-transformers-course", "attention-transformers-grader"
COMMANDS = ("nbgrader", "alembic")  # the distributions whose commands the course runs (nbgrader runs alembic)


def run(*command, cwd: Path, timeout: float = 900, check: bool = True, **extra_env) -> subprocess.CompletedProcess:
    """``command`` with this process's environment less its Python settings, plus ``extra_env``."""
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    result = subprocess.run(
        [str(part) for part in command], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env | extra_env
    )
    if check:
        assert result.returncode == 0, f"{command}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


SOURCES = ("pyproject.toml", "LICENSE", "LICENSE-CC-BY-4.0", "course_checks", "course_widgets", "autograder")


def build_wheels(dist: Path) -> dict[str, Path]:
    """{distribution name: wheel} of the course's two distributions, built from a copy of this
    checkout's sources (a build leaves build/ folders in its source tree) with the dev lock's
    setuptools (no build isolation: no index asked, the same build every day)."""
    source = dist.parent / "source"
    source.mkdir()
    for name in SOURCES:
        if (REPOSITORY / name).is_dir():
            ignore = shutil.ignore_patterns("__pycache__", "build", "*.egg-info")
            shutil.copytree(REPOSITORY / name, source / name, ignore=ignore)
        else:
            shutil.copy2(REPOSITORY / name, source)
    for project in (source, source / "autograder"):
        run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet", "-w", dist, project,
            cwd=dist.parent)  # fmt: skip
    [course] = dist.glob("attention_transformers_course-*.whl")
    [grader] = dist.glob("attention_transformers_grader-*.whl")
    return {COURSE: course, GRADER: grader}


def locked(name: str, set_name: str = "student") -> str:
    """The lock's entry of ``name`` (its version and hashes), as a requirements file line."""
    text = (REPOSITORY / "requirements" / f"{set_name}.txt").read_text()
    [entry] = re.findall(rf"^{re.escape(name)}==[^\n]*(?:\n    [^\n]*)*", text, flags=re.MULTILINE)
    return "\n".join(line for line in entry.splitlines() if not line.strip().startswith("#"))


def environment(folder: Path, wheels: list[Path], base_python: str = sys.executable) -> Path:
    """A fresh venv in ``folder`` holding ``wheels`` (installed, not editable), made by ``base_python``
    (a Python 3 of this checkout's version); returns its python."""
    run(base_python, "-m", "venv", folder, cwd=folder.parent)
    python = folder / "bin" / "python"
    commands = folder.parent / f"{folder.name}-commands.txt"
    commands.write_text("".join(locked(name) + "\n" for name in COMMANDS))
    pip = (python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps", "--no-compile")
    if wheels:
        run(*pip, *wheels, cwd=folder)
    run(*pip, "--require-hashes", "-r", commands, cwd=folder)
    where = run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", cwd=folder)
    purelib = Path(where.stdout.strip())
    (purelib / "zz-checkout-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    templates = Path(sysconfig.get_paths()["data"]) / "share" / "jupyter" / "nbconvert"
    shutil.copytree(templates, folder / "share" / "jupyter" / "nbconvert")
    return python
