"""A snapshot of the functions the checks rely on, taken before student code runs.

Every graded kernel imports it first, through ``kernel_boot`` (see
``nbgrader_config.py``), so the snapshot holds the real ``torch.allclose`` and
friends. ``replaced()`` then lists what student code has swapped out since: a
check that finds anything refuses to give points, because any comparison it
made afterwards could be fooled.
"""

import base64
import builtins
import json
import math
import pickle
import socket
import sys
import types

import numpy
import numpy.testing
import torch
import torch.nn.functional

from .compat import tensor_base

# Namespaces whose callables must not change. For classes, a new attribute
# counts too: it would shadow a method inherited from the base class.
_MODULES = {
    "torch": torch,
    "torch.nn.functional": torch.nn.functional,
    "torch.linalg": torch.linalg,
    "numpy": numpy,
    "numpy.testing": numpy.testing,
    "math": math,
    # what the wire to the grader is made of
    "json": json,
    "base64": base64,
    "pickle": pickle,
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
    "torch._C.TensorBase": tensor_base(),
    "numpy.ndarray": numpy.ndarray,
    "socket.socket": socket.socket,
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
# Attributes Python itself caches on a class: pickling an instance (torch.save, copy.deepcopy) stores
# copyreg's list of slot names as __slotnames__. Their appearance is no tampering.
_INTERPRETER_CACHES = {"__slotnames__"}


# ---------------------------------------------------------------- the grading helpers
# ``seal`` (called by ``kernel_boot`` once the helpers are loaded, before any
# student code) records the helpers as they are: each module's place in
# sys.modules, every name in it, and for every function (module-level, or a
# method of a class defined there) the function object, its code, defaults and
# closure. Replacing a helper (``checks.observe = ...``), a method
# (``verdict.Link.result = ...``), a code object (``f.__code__ = ...``), a module
# (``sys.modules["autograder.verdict"] = ...``) or this detector itself, by any
# route (setattr, vars(), exec of a built string), shows up in ``replaced()``.
_helpers: dict[str, tuple] = {}


def _function_state(function) -> tuple:
    return (function, function.__code__, function.__defaults__, function.__kwdefaults__, function.__closure__)


def _module_state(module) -> dict:
    state = {}
    for name, value in vars(module).items():
        state[name] = value
        if isinstance(value, types.FunctionType):
            state[f"{name}()"] = _function_state(value)
        elif isinstance(value, type) and getattr(value, "__module__", None) == module.__name__:
            state[f"{name}.*"] = frozenset(vars(value)) - _INTERPRETER_CACHES
            for attribute, member in vars(value).items():
                if isinstance(member, (staticmethod, classmethod)):
                    member = member.__func__
                if isinstance(member, types.FunctionType):
                    state[f"{name}.{attribute}()"] = _function_state(member)
    return state


def seal(*modules) -> None:
    """Record the grading helpers ``modules`` as they are now (once per module)."""
    for module in modules:
        if module.__name__ not in _helpers:
            _helpers[module.__name__] = (module, _module_state(module))


def _helper_changes() -> list[str]:
    changed = []
    for label, (module, state) in _helpers.items():
        if sys.modules.get(label) is not module:
            changed.append(f"sys.modules[{label!r}]")
        now = _module_state(module)
        for key in sorted(set(state) | set(now)):
            before, after = state.get(key, _MISSING_STATE), now.get(key, _MISSING_STATE)
            same = (
                before is after
                if not isinstance(before, (tuple, frozenset))
                else (
                    before == after
                    if isinstance(before, frozenset)
                    else (
                        isinstance(after, tuple)
                        and len(after) == len(before)
                        and all(a is b for a, b in zip(before, after))
                    )
                )
            )
            if not same:
                changed.append(f"{label}.{key.rstrip('()*').rstrip('.')}")
    return list(dict.fromkeys(changed))


_MISSING_STATE = object()


def replaced() -> list[str]:
    """Qualified names of watched functions that differ from the snapshot."""
    changed = _helper_changes()
    for label, obj in {**_MODULES, **_CLASSES, "builtins": builtins}.items():
        now = vars(obj)
        for name, original in _snapshot[label].items():
            if not _unchanged(label, name, now.get(name), original):
                changed.append(f"{label}.{name}")
    for label, cls in _CLASSES.items():
        added = set(vars(cls)) - _class_keys[label] - _INTERPRETER_CACHES
        changed.extend(f"{label}.{name}" for name in sorted(added))
    return changed


# The comparisons the checks use, bound now.
allclose = torch.allclose
isfinite = torch.isfinite
isnan = torch.isnan
as_tensor = torch.as_tensor
