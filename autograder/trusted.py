"""A snapshot of the functions the checks rely on, taken before student code runs.

nbgrader imports this module when each graded kernel starts (see
``nbgrader_config.py``), so the snapshot holds the real ``torch.allclose`` and
friends. ``replaced()`` then lists what student code has swapped out since: a
check that finds anything refuses to give points, because any comparison it
made afterwards could be fooled.
"""
import builtins
import math
import sys

import numpy
import numpy.testing
import torch
import torch.nn.functional

# Namespaces whose callables must not change. For classes, a new attribute
# counts too: it would shadow a method inherited from the base class.
_MODULES = {
    "torch": torch,
    "torch.nn.functional": torch.nn.functional,
    "torch.linalg": torch.linalg,
    "numpy": numpy,
    "numpy.testing": numpy.testing,
    "math": math,
}
# ipykernel itself swaps builtins such as input() on every execution, so only
# the builtins that the checks call are watched.
_BUILTINS = (
    "abs all any bool callable compile dict enumerate exec float getattr hasattr int isinstance "
    "issubclass iter len list max min next range repr set sorted str sum tuple type vars zip "
    "__import__ __build_class__"
).split()
_CLASSES = {
    "torch.Tensor": torch.Tensor,
    "torch._C.TensorBase": torch._C.TensorBase,
    "numpy.ndarray": numpy.ndarray,
}


def _callables(namespace):
    return {
        name: value
        for name, value in vars(namespace).items()
        if callable(value) and not (name.startswith("_") and not name.startswith("__"))
    }


_snapshot = {label: _callables(obj) for label, obj in {**_MODULES, **_CLASSES}.items()}
_snapshot["builtins"] = {name: getattr(builtins, name) for name in _BUILTINS}
_class_keys = {label: set(vars(cls)) for label, cls in _CLASSES.items()}


def _torch_rewrap(label: str, name: str, now, original) -> bool:
    """True for the one replacement torch makes itself: importing torch._dynamo
    (transformers does, and so do some nn operations, e.g. building a module on
    the meta device) wraps torch.manual_seed once with torch._disable_dynamo."""
    return (label == "torch" and name == "manual_seed" and "torch._dynamo" in sys.modules
            and getattr(now, "__wrapped__", None) is original)


def replaced() -> list[str]:
    """Qualified names of watched functions that differ from the snapshot."""
    changed = []
    for label, obj in {**_MODULES, **_CLASSES, "builtins": builtins}.items():
        now = vars(obj)
        for name, original in _snapshot[label].items():
            if now.get(name) is not original and not _torch_rewrap(label, name, now.get(name), original):
                changed.append(f"{label}.{name}")
    for label, cls in _CLASSES.items():
        changed.extend(f"{label}.{name}" for name in sorted(set(vars(cls)) - _class_keys[label]))
    return changed


# The comparisons the checks use, bound now.
allclose = torch.allclose
isfinite = torch.isfinite
isnan = torch.isnan
as_tensor = torch.as_tensor
