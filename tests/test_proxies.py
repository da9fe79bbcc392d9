"""Substitutes for the reference (``course_checks.proxies``), answered outside the kernel.

Each test drives the kernel's side (``proxies.RemoteJudge`` over a real ``verdict.Link``) against a
real ``judge.VerdictServer`` and a real referee process (``worker.referee.Referee``), in this
process: what a sandboxed kernel does, without the sandbox. The made-up assignment below has an
answer of every kind a substitute stands for: functions, an ``nn.Module``, a plain class whose
objects the referee holds, a dataclass.
"""

from __future__ import annotations

import threading
import time
import types

import pytest
import torch
from torch import nn

from autograder.exercises import catalogue
from autograder.worker import judge, referee
from course_checks import checks, proxies, verdict

CELLS = [
    ("setup_imports", "import time\nimport torch\nfrom torch import nn\nfrom dataclasses import dataclass"),
    ("double", "def double(x):\n    return 2 * x"),
    ("table", "def table(n):\n    return torch.ones(n, n)"),
    ("slow", "def slow(seconds):\n    time.sleep(seconds)\n    return seconds"),
    (
        "Counter",
        "class Counter:\n    def __init__(self):\n        self.items = []\n    def add(self, x):\n"
        "        self.items.append(x)\n        return len(self.items)\n    @property\n    def size(self):\n"
        "        return len(self.items)",
    ),
    (
        "Sizes",
        "@dataclass\nclass Sizes:\n    width: int\n    depth: int = 2\n    def __post_init__(self):\n"
        "        if self.width % 2:\n            raise ValueError(f'odd width {self.width}')",
    ),
    (
        "Tiny",
        "class Tiny(nn.Module):\n    def __init__(self, d):\n        super().__init__()\n"
        "        self.proj = nn.Linear(d, d, bias=False)\n    def forward(self, x):\n        return 2 * self.proj(x)",
    ),
    ("uses", "def uses(x):\n    return double(x)"),
]
ANSWERS = ("double", "table", "slow", "Counter", "Sizes", "Tiny")
ASSIGNMENT = "99_fake"


def _cases(ref):
    yield catalogue.Case("a vector", (torch.arange(3.0),))


@pytest.fixture(scope="module")
def answers():
    """The referee process, started once for this module."""
    started = referee.Referee(memory_mb=512)
    started.start()
    yield started
    started.close()


@pytest.fixture
def kernel(tmp_path, monkeypatch, answers):
    """A verdict server for the fake notebook, and the kernel's judge talking to it: ``check`` runs
    in the cell ``test_uses``, every other exercise counted as checked already."""
    exercises = {name: catalogue.Exercise(name, _cases) for name in ANSWERS}
    exercises["uses"] = catalogue.Exercise("uses", _cases, depends_on=ANSWERS)
    monkeypatch.setattr(judge, "module_for", lambda assignment: types.SimpleNamespace(EXERCISES=exercises))
    expected = {f"test_{name}": [(ASSIGNMENT, name)] for name in exercises}
    server = judge.VerdictServer(
        str(tmp_path / "verdicts.sock"), {ASSIGNMENT: judge.Judge(ASSIGNMENT, CELLS)}, expected, answers, 20
    )
    server.new_kernel([f"test_{name}" for name in ANSWERS])
    server.start_cell("test_uses")
    try:
        yield server, proxies.RemoteJudge(verdict.Link(server.path))
    finally:
        server.end_cell()
        server.close()


def given(kernel) -> proxies.Given:
    _, remote = kernel
    shipment = remote.begin(ASSIGNMENT, "uses", [])
    assert not isinstance(shipment, str), shipment
    return shipment.given


