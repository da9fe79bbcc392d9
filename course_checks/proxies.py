"""Under ``./course grade``: what a check gets from the grader outside, and the substitutes that
answer for the reference without bringing it into the kernel.

While an exercise is checked, the exercises it builds on must be the reference's, so that a
wrong ``softmax`` costs the ``softmax`` points only. No answer of the notebook being graded
ever enters this kernel (no object, source, bytecode or file of it): each one the check needs
is a *substitute* here, and the grader, outside the sandbox, computes the reference's answer
from the inputs the substitute is given:

- a function: its arguments go out, its result comes back as data;
- an ``nn.Module`` class: an instance holds its weights here, made like the reference's
  (the grader builds one from this kernel's random state and hands back the weights and
  sub-modules, so ``load_state_dict`` and the parameter names work); its ``forward`` sends the
  weights and the inputs out, and the reference module computes the output there;
- any other class (a cache): the instance lives on the grader's side, and its methods and
  attributes are answered over the wire;
- a dataclass (a config): its fields are data here; the grader checks them as the
  reference would (``__post_init__``).

The grader answers a substitute only while the check that handed it over runs, in its own
test cell, and only once the exercise it stands for has been checked itself. What the
notebook's read-only set-up cells define (restated from earlier notebooks, so in the released
notebook already) comes as their code and runs here.

``RemoteJudge`` is the judge ``checks`` uses under ``./course grade``: ``begin`` builds the
check's ``Shipment`` from the grader's reply (the set-up code, a ``Given`` of substitutes, and
the cases and probes, pickled by the trusted side and unpacked here with only the kernel
side's own classes, ``unpack``).
"""

from __future__ import annotations

import _pickle
import builtins
import copy
import dataclasses
import io
import itertools
import os
import sys
import types
import typing
import weakref

import torch
from torch import nn

from . import trusted, verdict
from .cases import Shipment
from .modules import module_from_cells

# Bound now (the warm interpreter imports this module before any notebook): a notebook that
# swaps ``sys.settrace`` / ``sys.gettrace`` afterwards changes nothing here.
_settrace, _gettrace = sys.settrace, sys.gettrace

# Exceptions of the reference that reach the learner's code as themselves; others as RuntimeError.
_ERRORS = {
    name: getattr(builtins, name)
    for name in (
        "ArithmeticError",
        "AssertionError",
        "AttributeError",
        "IndexError",
        "KeyError",
        "LookupError",
        "MemoryError",
        "NotImplementedError",
        "OverflowError",
        "RuntimeError",
        "TypeError",
        "ValueError",
        "ZeroDivisionError",
    )
}
_DUNDERS = ("__len__", "__getitem__", "__setitem__", "__contains__", "__call__")
MAX_HOOK_CALLS = 1000  # forward-hook calls replayed after one answer


class ProxyRefused(RuntimeError):
    """The grader would not answer for the reference (the check that handed it over has ended)."""


# ---------------------------------------------------------------- the set-up code


_setups: dict = {}


def setup_module(assignment: str, cells) -> types.ModuleType:
    """The module of the notebook's set-up cells, run here once per kernel (they are in the
    released notebook): registered as ``course_checks.setup_<assignment>``."""
    key = (assignment, tuple(tuple(cell) for cell in cells))
    if key not in _setups:
        _setups[key] = module_from_cells(assignment, key[1], kind="setup")
    return _setups[key]


# ---------------------------------------------------------------- the check's substitutes


