"""The referee keeps a module it built from a kernel's description for the session's next call
(``referee.Built``): 08's generation sends the same model a dozen times in a row. A module is used
again only when its description is the same in every part and nothing changed it since; otherwise
the reference gets a new one, built as before."""

from __future__ import annotations

import copy
import types

import pytest
import torch

from autograder.worker import referee
from course_checks import verdict

REFERENCE = """
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self, history=False):
        super().__init__()
        self.lin = nn.Linear(3, 2)
        self.scale = 2.0
        if history:
            self.seen = []  # a plain attribute that can change inside

    def forward(self, x):
        return self.lin(x) * self.scale
"""


@pytest.fixture()
def ref():
    module = types.ModuleType("reference_for_the_test")
    exec(REFERENCE, vars(module))
    return module


class KernelSide(verdict.Codec):
    """Names ``Net`` as the kernel's side does: a description of the module, weights and all."""

    def __init__(self, ref):
        super().__init__()
        self.ref = ref

    def classify(self, obj):
        return "answer:Net" if obj is self.ref.Net else None


def described(ref, net) -> dict:
    return verdict.encode(net, 0, [verdict.MAX_ITEMS], KernelSide(ref))


def received(ref, session, description, budget=None, codec=None):
    """The module a call's argument stands for on the referee's side (a fresh copy of the wire's data
    each time, as each call parses its own message)."""
    codec = codec or referee.ReferenceCodec(ref, {"Net"}, session)
    budget = [verdict.MAX_ITEMS] if budget is None else budget
    return verdict.decode(copy.deepcopy(description), 1, budget, codec)


def test_the_same_module_sent_again_is_the_one_built_before(ref):
    torch.manual_seed(0)
    net = ref.Net()
    session = referee.Session()
    first = received(ref, session, described(ref, net))
    again = received(ref, session, described(ref, net))
    assert again is first
    assert torch.equal(again.lin.weight, net.lin.weight)
    other = referee.Session()  # another notebook's session keeps its own
    assert received(ref, other, described(ref, net)) is not first


def test_a_module_with_other_weights_is_built_anew(ref):
    torch.manual_seed(0)
    net = ref.Net()
    session = referee.Session()
    first = received(ref, session, described(ref, net))
    with torch.no_grad():
        net.lin.bias.add_(1.0)
    second = received(ref, session, described(ref, net))
    assert second is not first
    assert torch.equal(second.lin.bias, net.lin.bias)


@pytest.mark.parametrize(
    "change",
    [
        lambda m: m.lin.weight.data.mul_(3.0),  # in place, through .data
        lambda m: torch.nn.init.zeros_(m.lin.bias),
        lambda m: setattr(m, "scale", 5.0),
        lambda m: setattr(m.lin, "weight", torch.nn.Parameter(torch.zeros(2, 3))),
        lambda m: m.lin.register_forward_hook(lambda *args: None),
        lambda m: m.train(not m.training),
        lambda m: m.add_module("extra", torch.nn.Identity()),
    ],
)
def test_a_module_the_reference_changed_is_built_anew_as_described(ref, change):
    torch.manual_seed(0)
    net = ref.Net()
    session = referee.Session()
    first = received(ref, session, described(ref, net))
    with torch.no_grad():
        change(first)
    again = received(ref, session, described(ref, net))
    assert again is not first
    assert torch.equal(again.lin.weight, net.lin.weight) and torch.equal(again.lin.bias, net.lin.bias)
    assert again.scale == 2.0 and again.training == net.training and "extra" not in again._modules
    assert not again.lin._forward_hooks


def test_a_module_with_a_list_inside_is_never_kept(ref):
    net = ref.Net(history=True)
    session = referee.Session()
    first = received(ref, session, described(ref, net))
    first.seen.append("a call")
    again = received(ref, session, described(ref, net))
    assert again is not first and again.seen == []