def test_each_kind_of_answer_is_a_substitute_answered_outside(kernel):
    ref = given(kernel)
    assert ref.double(torch.arange(3.0)).tolist() == [0.0, 2.0, 4.0]
    assert not hasattr(ref.double, "__wrapped__") and ref.double.__code__.co_filename == proxies.__file__
    counter = ref.Counter()  # the object lives in the referee; this is its handle
    assert [counter.add("a"), counter.add("b")] == [1, 2] and counter.size == 2 and counter.items == ["a", "b"]
    assert "items" not in vars(counter)
    assert ref.Sizes(4).depth == 2 and ref.Sizes(width=6, depth=3) == ref.Sizes(6, 3)
    with pytest.raises(ValueError, match="odd width 3"):  # checked as the reference checks it
        ref.Sizes(3)
    torch.manual_seed(0)
    tiny = ref.Tiny(4)  # its weights here, drawn as the reference draws them, from this random state
    after = torch.rand(())
    torch.manual_seed(0)
    expected_weight = nn.Linear(4, 4, bias=False).weight.detach()
    assert torch.equal(tiny.proj.weight, expected_weight) and torch.equal(torch.rand(()), after)
    assert list(dict(tiny.named_parameters())) == ["proj.weight"] and isinstance(tiny.proj, nn.Linear)
    with torch.no_grad():
        tiny.proj.weight.copy_(torch.eye(4))  # changed here: the forward outside uses it
    assert tiny(torch.ones(1, 4)).tolist() == [[2.0, 2.0, 2.0, 2.0]]
    tiny.load_state_dict({"proj.weight": 3 * torch.eye(4)})
    assert tiny.double()(torch.ones(1, 4, dtype=torch.float64)).dtype == torch.float64


def test_the_check_substitutes_them_for_the_learners_own(kernel):
    namespace = {"double": lambda x: x, "uses": lambda x: double(x)}  # noqa: F821  (the substitute's)
    exec("def uses(x):\n    return double(x)", namespace)
    outcome = checks.diagnose(ASSIGNMENT, "uses", namespace, judge=kernel[1])
    assert outcome.passed, outcome.message
    assert namespace["double"].__name__ == "double" and namespace["double"](1) == 2  # until the cell ends
    outcome.restore()
    assert namespace["double"](1) == 1


def test_a_substitute_answers_only_while_its_check_runs(kernel):
    server, _ = kernel
    double = given(kernel).double
    assert double(3) == 6
    server.end_cell()
    with pytest.raises(proxies.ProxyRefused, match="only while the check that handed it over runs"):
        double(3)
    server.start_cell("test_double")  # another check's cell: still not this one's
    with pytest.raises(proxies.ProxyRefused):
        double(3)


def test_a_substitute_waits_for_its_exercises_own_verdict(kernel):
    """Begun but not finished (the learner's code holds its result back): its substitute is refused."""
    server, remote = kernel
    server.new_kernel()
    server.expected["test_uses"] = [(ASSIGNMENT, "double"), (ASSIGNMENT, "uses")]
    for name in ANSWERS[1:]:
        server.done.add(name)
        server.checked.add(name)
    server.start_cell("test_uses")
    assert not isinstance(remote.begin(ASSIGNMENT, "double", []), str)
    substitutes = remote.begin(ASSIGNMENT, "uses", []).given
    with pytest.raises(proxies.ProxyRefused, match="only once its own check has run"):
        substitutes.double(3)
    remote.result(ASSIGNMENT, "double", None, [verdict.encode(torch.arange(3.0) * 2)], [])
    assert substitutes.double(3) == 6


def test_a_check_its_cell_stopped_counts_as_run(kernel):
    """Begun, then its cell interrupted before any result (a learner's code that never returns): the
    exercises built on it still get its substitute, so they keep their own points."""
    server, remote = kernel
    server.new_kernel()
    for name in ANSWERS[1:]:
        server.done.add(name)
        server.checked.add(name)
    server.end_cell()
    server.start_cell("test_double")
    assert not isinstance(remote.begin(ASSIGNMENT, "double", []), str)
    server.end_cell()  # stopped: no result ever came
    assert not server.cell_verdicts("test_double")[0].finished
    server.start_cell("test_uses")
    assert given(kernel).double(3) == 6


def test_a_replayed_check_keeps_its_first_verdict(kernel):
    server, remote = kernel
    server.end_cell()
    server.start_cell("test_double")
    remote.begin(ASSIGNMENT, "double", [])
    assert "does not match" in remote.result(ASSIGNMENT, "double", None, [verdict.encode(torch.zeros(3))], [])
    server.end_cell()
    server.new_kernel()  # the notebook replayed after a crash
    server.start_cell("test_double")
    remote.begin(ASSIGNMENT, "double", [])
    right = [verdict.encode(torch.arange(3.0) * 2)]
    assert "does not match" in remote.result(ASSIGNMENT, "double", None, right, [])
    assert not server.cell_verdicts("test_double")[0].passed


