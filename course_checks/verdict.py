"""The wire between a sandboxed notebook's ``check`` and the trusted grader outside.

Inside the sandbox ``check`` (``checks.diagnose``) asks the grader, over a Unix
socket whose path is in ``AUTOGRADER_VERDICTS`` (read once, as the kernel starts),
for the cases to run (``begin``), runs the learner's function on them, and sends
the outputs back (``result``); the grader (``autograder.worker.judge``) compares
them with the reference and answers with the message to show, or none when the
check passed. The grader records that verdict itself: whatever the notebook does
with the answer, its points come from the grader's record. ``Link`` is one of
the two judges ``checks`` knows (the other, ``autograder.local_judge``, judges in
the kernel itself).

Messages are one JSON line each way. Outputs cross as plain data (``encode``:
numbers, strings, tensors as dtype, shape and raw bytes, sequences): the grader
never unpickles anything that comes from student code. The cases go the other
way pickled, from the trusted side to the sandbox.
"""

from __future__ import annotations

import base64
import json
import math
import os
import pickle
import re
import socket

from .cases import Shipment
from .modules import module_from_cells

ENVIRONMENT = "AUTOGRADER_VERDICTS"
MAX_MESSAGE = 64 * 1024 * 1024  # bytes of one message, either way
_MAX_DEPTH = 16
# Items (numbers, strings, tensors, sequences) in one message's outputs: tensors cross
# as one string each, so honest outputs have a few dozen; one output made of millions
# of small objects would cost the judge seconds and gigabytes to parse and decode.
MAX_ITEMS = 10_000
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


CHECK_CALL = re.compile(r"""check\(\s*["']([^"']+)["']\s*,\s*["']([^"']+)["']""")


def expected_checks(source: str) -> list[tuple[str, str]]:
    """(assignment, exercise) of each ``check(...)`` call in a grade cell's source."""
    return CHECK_CALL.findall(source)


class ProtocolError(ValueError):
    """A message that does not follow the protocol (from a broken or hostile notebook)."""


# ---------------------------------------------------------------- data


def encode(value, depth: int = 0, budget: list | None = None):
    """``value`` as JSON-able data: learner outputs on their way out of the sandbox."""
    import numpy  # here: the grade command's process reads this module without torch
    import torch  # here: the grade command's process reads this module without torch

    budget = budget if budget is not None else [MAX_ITEMS]
    budget[0] -= 1
    if budget[0] < 0:
        raise ProtocolError(f"output made of more than {MAX_ITEMS} objects")
    if depth > _MAX_DEPTH:
        raise ProtocolError("output nested too deeply")
    if value is None or isinstance(value, (bool, str)):
        return {"value": value}
    if isinstance(value, int):
        return {"value": value} if abs(value) < 2**63 else {"object": "int"}
    if isinstance(value, float):
        return {"value": value} if math.isfinite(value) else {"float": repr(value)}
    if isinstance(value, torch.Tensor):
        tensor = value.detach().cpu().contiguous()
        dtype = str(tensor.dtype).removeprefix("torch.")
        if dtype not in TENSOR_DTYPES:
            return {"object": f"tensor of {dtype}"}
        raw = tensor.reshape(-1).view(torch.uint8).numpy().tobytes() if tensor.numel() else b""
        return {"tensor": dtype, "shape": list(tensor.shape), "data": base64.b64encode(raw).decode("ascii")}
    if isinstance(value, numpy.ndarray):
        if value.dtype.kind not in "biufc":
            return {"object": "ndarray"}
        return {
            "tensor": str(torch.as_tensor(value).dtype).removeprefix("torch."),
            "numpy": True,
            **{k: v for k, v in encode(torch.as_tensor(value)).items() if k in ("shape", "data")},
        }
    if isinstance(value, numpy.generic):
        return encode(value.item(), depth + 1, budget)
    if isinstance(value, (tuple, list)):
        if len(value) > MAX_ITEMS:
            raise ProtocolError(f"output made of more than {MAX_ITEMS} objects")
        return {
            "sequence": "tuple" if isinstance(value, tuple) else "list",
            "items": [encode(item, depth + 1, budget) for item in value],
        }
    return {"object": type(value).__name__[:80]}


class Opaque:
    """Stands for a learner output that cannot cross (its type name only)."""