class Given:
    """What one check may use besides the learner's code, by name: the set-up code's objects, and
    substitutes for the reference's answers (made on first use from the grader's descriptions)."""

    def __init__(self, ask, assignment: str, check: str, reply: dict):
        self._grader = ask  # the grader's answer to a message (on the check's own connection while it runs)
        self._assignment = assignment
        self._check = check
        self._setup = setup_module(assignment, reply.get("setup") or [])
        self._descriptions = dict(reply.get("answers") or {})
        self._made: dict = {}
        # the modules' weights sent in full, by id (``_Sent``), and the keys they were sent under
        self._sent: dict[int, _Sent] = {}
        self._sent_bytes = 0  # what their copies hold (at most ``verdict.KEPT_WEIGHT_BYTES``, as the grader's)
        self._keys = (f"{os.urandom(6).hex()}.{n}" for n in itertools.count())
        self._setup_refs = {
            id(value): f"setup:{name}"
            for name, value in vars(self._setup).items()
            if isinstance(value, (type, types.FunctionType)) and not name.startswith("_")
        }

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        if name in self._descriptions:
            return self._substitute(name)
        try:
            return getattr(self._setup, name)
        except AttributeError:
            raise AttributeError(f"the reference has no `{name}` for this check") from None

    def __dir__(self):
        return sorted({*self._descriptions, *(n for n in vars(self._setup) if not n.startswith("_"))})

    # ------------------------------------------------------------ making substitutes
    def _substitute(self, name: str):
        if name not in self._made:
            description = self._descriptions[name]
            kind = description.get("kind") if isinstance(description, dict) else None
            make = {
                "function": _function,
                "module": _module_class,
                "class": _remote_class,
                "dataclass": _dataclass,
            }.get(kind)
            if make is None:
                raise ProtocolError(f"the grader described `{name}` as {kind!r}")
            self._made[name] = make(self, name, description)
        return self._made[name]

    # ------------------------------------------------------------ asking the grader
    def _ask(self, op: str, target: str, *, self_=None, args=(), kwargs=None, raw=False, rng=False, **fields):
        """The grader's answer for ``target``'s ``op`` on these inputs (decoded, unless ``raw``)."""

        tracer = _gettrace()
        if tracer is not None:  # a step counter (a probe) counts the learner's steps, not the wire's
            _settrace(None)
        try:
            for _ in range(2):
                codec = KernelCodec(self)
                budget = [verdict.MAX_ITEMS]
                message = {"op": op, "assignment": self._assignment, "name": self._check, "target": target, **fields}
                if self_ is not None:
                    message["self"] = self_(codec, budget)
                message["args"] = verdict.encode(list(args), 0, budget, codec)
                message["kwargs"] = verdict.encode(dict(kwargs or {}), 0, budget, codec)
                if rng:
                    message["rng"] = verdict.b64encode(torch.get_rng_state().numpy().tobytes())
                reply = self._grader(message)
                if reply.get("resend") is not True:
                    break
                self._sent.clear()  # the grader keeps none of them (a new cell): every weight in full again
                self._sent_bytes = 0
            self._kept(reply.get("kept"))
            if "refused" in reply:
                raise ProxyRefused(str(reply["refused"])[:2000])
            if "error" in reply:
                error = reply["error"] if isinstance(reply["error"], dict) else {}
                kind, text = str(error.get("type", "RuntimeError")), str(error.get("message", ""))[:4000]
                if kind in _ERRORS:
                    raise _ERRORS[kind](text)
                raise RuntimeError(f"{kind}: {text}")
            if rng and isinstance(reply.get("rng"), str):
                state = verdict.b64decode(reply["rng"])
                torch.set_rng_state(torch.frombuffer(bytearray(state), dtype=torch.uint8))
            value = reply.get("value") if raw else verdict.decode(reply.get("value"), codec=codec)
            _replay_hooks(codec, reply.get("calls"))
            return value
        finally:
            if tracer is not None:
                _settrace(tracer)

    # ------------------------------------------------------------ weights sent once
    def _weight(self, tensor, depth: int, budget: list) -> dict:
        """A module's weight for the grader: by key when the grader keeps it as it still is here,
        else in full, asking the grader to keep it (under a new key) when there is room."""
        sent = self._sent.get(id(tensor))
        if sent is not None and sent.confirmed and sent.same(tensor):
            verdict._spend(budget)  # as encoding it in full would
            return {"tensor": sent.dtype, "shape": sent.shape, "kept": sent.key}
        data = verdict.encode(tensor, depth, budget)
        if "data" not in data:
            return data
        size = tensor.numel() * tensor.element_size()
        if sent is not None:  # its values changed, or the grader did not keep them: this copy goes
            del self._sent[id(tensor)]
            self._sent_bytes -= sent.size
        if len(self._sent) >= verdict.KEPT_WEIGHTS or self._sent_bytes + size > verdict.KEPT_WEIGHT_BYTES:
            for key, gone in [(k, s) for k, s in self._sent.items() if s.tensor() is None]:
                del self._sent[key]  # the weights of modules no longer alive
                self._sent_bytes -= gone.size
        if len(self._sent) < verdict.KEPT_WEIGHTS and self._sent_bytes + size <= verdict.KEPT_WEIGHT_BYTES:
            sent = _Sent(tensor, next(self._keys), data["tensor"], size)
            self._sent[id(tensor)] = sent
            self._sent_bytes += size
            data["keep"] = sent.key
        return data

    def _kept(self, keys) -> None:
        """The keys the grader says it keeps (from its reply): their weights go by key from now on."""
        if not isinstance(keys, list):
            return
        keys = set(keys)
        for sent in self._sent.values():
            if sent.key in keys:
                sent.confirmed = True


