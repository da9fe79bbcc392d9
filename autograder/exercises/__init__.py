"""Per notebook, what each exercise is checked on and the mistakes it can name.

The module for assignment ``NN_topic`` is ``autograder.exercises.topic``
(``01_attention`` -> ``attention``). It sets ``ASSIGNMENT`` and ``EXERCISES``,
a dict of ``catalogue.Exercise`` by name; adding a notebook's module touches no
other file.
"""

import importlib
import re


def module_for(assignment: str):
    topic = re.sub(r"^\d+_", "", assignment)
    module = importlib.import_module(f"{__name__}.{topic}")
    covered = getattr(module, "ASSIGNMENT", None)  # ``catalogue`` (the types) covers none
    if covered != assignment:
        raise LookupError(f"{module.__name__} covers {covered or 'no assignment'}, not {assignment}")
    return module


def exercise(assignment: str, name: str):
    try:
        return module_for(assignment).EXERCISES[name]
    except (ImportError, KeyError):
        raise LookupError(f"no checks are registered for {assignment}/{name}") from None
