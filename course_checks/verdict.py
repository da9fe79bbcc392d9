"""The wire between a sandboxed notebook's ``check`` and the trusted grader outside.

Inside the sandbox ``check`` (``checks.diagnose``) asks the grader, over a Unix
socket whose path is in ``AUTOGRADER_VERDICTS`` (read once, as the kernel starts),
for what to observe (``begin``), runs the learner's code on it, and sends what it
saw back (``result``); the grader (``autograder.worker.judge``) compares it with
the reference and answers with the message to show, or none when the check
passed. The grader records that verdict itself: whatever the notebook does with
the answer, its points come from the grader's record. While a check runs, the
substitutes for the exercises it builds on ask the grader too (``proxies``): the
grader computes the reference's answer outside and sends it back as data.

Messages are one JSON line each way, written and read with the C encoder and
scanner of ``_json`` and sent over a C socket (``_socket``), all bound when this
module is imported (before any student code): a notebook that patches ``json``,
``json.encoder`` or ``socket`` afterwards changes nothing on this wire.

Values cross as plain data (``encode`` / ``decode``: numbers, strings, tensors as
dtype, shape and raw bytes, sequences, dicts), bounded in size, depth and count;
the grader never unpickles anything that comes from a notebook. Objects of the
reference's own classes (a model, a config, a cache) cross as descriptions when a
``Codec`` that knows those classes is given: an ``nn.Module`` as its class, its
weights, its sub-modules and its plain attributes; a dataclass as its fields; an
object the grader holds as a handle. The cases go the other way pickled, from the
trusted side to the sandbox (``proxies.unpack``).
"""

from __future__ import annotations

import _json
import _socket
import binascii
import dataclasses
import json.decoder
import math
import os
import re
import types
from _thread import allocate_lock as _Lock
from typing import NamedTuple

ENVIRONMENT = "AUTOGRADER_VERDICTS"
MAX_MESSAGE = 64 * 1024 * 1024  # bytes of one message, either way
_MAX_DEPTH = 16
# Items (numbers, strings, tensors, sequences) in one message's outputs: tensors cross
# as one string each, so honest outputs have a few dozen; one output made of millions
# of small objects would cost the judge seconds and gigabytes to parse and decode.
MAX_ITEMS = 10_000
# A module's weights a kernel has sent once in a cell, kept by the referee and named again by key
# (``Codec.weight``): 08's generation sends the same model with every token it makes.
KEPT_WEIGHTS = 256
KEPT_WEIGHT_BYTES = 8 * 1024 * 1024
TENSOR_DTYPES = (
    "float16",
    "bfloat16",
    "float32",
    "float64",
    "uint8",
    "int8",
    "int16",
    "int32",
    "int64",
    "bool",
    "complex64",
    "complex128",
)

# What the wire is made of, bound now (C functions and types, which no notebook can patch).
_make_encoder = _json.make_encoder
_encode_string = _json.encode_basestring_ascii
_scan = _json.make_scanner(json.decoder.JSONDecoder())
_b64encode = binascii.b2a_base64
_b64decode = binascii.a2b_base64
_Socket = _socket.socket
_AF_UNIX, _SOCK_STREAM = _socket.AF_UNIX, _socket.SOCK_STREAM


CHECK_CALL = re.compile(r"""check\(\s*["']([^"']+)["']\s*,\s*["']([^"']+)["']""")


def expected_checks(source: str) -> list[tuple[str, str]]:
    """(assignment, exercise) of each ``check(...)`` call in a grade cell's source."""
    return CHECK_CALL.findall(source)


class ProtocolError(ValueError):
    """A message that does not follow the protocol (from a broken or hostile notebook)."""


class ConnectionClosed(ProtocolError):
    """The other end closed the connection (the grader ends a check whose cell is over)."""


# ---------------------------------------------------------------- JSON, bound


def _not_json(value):
    raise TypeError(f"{type(value).__name__} is not JSON")