class _Sent:
    """A weight sent in full under ``key``, as it was then: the tensor (weakly), its version
    counter, storage, shape and stride, and a copy of its values (``.data`` changes a tensor
    without counting a version)."""

    def __init__(self, tensor, key: str, dtype: str, size: int):
        self.tensor = weakref.ref(tensor)
        self.key, self.dtype, self.size, self.confirmed = key, dtype, size, False
        self.shape = list(tensor.shape)
        self.state = _tensor_state(tensor)
        self.copy = tensor.detach().clone()

    def same(self, tensor) -> bool:
        return (
            self.tensor() is tensor and _tensor_state(tensor) == self.state and torch.equal(tensor.detach(), self.copy)
        )


def _tensor_state(tensor) -> tuple:
    return (tensor._version, tensor.data_ptr(), tensor.shape, tensor.stride(), tensor.dtype)


ProtocolError = verdict.ProtocolError


def _replay_hooks(codec: KernelCodec, calls) -> None:
    """Let the forward hooks of modules sent out see the calls the reference made of them (as
    observers: what they return is not used)."""
    if not isinstance(calls, list):
        return
    for entry in calls[:MAX_HOOK_CALLS]:
        try:
            index, args, output = entry
            module = codec.hooked[index]
            args = verdict.decode(args, codec=KernelCodec(codec.given))
            output = verdict.decode(output, codec=KernelCodec(codec.given))
        except (ValueError, TypeError, IndexError, verdict.ProtocolError):
            continue
        args = tuple(args) if isinstance(args, (list, tuple)) else (args,)
        for hook_id, hook in list(module._forward_pre_hooks.items()):
            if hook_id in module._forward_pre_hooks_with_kwargs:
                hook(module, args, {})
            else:
                hook(module, args)
        for hook_id, hook in list(module._forward_hooks.items()):
            if hook_id in module._forward_hooks_with_kwargs:
                hook(module, args, {}, output)
            else:
                hook(module, args, output)


def _self_module(module, ref: str):
    return lambda codec, budget: codec._describe_module(module, ref, 0, budget)


def _self_value(value):
    return lambda codec, budget: verdict.encode(value, 0, budget, codec)


def _named(function, name: str, qualname: str):
    function.__name__, function.__qualname__ = name, qualname
    return function


def _function(given: Given, name: str, description: dict):
    def substitute(*args, **kwargs):
        return given._ask("call", name, args=args, kwargs=kwargs)

    substitute = _named(substitute, name, name)
    substitute.__doc__ = f"The reference `{name}`: the grader computes its answer outside this kernel."
    substitute.__proxy_ref__ = f"answer:{name}"
    return substitute


def _remote_method(given: Given, name: str, method: str, encode_self):
    def remote(self, *args, **kwargs):
        return given._ask("method", name, self_=encode_self(self), method=method, args=args, kwargs=kwargs)

    return _named(remote, method, f"{name}.{method}")