def test_the_referee_is_bounded_in_memory_and_time_and_comes_back(kernel, answers):
    ref = given(kernel)
    with pytest.raises((MemoryError, RuntimeError)):
        ref.table(20_000)  # 1.6 GB: more than the referee may take
    starts = answers.starts
    with pytest.raises(RuntimeError, match="took longer"):
        ref.slow(30)  # past the server's 20 s
    assert ref.double(2) == 4 and answers.starts == starts + 1  # a fresh referee answers the next call


def test_a_call_just_under_the_size_limit_is_answered_within_the_default_cell_limit(kernel, answers):
    """About 60 MB each way (11 M float32 values as base64, the size limit is 64 MB): the referee reads
    and writes it in linear time, so it is answered in about the time the reference takes, inside the
    default cell limit (the server's deadline for the call; past it the call fails)."""
    from autograder.sandboxing.bubblewrap import Limits

    server, _ = kernel
    server.seconds = Limits().cell_seconds
    x = torch.arange(11_000_000, dtype=torch.float32)
    size = len(verdict.dumps(verdict.encode(x)))
    assert 55e6 < size < verdict.MAX_MESSAGE
    started = time.monotonic()
    doubled = given(kernel).double(x)
    print(f"{size / 1e6:.1f} MB each way, answered in {time.monotonic() - started:.2f} s")
    assert torch.equal(doubled, 2 * x)


def test_the_referee_starts_between_cells_never_inside_one(kernel, answers):
    """Ready, with the reference loaded, before a notebook's cells run; stopped with a cell that
    ended while its call ran, and made ready again before the next cell: its start-up (torch's
    import, the reference built) never counts against a learner's cell."""
    server, _ = kernel
    key = server.judges[ASSIGNMENT].key
    answers.close()
    answers.prepare(server.judges.values())
    assert answers.alive() and answers._ready and key in answers.loaded
    slow, errors = given(kernel).slow, []

    def call():
        try:
            slow(5)
        except Exception as error:
            errors.append(error)

    thread = threading.Thread(target=call)
    thread.start()
    deadline = time.monotonic() + 20
    while not answers.busy and time.monotonic() < deadline:
        time.sleep(0.02)
    starts = answers.starts
    server.end_cell()  # the cell ended while the reference was still working for it
    thread.join(30)
    assert [type(error) for error in errors] == [RuntimeError] and "the grader" in str(errors[0])
    assert answers.starts == starts + 1
    assert answers.alive() and answers._ready and key in answers.loaded


def test_objects_held_outside_are_let_go_when_the_cell_ends(kernel):
    server, _ = kernel
    counter = given(kernel).Counter()
    counter.add(1)
    server.end_cell()
    server.start_cell("test_uses")
    with pytest.raises((proxies.ProxyRefused, ValueError)):  # a new check: that object is gone
        given(kernel).Counter.add(counter, 2)


def test_forward_hooks_see_the_calls_made_outside(kernel):
    ref = given(kernel)
    tiny = ref.Tiny(3)
    seen = []
    tiny.proj.register_forward_hook(lambda module, inputs, output: seen.append((inputs[0].shape, output.shape)))
    tiny(torch.ones(2, 3))
    assert seen == [(torch.Size([2, 3]), torch.Size([2, 3]))]


def test_cases_come_in_with_the_kernel_sides_classes_only():
    import pickle

    from autograder.exercises import kv_cache

    kinds = [torch.float64, torch.Size([2]), nn.Parameter(torch.ones(1))]
    for trusted in (catalogue.Case("a", (torch.ones(2),)), kinds):
        assert repr(proxies.unpack(verdict.b64encode(pickle.dumps(trusted, protocol=4)))) == repr(trusted)
    for foreign in (kv_cache._positions, catalogue.Exercise, pickle.loads):  # the catalogue never loads in a kernel
        with pytest.raises(verdict.ProtocolError, match="does not take"):
            proxies.unpack(verdict.b64encode(pickle.dumps(foreign, protocol=4)))
