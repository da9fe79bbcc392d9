"""Where the reference solutions come from: the solution notebooks, the one source.

``load(assignment, solutions)`` executes the reference notebook's setup cells
(read-only code cells whose nbgrader ``grade_id`` starts with ``setup``) and its
answer cells, in notebook order, into a fresh module, and returns that module.
There is no second copy of any solution anywhere.

The caller says where the solutions are: the course folder's source directory
(``engine.course.CourseFolder.source``) for the grade command, the ``solutions/``
above a learner's notebook for the in-kernel judge (``local_judge``). The
sandboxed grader reads the reference cells in the trusted process
(``source_cells``) and builds its judges' modules from them (``from_cells``);
only the cells of an exercise's dependencies ever travel into a sandbox.
"""

from __future__ import annotations

import functools
import json
import types
from pathlib import Path

from course_checks.modules import module_from_cells

from . import REPOSITORY
from .cells import nbgrader_of


def reference_cells(notebook: dict):
    """(grade_id, source) of the cells that make up the reference, in order."""
    for cell in notebook["cells"]:
        if cell["cell_type"] != "code":
            continue
        meta = nbgrader_of(cell)
        grade_id = meta.get("grade_id", "")
        answer = meta.get("solution", False) and not meta.get("grade", False)
        setup = meta.get("locked", False) and not meta.get("grade", False) and grade_id.startswith("setup")
        if answer or setup:
            source = cell["source"]
            yield grade_id, "".join(source) if isinstance(source, list) else source


def notebook_path(assignment: str, solutions: Path | None = None) -> Path:
    """``assignment``'s solution notebook in ``solutions``; by default this checkout's ``solutions/``."""
    folder = REPOSITORY / "solutions" if solutions is None else Path(solutions)
    return folder / assignment / f"{assignment}.ipynb"


def source_cells(assignment: str, solutions: Path | None = None) -> list[tuple[str, str]]:
    """(grade_id, source) of the reference cells of ``assignment``, read from the solutions folder."""
    path = notebook_path(assignment, solutions)
    if not path.is_file():
        raise FileNotFoundError(f"no reference notebook for {assignment!r} at {path}")
    return list(reference_cells(json.loads(path.read_text(encoding="utf-8"))))


def from_cells(assignment: str, cells) -> types.ModuleType:
    """The reference module of ``assignment`` made from its cells ((grade_id, source) pairs)."""
    return module_from_cells(assignment, [tuple(cell) for cell in cells])


def load(assignment: str, solutions: Path | None = None) -> types.ModuleType:
    """The reference module of ``assignment`` from the solution notebook in ``solutions`` (built once);
    by default this checkout's ``solutions/``."""
    return _load(notebook_path(assignment, solutions).resolve(), assignment)


@functools.cache
def _load(path: Path, assignment: str) -> types.ModuleType:
    module = from_cells(assignment, source_cells(assignment, path.parent.parent))
    module.__file__ = str(path)
    return module