def _remote_property(given: Given, name: str, attribute: str, encode_self, settable: bool):
    def read(self):
        return given._ask("getattr", name, self_=encode_self(self), attribute=attribute)

    def write(self, value):
        given._ask("setattr", name, self_=encode_self(self), attribute=attribute, args=(value,))

    return property(read, write if settable else None)


def _members(given: Given, name: str, description: dict, encode_self) -> dict:
    members = {}
    for method in description.get("methods") or []:
        if isinstance(method, str) and (method.isidentifier() and not method.startswith("_") or method in _DUNDERS):
            members[method] = _remote_method(given, name, method, encode_self)
    for attribute, settable in description.get("properties") or []:
        if isinstance(attribute, str) and attribute.isidentifier() and not attribute.startswith("_"):
            members[attribute] = _remote_property(given, name, attribute, encode_self, bool(settable))
    return members


# ------------------------------------------------------------ nn.Module classes


def _module_class(given: Given, name: str, description: dict):
    ref = f"answer:{name}"

    def __init__(self, *args, **kwargs):
        nn.Module.__init__(self)
        codec = KernelCodec(given)
        built = given._ask("construct", name, args=args, kwargs=kwargs, raw=True, rng=True)
        if not isinstance(built, dict) or "module" not in built:
            raise ProtocolError(f"the grader could not build `{name}`")
        codec.fill_module(self, built, 0, [verdict.MAX_ITEMS])

    def forward(self, *args, **kwargs):
        return given._ask("forward", name, self_=_self_module(self, ref), args=args, kwargs=kwargs)

    encode_self = lambda module: _self_module(module, ref)  # noqa: E731
    namespace = {
        "__init__": _named(__init__, "__init__", f"{name}.__init__"),
        "forward": _named(forward, "forward", f"{name}.forward"),
        "__doc__": f"The reference `{name}`: its weights are here, its forward runs outside this kernel.",
        "__module__": __name__,
        "__proxy_ref__": ref,
        **{
            key: value
            for key, value in _members(given, name, description, encode_self).items()
            if key not in ("forward", "__call__")
        },
    }
    return type(name, (nn.Module,), namespace)


# ------------------------------------------------------------ other classes: objects held outside


class RemoteObject:
    """An object of the reference's that lives on the grader's side; this is its handle."""

    __proxy_ref__ = None

    def __getattr__(self, attribute: str):
        if attribute.startswith("_"):
            raise AttributeError(attribute)
        remote = self.__dict__.get("_remote")
        if remote is None:
            raise AttributeError(attribute)
        return remote[2]._ask("getattr", remote[3], self_=_self_value(self), attribute=attribute)

    def __setattr__(self, attribute: str, value) -> None:
        remote = self.__dict__.get("_remote")
        if remote is not None and attribute in remote[1]:
            remote[2]._ask("setattr", remote[3], self_=_self_value(self), attribute=attribute, args=(value,))
        else:
            object.__setattr__(self, attribute, value)

    def __repr__(self) -> str:
        remote = self.__dict__.get("_remote")
        return f"<{type(self).__name__} held by the grader (#{remote[0] if remote else '?'})>"


def _remote_class(given: Given, name: str, description: dict):
    def __init__(self, *args, **kwargs):
        handle = given._ask("construct", name, args=args, kwargs=kwargs, raw=True, rng=True)
        _attach(self, given, name, handle)

    namespace = {
        "__init__": _named(__init__, "__init__", f"{name}.__init__"),
        "__doc__": f"The reference `{name}`: its instances live outside this kernel, held by the grader.",
        "__module__": __name__,
        "__proxy_ref__": f"answer:{name}",
        **_members(given, name, description, _self_value),
    }
    return type(name, (RemoteObject,), namespace)


def _attach(obj, given: Given, name: str, handle) -> None:
    if not (isinstance(handle, dict) and isinstance(handle.get("remote"), int)):
        raise ProtocolError(f"the grader could not make a `{name}`")
    attributes = frozenset(a for a in handle.get("attributes") or [] if isinstance(a, str))
    object.__setattr__(obj, "_remote", (handle["remote"], attributes, given, name))


