"""A snapshot of the functions the checks rely on, taken before student code runs.

Every graded kernel imports it first, through ``kernel_boot`` (see
``nbgrader_config.py``), so the snapshot holds the real ``torch.allclose`` and
friends. ``replaced()`` then lists what student code has swapped out since: a
check that finds anything refuses to give points, because any comparison it
made afterwards could be fooled.
"""

import ast
import base64
import builtins
import copy
import dataclasses
import inspect
import io
import json
import json.decoder
import json.encoder
import math
import pickle
import socket
import sys
import textwrap
import types

import numpy
import numpy.testing
import torch
import torch.nn.functional

from .compat import SHELL_METHODS, tensor_base

# Namespaces whose callables must not change. For classes, a new attribute
# counts too: it would shadow a method inherited from the base class.
_MODULES = {
    "torch": torch,
    "torch.nn.functional": torch.nn.functional,
    "torch.linalg": torch.linalg,
    "numpy": numpy,
    "numpy.testing": numpy.testing,
    "math": math,
    # what the wire to the grader is made of (``verdict`` binds the C parts it uses when it is
    # imported, so a change here has no effect on the wire; it is reported all the same)
    "json": json,
    "json.encoder": json.encoder,
    "json.decoder": json.decoder,
    "base64": base64,
    "pickle": pickle,
    "socket": socket,
    # the standard library the kernel side's cases, probes and substitutes call
    "ast": ast,
    "inspect": inspect,
    "textwrap": textwrap,
    "io": io,
    "copy": copy,
    "dataclasses": dataclasses,
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
    "json.encoder.JSONEncoder": json.encoder.JSONEncoder,
    "json.decoder.JSONDecoder": json.decoder.JSONDecoder,
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
_TORCH_OWN_WRAPPERS = frozenset({("torch", "manual_seed")})


def _unchanged(label: str, name: str, now, original) -> bool:
    if now is original:
        return True
    return (label, name) in _TORCH_OWN_WRAPPERS and getattr(now, "__wrapped__", None) is original


# Attributes Python itself caches on a class: pickling an instance (torch.save, copy.deepcopy) stores
# copyreg's list of slot names as __slotnames__. Their appearance is no tampering.
_INTERPRETER_CACHES = frozenset({"__slotnames__"})
# ... and in a module's globals: any warning, even an ignored one (a ResourceWarning for a socket
# collected while a helper's frame runs), makes ``warnings`` add a __warningregistry__ there.
_MODULE_CACHES = frozenset({"__warningregistry__"})


def _snapshotter():
    """``replaced`` with the snapshot taken now in its closure, as immutable records (no module
    global leads to them: they cannot be edited in place)."""
    watched = types.MappingProxyType({**_MODULES, **_CLASSES, "builtins": builtins})
    classes = types.MappingProxyType(dict(_CLASSES))
    snapshot = {label: _callables(obj) for label, obj in {**_MODULES, **_CLASSES}.items()}
    snapshot["builtins"] = {name: getattr(builtins, name) for name in _BUILTINS}
    snapshot = types.MappingProxyType({label: tuple(found.items()) for label, found in snapshot.items()})
    class_keys = types.MappingProxyType({label: frozenset(vars(cls)) for label, cls in _CLASSES.items()})
    unchanged, caches = _unchanged, _INTERPRETER_CACHES

    def changes() -> list[str]:
        changed = []
        for label, obj in watched.items():
            now = vars(obj)
            for name, original in snapshot[label]:
                if not unchanged(label, name, now.get(name), original):
                    changed.append(f"{label}.{name}")
        for label, cls in classes.items():
            added = set(vars(cls)) - class_keys[label] - caches
            changed.extend(f"{label}.{name}" for name in sorted(added))
        return changed

    return changes


# ---------------------------------------------------------------- the grading helpers
# ``seal`` (called by ``kernel_boot`` once the helpers are loaded, before any
# student code) records the helpers as they are: each module's place in
# sys.modules, every name in it, and for every function (module-level, or a
# method of a class defined there) the function object, its code, defaults and
# closure; and the IPython shell's execution and traceback methods (``_SHELL``).
# Replacing a helper (``checks.observe = ...``), a method
# (``verdict.Link.result = ...``), a code object (``f.__code__ = ...``), a module
# (``sys.modules["autograder.verdict"] = ...``), a shell method
# (``get_ipython().run_cell = ...``) or this detector itself, by any route
# (setattr, vars(), exec of a built string), shows up in ``replaced()``.
#
# The records are immutable (tuples, frozensets, mapping proxies) and held in the
# closure of ``seal`` and ``_helper_changes``, not in a module global: no name of
# this module leads to them, so they cannot be edited in place. ``seal`` records
# once; a second call changes nothing and is itself reported.

# What a notebook could swap on the shell, its kernel or their session (``compat.SHELL_METHODS``).
_SHELL_METHODS = types.MappingProxyType(dict(SHELL_METHODS))


def _function_state(function) -> tuple:
    return (function, function.__code__, function.__defaults__, function.__kwdefaults__, function.__closure__)


def _module_state(module) -> dict:
    state = {}
    # a copy first (made in one step under the GIL): another thread's warning can add
    # __warningregistry__ to a module while this loop walks it ("dictionary changed size")
    for name, value in vars(module).copy().items():
        if name in _MODULE_CACHES:
            continue
        state[name] = value
        if isinstance(value, types.FunctionType):
            state[f"{name}()"] = _function_state(value)
        elif isinstance(value, type) and getattr(value, "__module__", None) == module.__name__:
            state[f"{name}.*"] = frozenset(vars(value)) - _INTERPRETER_CACHES
            for attribute, member in vars(value).copy().items():
                if isinstance(member, (staticmethod, classmethod)):
                    member = member.__func__
                if isinstance(member, types.FunctionType):
                    state[f"{name}.{attribute}()"] = _function_state(member)
    return state


def _shell_parts() -> dict:
    """{"shell": the IPython shell, "kernel": its kernel, "session": their session} (those that exist)."""
    try:
        shell = get_ipython()  # noqa: F821 (defined inside IPython only)
    except NameError:
        return {}
    kernel = getattr(shell, "kernel", None)
    parts = {"shell": shell, "kernel": kernel, "session": getattr(kernel, "session", None)}
    return {label: part for label, part in parts.items() if part is not None}


def _shell_state(parts: dict) -> dict:
    """For each watched method: what the instance's class has under that name, and what the
    instance holds of its own (which would shadow it); and the kernel's handler of each message."""
    state = {}
    for label, part in parts.items():
        for name in _SHELL_METHODS[label]:
            state[f"{label}.{name}"] = (getattr(type(part), name, None), vars(part).get(name))
    handlers = getattr(parts.get("kernel"), "shell_handlers", None)
    if isinstance(handlers, dict):
        for name, handler in handlers.items():
            state[f"kernel.shell_handlers[{name!r}]"] = (getattr(handler, "__func__", handler),)
    return state


def _same(before, after) -> bool:
    if isinstance(before, frozenset):
        return before == after
    if isinstance(before, tuple):
        return isinstance(after, tuple) and len(after) == len(before) and all(a is b for a, b in zip(before, after))
    return before is after


_MISSING_STATE = object()


def _sealer():
    """(``seal``, ``changes``) sharing the records in their closure (each a tuple of mapping proxies)."""
    sealed = None  # ((label, module, its state), ...), recorded once
    shell = None  # (the shell's parts, their state), taken with the seal
    again = False  # seal was called a second time

    def seal(*modules) -> None:
        """Record the grading helpers ``modules`` as they are now, and the shell's methods (once)."""
        nonlocal sealed, shell, again
        if sealed is not None:
            again = True
            return
        sealed = tuple(
            (module.__name__, module, types.MappingProxyType(_module_state(module)))
            for module in dict.fromkeys(modules)
        )
        parts = _shell_parts()
        shell = (types.MappingProxyType(parts), types.MappingProxyType(_shell_state(parts)))

    def changes() -> list[str]:
        changed = ["course_checks.trusted.seal (called again after the kernel started)"] if again else []
        for label, module, state in sealed or ():
            if sys.modules.get(label) is not module:
                changed.append(f"sys.modules[{label!r}]")
            now = _module_state(module)
            for key in sorted(set(state) | set(now)):
                if not _same(state.get(key, _MISSING_STATE), now.get(key, _MISSING_STATE)):
                    changed.append(f"{label}.{key.rstrip('()*').rstrip('.')}")
        if shell is not None:
            parts, state = shell
            now = _shell_state(parts)
            for key in sorted(set(state) | set(now)):
                if not _same(state.get(key, _MISSING_STATE), now.get(key, _MISSING_STATE)):
                    changed.append(f"IPython {key}")
        return list(dict.fromkeys(changed))

    return seal, changes


seal, _helper_changes = _sealer()
_library_changes = _snapshotter()


def _replacer(helper_changes, library_changes):
    def replaced() -> list[str]:
        """Qualified names of watched functions that differ from the snapshot."""
        return helper_changes() + library_changes()

    return replaced


# Both halves held in its closure: rebinding ``_helper_changes`` or ``_library_changes`` here
# changes nothing it reports (and is itself a change to this module that it reports).
replaced = _replacer(_helper_changes, _library_changes)


# The comparisons the checks use, bound now.
allclose = torch.allclose
isfinite = torch.isfinite
isnan = torch.isnan
as_tensor = torch.as_tensor
