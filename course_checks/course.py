"""Where the course's folders are, seen from a learner's kernel (which runs in a notebook's folder).

- the folder that holds the notebook folders (``notebooks/`` in a clone, wherever a class student
  keeps them): the progress file lives there, and the graded exercises are read from the
  notebooks themselves (each check cell's nbgrader id is ``test_<exercise>``);
- ``solutions/`` above the working folder (a clone or Binder): self-study mode, and the reference
  that stock nbgrader's hidden checks compare with. A class student has none.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

ASSIGNMENT_FOLDER = re.compile(r"\d\d_\w+$")


def notebooks_root(here: Path | None = None) -> Path:
    """The folder holding the notebook folders: the parent of ``NN_topic/`` when the kernel runs in one."""
    here = Path.cwd() if here is None else here
    return here.parent if ASSIGNMENT_FOLDER.match(here.name) else here


def solutions_root(assignment: str, here: Path | None = None) -> Path | None:
    """The nearest ``solutions/`` above ``here`` that holds ``assignment``'s solution notebook, if any."""
    here = (Path.cwd() if here is None else here).resolve()
    for folder in (here, *here.parents):
        if (folder / "solutions" / assignment / f"{assignment}.ipynb").is_file():
            return folder / "solutions"
    return None


def graded_exercises(notebook: Path) -> list[str]:
    """The exercises a notebook grades, in order: its check cells' ids without ``test_``."""
    try:
        cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    except (OSError, ValueError, KeyError, TypeError):
        return []
    names = []
    for cell in cells:
        meta = cell.get("metadata", {}).get("nbgrader", {}) if isinstance(cell, dict) else {}
        grade_id = str(meta.get("grade_id", ""))
        if meta.get("grade") and cell.get("cell_type") == "code" and grade_id.startswith("test_"):
            names.append(grade_id.removeprefix("test_"))
    return names


def exercise_names(assignment: str, here: Path | None = None) -> list[str]:
    """The graded exercises of ``assignment``, read from its notebook beside this one."""
    return graded_exercises(notebooks_root(here) / assignment / f"{assignment}.ipynb")


def assignments(here: Path | None = None) -> list[str]:
    """Every assignment folder beside this notebook's whose notebook grades something, in course order."""
    root = notebooks_root(here)
    try:
        folders = sorted(p for p in root.iterdir() if p.is_dir() and ASSIGNMENT_FOLDER.match(p.name))
    except OSError:
        return []
    return [p.name for p in folders if graded_exercises(p / f"{p.name}.ipynb")]
