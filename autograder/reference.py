"""Where the reference solutions come from: ``solutions/``, the one source.

``load(assignment)`` executes the reference notebook's setup cells (read-only
code cells whose nbgrader ``grade_id`` starts with ``setup``) and its answer
cells, in notebook order, into a fresh module, and returns that module. There
is no second copy of any solution anywhere.

This is the only place that knows where the reference lives. The grading
sandbox can point it elsewhere with ``AUTOGRADER_SOLUTIONS``.
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


@functools.cache
def load(assignment: str) -> types.ModuleType:
    path = solutions_dir() / assignment / f"{assignment}.ipynb"
    if not path.is_file():
        raise FileNotFoundError(f"no reference notebook for {assignment!r} at {path}")
    notebook = json.loads(path.read_text(encoding="utf-8"))
    module = types.ModuleType(f"autograder.reference_{assignment}")
    module.__file__ = str(path)
    sys.modules[module.__name__] = module  # dataclasses look their module up here
    for grade_id, source in reference_cells(notebook):
        exec(compile(source, f"<reference {assignment}:{grade_id}>", "exec"), module.__dict__)
    return module
