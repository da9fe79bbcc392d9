"""The judge on a made-up assignment (autograder/worker/judge.py): what it ships to the kernel, and its verdicts."""

import json
import types

import pytest
import torch

from autograder.exercises import catalogue
from autograder.worker import judge
from course_checks import proxies, verdict

FAKE_CELLS = [
    ("setup_imports", "import torch\nfrom torch import nn"),
    ("double", "def double(x):\n    return 2 * x"),
    ("quad", "def quad(x):\n    return double(double(x))"),
    (
        "Tiny",
        "class Tiny(nn.Module):\n    def __init__(self, d):\n        super().__init__()\n"
        "        self.proj = nn.Linear(d, d, bias=False)\n    def forward(self, x):\n        return self.proj(x)",
    ),
]


@pytest.fixture
def fake_judge(monkeypatch):
    """A Judge for a made-up assignment with a function, a dependant and an nn.Module exercise."""

    def cases(ref):
        g = torch.Generator().manual_seed(0)
        yield catalogue.Case("a vector", (torch.randn(4, generator=g),))

    def module_cases(ref):
        yield catalogue.module_case("a batch", (torch.ones(2, 3),), reference=ref.Tiny, init_args=(3,), seed=5)

    module = types.SimpleNamespace(
        ASSIGNMENT="99_fake",
        EXERCISES={
            "double": catalogue.Exercise("double", cases),
            "quad": catalogue.Exercise(
                "quad",
                cases,
                depends_on=("double",),
                mistakes=[catalogue.Mistake("times-two", "doubled once", "Double twice.", lambda ref: ref.double)],
            ),
            "Tiny": catalogue.Exercise("Tiny", module_cases),
        },
    )
    monkeypatch.setattr(judge, "module_for", lambda assignment: module)
    return judge.Judge("99_fake", FAKE_CELLS)


def test_dependencies_are_handed_over_only_after_their_own_check_and_never_as_code(fake_judge):
    graded = {"double", "quad", "Tiny"}
    early = fake_judge.shipment("quad", checked=set(), graded=graded)
    assert "checked before `double`" in early["message"]
    shipment = fake_judge.shipment("quad", checked={"double"}, graded=graded)
    assert shipment["setup"] == [FAKE_CELLS[0]]  # the set-up cell's code; no answer cell's
    assert shipment["answers"]["double"] == {"kind": "function"} and "quad" not in shipment["answers"]
    assert shipment["grant"] == ["double"]  # the one substitute this check may call
    assert "def double" not in json.dumps({k: v for k, v in shipment.items() if k != "grant"})
    own = fake_judge.shipment("double", checked=set(), graded=graded)
    assert own["grant"] == [] and "double" not in own["answers"]


def test_module_cases_ship_their_weights_but_not_the_reference_class(fake_judge):
    shipment = fake_judge.shipment("Tiny", checked=set(), graded={"Tiny"})
    assert shipment["grant"] == [] and "Tiny" not in shipment["answers"]
    raw = verdict.b64decode(shipment["cases"])
    assert b"reference" not in raw and b"Tiny" not in raw
    (case,) = proxies.unpack(shipment["cases"])
    assert not hasattr(case, "reference") and set(case.state) == {"proj.weight"}
    output = case.run(fake_judge.ref.Tiny)  # the learner's class would be built the same way
    assert fake_judge.verdict("Tiny", None, [verdict.encode(output)], []) is None
    assert "does not match" in fake_judge.verdict("Tiny", None, [verdict.encode(output + 1)], [])


def test_verdicts_name_mistakes_and_refuse_tampering(fake_judge):
    (case,) = fake_judge.cases("quad")
    right = verdict.encode(4 * case.args[0])
    once = verdict.encode(2 * case.args[0])
    assert fake_judge.verdict("quad", None, [right], []) is None
    assert fake_judge.verdict("quad", None, [once], []).endswith("[mistake:times-two]")
    assert "[mistake:tampering]" in fake_judge.verdict("quad", None, [right], ["torch.allclose"])
    assert fake_judge.verdict("quad", "`quad` raised TypeError: boom", [], []) == "`quad` raised TypeError: boom"
    assert "every case" in fake_judge.verdict("quad", None, [], [])


def _torch_threads() -> int:
    return torch.get_num_threads()


def test_the_local_pool_judges_on_one_torch_thread():
    """A pool process of ``./course grade`` runs the judge's torch on one thread, as its kernels and
    referees do: torch's default (a thread per core) had each worker's judge compete for the cores
    the other workers' kernels run on. (On a one-core machine the default is one thread already.)"""
    from pathlib import Path

    from autograder.engine.runners import LocalPool
    from autograder.sandboxing.bubblewrap import Limits

    # (the fork server is a fresh interpreter: torch's default there is a thread per core)
    pool = LocalPool(Path(__file__).resolve().parents[1], Limits(), sandboxed=False, workers=1)
    try:
        pool.start(1)
        pool._launched()
        assert pool.lanes[0].executor.submit(_torch_threads).result(timeout=120) == 1
    finally:
        pool.join()