def _opaque(type_name: str):
    cls = type(type_name if type_name.isidentifier() else "object", (Opaque,), {})
    return cls()


def decode(data, depth: int = 0, budget: list | None = None):
    """The value ``encode`` described; outside the sandbox, on untrusted data (bounded: at most
    ``MAX_ITEMS`` objects, ``_MAX_DEPTH`` levels, tensors of the size their bytes say)."""
    import torch  # here: the grade command's process reads this module without torch

    budget = budget if budget is not None else [MAX_ITEMS]
    budget[0] -= 1
    if budget[0] < 0:
        raise ProtocolError(f"output made of more than {MAX_ITEMS} objects")
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
            or not all(isinstance(n, int) and 0 <= n for n in shape)
            or len(shape) > 16
        ):
            raise ProtocolError("malformed tensor")
        dtype = getattr(torch, dtype_name)
        raw = base64.b64decode(data.get("data", ""), validate=True)
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
        values = [decode(item, depth + 1, budget) for item in items]
        return tuple(values) if data["sequence"] == "tuple" else values
    if "object" in data:
        return _opaque(str(data["object"])[:80])
    raise ProtocolError("unknown output kind")


def unpack(text: str):
    return pickle.loads(base64.b64decode(text))


# ---------------------------------------------------------------- lines


def read_line(stream, limit: int = MAX_MESSAGE) -> dict:
    line = stream.readline(limit + 1)
    if not line:
        raise ProtocolError("connection closed")
    if len(line) > limit:
        raise ProtocolError("message too large")
    # Bounded before parsing: every object of the message opens a brace (a tensor's
    # bytes are one base64 string, which has none), so this counts them in one pass.
    if line.count(b"{" if isinstance(line, bytes) else "{") > 4 * MAX_ITEMS:
        raise ProtocolError("message made of too many objects")
    message = json.loads(line)
    if not isinstance(message, dict):
        raise ProtocolError("a message must be an object")
    return message


def write_line(stream, message: dict) -> None:
    stream.write(json.dumps(message).encode("utf-8") + b"\n")
    stream.flush()


# ---------------------------------------------------------------- the kernel's side


class Link:
    """The kernel's end: one short connection per request."""

    def __init__(self, path: str):
        self.path = path

    def ask(self, message: dict) -> dict:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
            connection.connect(self.path)
            stream = connection.makefile("rwb")
            write_line(stream, message)
            return read_line(stream)

    def begin(self, assignment: str, name: str, tampered):
        """The grader's refusal (a message), or the ``checks.Shipment`` to observe with.

        The reference cells it sends (the exercise's dependencies) are built into a module
        first; then the cases and properties are unpacked (``unpack``): they may carry
        objects of the classes those cells define (a reference config, a model).
        """
        reply = self.ask({"op": "begin", "assignment": assignment, "name": name, "tampered": list(tampered)})
        if reply.get("message"):
            return str(reply["message"])
        reference = module_from_cells(assignment, reply.get("cells", []))
        return Shipment(
            target=str(reply["target"]),
            depends_on=tuple(reply.get("depends_on", ())),
            properties=tuple(unpack(reply["properties"])),
            reference=reference,
            cases=list(unpack(reply["cases"])),
        )

    def result(self, assignment: str, name: str, problem, outputs, tampered) -> str | None:
        """The grader's message for the learner, or None when the check passed."""
        try:
            encoded = [encode(output) for output in outputs]
        except ProtocolError as error:
            problem, encoded = problem or f"`{name}` returned something that cannot be checked ({error}).", []
        reply = self.ask(
            {
                "op": "result",
                "assignment": assignment,
                "name": name,
                "problem": problem,
                "outputs": encoded,
                "tampered": list(tampered),
            }
        )
        return reply.get("message")

    def missing(self, assignment: str, name: str, message: str, tampered) -> str:
        """Tell the grader the learner's object is not defined; its message for the learner."""
        reply = self.ask(
            {"op": "missing", "assignment": assignment, "name": name, "problem": message, "tampered": list(tampered)}
        )
        return reply.get("message") or message


def link() -> Link | None:
    """The link to the grader when this kernel runs under the sandboxed grader, else None."""
    path = os.environ.get(ENVIRONMENT)
    return Link(path) if path else None