# ------------------------------------------------------------ dataclasses


def _dataclass(given: Given, name: str, description: dict):
    specs = []
    for entry in description.get("fields") or []:
        field_name, has_default, default = entry
        if not (isinstance(field_name, str) and field_name.isidentifier()):
            raise ProtocolError("malformed field")
        if has_default:
            value = verdict.decode(default, codec=KernelCodec(given))
            if isinstance(value, (list, dict, set)):  # a mutable default: each instance its own copy
                made = dataclasses.field(default_factory=lambda value=value: copy.deepcopy(value))
            else:
                made = dataclasses.field(default=value)
            specs.append((field_name, typing.Any, made))
        else:
            specs.append((field_name, typing.Any))
    ref = f"answer:{name}"
    namespace = {
        "__doc__": f"The reference `{name}`: its fields are here; the grader checks them as the reference does.",
        "__proxy_ref__": ref,
        **_members(given, name, description, _self_value),
    }
    if description.get("post_init"):

        def __post_init__(self):
            fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
            checked = given._ask("construct", name, kwargs=fields)
            if isinstance(checked, dict):
                for key, value in checked.items():
                    if isinstance(key, str) and key.isidentifier() and not key.startswith("__"):
                        object.__setattr__(self, key, value)

        namespace["__post_init__"] = _named(__post_init__, "__post_init__", f"{name}.__post_init__")
    namespace["__module__"] = __name__
    return dataclasses.make_dataclass(name, specs, namespace=namespace, frozen=bool(description.get("frozen")))


# ---------------------------------------------------------------- the kernel's vocabulary on the wire


class KernelCodec(verdict.Codec):
    """The kernel's side of ``verdict.Codec``: the reference's answers are substitutes here, its
    set-up classes the set-up code run here, and objects held by the grader ``RemoteObject``s."""

    def __init__(self, given: Given):
        super().__init__()
        self.given = given

    def classify(self, obj):
        if isinstance(obj, (type, types.FunctionType)):
            own = obj.__dict__.get("__proxy_ref__") if isinstance(obj, type) else getattr(obj, "__proxy_ref__", None)
            if isinstance(own, str):
                return own
            found = self.given._setup_refs.get(id(obj))
            if found is None and isinstance(obj, type):
                # the notebook's own run of a set-up cell: the same class when it has the same code
                twin = vars(self.given._setup).get(obj.__name__)
                if isinstance(twin, type) and self.given._setup_refs.get(id(twin)) and _same_class(obj, twin):
                    found = self.given._setup_refs[id(twin)]
            return found
        return None

    def resolve(self, ref: str):
        kind, _, name = ref.partition(":")
        if kind == "answer" and name in self.given._descriptions:
            return self.given._substitute(name)
        if kind == "setup" and f"setup:{name}" in self.given._setup_refs.values():
            return getattr(self.given._setup, name)
        if kind == "torch":
            cls = getattr(nn, name, None)
            return cls if isinstance(cls, type) and issubclass(cls, nn.Module) else None
        return None

    def weight(self, tensor, depth: int, budget: list) -> dict:
        return self.given._weight(tensor, depth, budget)

    def remote_handle(self, obj):
        if isinstance(obj, RemoteObject):
            remote = obj.__dict__.get("_remote")
            if remote is None:
                raise ProtocolError(f"this {type(obj).__name__} was never made")
            return {"remote": remote[0], "class": f"answer:{remote[3]}"}
        return None

    def remote_object(self, data: dict):
        ref = data.get("class")
        name = ref.partition(":")[2] if isinstance(ref, str) and ref.startswith("answer:") else None
        cls = self.resolve(ref) if name else None
        if not (isinstance(cls, type) and issubclass(cls, RemoteObject)):
            raise ProtocolError("malformed handle")
        obj = object.__new__(cls)
        _attach(obj, self.given, name, data)
        return obj


