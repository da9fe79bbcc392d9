"""Where the reference answers for the substitutes of a sandboxed kernel: a process of the worker's own.

Under ``./course grade`` no reference answer enters the learner's kernel: while a check runs,
the exercises it builds on are substitutes there (``course_checks.proxies``), and each of their
calls (a function's arguments, a module's weights and inputs, a method of an object held here)
comes out over the verdict socket. The worker's ``judge.VerdictServer`` accepts it only while
the check that handed the substitute over runs, and passes it on, as it came, to the
``Referee``: a process of its own beside the worker, which holds the reference modules
(built from the same reference cells as the judge's), decodes the request (bounded, as any
data from a kernel), computes the reference's answer and encodes it back as data.

The inputs are the kernel's choice, so the computing happens where it can be bounded: in this
process, whose address space is limited (a request that would take more memory fails with an
error, not the worker), and which the worker kills when a request outlasts its time (the cell's
limit) or when the cell ends while one is still running; the next request starts it again.
Objects the reference makes for a kernel (a cache) are held here, per notebook, until the cell
ends. Answers are computed with one thread, as in the kernel, so they agree bit for bit with
what the reference would have given there.

``ReferenceCodec`` is the reference side's vocabulary on the wire (``course_checks.verdict.Codec``):
the judge pickles its cases with it (``Judge.shipment``), the referee reads and answers
requests with it.

A pool process of ``./course grade`` forks its referees from a copy of itself made while it had
one thread (``Factory``): torch is imported already, so a referee starts in milliseconds and shares
those pages. Elsewhere (a Dask worker, a test) a referee is a fresh interpreter, run as
``python -m autograder.worker.referee CONFIG_JSON``. Either way it reads requests on stdin and
answers on stdout, one JSON line each, until stdin closes.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import os
import resource
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
import types

import torch
from torch import nn

from course_checks import verdict
from course_checks.probes import COUNTED

from .. import reference
from ..sandboxing.linux import die_with_parent, drop_signal_handlers, keep_only_descriptors

OPS = ("call", "forward", "construct", "method", "getattr", "setattr")
_DUNDERS = ("__len__", "__getitem__", "__setitem__", "__contains__", "__call__")
MAX_HOOK_CALLS = 1000
MAX_OBJECTS = 10_000  # objects held for one notebook
# Modules kept for the session's next call (``Built``): how many, and the largest (tensor bytes)
KEPT_MODULES = 8
KEPT_MODULE_BYTES = 4 * 1024 * 1024


# ---------------------------------------------------------------- the reference's vocabulary


def answer_names(ref, answers) -> dict:
    """{id(object): "answer:name" or "setup:name"} of the classes and functions the reference
    cells define (``answers``: the names the answer cells define)."""
    refs = {}
    for name, value in vars(ref).items():
        if name.startswith("_") or not isinstance(value, (type, types.FunctionType)):
            continue
        if getattr(value, "__module__", None) != ref.__name__:
            continue  # imported by a cell (torch's, dataclasses'), not defined by one
        refs[id(value)] = f"{'answer' if name in answers else 'setup'}:{name}"
    return refs


class Session:
    """The objects the reference made for one notebook's kernel, by handle, the modules it
    built from the kernel's descriptions (``Built``), newest last, and the weights the kernel
    asked it to keep (``keep``), by the kernel's key."""

    def __init__(self):
        self.objects: dict[int, object] = {}
        self.next = 1
        self.built: list[Built] = []
        self.weights: dict[str, torch.Tensor] = {}
        self.weight_bytes = 0

    def keep(self, key, tensor: torch.Tensor) -> bool:
        """Keep a copy of ``tensor`` under the kernel's ``key``: False when the key is not a short
        string, is taken (a key always names the same values), or the session holds its fill."""
        size = tensor.numel() * tensor.element_size()
        if not (isinstance(key, str) and 0 < len(key) <= 64) or key in self.weights:
            return False
        if len(self.weights) >= verdict.KEPT_WEIGHTS or self.weight_bytes + size > verdict.KEPT_WEIGHT_BYTES:
            return False
        self.weights[key] = tensor.detach().clone()
        self.weight_bytes += size
        return True

    def kept(self, data: dict) -> torch.Tensor:
        """A copy of the weight kept under ``data["kept"]``, which must have the dtype and shape the
        kernel says; ``Resend`` when this session keeps nothing under that key."""
        found = self.weights.get(data["kept"]) if isinstance(data.get("kept"), str) else None
        if found is None:
            raise Resend("no weight kept under this key")
        if data.get("tensor") != str(found.dtype).removeprefix("torch.") or data.get("shape") != list(found.shape):
            raise verdict.ProtocolError("malformed tensor")
        return found.clone()