def dumps(message) -> bytes:
    """``message`` as one line of JSON (no newline), by the C encoder bound at import."""
    encoder = _make_encoder({}, _not_json, _encode_string, None, ":", ",", False, False, False)
    return "".join(encoder(message, 0)).encode("utf-8")


def loads(line):
    """The JSON value of one line, by the C scanner bound at import."""
    try:
        text = (line.decode("utf-8") if isinstance(line, (bytes, bytearray)) else str(line)).strip()
        value, end = _scan(text, 0)
    except (StopIteration, ValueError, UnicodeDecodeError, RecursionError) as error:
        raise ProtocolError(f"not JSON ({type(error).__name__})") from None
    if end != len(text):
        raise ProtocolError("not JSON (text after the value)")
    return value


def b64encode(raw: bytes) -> str:
    return _b64encode(raw, newline=False).decode("ascii")


def b64decode(text) -> bytes:
    if not isinstance(text, str):
        raise ProtocolError("malformed bytes")
    try:
        return _b64decode(text.encode("ascii"), strict_mode=True)
    except (binascii.Error, UnicodeEncodeError, ValueError):
        raise ProtocolError("malformed bytes") from None


# ---------------------------------------------------------------- data


class Opaque:
    """Stands for a learner output that cannot cross (its type name only)."""


def _opaque(type_name: str):
    cls = type(type_name if type_name.isidentifier() else "object", (Opaque,), {})
    return cls()


def _spend(budget: list, count: int = 1) -> None:
    budget[0] -= count
    if budget[0] < 0:
        raise ProtocolError(f"output made of more than {MAX_ITEMS} objects")


def encode(value, depth: int = 0, budget: list | None = None, codec: Codec | None = None):
    """``value`` as JSON-able data.

    Learner outputs on their way out of the sandbox are encoded without a codec: an object
    of any other kind crosses as its type name only. With a ``codec``, objects of the
    reference's classes cross as descriptions (see the module's text)."""
    import numpy  # here: the grade command's process reads this module without torch
    import torch  # here: the grade command's process reads this module without torch

    budget = budget if budget is not None else [MAX_ITEMS]
    _spend(budget)
    if depth > _MAX_DEPTH:
        raise ProtocolError("output nested too deeply")
    if value is None or isinstance(value, (bool, str)):
        return {"value": value}
    if isinstance(value, int):
        return {"value": int(value)} if abs(value) < 2**63 else {"object": "int"}
    if isinstance(value, float):
        return {"value": float(value)} if math.isfinite(value) else {"float": repr(float(value))}
    if isinstance(value, torch.Tensor):
        tensor = value.detach().cpu().contiguous()
        dtype = str(tensor.dtype).removeprefix("torch.")
        if dtype not in TENSOR_DTYPES:
            return {"object": f"tensor of {dtype}"}
        raw = tensor.reshape(-1).view(torch.uint8).numpy().tobytes() if tensor.numel() else b""
        return {"tensor": dtype, "shape": list(tensor.shape), "data": b64encode(raw)}
    if isinstance(value, numpy.ndarray):
        if value.dtype.kind not in "biufc":
            return {"object": "ndarray"}
        return {
            "tensor": str(torch.as_tensor(value).dtype).removeprefix("torch."),
            "numpy": True,
            **{k: v for k, v in encode(torch.as_tensor(value)).items() if k in ("shape", "data")},
        }
    if isinstance(value, numpy.generic):
        return encode(value.item(), depth + 1, budget, codec)
    if isinstance(value, (tuple, list)):
        if len(value) > MAX_ITEMS:
            raise ProtocolError(f"output made of more than {MAX_ITEMS} objects")
        return {
            "sequence": "list" if isinstance(value, list) else "tuple",
            "items": [encode(item, depth + 1, budget, codec) for item in value],
        }
    if type(value) is dict:
        if len(value) > MAX_ITEMS:
            raise ProtocolError(f"output made of more than {MAX_ITEMS} objects")
        items = []
        for key, item in value.items():
            if not (key is None or isinstance(key, (bool, int, float, str))):
                return {"object": "dict"}
            items.append([encode(key, depth + 1, budget), encode(item, depth + 1, budget, codec)])
        return {"dict": items}
    if codec is not None:
        described = codec.describe(value, depth, budget)
        if described is not None:
            return described
    return {"object": type(value).__name__[:80]}


