"""Regenerate ``notebooks/`` (the student versions) from ``solutions/`` with nbgrader.

    python -m autograder.release            # every assignment (./course generate)
    python -m autograder.release 01_attention
    python -m autograder.release --check    # exit 1 when notebooks/ is out of date

Generation runs nbgrader's own ``generate_assignment`` with the repository's
``nbgrader_config.py``, into a scratch course folder with its own gradebook,
so it never touches the instructor's gradebook. ``notebooks/<assignment>`` is
replaced only after generation succeeded.
"""

from __future__ import annotations

import argparse
import filecmp
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from . import REPOSITORY

SOLUTIONS = REPOSITORY / "solutions"
NOTEBOOKS = REPOSITORY / "notebooks"


def assignments() -> list[str]:
    """Assignment folders in solutions/, in course order."""
    return sorted(p.name for p in SOLUTIONS.iterdir() if (p / f"{p.name}.ipynb").is_file())


def course_config(course_root: Path, release_dir: Path):
    """The repository's nbgrader configuration, pointed at another root and release folder."""
    from traitlets.config.loader import PyFileConfigLoader  # here: the grade command starts without it

    config = PyFileConfigLoader("nbgrader_config.py", path=str(REPOSITORY)).load_config()
    config.CourseDirectory.root = str(course_root)
    config.CourseDirectory.release_directory = str(release_dir)
    return config


def generate(assignment_ids: list[str], release_dir: Path) -> None:
    """Run nbgrader generate_assignment for each assignment into ``release_dir``."""
    from nbgrader.apps import NbGraderAPI  # here: the grade command starts without it
    from nbgrader.coursedir import CourseDirectory  # here: the grade command starts without it

    # nbgrader runs `alembic` by name: make this interpreter's scripts findable
    # even when the virtual environment is not activated.
    scripts = str(Path(sys.executable).parent)
    if scripts not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = scripts + os.pathsep + os.environ.get("PATH", "")
    with tempfile.TemporaryDirectory(prefix="course-release-") as scratch:
        config = course_config(Path(scratch), release_dir)
        api = NbGraderAPI(CourseDirectory(config=config), config=config)
        for assignment in assignment_ids:
            result = api.generate_assignment(assignment, force=True, create=True)
            if not result["success"]:
                raise RuntimeError(
                    f"nbgrader generate_assignment {assignment} failed:\n{result['log']}\n{result['error']}"
                )


def differences(generated: Path, committed: Path) -> list[str]:
    """Files that differ between two release trees (notebooks compared as JSON)."""
    problems = []
    names = {p.relative_to(generated) for p in generated.rglob("*") if p.is_file()}
    names |= {p.relative_to(committed) for p in committed.rglob("*") if p.is_file()} if committed.exists() else set()
    for name in sorted(names):
        a, b = generated / name, committed / name
        if not a.exists():
            problems.append(f"{name}: in notebooks/ but not generated from solutions/")
        elif not b.exists():
            problems.append(f"{name}: generated from solutions/ but missing from notebooks/")
        elif name.suffix == ".ipynb":
            if json.loads(a.read_text(encoding="utf-8")) != json.loads(b.read_text(encoding="utf-8")):
                problems.append(f"{name}: differs from what solutions/ generates")
        elif not filecmp.cmp(a, b, shallow=False):
            problems.append(f"{name}: differs from solutions/")
    return problems


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("assignments", nargs="*", help="assignment ids (default: all in solutions/)")
    parser.add_argument("--check", action="store_true", help="only report whether notebooks/ is up to date")
    args = parser.parse_args(argv)
    chosen = args.assignments or assignments()
    with tempfile.TemporaryDirectory(prefix="course-notebooks-") as out:
        out = Path(out)
        generate(chosen, out)
        if args.check:
            problems = [p for a in chosen for p in differences(out / a, NOTEBOOKS / a)]
            for problem in problems:
                print(f"notebooks/{problem}")
            print("notebooks/ is up to date" if not problems else "run ./course generate to update notebooks/")
            return 1 if problems else 0
        for assignment in chosen:
            target = NOTEBOOKS / assignment
            if target.exists():
                shutil.rmtree(target)
            shutil.copytree(out / assignment, target)
            print(f"notebooks/{assignment} regenerated")
        for stale in sorted(set(p.name for p in NOTEBOOKS.iterdir() if p.is_dir()) - set(assignments())):
            shutil.rmtree(NOTEBOOKS / stale)
            print(f"notebooks/{stale} removed (no longer in solutions/)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
