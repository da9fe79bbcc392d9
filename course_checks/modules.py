"""A module made from notebook cells: how reference code handed to a check becomes importable.

The grader builds each assignment's reference from its solution notebook's cells
(``autograder.reference``); under ``./course grade`` a check in the sandbox receives the
cells of the exercise's dependencies and builds the same module here. Both name it
``reference_name(assignment)``, so objects pickled on one side (a reference model in a
case) are found on the other.
"""

from __future__ import annotations

import sys
import types


def reference_name(assignment: str) -> str:
    return f"course_checks.reference_{assignment}"


def module_from_cells(assignment: str, cells) -> types.ModuleType:
    """A fresh module made by executing ``cells`` ((grade_id, source) pairs) in order.

    It is registered in ``sys.modules`` under ``reference_name(assignment)``: dataclasses
    and pickle look a class's module up there.
    """
    module = types.ModuleType(reference_name(assignment))
    sys.modules[module.__name__] = module
    for grade_id, source in cells:
        exec(compile(source, f"<reference {assignment}:{grade_id}>", "exec"), module.__dict__)
    return module