def decode(data, depth: int = 0, budget: list | None = None, codec: Codec | None = None):
    """The value ``encode`` described; outside the sandbox, on untrusted data (bounded: at most
    ``MAX_ITEMS`` objects, ``_MAX_DEPTH`` levels, tensors of the size their bytes say).
    Descriptions of objects need a ``codec``; without one they are refused."""
    import torch  # here: the grade command's process reads this module without torch

    budget = budget if budget is not None else [MAX_ITEMS]
    _spend(budget)
    if depth > _MAX_DEPTH or not isinstance(data, dict):
        raise ProtocolError("malformed output")
    if "value" in data:
        value = data["value"]
        if value is not None and not isinstance(value, (bool, int, float, str)):
            raise ProtocolError("malformed value")
        return value
    if "float" in data:
        if data["float"] not in ("nan", "inf", "-inf"):
            raise ProtocolError("malformed float")
        return float(data["float"])
    if "tensor" in data:
        dtype_name, shape = data["tensor"], data.get("shape")
        if (
            dtype_name not in TENSOR_DTYPES
            or not isinstance(shape, list)
            or not all(isinstance(n, int) and not isinstance(n, bool) and 0 <= n for n in shape)
            or len(shape) > 16
        ):
            raise ProtocolError("malformed tensor")
        dtype = getattr(torch, dtype_name)
        raw = b64decode(data.get("data", ""))
        count = math.prod(shape)
        if count * torch.empty((), dtype=dtype).element_size() != len(raw):
            raise ProtocolError("tensor size does not match its shape")
        if count == 0:
            tensor = torch.empty(shape, dtype=dtype)
        else:
            tensor = torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(dtype).reshape(shape).clone()
        return tensor.numpy() if data.get("numpy") and dtype_name != "bfloat16" else tensor
    if "sequence" in data:
        items = data.get("items")
        if not isinstance(items, list):
            raise ProtocolError("malformed sequence")
        if len(items) > budget[0]:
            raise ProtocolError(f"output made of more than {MAX_ITEMS} objects")
        values = [decode(item, depth + 1, budget, codec) for item in items]
        return tuple(values) if data["sequence"] == "tuple" else values
    if "dict" in data:
        items = data["dict"]
        if not isinstance(items, list) or len(items) > budget[0]:
            raise ProtocolError("malformed dict")
        result = {}
        for pair in items:
            if not isinstance(pair, list) or len(pair) != 2:
                raise ProtocolError("malformed dict")
            key = decode(pair[0], depth + 1, budget)
            if not (key is None or isinstance(key, (bool, int, float, str))):
                raise ProtocolError("malformed dict key")
            result[key] = decode(pair[1], depth + 1, budget, codec)
        return result
    if "object" in data:
        return _opaque(str(data["object"])[:80])
    if codec is not None and any(kind in data for kind in Codec.KINDS):
        return codec.build(data, depth, budget)
    raise ProtocolError("unknown output kind")


# ---------------------------------------------------------------- objects of the reference's classes


_internals: list[frozenset] = []  # made once: a module's own attributes, as nn.Module sets them


def _module_internals() -> frozenset:
    if not _internals:
        from torch import nn  # here: the grade command's process reads this module without torch

        _internals.append(frozenset(vars(nn.Module())) | {"training"})
    return _internals[0]


def _name_ok(name) -> bool:
    return isinstance(name, str) and 0 < len(name) <= 100 and (name.isidentifier() or name.isdigit())


