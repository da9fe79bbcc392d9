"""A module made from notebook cells.

The grader builds each assignment's reference from its solution notebook's set-up and answer
cells (``autograder.reference``: a module named ``reference_name(assignment)``, compiled as
``<reference ...>``); under ``./course grade`` a check in the sandbox receives the set-up
cells only (they are in the released notebook) and builds them here, as
``course_checks.setup_<assignment>`` (``proxies.setup_module``). Dataclasses look a class's
module up in ``sys.modules``, so both are registered there.
"""

from __future__ import annotations

import sys
import types


def reference_name(assignment: str) -> str:
    return f"course_checks.reference_{assignment}"


def module_from_cells(assignment: str, cells, kind: str = "reference") -> types.ModuleType:
    """A fresh module made by executing ``cells`` ((grade_id, source) pairs) in order.

    It is registered in ``sys.modules`` as ``course_checks.<kind>_<assignment>``, and each cell
    is compiled as the file ``<kind assignment:grade_id>``.
    """
    module = types.ModuleType(f"course_checks.{kind}_{assignment}")
    sys.modules[module.__name__] = module
    for grade_id, source in cells:
        exec(compile(source, f"<{kind} {assignment}:{grade_id}>", "exec"), module.__dict__)
    return module