class Resend(verdict.ProtocolError):
    """A call named a weight this session does not keep (its cell ended, the referee is a new one):
    the kernel sends the call again with every weight in full."""


class _Unkept(Exception):
    """A module holds an attribute that could change inside and look the same (a list, a tensor)."""


def _plain(value):
    """``value`` as it is now, when it is a number, a string, or a tuple or dataclass of those."""
    if value is None or isinstance(value, (bool, int, float, complex, str, bytes)):
        return value
    if isinstance(value, tuple):
        return tuple(_plain(item) for item in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return (
            type(value),
            id(value),
            tuple((f.name, _plain(getattr(value, f.name))) for f in dataclasses.fields(value)),
        )
    raise _Unkept


def _tensor_state(tensor) -> tuple | None:
    if tensor is None:
        return None
    return (id(tensor), tensor._version, tensor.data_ptr(), tensor.requires_grad, tensor.shape, tensor.stride())


def module_state(module: nn.Module) -> tuple | None:
    """All a call could change of ``module`` and its sub-modules, in place or by assignment: every
    attribute (the containers by identity and keys), every tensor's version counter, storage and
    shape. None when it holds a plain attribute that is not a number, a string, or a tuple or
    dataclass of them (a list could change inside and look the same)."""

    internals = verdict._module_internals()
    state = []
    for sub in module.modules():
        parts = [id(sub), type(sub)]
        for name, value in vars(sub).items():
            if name in ("_parameters", "_buffers"):
                parts.append((name, id(value), tuple((k, _tensor_state(t)) for k, t in value.items())))
            elif name == "_modules":
                parts.append((name, id(value), tuple((k, id(child)) for k, child in value.items())))
            elif name in internals and name != "training":  # hooks by their handles, names of buffers
                parts.append((name, id(value), tuple(value) if isinstance(value, (dict, set)) else value))
            else:
                try:
                    parts.append((name, _plain(value)))
                except _Unkept:
                    return None
        state.append(tuple(parts))
    return tuple(state)


@dataclasses.dataclass
class Built:
    """A module built from a kernel's description in this session, kept for its next call of the
    same module: generating 12 tokens calls 08's ``forward_cached`` 12 times with the same model,
    and building it from its description took half of the referee's time. It is used again only
    when the description is the same in every part (weights included), and the module is as it
    was built (``module_state``, and every tensor equal to a copy made then)."""

    module: nn.Module
    description: dict
    state: tuple
    depth: int  # where it was built: deeper, its sub-modules could pass the depth limit
    items: int  # what building it spent of the message's budget, spent again when it is used
    copies: list  # (tensor, a copy made when it was built): ``.data`` changes a tensor unversioned

    def fits(self, cls, description: dict, depth: int) -> bool:
        return (
            type(self.module) is cls
            and depth <= self.depth
            and self.description == description
            and module_state(self.module) == self.state
            and all(torch.equal(tensor, copy) for tensor, copy in self.copies)
        )


class ReferenceCodec(verdict.Codec):
    """The reference's side of ``verdict.Codec``: names are the reference module's own classes and
    functions; an object of an answer class that is neither a module nor a dataclass stays here
    (in ``session``) and crosses as a handle. ``used`` collects the names met on the way."""

    def __init__(self, ref, answers, session: Session | None = None, names: dict | None = None):
        super().__init__()
        self.ref = ref
        self.answers = frozenset(answers)
        self.session = session
        self.refs = answer_names(ref, self.answers) if names is None else names  # names: as loaded
        self.used: set[str] = set()
        self.given: set[int] = set()  # modules kept from earlier calls, already given in this one
        self.kept: list[str] = []  # keys of the weights this call asked the session to keep, kept

    def _build_module(self, cls, data: dict, depth: int, budget: list):
        """The module the session's ``Built`` kept for this description, or a new one (kept when
        it is an argument's own, has no hooks and only plain attributes, and is small). A module
        given twice in one call is two modules, as a new build would be."""
        if self.session is None or depth > 1:  # an argument of the call itself (not a part of one)
            return super()._build_module(cls, data, depth, budget)
        kept = self.session.built
        for built in reversed(kept):
            if id(built.module) not in self.given and built.fits(cls, data, depth):
                verdict._spend(budget, built.items)
                self.given.add(id(built.module))
                return built.module
        before, hooked = budget[0], len(self.hooked)
        module = super()._build_module(cls, data, depth, budget)
        tensors = [*module.parameters(), *module.buffers()]
        size = sum(t.numel() * t.element_size() for t in tensors)
        state = module_state(module) if len(self.hooked) == hooked and size <= KEPT_MODULE_BYTES else None
        if state is not None:
            copies = [(t, t.detach().clone()) for t in tensors]
            kept.append(Built(module, data, state, depth, before - budget[0], copies))
            del kept[:-KEPT_MODULES]
            self.given.add(id(module))
        return module

    def weight_value(self, data, depth: int, budget: list):
        if self.session is None:
            return super().weight_value(data, depth, budget)
        if isinstance(data, dict) and "kept" in data:
            verdict._spend(budget)  # as decoding it in full would
            return self.session.kept(data)
        value = super().weight_value(data, depth, budget)
        if isinstance(data, dict) and "keep" in data and isinstance(value, torch.Tensor):
            if self.session.keep(data["keep"], value):
                self.kept.append(data["keep"])
        return value

    def classify(self, obj):
        found = self.refs.get(id(obj)) if isinstance(obj, (type, types.FunctionType)) else None
        if found:
            self.used.add(found)
        return found

    def resolve(self, ref: str):
        kind, _, name = ref.partition(":")
        if kind in ("answer", "setup"):
            value = vars(self.ref).get(name)
            return value if value is not None and self.refs.get(id(value)) == ref else None
        if kind == "torch":
            cls = getattr(nn, name, None)
            return cls if isinstance(cls, type) and issubclass(cls, nn.Module) else None
        return None

    def held(self, obj) -> bool:
        """Whether ``obj`` is an object of an answer class that lives on this side (not data)."""

        ref = self.refs.get(id(type(obj)))
        return bool(ref and ref.startswith("answer:")) and not (
            isinstance(obj, nn.Module) or dataclasses.is_dataclass(obj)
        )

    def remote_handle(self, obj):
        if not self.held(obj):
            return None
        if self.session is None:
            raise verdict.ProtocolError(f"a {type(obj).__name__} cannot be handed to a kernel")
        session = self.session
        handle = next((h for h, held in session.objects.items() if held is obj), None)
        if handle is None:
            if len(session.objects) >= MAX_OBJECTS:
                raise verdict.ProtocolError("too many objects held for this notebook")
            handle, session.next = session.next, session.next + 1
            session.objects[handle] = obj
        self.used.add(self.refs[id(type(obj))])
        attributes = sorted(name for name in vars(obj) if not name.startswith("_")) if hasattr(obj, "__dict__") else []
        return {"remote": handle, "class": self.refs[id(type(obj))], "attributes": attributes}

    def remote_object(self, data: dict):
        handle = data.get("remote")
        obj = self.session.objects.get(handle) if self.session is not None and isinstance(handle, int) else None
        if obj is None or self.refs.get(id(type(obj))) != data.get("class"):
            raise verdict.ProtocolError("an object this notebook does not hold")
        return obj


def describe_answer(value) -> dict:
    """What a kernel needs to make the substitute for an answer class or function: its kind, and
    the names of its methods and properties (a dataclass: its fields and their defaults). No code."""

    if not isinstance(value, type):
        return {"kind": "function"}
    methods, properties = [], []
    for klass in value.__mro__:
        if klass in (object, nn.Module) or klass.__module__.split(".")[0] == "torch":
            continue
        for name, member in vars(klass).items():
            if name in methods or any(name == p for p, _ in properties):
                continue
            if isinstance(member, property):
                if not name.startswith("_"):
                    properties.append([name, member.fset is not None])
            elif isinstance(member, (types.FunctionType, staticmethod, classmethod)):
                if (not name.startswith("_") or name in _DUNDERS) and name not in ("forward",):
                    methods.append(name)
    if issubclass(value, nn.Module):
        return {"kind": "module", "methods": methods, "properties": properties}
    if dataclasses.is_dataclass(value):
        fields = []
        for field in dataclasses.fields(value):
            if field.default is not dataclasses.MISSING:
                fields.append([field.name, True, verdict.encode(field.default)])
            elif field.default_factory is not dataclasses.MISSING:
                fields.append([field.name, True, verdict.encode(field.default_factory())])
            else:
                fields.append([field.name, False, None])
        return {
            "kind": "dataclass",
            "fields": fields,
            "frozen": bool(value.__dataclass_params__.frozen),
            "post_init": hasattr(value, "__post_init__"),
            "methods": [m for m in methods if m != "__post_init__"],
            "properties": properties,
        }
    return {"kind": "class", "methods": methods, "properties": properties}


# ---------------------------------------------------------------- the process: answering requests


class Oracle:
    """The referee process's state: the reference modules, and the objects held for each notebook."""

    def __init__(self):
        # key -> (module, answer names, counted set-up functions, ``answer_names`` of the module)
        self.refs: dict[str, tuple] = {}
        self.sessions: dict[str, Session] = {}

    def load(self, key: str, assignment: str, cells, answers, counted=()) -> None:
        if key not in self.refs:
            ref, answers = reference.from_cells(assignment, cells), frozenset(answers)
            self.refs[key] = (ref, answers, frozenset(counted or ()), answer_names(ref, answers))

    def forget(self, session: str) -> None:
        self.sessions.pop(session, None)

    def answer(self, key: str, session_id: str, line: bytes, counted: dict | None = None) -> dict:
        """The reply to a kernel's call ``line``; ``counted`` gets what the judge counts of the work
        it took (``embedded``: the token positions every embedding read; ``calls/<function>/<shape>``:
        a call of a function, by the shape of its first argument)."""
        try:
            return self._answer(key, session_id, line, {} if counted is None else counted)
        except Resend:
            return {"resend": True}
        except verdict.ProtocolError as error:
            return {"error": {"type": "ValueError", "message": f"the grader could not read this call: {error}"}}
        except RecursionError:
            return {"error": {"type": "RecursionError", "message": "nested too deeply"}}
        except MemoryError:
            return {"error": {"type": "MemoryError", "message": "the reference needed more memory than it may use"}}
        except Exception as error:  # the reference's own error on these inputs: the learner's code sees it
            return {"error": {"type": type(error).__name__, "message": str(error)[:4000]}}

    def _answer(self, key: str, session_id: str, line: bytes, counted: dict) -> dict:
        request = verdict.parse_line(line)
        ref, answers, counted_calls, names = self.refs[key]
        op, target = request.get("op"), request.get("target")
        if op not in OPS or not (target in answers or (op == "call" and target in counted_calls)):
            raise verdict.ProtocolError("not a call the grader answers")
        session = self.sessions.setdefault(session_id, Session())
        codec = ReferenceCodec(ref, answers, session, names)
        value = getattr(ref, target)
        budget = [verdict.MAX_ITEMS]
        this = verdict.decode(request["self"], 0, budget, codec) if "self" in request else None
        args = verdict.decode(request.get("args", {"sequence": "list", "items": []}), 0, budget, codec)
        kwargs = verdict.decode(request.get("kwargs", {"dict": []}), 0, budget, codec)
        if not isinstance(args, list) or not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
            raise verdict.ProtocolError("malformed arguments")
        calls: list = []
        handles = []
        for index, module in enumerate(codec.hooked):
            handles.append(module.register_forward_hook(_recorder(calls, index)))
        counted["embedded"] = 0
        if op == "call":  # what the call was given, seen here: the kernel cannot forge it
            counted[f"calls/{target}/{_first_shape(value, args, kwargs)}"] = 1
        for embedding in _embeddings(this, *args, *kwargs.values()):
            handles.append(embedding.register_forward_hook(_positions(counted)))
        reply: dict = {}
        try:
            with torch.no_grad():
                if op == "call":
                    if not isinstance(value, types.FunctionType):
                        raise verdict.ProtocolError("not a function")
                    result = value(*args, **kwargs)
                elif op == "forward":
                    if not (isinstance(value, type) and issubclass(value, nn.Module) and type(this) is value):
                        raise verdict.ProtocolError("not a module of this class")
                    result = this(*args, **kwargs)
                elif op == "construct":
                    if not isinstance(value, type):
                        raise verdict.ProtocolError("not a class")
                    state = request.get("rng")
                    with torch.random.fork_rng(devices=[]):
                        if isinstance(state, str):
                            torch.set_rng_state(
                                torch.frombuffer(bytearray(verdict.b64decode(state)), dtype=torch.uint8)
                            )
                        made = value(*args, **kwargs)
                        if isinstance(state, str):
                            reply["rng"] = verdict.b64encode(torch.get_rng_state().numpy().tobytes())
                    result = dict(vars(made)) if dataclasses.is_dataclass(made) else made
                else:
                    if type(this) is not value:
                        raise verdict.ProtocolError("not an object of this class")
                    name = request.get("method") if op == "method" else request.get("attribute")
                    public = isinstance(name, str) and name.isidentifier() and not name.startswith("_")
                    if op == "method" and (public or name in _DUNDERS):
                        result = getattr(this, name)(*args, **kwargs)
                    elif op == "getattr" and public:
                        result = getattr(this, name)
                    elif op == "setattr" and public and codec.held(this) and len(args) == 1:
                        setattr(this, name, args[0])
                        result = None
                    else:
                        raise verdict.ProtocolError("not an attribute the grader answers")
        finally:
            for handle in handles:
                handle.remove()
        reply["value"] = verdict.encode(result, 0, [verdict.MAX_ITEMS], codec)
        if codec.kept:
            reply["kept"] = codec.kept
        if calls:
            reply["calls"] = calls[:MAX_HOOK_CALLS]
        return reply


def _first_shape(function, args: list, kwargs: dict) -> str:
    """The shape of ``function``'s first parameter in this call, as ``"1x8x3x2"`` (passed by position or
    by name); ``"-"`` when it is no tensor or the call does not fit the signature."""
    try:
        first = next(iter(_signature(function).bind(*args, **kwargs).arguments.values()), None)
    except (TypeError, ValueError):
        first = None
    return "x".join(map(str, first.shape))[:100] if isinstance(first, torch.Tensor) else "-"


@functools.lru_cache(maxsize=256)
def _signature(function) -> inspect.Signature:
    """A reference function's signature, read once (09's ``merge_partials`` is called 600 times a notebook)."""
    return inspect.signature(function)


def _embeddings(*values) -> list:
    """The embedding layers of the models among ``values`` that the grader counts (``probes.COUNTED``:
    a probe's model, handed to a substitute such as ``forward_cached``)."""
    found = {}
    for value in values:
        if isinstance(value, nn.Module) and getattr(value, COUNTED, False) is True:
            found.update((id(m), m) for m in value.modules() if isinstance(m, nn.Embedding))
    return list(found.values())


def _positions(counted: dict):
    def count(module, inputs, output):
        counted["embedded"] += int(inputs[0].shape[-1]) if inputs and inputs[0].dim() else 1

    return count


def _recorder(calls: list, index: int):
    def record(module, inputs, output):
        if len(calls) < MAX_HOOK_CALLS:
            calls.append([index, verdict.encode(list(inputs)), verdict.encode(output)])

    return record


def _limit_memory(megabytes: int) -> None:
    """This process may take ``megabytes`` more address space than it has now (torch and the
    reference loaded): a request that needs more fails with MemoryError."""

    try:
        with open("/proc/self/status") as status:
            size_kb = next(int(line.split()[1]) for line in status if line.startswith("VmSize:"))
    except (OSError, StopIteration, ValueError):
        return
    limit = size_kb * 1024 + megabytes * 1024 * 1024
    try:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    except (ValueError, OSError):
        pass


def main(config: dict, stdin=None, stdout=None) -> None:
    """Answer the worker's commands read from ``stdin`` on ``stdout`` (binary streams; the process's
    own by default) until ``stdin`` closes."""
    torch.set_num_threads(1)

    _limit_memory(int(config.get("memory_mb", 2048)))
    oracle = Oracle()
    stdin = sys.stdin.buffer if stdin is None else stdin
    stdout = sys.stdout.buffer if stdout is None else stdout
    stdout.write(b'{"ready": true}\n')
    stdout.flush()
    while True:
        header = stdin.readline(1 << 26)
        if not header:
            return
        counted: dict = {}
        op = None
        try:
            command = json.loads(header)
            op = command.get("op")
            if op == "load":
                oracle.load(
                    command["key"], command["assignment"], command["cells"], command["answers"], command.get("counted")
                )
                reply = {"loaded": True}
            elif op == "forget":
                oracle.forget(str(command.get("session")))
                reply = {"forgotten": True}
            elif op == "ask":
                line = stdin.readline(verdict.MAX_MESSAGE + 1)
                reply = oracle.answer(str(command["key"]), str(command.get("session")), line, counted)
            else:
                reply = {"error": {"type": "ValueError", "message": "unknown command"}}
        except Exception as error:  # a command the worker sent wrong: say so, stay up
            reply = {"error": {"type": type(error).__name__, "message": str(error)[:2000]}}
        data = verdict.dumps(reply)
        if len(data) > verdict.MAX_MESSAGE:
            data = verdict.dumps({"error": {"type": "ValueError", "message": "the reference's answer is too large"}})
        if op == "ask":  # what the judge counts, on a line of its own before the answer
            stdout.write(verdict.dumps(counted) + b"\n")
        stdout.write(data + b"\n")
        stdout.flush()


# ---------------------------------------------------------------- the worker's side


class RefereeGone(RuntimeError):
    """The referee died, or was stopped because a request outlasted its time."""


class Referee:
    """The worker's handle on its referee process (one per warm sandbox); one request at a time."""

    def __init__(self, memory_mb: int = 2048):
        self.memory_mb = memory_mb
        self.process: subprocess.Popen | None = None
        self.loaded: set[str] = set()
        self.lock = threading.Lock()
        self.busy = False
        self._buffer = bytearray()  # what the process wrote past the last line read
        self._scanned = 0  # how much of ``_buffer`` holds no newline
        self._ready = False
        self.starts = 0

    # ------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Start the process now (it imports torch while the worker does other work)."""
        if self.alive():
            return
        self.close()
        config = {"memory_mb": self.memory_mb}
        self.process = None
        if factory.alive():  # forked from a warm copy of this process
            try:
                self.process = factory.fork(config)
            except OSError:
                pass  # the factory is gone: a fresh interpreter, as below
        if self.process is None:
            env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
            self.process = subprocess.Popen(
                [sys.executable, "-m", "autograder.worker.referee", json.dumps(config)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env=env,
            )
        self.loaded, self._buffer, self._scanned, self._ready = set(), bytearray(), 0, False
        self.starts += 1

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def close(self) -> None:
        process, self.process = self.process, None
        if process is None:
            return
        try:
            process.kill()
        except OSError:
            pass
        for stream in (process.stdin, process.stdout):
            try:
                stream.close()
            except Exception:
                pass
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass

    def abort(self) -> None:
        """Stop a request still running (its cell has ended): the process goes, the next request
        starts another one."""
        if self.busy:
            self.close()

    # ------------------------------------------------------------ lines
    def _send(self, data: bytes) -> None:
        try:
            self.process.stdin.write(data)
            self.process.stdin.flush()
        except (OSError, ValueError, AttributeError) as error:
            self.close()
            raise RefereeGone(f"the referee is gone ({error})") from None

    def _line(self, deadline: float) -> bytes:
        """The process's next line. Read in linear time: each byte is appended once and searched
        for a newline once (a 60 MB answer is read as fast as the pipe delivers it)."""
        process = self.process
        if process is None:
            raise RefereeGone("the referee is gone")
        stream = process.stdout
        buffer = self._buffer
        while (end := buffer.find(b"\n", self._scanned)) < 0:
            self._scanned = len(buffer)
            left = deadline - time.monotonic()
            if left <= 0:
                self.close()
                raise RefereeGone("the reference took longer than the cell may")
            try:
                ready, _, _ = select.select([stream], [], [], min(left, 1.0))
            except (OSError, ValueError):
                raise RefereeGone("the referee is gone") from None
            if ready:
                chunk = os.read(stream.fileno(), 1 << 20)
                if not chunk:
                    self.close()
                    raise RefereeGone("the referee stopped")
                buffer += chunk
                if len(buffer) > verdict.MAX_MESSAGE + 1:
                    self.close()
                    raise RefereeGone("the referee's answer is too large")
        line = bytes(buffer[:end])
        del buffer[: end + 1]
        self._scanned = 0
        return line

    def _command(self, command: dict, deadline: float, body: bytes = b"") -> dict:
        self._send(json.dumps(command).encode("utf-8") + b"\n" + body)
        return json.loads(self._line(deadline))

    def _ensure(self, deadline: float) -> None:
        if not self.alive():
            self.start()
        if not self._ready:
            json.loads(self._line(deadline))  # {"ready": true}
            self._ready = True

    def _load(self, judge) -> None:
        if judge.key not in self.loaded:
            self._command(
                {
                    "op": "load",
                    "key": judge.key,
                    "assignment": judge.assignment,
                    "cells": judge.cells,
                    "answers": sorted(judge.answers),
                    "counted": judge.counted_calls(),
                },
                time.monotonic() + 120,
            )
            self.loaded.add(judge.key)

    def prepare(self, judges) -> None:
        """The process started and ready, with these judges' references loaded: called before a
        notebook's cells run and after a cell whose call was stopped, so that starting it (torch's
        import, the reference built) never counts against a learner's cell."""
        with self.lock:
            try:
                self._ensure(time.monotonic() + 120)
                for judge in judges:
                    self._load(judge)
            except (RefereeGone, ValueError):
                self.close()  # the first call starts it again, and says so if it cannot

    # ------------------------------------------------------------ requests
    def ask(self, judge, session: str, line: bytes, seconds: float) -> tuple[bytes, dict]:
        """The referee's answer (a JSON line, for the kernel) to a kernel's call ``line``, and what the
        judge counts of the work it took (``Oracle.answer``)."""
        deadline = time.monotonic() + max(1.0, seconds)
        with self.lock:
            self.busy = True
            try:
                self._ensure(time.monotonic() + 120)
                self._load(judge)
                body = line if line.endswith(b"\n") else line + b"\n"
                self._send(json.dumps({"op": "ask", "key": judge.key, "session": session}).encode() + b"\n" + body)
                counted = json.loads(self._line(deadline))
                return self._line(deadline), counted if isinstance(counted, dict) else {}
            except (RefereeGone, OSError, ValueError) as error:  # also a process closed under the read
                self.close()
                return verdict.dumps({"error": {"type": "RuntimeError", "message": f"the grader: {error}"}}), {}
            finally:
                self.busy = False

    def forget(self, session: str) -> None:
        """Let go of the objects held for ``session`` (its cell has ended)."""
        if not self.alive() or not self._ready:
            return
        with self.lock:
            try:
                self._command({"op": "forget", "session": session}, time.monotonic() + 30)
            except (RefereeGone, ValueError):
                self.close()


# ---------------------------------------------------------------- referees forked from a warm copy


class Factory:
    """Where a grading process's referees come from: a copy of that process, forked while it still
    has one thread (``start``), which forks a referee each time the process asks for one.

    A referee forked so starts with torch and the reference machinery already imported (the pool
    processes' fork server preloads them), in milliseconds instead of the seconds a fresh
    interpreter takes, and shares those pages with the grading processes until it writes them. The
    copy itself never computes anything and starts no thread: forking it is safe where forking the
    grading process (its verdict server's thread, its kernels' readers) would not be.

    The two talk over a socket pair, one message each way per referee: the grading process sends
    the referee's config and the two pipe ends it will use (stdin's read end, stdout's write end);
    the copy answers with the referee's pid and a pidfd for it, through which the grading
    process sees it end and kills it (``Forked``), though it is not its own child.
    """

    def __init__(self):
        self.channel: socket.socket | None = None
        self.pid: int | None = None
        self.lock = threading.Lock()

    def start(self) -> bool:
        """Fork the copy now; False (and no copy) when this process runs another Python thread (one
        could hold a lock the copy would inherit held) or the system has no pidfd."""
        if threading.active_count() != 1 or not hasattr(os, "pidfd_open"):
            return False
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        pid = os.fork()
        if pid == 0:  # the copy
            try:
                ours.close()
                _serve(theirs)
            finally:
                os._exit(0)
        theirs.close()
        self.channel, self.pid = ours, pid
        return True

    def alive(self) -> bool:
        return self.channel is not None

    def fork(self, config: dict) -> Forked:
        """A referee forked from the copy, with ``config`` (``main``'s), its pipes connected here."""
        read_in, write_in = os.pipe()  # we write its stdin
        read_out, write_out = os.pipe()  # it writes its stdout
        try:
            with self.lock:
                socket.send_fds(self.channel, [json.dumps(config).encode()], [read_in, write_out])
                message, fds, _, _ = socket.recv_fds(self.channel, 64, 1)
            if not message or len(fds) != 1:
                for fd in fds:
                    os.close(fd)
                raise OSError("the referees' factory is gone")
        except OSError:
            os.close(write_in)
            os.close(read_out)
            self.close()
            raise
        finally:
            os.close(read_in)
            os.close(write_out)
        return Forked(int(message), fds[0], write_in, read_out)

    def close(self) -> None:
        """Let the copy go (it ends when its channel closes)."""
        channel, self.channel = self.channel, None
        if channel is not None:
            channel.close()
        if self.pid is not None:
            try:
                os.waitpid(self.pid, 0)
            except ChildProcessError:
                pass
            self.pid = None


def _serve(channel: socket.socket) -> None:
    """The copy's loop: one referee forked per request, until the channel closes.

    It keeps none of what it was forked with but its channel and the standard streams (a pool
    process's queues, a fork server's socket and pipes), and none of its Python signal handlers
    (a signal ignored stays ignored: Ctrl-C is the grade command's)."""
    die_with_parent()
    drop_signal_handlers()
    keep_only_descriptors({0, 1, 2, channel.fileno()})
    while True:
        while True:  # the referees that ended
            try:
                if os.waitpid(-1, os.WNOHANG)[0] == 0:
                    break
            except ChildProcessError:
                break
        try:
            message, fds, _, _ = socket.recv_fds(channel, 1 << 16, 2)
        except OSError:
            return
        if not message:
            return
        if len(fds) != 2:
            for fd in fds:
                os.close(fd)
            return
        pid = os.fork()
        if pid == 0:  # the referee
            code = 1
            try:
                channel.close()
                die_with_parent()
                main(json.loads(message), os.fdopen(fds[0], "rb"), os.fdopen(fds[1], "wb"))
                code = 0
            except BaseException:
                traceback.print_exc()
            finally:
                os._exit(code)
        for fd in fds:
            os.close(fd)
        pidfd = os.pidfd_open(pid)  # before it is reaped: the pid is still its own
        try:
            socket.send_fds(channel, [str(pid).encode()], [pidfd])
        except OSError:
            return
        finally:
            os.close(pidfd)


class Forked:
    """A forked referee, seen as ``subprocess.Popen`` shows a child (what ``Referee`` uses of it)."""

    def __init__(self, pid: int, pidfd: int, stdin: int, stdout: int):
        self.pid, self.pidfd, self.returncode = pid, pidfd, None
        self.stdin, self.stdout = os.fdopen(stdin, "wb"), os.fdopen(stdout, "rb")

    def poll(self):
        if self.returncode is None and self.pidfd >= 0 and select.select([self.pidfd], [], [], 0)[0]:
            self._ended()
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None and self.pidfd >= 0:
            try:
                signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def wait(self, timeout: float | None = None):
        if self.returncode is None and not select.select([self.pidfd], [], [], timeout)[0]:
            raise subprocess.TimeoutExpired(f"referee {self.pid}", timeout)
        self._ended()
        return self.returncode

    def _ended(self) -> None:
        if self.returncode is None:
            self.returncode = -1  # its parent, the factory, reaps it and keeps its status
            os.close(self.pidfd)
            self.pidfd = -1


factory = Factory()


def start_factory() -> bool:
    """Fork this process's referees' factory now (call it while the process has one thread):
    its referees are forked from it from then on, not started as fresh interpreters."""
    return factory.alive() or factory.start()


_referees: dict = {}


def for_slot(slot: int, memory_mb: int = 2048) -> Referee:
    """The referee of the warm sandbox in worker slot ``slot`` (one per grading thread)."""
    if slot not in _referees:
        _referees[slot] = Referee(memory_mb)
    return _referees[slot]


if __name__ == "__main__":
    main(json.loads(sys.argv[1]) if len(sys.argv) > 1 else {})
