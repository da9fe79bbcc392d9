"""The wire between the learner's kernel and the judge (course_checks/verdict.py): what crosses
it, what is refused, and the check calls read from a cell's text."""

from __future__ import annotations

import json
import math

import pytest
import torch

from course_checks import verdict


@pytest.mark.parametrize(
    "value",
    [
        torch.tensor([[1.0, 2.0], [3.0, float("nan")]]),
        torch.arange(6, dtype=torch.int64).reshape(2, 3),
        torch.tensor([True, False]),
        torch.zeros(0, 4, dtype=torch.float64),
        torch.tensor(2.5, dtype=torch.bfloat16),
        (torch.ones(2), [1, 2.5, None, "x", True]),
        float("inf"),
    ],
)
def test_outputs_cross_the_wire_unchanged(value):
    back = verdict.decode(verdict.encode(value))

    def same(a, b):
        if isinstance(a, torch.Tensor):
            return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.nan_to_num(7.0), b.nan_to_num(7.0))
        if isinstance(a, (tuple, list)):
            return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
        if isinstance(a, float) and math.isinf(a):
            return a == b
        return a == b

    assert same(value, back)


def test_unknown_objects_cross_as_their_type_name_only():
    class Sneaky:
        def __reduce__(self):
            raise AssertionError("never pickled")

    back = verdict.decode(verdict.encode(Sneaky()))
    assert type(back).__name__ == "Sneaky" and isinstance(back, verdict.Opaque)


@pytest.mark.parametrize(
    "data",
    [
        {"tensor": "float32", "shape": [2], "data": "AAAA"},  # 3 bytes for 8
        {"tensor": "object", "shape": [1], "data": ""},  # not a tensor dtype
        {"tensor": "float32", "shape": [-1], "data": ""},
        {"value": {"nested": "dict"}},
        {"float": "1e999"},
        {"sequence": "tuple", "items": "not a list"},
        {"__reduce__": "os.system"},
        "just a string",
    ],
)
def test_malformed_outputs_are_refused(data):
    with pytest.raises(verdict.ProtocolError):
        verdict.decode(data)


def test_check_calls_are_read_from_text():
    source = (
        '### BEGIN HIDDEN TESTS\nfrom course_checks.checks import check; check("01_attention", "softmax", globals())'
    )
    assert verdict.expected_checks(source) == [("01_attention", "softmax")]


def test_decoding_is_bounded():
    with pytest.raises(verdict.ProtocolError):
        verdict.encode([[0.5] * 1000] * 2000)
    many = {"sequence": "list", "items": [{"value": 0}] * (verdict.MAX_ITEMS + 1)}
    with pytest.raises(verdict.ProtocolError):
        verdict.decode(many)
    line = json.dumps({"op": "result", "outputs": [{"value": 0}] * 3_000_000}).encode() + b"\n"

    class Stream:
        def readline(self, limit):
            return line[:limit]

    with pytest.raises(verdict.ProtocolError):
        verdict.read_line(Stream())