def test_one_module_given_twice_in_a_call_is_two_modules(ref):
    net = ref.Net()
    session = referee.Session()
    received(ref, session, described(ref, net))
    codec = referee.ReferenceCodec(ref, {"Net"}, session)
    budget = [verdict.MAX_ITEMS]
    a = received(ref, session, described(ref, net), budget, codec)
    b = received(ref, session, described(ref, net), budget, codec)
    assert a is not b


def test_a_kept_module_costs_the_calls_budget_what_building_it_did(ref):
    net = ref.Net()
    session = referee.Session()
    budget = [verdict.MAX_ITEMS]
    first = received(ref, session, described(ref, net), budget)
    spent = verdict.MAX_ITEMS - budget[0]
    assert spent > 0
    budget = [verdict.MAX_ITEMS]
    assert received(ref, session, described(ref, net), budget) is first
    assert verdict.MAX_ITEMS - budget[0] == spent
    with pytest.raises(verdict.ProtocolError):
        received(ref, session, described(ref, net), [spent - 1])


def test_a_session_keeps_a_few_modules_only(ref):
    session = referee.Session()
    for seed in range(referee.KEPT_MODULES + 3):
        torch.manual_seed(seed)
        received(ref, session, described(ref, ref.Net()))
    assert len(session.built) == referee.KEPT_MODULES


# ---------------------------------------------------------------- weights kept by key


def test_a_weight_kept_under_a_key_is_given_as_it_was_sent_and_never_replaced():
    session = referee.Session()
    weight = torch.arange(6.0).reshape(2, 3)
    assert session.keep("k.1", weight)
    weight.mul_(10)  # the referee kept a copy of the values it was sent
    assert not session.keep("k.1", torch.zeros(2, 3))  # a key always names the same values
    named = session.kept({"tensor": "float32", "shape": [2, 3], "kept": "k.1"})
    assert torch.equal(named, torch.arange(6.0).reshape(2, 3))
    named.add_(1)  # a copy each time: what the reference does with one changes nothing kept
    assert torch.equal(
        session.kept({"tensor": "float32", "shape": [2, 3], "kept": "k.1"}), torch.arange(6.0).reshape(2, 3)
    )
    for wrong in ({"tensor": "float64", "shape": [2, 3]}, {"tensor": "float32", "shape": [3, 2]}):
        with pytest.raises(verdict.ProtocolError):
            session.kept({**wrong, "kept": "k.1"})
    with pytest.raises(referee.Resend):
        session.kept({"tensor": "float32", "shape": [2, 3], "kept": "k.2"})
    with pytest.raises(referee.Resend):
        referee.Session().kept({"tensor": "float32", "shape": [2, 3], "kept": "k.1"})  # another cell's


def test_the_weights_a_session_keeps_are_bounded():
    session = referee.Session()
    assert not session.keep("x" * 65, torch.zeros(1)) and not session.keep(7, torch.zeros(1))
    big = torch.zeros(verdict.KEPT_WEIGHT_BYTES // 4)
    assert session.keep("big", big) and not session.keep("one more", torch.zeros(1))
    session = referee.Session()
    assert all(session.keep(f"k.{n}", torch.zeros(1)) for n in range(verdict.KEPT_WEIGHTS))
    assert not session.keep("k.last", torch.zeros(1))


def test_a_call_naming_a_weight_the_referee_does_not_keep_is_answered_resend(ref):
    oracle = referee.Oracle()
    oracle.load("key", "99_net", [("Net", REFERENCE)], {"Net"})
    torch.manual_seed(0)
    net = ref.Net()
    description = described(ref, net)
    weight = description["children"][0][1]["params"][0]
    weight[1] = {"tensor": "float32", "shape": [2, 3], "kept": "never.1"}
    args = verdict.encode([torch.ones(1, 3)], 0, [verdict.MAX_ITEMS])
    line = verdict.dumps({"op": "forward", "target": "Net", "self": description, "args": args})
    assert oracle.answer("key", "session", line) == {"resend": True}