def _same_code(a, b) -> bool:
    if not (isinstance(a, types.CodeType) and isinstance(b, types.CodeType)):
        return a == b if not isinstance(a, types.CodeType) and not isinstance(b, types.CodeType) else False
    return (
        a.co_code == b.co_code
        and a.co_names == b.co_names
        and len(a.co_consts) == len(b.co_consts)
        and all(_same_code(x, y) for x, y in zip(a.co_consts, b.co_consts))
    )


def _members_code(cls) -> dict:
    found = {}
    for name, member in vars(cls).items():
        if isinstance(member, (staticmethod, classmethod)):
            member = member.__func__
        if isinstance(member, property):
            found[name] = tuple(getattr(f, "__code__", None) for f in (member.fget, member.fset))
        elif isinstance(member, types.FunctionType):
            found[name] = (member.__code__,)
    return found


def _same_class(a: type, b: type) -> bool:
    """Whether classes ``a`` and ``b`` were made by the same code (a set-up cell run twice)."""
    if a.__qualname__ != b.__qualname__ or [c.__name__ for c in a.__mro__] != [c.__name__ for c in b.__mro__]:
        return False
    mine, theirs = _members_code(a), _members_code(b)
    return mine.keys() == theirs.keys() and all(
        len(mine[k]) == len(theirs[k]) and all(_same_code(x, y) for x, y in zip(mine[k], theirs[k])) for k in mine
    )


# ---------------------------------------------------------------- the cases, unpacked


_Unpickler = _pickle.Unpickler  # the C unpickler, bound now
_BytesIO = io.BytesIO
_SAFE_BUILTINS = frozenset(
    "tuple list dict set frozenset slice range complex int float bool str bytes bytearray object".split()
)
_DATA_MODULES = ("builtins", "collections", "copyreg", "numpy", "numpy.core.multiarray", "numpy._core.multiarray")


class _CaseUnpickler(_Unpickler):
    """Unpickles cases and probes with the kernel side's own classes, torch's and plain data only
    (never the grader's catalogue); the reference's objects in them are descriptions, built here
    by the check's ``KernelCodec`` (substitutes for its answers)."""

    def __init__(self, file, codec: KernelCodec):
        super().__init__(file)
        self.codec = codec

    def persistent_load(self, described):
        return verdict.decode(described, codec=self.codec)

    def find_class(self, module: str, name: str):
        if module == "builtins" and name not in _SAFE_BUILTINS:
            raise ProtocolError(f"the grader sent builtins.{name}")
        if module.startswith("course_checks.") and module.split(".")[1] in ("cases", "scripts", "probes"):
            return super().find_class(module, name)
        if module in _DATA_MODULES or module.startswith("torch.nn.modules."):
            return super().find_class(module, name)
        if module in ("torch", "torch._utils", "torch.storage", "torch._tensor", "torch.nn.parameter"):
            found = super().find_class(module, name)
            if isinstance(found, (type, torch.dtype, torch.device, torch.layout, torch.memory_format)) or (
                name.startswith(("_rebuild", "_load_from_bytes"))
            ):
                return found
        raise ProtocolError(f"the grader sent {module}.{name}, which the kernel does not take")


def unpack(text: str, codec: KernelCodec | None = None):
    """Cases or probes as the grader pickled them (trusted data, from outside the sandbox)."""
    return _CaseUnpickler(_BytesIO(verdict.b64decode(text)), codec).load()


# ---------------------------------------------------------------- the judge outside


