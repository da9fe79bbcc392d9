"""Where the reference solutions come from: ``solutions/``, the one source.

``load(assignment)`` executes the reference notebook's setup cells (read-only
code cells whose nbgrader ``grade_id`` starts with ``setup``) and its answer
cells, in notebook order, into a fresh module, and returns that module. There
is no second copy of any solution anywhere.

This is the only place that knows where the reference lives:
``AUTOGRADER_SOLUTIONS`` points it at another folder, and the sandboxed grader
(``autograder.grade``), whose notebooks never see ``solutions/``, reads the
reference cells here (``source_cells``) in the trusted process and hands them to
its workers as data (``provide``); inside the sandbox, ``build`` makes a module
of only the cells a check may reveal (its exercise's dependencies).
"""

import functools
import json
import os
import sys
import types
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parent.parent


def solutions_dir() -> Path:
    return Path(os.environ.get("AUTOGRADER_SOLUTIONS", REPOSITORY / "solutions"))


def reference_cells(notebook: dict):
    """(grade_id, source) of the cells that make up the reference, in order."""
    for cell in notebook["cells"]:
        if cell["cell_type"] != "code":
            continue
        meta = cell.get("metadata", {}).get("nbgrader", {})
        grade_id = meta.get("grade_id", "")
        answer = meta.get("solution", False) and not meta.get("grade", False)
        setup = meta.get("locked", False) and not meta.get("grade", False) and grade_id.startswith("setup")
        if answer or setup:
            source = cell["source"]
            yield grade_id, "".join(source) if isinstance(source, list) else source


_provided: dict[str, list] = {}


def source_cells(assignment: str) -> list[tuple[str, str]]:
    """(grade_id, source) of the reference cells of ``assignment``, read from the solutions folder."""
    path = solutions_dir() / assignment / f"{assignment}.ipynb"
    if not path.is_file():
        raise FileNotFoundError(f"no reference notebook for {assignment!r} at {path}")
    return list(reference_cells(json.loads(path.read_text(encoding="utf-8"))))


def provide(assignment: str, cells) -> None:
    """Use ``cells`` ((grade_id, source) pairs) as the reference of ``assignment`` from now on."""
    _provided[assignment] = [tuple(cell) for cell in cells]
    load.cache_clear()


def build(assignment: str, cells) -> types.ModuleType:
    """A fresh module made by executing ``cells`` in order, registered in ``sys.modules``."""
    module = types.ModuleType(f"autograder.reference_{assignment}")
    sys.modules[module.__name__] = module  # dataclasses and pickle look their module up here
    for grade_id, source in cells:
        exec(compile(source, f"<reference {assignment}:{grade_id}>", "exec"), module.__dict__)
    return module


@functools.cache
def load(assignment: str) -> types.ModuleType:
    if assignment in _provided:
        return build(assignment, _provided[assignment])
    module = build(assignment, source_cells(assignment))
    module.__file__ = str(solutions_dir() / assignment / f"{assignment}.ipynb")
    return module