class Codec:
    """Objects of the reference's classes on the wire, for one side of it.

    A side says which classes and functions it can name (``classify``: a reference string
    such as ``"answer:Llama"``, ``"setup:GroupedQueryAttention"`` or ``"torch:Linear"``, or
    None) and what a name stands for on its side (``resolve``); the grader answers a
    ``Llama`` with the reference class, the kernel with a substitute that asks the grader.
    ``nn.Module`` instances cross as a description (class, weights, sub-modules, plain
    attributes), dataclass instances as their fields (a dataclass of a class neither side
    names crosses as a namespace of its fields), and objects that live on the grader's
    side as handles (``remote_handle`` / ``remote_object``).
    """

    KINDS = ("module", "dataclass", "class", "function", "remote", "namespace")

    def __init__(self):
        self.hooked: list = []  # modules with forward hooks, in the order they were encoded or built

    # the side's own vocabulary
    def classify(self, obj) -> str | None:
        return None

    def resolve(self, ref: str):
        return None

    def remote_handle(self, obj) -> dict | None:
        """``{"remote": handle, ...}`` for an object that lives on the grader's side, else None."""
        return None

    def remote_object(self, data: dict):
        raise ProtocolError("no objects are held here")

    def torch_ref(self, cls) -> str | None:
        from torch import nn  # here: the grade command's process reads this module without torch

        name = getattr(cls, "__name__", "")
        return f"torch:{name}" if isinstance(cls, type) and getattr(nn, name, None) is cls else None

    # ------------------------------------------------------------ out
    def describe(self, value, depth: int, budget: list):
        from torch import nn  # here: the grade command's process reads this module without torch

        remote = self.remote_handle(value)
        if remote is not None:
            return remote
        if isinstance(value, type):
            ref = self.classify(value) or self.torch_ref(value)
            return {"class": ref} if ref else None
        if isinstance(value, types.FunctionType):
            ref = self.classify(value)
            return {"function": ref} if ref else None
        if isinstance(value, nn.Module):
            ref = self.classify(type(value)) or self.torch_ref(type(value))
            if ref is None:
                raise ProtocolError(f"a {type(value).__name__[:80]} cannot be sent to the grader")
            return self._describe_module(value, ref, depth, budget)
        if dataclasses.is_dataclass(value) or isinstance(value, types.SimpleNamespace):
            ref = self.classify(type(value))
            fields = (
                {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
                if not hasattr(value, "__dict__")
                else dict(vars(value))
            )
            encoded = encode(fields, depth + 1, budget, self)
            return {"dataclass": ref, "fields": encoded} if ref else {"namespace": encoded}
        return None

    def _describe_module(self, module, ref: str, depth: int, budget: list) -> dict:
        if depth > _MAX_DEPTH:
            raise ProtocolError("output nested too deeply")
        internals = _module_internals()
        hooked = bool(module._forward_hooks or module._forward_pre_hooks)
        if hooked:
            self.hooked.append(module)
        return {
            "module": ref,
            "training": bool(module.training),
            "hooked": hooked,
            "params": [
                [
                    name,
                    None if p is None else self.weight(p, depth + 1, budget),
                    bool(p is not None and p.requires_grad),
                ]
                for name, p in module._parameters.items()
            ],
            "buffers": [
                [
                    name,
                    None if b is None else self.weight(b, depth + 1, budget),
                    name not in module._non_persistent_buffers_set,
                ]
                for name, b in module._buffers.items()
            ],
            "children": [
                [name, None if child is None else encode(child, depth + 1, budget, self)]
                for name, child in module._modules.items()
            ],
            "attrs": [
                [name, encode(value, depth + 1, budget, self)]
                for name, value in vars(module).items()
                if name not in internals
            ],
        }

    def weight(self, tensor, depth: int, budget: list) -> dict:
        """A module's parameter or buffer on the wire; a side that keeps track of what it sent may
        name one the other side kept (``{"tensor", "shape", "kept": key}``) or ask it to keep one
        (``"keep": key`` beside the data)."""
        return encode(tensor, depth, budget)

    # ------------------------------------------------------------ in
    def weight_value(self, data, depth: int, budget: list):
        """The tensor ``weight`` described; here only one sent in full (a ``kept`` key names nothing)."""
        return decode(data, depth, budget)

    def build(self, data: dict, depth: int, budget: list):
        if "remote" in data:
            return self.remote_object(data)
        if "namespace" in data:
            fields = decode(data["namespace"], depth + 1, budget, self)
            if not isinstance(fields, dict) or not all(_name_ok(k) for k in fields):
                raise ProtocolError("malformed namespace")
            return types.SimpleNamespace(**fields)
        kind = next(kind for kind in ("module", "dataclass", "class", "function") if kind in data)
        ref = data[kind]
        target = self.resolve(ref) if isinstance(ref, str) else None
        if target is None:
            raise ProtocolError(f"unknown {kind} {str(ref)[:80]!r}")
        if kind in ("class", "function"):
            return target
        if kind == "dataclass":
            fields = decode(data.get("fields"), depth + 1, budget, self)
            if not isinstance(target, type) or not isinstance(fields, dict) or not all(_name_ok(k) for k in fields):
                raise ProtocolError("malformed dataclass")
            obj = object.__new__(target)
            for name, value in fields.items():
                object.__setattr__(obj, name, value)
            return obj
        return self._build_module(target, data, depth, budget)

    def empty_module(self, cls):
        """An instance of the module class ``cls`` with nothing in it yet (its ``__init__`` not run)."""
        from torch import nn  # here: the grade command's process reads this module without torch

        if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
            raise ProtocolError("malformed module")
        module = object.__new__(cls)
        nn.Module.__init__(module)
        return module

    def _build_module(self, cls, data: dict, depth: int, budget: list):
        module = self.empty_module(cls)
        self.fill_module(module, data, depth, budget)
        return module

    def fill_module(self, module, data: dict, depth: int, budget: list) -> None:
        """Give ``module`` (made by ``empty_module``) what ``data`` describes."""
        import torch  # here: the grade command's process reads this module without torch
        from torch import nn  # here: the grade command's process reads this module without torch

        if depth > _MAX_DEPTH:
            raise ProtocolError("output nested too deeply")
        internals = _module_internals()
        parts = {key: data.get(key) for key in ("params", "buffers", "children", "attrs")}
        if not all(isinstance(part, list) for part in parts.values()):
            raise ProtocolError("malformed module")
        module.training = bool(data.get("training"))
        for entry in parts["params"]:
            if not (isinstance(entry, list) and len(entry) == 3 and _name_ok(entry[0])):
                raise ProtocolError("malformed parameter")
            name, tensor, grad = entry
            value = None if tensor is None else self.weight_value(tensor, depth + 1, budget)
            if value is not None and not isinstance(value, torch.Tensor):
                raise ProtocolError("malformed parameter")
            grad = bool(grad) and value is not None and (value.is_floating_point() or value.is_complex())
            module._parameters[name] = None if value is None else nn.Parameter(value, requires_grad=grad)
        for entry in parts["buffers"]:
            if not (isinstance(entry, list) and len(entry) == 3 and _name_ok(entry[0])):
                raise ProtocolError("malformed buffer")
            name, tensor, persistent = entry
            value = None if tensor is None else self.weight_value(tensor, depth + 1, budget)
            if value is not None and not isinstance(value, torch.Tensor):
                raise ProtocolError("malformed buffer")
            module._buffers[name] = value
            if not persistent:
                module._non_persistent_buffers_set.add(name)
        for entry in parts["children"]:
            if not (isinstance(entry, list) and len(entry) == 2 and _name_ok(entry[0])):
                raise ProtocolError("malformed sub-module")
            name, child = entry
            value = None if child is None else decode(child, depth + 1, budget, self)
            if value is not None and not isinstance(value, nn.Module):
                raise ProtocolError("malformed sub-module")
            module._modules[name] = value
        for entry in parts["attrs"]:
            if not (isinstance(entry, list) and len(entry) == 2 and _name_ok(entry[0])):
                raise ProtocolError("malformed attribute")
            name, value = entry
            if name in internals or name.startswith("__"):
                raise ProtocolError("malformed attribute")
            module.__dict__[name] = decode(value, depth + 1, budget, self)
        if data.get("hooked"):
            self.hooked.append(module)


# ---------------------------------------------------------------- lines


def read_line(stream, limit: int = MAX_MESSAGE) -> dict:
    line = stream.readline(limit + 1)
    if not line:
        raise ProtocolError("connection closed")
    return parse_line(line, limit)


def parse_line(line, limit: int = MAX_MESSAGE) -> dict:
    if len(line) > limit:
        raise ProtocolError("message too large")
    # Bounded before parsing: every object of the message opens a brace (a tensor's
    # bytes are one base64 string, which has none), so this counts them in one pass.
    if line.count(b"{" if isinstance(line, (bytes, bytearray)) else "{") > 4 * MAX_ITEMS:
        raise ProtocolError("message made of too many objects")
    message = loads(line)
    if not isinstance(message, dict):
        raise ProtocolError("a message must be an object")
    return message


def write_line(stream, message: dict) -> None:
    stream.write(dumps(message) + b"\n")
    stream.flush()


# ---------------------------------------------------------------- the kernel's side


def _receive(connection) -> dict:
    """The grader's reply: one line, which ends the last chunk it sends before it waits again."""
    chunks, size = [], 0
    while True:
        chunk = connection.recv(1 << 20)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
        if size > MAX_MESSAGE + 1:
            raise ProtocolError("message too large")
        if chunk.endswith(b"\n"):
            break
    if not chunks:
        raise ConnectionClosed("connection closed")
    return parse_line(b"".join(chunks))


def _line(message: dict) -> bytes:
    data = dumps(message) + b"\n"
    if len(data) > MAX_MESSAGE:
        raise ProtocolError("message too large")
    return data


def _invocation(connection, token: str):
    """``send(message) -> reply`` on a check's own connection, each message with the check's token
    and the next number, one at a time (the token and the count live here only)."""
    count = [0]
    lock = _Lock()

    def send(message: dict) -> dict:
        with lock:
            count[0] += 1
            connection.sendall(_line({**message, "invocation": token, "seq": count[0]}))
            return _receive(connection)

    return send


class Link(NamedTuple):
    """The kernel's end, to the socket at ``path`` (fixed when the kernel starts): a short
    connection per request, or a check's own connection from its begin to its end (``open``)."""

    path: str

    def _connect(self):
        connection = _Socket(_AF_UNIX, _SOCK_STREAM)
        try:
            connection.connect(self.path)
        except BaseException:
            connection.close()
            raise
        return connection

    def ask(self, message: dict) -> dict:
        data = _line(message)
        connection = self._connect()
        try:
            connection.sendall(data)
            return _receive(connection)
        finally:
            connection.close()

    def open(self, assignment: str, name: str, tampered) -> tuple:
        """Begin a check on a connection of its own: (the grader's reply, ``send`` for the rest of
        the check's messages or None when it refused, ``close``)."""
        data = _line({"op": "begin", "assignment": assignment, "name": name, "tampered": list(tampered)})
        connection = self._connect()
        try:
            connection.sendall(data)
            reply = _receive(connection)
            token = reply.pop("invocation", None)
        except BaseException:
            connection.close()
            raise
        if not isinstance(token, str):
            connection.close()
            return reply, None, connection.close
        return reply, _invocation(connection, token), connection.close

    @staticmethod
    def result(assignment: str, name: str, problem, outputs, tampered, observations=()) -> dict:
        """What a check sends once it has observed: the outputs and what its probes saw, as data."""
        try:
            encoded = [encode(output) for output in outputs]
            seen = [encode(observation) for observation in observations]
        except ProtocolError as error:
            problem, encoded = problem or f"`{name}` returned something that cannot be checked ({error}).", []
            seen = []
        return {
            "op": "result",
            "assignment": assignment,
            "name": name,
            "problem": problem,
            "outputs": encoded,
            "observations": seen,
            "tampered": list(tampered),
        }


def link() -> Link | None:
    """The link to the grader when this kernel runs under the sandboxed grader, else None."""
    path = os.environ.get(ENVIRONMENT)
    return Link(path) if path else None