class RemoteJudge:
    """The grader outside the sandbox, as ``checks`` sees a judge (the other one is
    ``autograder.local_judge``, inside the kernel).

    Each check runs as one invocation on a connection of its own (``verdict.Link.open``): its
    begin, its substitutes' calls, its result and its end, in order, each with the token the
    grader handed out at its begin and the next number (both held in a closure, never in an
    object or a frame of the check). Only the check helper's ``diagnose``, through ``result`` or
    ``missing`` here, can send its result (``_invocation``); a call from anywhere else is reported
    to the grader as interference and ends the check with no points.
    """

    def __init__(self, link: verdict.Link):
        self.link = link
        self._open: dict = {}  # (assignment, name) -> the check's ``finish``, from its begin to its result

    def begin(self, assignment: str, name: str, tampered) -> Shipment | str:
        stale = self._open.pop((assignment, name), None)
        if stale is not None:  # begun before and stopped: its connection goes
            stale[1]()
        reply, ask, finish, close = _invocation(self.link, assignment, name, tampered)
        if finish is None or reply.get("message"):
            close()
            return str(reply.get("message") or "The grader did not begin this check.")
        self._open[(assignment, name)] = (finish, close)
        given = Given(ask, assignment, name, reply)
        codec = KernelCodec(given)
        return Shipment(
            target=str(reply["target"]),
            depends_on=tuple(reply.get("depends_on", ())),
            probes=tuple(unpack(reply["probes"], codec)),
            given=given,
            cases=list(unpack(reply["cases"], codec)),
        )

    def result(self, assignment: str, name: str, problem, outputs, tampered, observations=()) -> str | None:
        finish = self._open.pop((assignment, name), (None,))[0]
        if finish is None:
            return f"The check of `{name}` was interfered with (or never began); it gives no points."
        return finish(verdict.Link.result(assignment, name, problem, outputs, tampered, observations)).get("message")

    def missing(self, assignment: str, name: str, message: str, tampered) -> str:
        finish = self._open.pop((assignment, name), (None,))[0]
        if finish is None:
            return message
        reply = finish(
            {"op": "missing", "assignment": assignment, "name": name, "problem": message, "tampered": list(tampered)}
        )
        return reply.get("message") or message


# The code of the check helper (``checks.diagnose``), registered once by ``checks`` as it is imported
# (before the seal): the only caller whose result a check's connection carries.
_CHECKS: frozenset = frozenset()
_getframe = sys._getframe
_replaced = trusted.replaced


def register_check(*functions) -> None:
    global _CHECKS
    if not _CHECKS:
        _CHECKS = frozenset(function.__code__ for function in functions)


def _invocation(link: verdict.Link, assignment: str, name: str, tampered) -> tuple:
    """Begin a check: (the grader's reply, ``ask`` for its substitutes' calls, ``finish`` for its
    result and end, or None when the grader refused it, ``close`` for its connection)."""
    reply, send, close = link.open(assignment, name, tampered)
    if send is None:
        return reply, link.ask, None, close
    running = [True]

    def ask(message: dict) -> dict:
        """A substitute's call: on the check's connection while it runs, on one of its own after."""
        if not running[0]:
            return link.ask(message)
        if message.get("op") not in _PROXY_OPS:
            raise ProtocolError("a substitute asks only for calls")
        try:
            return send(message)
        except (OSError, verdict.ConnectionClosed):
            running[0] = False
            close()
            raise ProxyRefused(
                f"the grader ended the check of `{name}`: `{message.get('target')}` stands for the reference "
                "only while the check that handed it over runs, in its own test cell."
            ) from None

    def finish(message: dict) -> dict:
        """The check's result (or "missing"), then its end; from ``diagnose`` through ``RemoteJudge`` only."""
        caller, check = _getframe(1).f_code, _getframe(2).f_code
        if not running[0]:  # its result came already, from elsewhere: the grader ended it
            return {"message": f"The check of `{name}` was interfered with; it gives no points."}
        running[0] = False
        try:
            if caller not in _FINISHERS or check not in _CHECKS:
                send({"op": "interfered", "why": f"from `{check.co_qualname[:60]}`"})
                raise ProtocolError("a check's result comes from the check itself")
            reply = send(message)
            send({"op": "end", "tampered": _replaced()})
            return reply
        finally:
            close()

    return reply, ask, finish, close


_PROXY_OPS = frozenset(("call", "forward", "construct", "method", "getattr", "setattr"))
_FINISHERS = frozenset((RemoteJudge.result.__code__, RemoteJudge.missing.__code__))
