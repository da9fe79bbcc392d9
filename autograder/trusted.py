"""A snapshot of the functions the checks rely on, taken before student code runs.

nbgrader imports this module when each graded kernel starts (see
``nbgrader_config.py``), so the snapshot holds the real ``torch.allclose`` and
friends. ``replaced()`` then lists what student code has swapped out since: a
check that finds anything refuses to give points, because any comparison it
made afterwards could be fooled.
"""
import builtins
import math

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


# Wrappers torch puts on its own functions later: importing torch._dynamo (as
# transformers and torch.compile do) replaces torch.manual_seed by a "disable
# dynamo" wrapper around it. The wrapper keeps the original in __wrapped__ and
# changes no result the checks compare, so it is not tampering.
_TORCH_OWN_WRAPPERS = {("torch", "manual_seed")}


def _unchanged(label: str, name: str, now, original) -> bool:
    if now is original:
        return True
    return (label, name) in _TORCH_OWN_WRAPPERS and getattr(now, "__wrapped__", None) is original


_snapshot = {label: _callables(obj) for label, obj in {**_MODULES, **_CLASSES}.items()}
_snapshot["builtins"] = {name: getattr(builtins, name) for name in _BUILTINS}
_class_keys = {label: set(vars(cls)) for label, cls in _CLASSES.items()}


def replaced() -> list[str]:
    """Qualified names of watched functions that differ from the snapshot."""
    changed = []
    for label, obj in {**_MODULES, **_CLASSES, "builtins": builtins}.items():
        now = vars(obj)
        for name, original in _snapshot[label].items():
            if not _unchanged(label, name, now.get(name), original):
                changed.append(f"{label}.{name}")
    for label, cls in _CLASSES.items():
        changed.extend(f"{label}.{name}" for name in sorted(set(vars(cls)) - _class_keys[label]))
    return changed


# The comparisons the checks use, bound now.
allclose = torch.allclose
isfinite = torch.isfinite
isnan = torch.isnan
as_tensor = torch.as_tensor
