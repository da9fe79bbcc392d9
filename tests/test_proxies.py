"""Substitutes for the reference (``course_checks.proxies``), answered outside the kernel.

Each test drives the kernel's side (``proxies.RemoteJudge`` over a real ``verdict.Link``) against a
real ``judge.VerdictServer`` and a real referee process (``worker.referee.Referee``), in this
process: what a sandboxed kernel does, without the sandbox. The made-up assignment below has an
answer of every kind a substitute stands for: functions, an ``nn.Module``, a plain class whose
objects the referee holds, a dataclass.
"""

from __future__ import annotations

import contextlib
import gc
import threading
import time
import types

import pytest
import torch
from processes import still_running
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
    """Begun but not finished (the learner's code stopped its check before its result): its
    substitute is refused."""
    server, remote = kernel
    server.new_kernel()
    server.expected["test_uses"] = [(ASSIGNMENT, "double"), (ASSIGNMENT, "uses")]
    for name in ANSWERS[1:]:
        server.done.add(name)
        server.checked.add(name)
    server.start_cell("test_uses")
    reply, send, close = verdict.Link(server.path).open(ASSIGNMENT, "double", [])
    assert send is not None and "cases" in reply
    close()  # stopped: no result, no end
    substitutes = remote.begin(ASSIGNMENT, "uses", []).given
    with pytest.raises(proxies.ProxyRefused, match="only once its own check has run"):
        substitutes.double(3)
    assert not server.cell_verdicts("test_uses")[0].finished


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


def _check_double(server, remote, learner) -> checks.Diagnosis:
    """The check of ``double`` run in its own cell, as a kernel runs it, on ``learner``."""
    server.start_cell("test_double")
    try:
        return checks.diagnose(ASSIGNMENT, "double", {"double": learner}, judge=remote)
    finally:
        server.end_cell()


def test_a_replayed_check_earns_what_the_replay_verifies_and_never_more_than_a_failure(kernel):
    """The notebook replayed in a fresh kernel (after a crash) runs its checks again: a failure
    stays, a pass must be passed again, and a replay stopped before its end earns nothing."""
    server, remote = kernel
    server.end_cell()
    right, wrong = (lambda x: 2 * x), (lambda x: x)
    assert "does not match" in _check_double(server, remote, wrong).message
    server.new_kernel()
    assert "does not match" in _check_double(server, remote, right).message  # its first failure stands
    assert not server.cell_verdicts("test_double")[0].passed
    server.failed.clear()
    assert _check_double(server, remote, right).passed
    server.new_kernel()
    assert "does not match" in _check_double(server, remote, wrong).message  # a pass before is no credit
    server.failed.clear()
    assert _check_double(server, remote, right).passed
    server.new_kernel()
    server.start_cell("test_double")
    assert not isinstance(remote.begin(ASSIGNMENT, "double", []), str)
    server.end_cell()  # the replay stopped before its result: the pass before does not count
    assert not server.cell_verdicts("test_double")[0].passed


def _caller_local(name: str):
    """What a learner's code finds by reading its callers' frames: the first local called ``name``."""
    import sys

    frame = sys._getframe(1)
    while frame is not None and name not in frame.f_locals:
        frame = frame.f_back
    return frame.f_locals[name]


def test_a_result_on_another_connection_earns_nothing_and_is_noted(kernel):
    """A wrong ``double`` that, while checked, sends a forged passing result on a connection of its
    own (and one before the check began): the server reads neither while the check holds its
    connection, refuses both, notes the interference, and the check fails on its own outputs."""
    server, remote = kernel
    server.end_cell()
    forged = {"op": "result", "assignment": ASSIGNMENT, "name": "double", "problem": None, "tampered": []}
    forged["outputs"] = [verdict.encode(torch.arange(3.0) * 2)]
    replies = []

    def forge():
        replies.append(verdict.Link(server.path).ask(forged))

    def wrong(x):
        threading.Thread(target=forge).start()
        return x

    server.start_cell("test_double")
    forge()  # before the check begins
    outcome = checks.diagnose(ASSIGNMENT, "double", {"double": wrong}, judge=remote)
    deadline = time.monotonic() + 20
    while len(replies) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    server.end_cell()
    assert "does not match" in outcome.message
    assert len(replies) == 2 and all("does not count" in reply["message"] for reply in replies), replies
    assert not server.cell_verdicts("test_double")[0].passed
    assert len(server.interference) == 2 and "outside that check" in server.interference[0]


@pytest.mark.parametrize("route", ["judge", "finish"])
def test_a_result_sent_from_the_learners_code_ends_the_check_with_no_points(kernel, route):
    """A wrong ``double`` that finds the check's judge (or its ``finish``) in its callers' frames and
    sends a passing result through it: only the check helper itself may send its result, so the
    check ends as interfered with, no points, and the server notes it."""
    server, remote = kernel
    server.end_cell()
    attempts = []

    def wrong(x):
        judge = _caller_local("judge")
        right = [verdict.encode(2 * case.args[0]) for case in _caller_local("cases")]
        try:
            if route == "judge":
                judge.result(ASSIGNMENT, "double", None, right, [])
            else:
                judge._open[(ASSIGNMENT, "double")][0](verdict.Link.result(ASSIGNMENT, "double", None, right, []))
        except verdict.ProtocolError as refused:
            attempts.append(str(refused))
        return x

    server.start_cell("test_double")
    outcome = checks.diagnose(ASSIGNMENT, "double", {"double": wrong}, judge=remote)
    server.end_cell()
    assert "interfered" in outcome.message
    assert attempts == ["a check's result comes from the check itself"]
    (record,) = server.cell_verdicts("test_double")
    assert record.finished and not record.passed and "[mistake:tampering]" in record.message
    assert "interfered" in record.message and "reported its result from outside" in server.interference[0]


def test_a_check_stopped_by_the_learners_code_earns_nothing(kernel):
    """A ``double`` that raises a BaseException of its own while checked (to stop the check after a
    forged result, say): the check did not reach its end, so it gives nothing."""
    server, remote = kernel
    server.end_cell()

    class Stop(BaseException):
        pass

    def stops(x):
        raise Stop()

    server.start_cell("test_double")
    with pytest.raises(Stop):
        checks.diagnose(ASSIGNMENT, "double", {"double": stops}, judge=remote)
    server.end_cell()
    (record,) = server.cell_verdicts("test_double")
    assert not record.finished and not record.passed


def test_a_message_out_of_order_on_the_checks_connection_ends_it(kernel):
    """The check's connection carries its messages in order, each with its token and the next
    number: a result with another number (as a notebook writing to the check's socket would send)
    ends the check as interfered with."""
    import socket as sockets

    server, _ = kernel
    server.end_cell()
    server.start_cell("test_double")
    with sockets.socket(sockets.AF_UNIX) as connection:
        connection.connect(server.path)
        reader = connection.makefile("rb")
        begin = {"op": "begin", "assignment": ASSIGNMENT, "name": "double", "tampered": []}
        connection.sendall(verdict.dumps(begin) + b"\n")
        token = verdict.parse_line(reader.readline())["invocation"]
        forged = {"op": "result", "assignment": ASSIGNMENT, "name": "double", "problem": None, "tampered": []}
        forged.update(outputs=[verdict.encode(torch.arange(3.0) * 2)], invocation=token, seq=7)
        connection.sendall(verdict.dumps(forged) + b"\n")
        assert "does not count" in verdict.parse_line(reader.readline())["message"]
    server.end_cell()
    (record,) = server.cell_verdicts("test_double")
    assert record.finished and not record.passed and "interfered" in record.message


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


POOL_PROCESS = """
import json, os, signal, sys, types
from autograder.worker import referee
from course_checks import verdict

report = {"factory": referee.start_factory()}  # first, as the pool process does, before any thread
cells = [tuple(cell) for cell in json.loads(sys.argv[1])]
notebook = types.SimpleNamespace(
    key="k", assignment="99_fake", cells=cells, answers={"double", "table", "slow"}, counted_calls=lambda: []
)
answers = referee.Referee(memory_mb=512)


def ask(target, *args, seconds=20.0):
    line = verdict.dumps({"op": "call", "target": target, "args": verdict.encode(list(args))})
    return verdict.parse_line(answers.ask(notebook, "notebook", line, seconds)[0])


def parent(pid):
    with open(f"/proc/{pid}/stat") as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[1])


answers.prepare([notebook])
first = answers.process
report.update(kind=type(first).__name__, parent=parent(first.pid), factory_pid=referee.factory.pid)
report["double"] = ask("double", 21)
report["table"] = ask("table", 20_000)
report["slow"] = ask("slow", 30, seconds=1.0)
report["again"] = ask("double", 2)
report.update(starts=answers.starts, second=answers.process.pid, first_alive=first.poll() is None)
report["second_parent"] = parent(answers.process.pid)
print(json.dumps(report), flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # the pool process dies: its factory and referee go with it
"""


def test_a_pool_process_forks_its_referees_from_a_warm_copy_of_itself():
    """What ``./course grade``'s pool processes do (``runners._pool_process_init``): the referees are
    forked from a copy of the process made while it had one thread, not started as fresh
    interpreters; bounded in memory and time as a fresh one is, replaced when stopped, and gone
    with the process that asked for them."""
    import json
    import subprocess
    import sys

    run = subprocess.run(
        [sys.executable, "-c", POOL_PROCESS, json.dumps(CELLS)], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == -9, run.stderr
    report = json.loads(run.stdout)
    assert report["factory"] is True and report["kind"] == "Forked"
    assert report["parent"] == report["second_parent"] == report["factory_pid"]  # not the pool process's children
    assert report["double"] == {"value": {"value": 42}}
    assert report["table"]["error"]["type"] in ("MemoryError", "RuntimeError")  # 1.6 GB: over its 512 MB
    assert "took longer" in report["slow"]["error"]["message"]
    assert report["again"] == {"value": {"value": 4}} and report["starts"] == 2 and not report["first_alive"]
    left = still_running([report["factory_pid"], report["second"]])
    assert not left, f"still running after their pool process died: {left}"


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


def _recorded(ref: proxies.Given) -> list[dict]:
    """The messages ``ref``'s substitutes send the grader, as sent."""
    sent, ask = [], ref._grader

    def recording(message: dict) -> dict:
        sent.append(message)
        return ask(message)

    ref._grader = recording
    return sent


def _weight_of(message: dict) -> dict:
    """The wire form of the first parameter of the module a ``forward`` message describes."""
    module = message["self"]
    while not module["params"]:
        module = module["children"][0][1]
    return module["params"][0][1]


def test_a_modules_weights_cross_once_while_they_stay_as_they_were(kernel):
    """08's generation sends the same model with every token: the referee keeps its weights after
    the first call, and later calls name them by key, for as long as they are what was sent. A change
    by any route (in place through ``.data``, which no version counter sees, ``copy_``, a new
    parameter) sends them in full again, and the answer is the reference's on the new weights."""
    ref = given(kernel)
    sent = _recorded(ref)
    torch.manual_seed(0)
    tiny = ref.Tiny(3)
    x = torch.ones(1, 3)

    def expected():
        return 2 * x @ tiny.proj.weight.detach().T

    for _ in range(3):
        assert torch.allclose(tiny(x), expected())
    forwards = [m for m in sent if m["op"] == "forward"]
    first, *later = [_weight_of(m) for m in forwards]
    assert "data" in first and "keep" in first
    assert all("data" not in w and w["kept"] == first["keep"] for w in later)

    with torch.no_grad():
        tiny.proj.weight.data.mul_(3)  # in place, unversioned
    assert torch.allclose(tiny(x), expected())
    with torch.no_grad():
        tiny.proj.weight.copy_(torch.eye(3))
    assert torch.allclose(tiny(x), expected())
    tiny.proj.weight = nn.Parameter(torch.full((3, 3), 0.5))
    assert torch.allclose(tiny(x), expected())
    changed = [_weight_of(m) for m in sent if m["op"] == "forward"][3:]
    assert len(changed) == 3 and all("data" in w for w in changed)
    assert len({w["keep"] for w in changed} | {first["keep"]}) == 4  # a key always names the same values
    assert torch.allclose(tiny(x), expected()) and "kept" in _weight_of(sent[-1])


def test_a_weight_the_referee_does_not_keep_is_sent_again_in_full(kernel):
    """The referee keeps a cell's weights for that cell (and a new referee keeps none): a call naming
    a weight it does not keep is answered after the kernel sends it again, in full."""
    ref = given(kernel)
    torch.manual_seed(0)
    tiny = ref.Tiny(3)
    x = torch.ones(1, 3)
    tiny(x)
    tiny(x)
    sent = _recorded(ref)
    for each in ref._sent.values():
        each.key = "not-kept." + each.key  # as if the grader had never kept them
    assert torch.allclose(tiny(x), 2 * x @ tiny.proj.weight.detach().T)
    (named, again) = [_weight_of(m) for m in sent]
    assert named["kept"].startswith("not-kept.") and "data" in again


def test_the_weights_a_kernel_keeps_copies_of_are_bounded(kernel, monkeypatch):
    """The kernel keeps a copy of each weight it asked the grader to keep (to see a change made
    without a version): at most ``KEPT_WEIGHT_BYTES`` of them, as the grader, the copies of modules
    no longer alive let go first; past that, weights go in full, and every answer is the same."""
    monkeypatch.setattr(verdict, "KEPT_WEIGHT_BYTES", 100)  # a Tiny(3)'s weight: 36 bytes
    ref = given(kernel)
    sent = _recorded(ref)
    x = torch.ones(1, 3)
    alive = [ref.Tiny(3) for _ in range(4)]
    for tiny in alive:
        assert torch.allclose(tiny(x), 2 * x @ tiny.proj.weight.detach().T)
    asked = [_weight_of(m) for m in sent if m["op"] == "forward"]
    assert ["keep" in w for w in asked] == [True, True, False, False] and ref._sent_bytes == 72
    del alive[:2], tiny
    gc.collect()
    late = ref.Tiny(3)
    assert torch.allclose(late(x), 2 * x @ late.proj.weight.detach().T)
    assert "keep" in _weight_of(sent[-1]) and ref._sent_bytes == 36 and len(ref._sent) == 1


def test_cases_come_in_with_the_kernel_sides_classes_only():
    import pickle

    from autograder.exercises import kv_cache

    kinds = [torch.float64, torch.Size([2]), nn.Parameter(torch.ones(1))]
    for trusted in (catalogue.Case("a", (torch.ones(2),)), kinds):
        assert repr(proxies.unpack(verdict.b64encode(pickle.dumps(trusted, protocol=4)))) == repr(trusted)
    for foreign in (kv_cache._positions, catalogue.Exercise, pickle.loads):  # the catalogue never loads in a kernel
        with pytest.raises(verdict.ProtocolError, match="does not take"):
            proxies.unpack(verdict.b64encode(pickle.dumps(foreign, protocol=4)))


# ---------------------------------------------------------------- 08: forward passes counted outside

KV = "08_kv_cache"
CLEARS_THE_PROBES_HOOK = "    model.embed._forward_hooks.clear()  # the count the kernel reports: nothing\n"
RECOMPUTES_THROUGH_FORWARD_CACHED = (
    "def generate_cached(model, tokens, max_new_tokens, temperature=1.0, top_k=None):\n"
    + CLEARS_THE_PROBES_HOOK
    + "    for _ in range(max_new_tokens):\n"
    "        logits = forward_cached(model, tokens, KVCache())[:, -1, :]\n"
    "        tokens = torch.cat([tokens, logits.argmax(dim=-1, keepdim=True)], dim=1)\n"
    "    return tokens\n"
)
CALLS_GENERATE = (
    "def generate_cached(model, tokens, max_new_tokens, temperature=1.0, top_k=None):\n"
    "    if tokens.shape[1] + max_new_tokens > model.config.max_seq_len:\n"
    "        raise ValueError(f'longer than max_seq_len = {model.config.max_seq_len}')\n"
    + CLEARS_THE_PROBES_HOOK
    + "    return generate(model, tokens, max_new_tokens, temperature, top_k)\n"
)


@contextlib.contextmanager
def notebook_kernel(tmp_path, answers, assignment: str, cell: str, run=()):
    """A notebook's real judge and referee, the check cell ``cell`` running (every other one counted as
    run); the namespace a kernel would have (the set-up cells, and the reference's answer cells ``run``,
    run here), its cells by grade id: (server, the kernel's judge, namespace, cells)."""
    from autograder import reference

    cells = reference.source_cells(assignment)
    notebook_judge = judge.Judge(assignment, cells)
    expected = {f"test_{name}": [(assignment, name)] for name in notebook_judge.exercises}
    server = judge.VerdictServer(str(tmp_path / "verdicts.sock"), {assignment: notebook_judge}, expected, answers, 60)
    server.new_kernel([other for other in expected if other != cell])
    server.start_cell(cell)
    namespace: dict = {}
    for grade_id, source in cells:
        if grade_id.startswith("setup") or grade_id in run:
            exec(source, namespace)
    try:
        yield server, proxies.RemoteJudge(verdict.Link(server.path)), namespace, dict(cells)
    finally:
        server.end_cell()
        server.close()


@pytest.fixture
def kv_kernel(tmp_path, answers):
    """Notebook 08's generate_cached check's cell running, and the reference's own generate_cached source."""
    with notebook_kernel(tmp_path, answers, KV, "test_generate_cached") as (server, remote, namespace, cells):
        yield server, remote, namespace, cells["generate_cached"]


def _check_generate_cached(kv_kernel, source: str):
    server, remote, namespace, _ = kv_kernel
    exec(source, namespace)
    outcome = checks.diagnose(KV, "generate_cached", namespace, judge=remote)
    outcome.restore()
    (record,) = server.cell_verdicts("test_generate_cached")
    return outcome, record


def test_08s_cached_generation_is_counted_outside_the_kernel(kv_kernel):
    """The reference's own generate_cached: every forward pass goes through forward_cached, so the
    referee counts its positions; it passes, with nothing to review."""
    outcome, record = _check_generate_cached(kv_kernel, kv_kernel[3])
    assert outcome.passed, outcome.message
    assert record.passed and record.review == []


def test_08s_recomputation_through_forward_cached_shows_whatever_the_kernel_reports(kv_kernel):
    """A generate_cached that recomputes the whole sequence through forward_cached with a fresh cache
    at every step, and clears the probe's hook so that the kernel reports no positions: the referee
    counted them, so it gets the recomputation's verdict."""
    outcome, record = _check_generate_cached(kv_kernel, RECOMPUTES_THROUGH_FORWARD_CACHED)
    assert not outcome.passed and "[mistake:recomputes-sequence]" in outcome.message, outcome.message
    assert not record.passed


def test_08s_passes_made_inside_the_kernel_are_flagged_for_review_not_scored(kv_kernel):
    """A generate_cached that calls 07's generate (every pass inside the kernel, where the referee
    cannot count it) and clears the probe's hook: the count it reports could be forged, so it decides
    no points, and the check asks for a human's look."""
    outcome, record = _check_generate_cached(kv_kernel, CALLS_GENERATE)
    assert outcome.passed, outcome.message
    assert len(record.review) == 1 and "ran inside the kernel" in record.review[0], record.review


# ---------------------------------------------------------------- 03: the calls of attention counted outside

MHA = "03_multi_head_attention"
MHA_INIT = (
    "class MultiHeadAttention(nn.Module):\n"
    "    def __init__(self, d_model, n_heads):\n"
    "        super().__init__()\n"
    "        self.n_heads = n_heads\n"
    "        self.q_proj = nn.Linear(d_model, d_model, bias=False)\n"
    "        self.k_proj = nn.Linear(d_model, d_model, bias=False)\n"
    "        self.v_proj = nn.Linear(d_model, d_model, bias=False)\n"
    "        self.o_proj = nn.Linear(d_model, d_model, bias=False)\n"
    "\n"
    "    def forward(self, x, mask=None):\n"
    "        q, k, v = (split_heads(p(x), self.n_heads) for p in (self.q_proj, self.k_proj, self.v_proj))\n"
)
LOOP_OVER_HEADS = (  # its calls by name: the referee reads the queries wherever they are passed
    "heads = [attention(q=q[:, h], k=k[:, h], v=v[:, h], mask=mask) for h in range(self.n_heads)]\n"
    "out = self.o_proj(merge_heads(torch.stack(heads, dim=1)))\n"
)
# A loop over heads whose forward empties the probe's step count (in its tracer's closure) before it
# returns: the kernel then reports as many steps with 8 heads as with 2.
FORGES_THE_STEP_COUNT = (
    MHA_INIT
    + "".join(f"        {line}\n" for line in LOOP_OVER_HEADS.splitlines())
    + "        import collections, sys\n"
    "        tracer = sys.gettrace()\n"
    "        for cell in getattr(tracer, '__closure__', None) or ():\n"
    "            if isinstance(cell.cell_contents, collections.Counter):\n"
    "                cell.cell_contents.clear()\n"
    "        return out\n"
)
# A loop over heads in a thread of its own, where the probe's tracer (sys.settrace: this thread) counts nothing.
LOOPS_IN_A_THREAD = (
    MHA_INIT + "        import threading\n"
    "        done = {}\n"
    "        def loop():\n"
    + "".join(f"            {line}\n" for line in LOOP_OVER_HEADS.splitlines())
    + "            done['out'] = out\n"
    "        worker = threading.Thread(target=loop)\n"
    "        worker.start()\n"
    "        worker.join()\n"
    "        return done['out']\n"
)
# A loop over heads compiled under torch's own file name: no line of it reads as the learner's.
LOOPS_UNDER_A_LIBRARY_NAME = (
    "_source = 'def looped(self, q, k, v, mask):\\n"
    "    heads = [attention(q[:, h], k[:, h], v[:, h], mask) for h in range(self.n_heads)]\\n"
    "    return self.o_proj(merge_heads(torch.stack(heads, dim=1)))\\n'\n"
    "exec(compile(_source, torch.__file__, 'exec'), globals())\n"
    + MHA_INIT
    + "        return looped(self, q, k, v, mask)\n"
)
EINSUM_WITHOUT_ATTENTION = (
    MHA_INIT + "        scores = torch.einsum('bhtd,bhsd->bhts', q, k) / math.sqrt(q.shape[-1])\n"
    "        if mask is not None:\n"
    "            scores = scores.masked_fill(~mask, float('-inf'))\n"
    "        return self.o_proj(merge_heads(torch.einsum('bhts,bhsd->bhtd', scores.softmax(dim=-1), v)))\n"
)
SPLITS_IN_A_LOOP = (
    "def split_heads(x, n_heads):\n"
    "    d = x.shape[-1] // n_heads\n"
    "    return torch.stack([x[..., h * d:(h + 1) * d] for h in range(n_heads)], dim=1)\n"
)


@pytest.fixture
def mha_kernel(tmp_path, answers):
    """Notebook 03's no_head_loop check's cell running, the reference's answers run in the kernel."""
    run = ("split_heads", "merge_heads", "MultiHeadAttention")
    with notebook_kernel(tmp_path, answers, MHA, "test_no_head_loop", run) as (server, remote, namespace, _):
        yield server, remote, namespace


def _check_no_head_loop(mha_kernel, source: str = "", then=None):
    """The check's outcome and verdict; ``then(namespace)`` runs after it in its cell (the visible checks)."""
    server, remote, namespace = mha_kernel
    exec(source, namespace)
    outcome = checks.diagnose(MHA, "no_head_loop", namespace, judge=remote)
    try:
        if then is not None:
            then(namespace)
    finally:
        outcome.restore()
    (record,) = server.cell_verdicts("test_no_head_loop")
    return outcome, record


def _kernel_alone(namespace: dict, source: str):
    """What the in-kernel probe alone reports of ``source``'s MultiHeadAttention, and its reading: the
    verdict without the referee's count (self-study's, or issue 33's ``./course grade``)."""
    from autograder import reference
    from autograder.exercises.multi_head_attention import NO_HEAD_LOOP_PROPERTY

    ref = reference.load(MHA)
    exec(source, namespace)
    seen = NO_HEAD_LOOP_PROPERTY.probe.run(namespace["MultiHeadAttention"], ref)
    return seen, NO_HEAD_LOOP_PROPERTY.reading(seen, NO_HEAD_LOOP_PROPERTY.probe, ref)


def test_03s_batched_attention_is_counted_outside_and_passes(mha_kernel):
    """The reference's forward pass: the referee answers one call of `attention` per pass, carrying all
    the heads ((1, 2, 3, 8), then (1, 8, 3, 2)); it passes, with nothing to review. The visible checks
    after it in its cell call the substitute still in place, and get the reference's answers."""
    visible = []

    def visible_checks(namespace):
        module = namespace["MultiHeadAttention"](8, 4)
        visible.append((namespace["attention"], module(torch.randn(1, 3, 8)).shape))

    outcome, record = _check_no_head_loop(mha_kernel, then=visible_checks)
    assert outcome.passed, outcome.message
    assert record.passed and record.review == []
    [(substitute, shape)] = visible
    assert getattr(substitute, "__proxy_ref__", None) == "answer:attention" and shape == (1, 3, 8)


@pytest.mark.parametrize(
    "source",
    [FORGES_THE_STEP_COUNT, LOOPS_IN_A_THREAD, LOOPS_UNDER_A_LIBRARY_NAME],
    ids=["forged", "thread", "library"],
)
def test_03s_loop_over_heads_shows_outside_whatever_the_kernel_reports(mha_kernel, source):
    """A loop over heads that fools the probe in the kernel (its step count emptied, the loop in a thread
    of its own) or hides its lines (compiled under torch's file name): the referee answered one call of
    `attention` per head, so the check fails with the head-loop diagnosis."""
    if source is not LOOPS_UNDER_A_LIBRARY_NAME:  # the probe in the kernel alone is fooled
        seen, alone = _kernel_alone(dict(mha_kernel[2]), source)
        assert alone is None and seen["steps"][0] == seen["steps"][1], seen
    outcome, record = _check_no_head_loop(mha_kernel, source)
    assert not outcome.passed and "[mistake:head-loop]" in outcome.message, outcome.message
    assert "called `attention` 16 times (16 on (1, 3, 2)" in outcome.message, outcome.message
    assert not record.passed


def test_03s_forward_without_attention_is_judged_by_its_kernels_count(mha_kernel):
    """A forward pass that never calls `attention` (einsum): the referee sees nothing, and the kernel's
    count decides; a correct one passes with nothing to review (as every correct alternative must)."""
    outcome, record = _check_no_head_loop(mha_kernel, EINSUM_WITHOUT_ATTENTION)
    assert outcome.passed and record.review == [], outcome.message


def test_03s_loop_the_referee_cannot_see_is_still_found_by_the_kernels_count(mha_kernel):
    """A loop over heads in the learner's own split_heads, with `attention` called once for all heads:
    the referee sees a batched call, the kernel's count finds the loop, and that is believed."""
    outcome, _ = _check_no_head_loop(mha_kernel, SPLITS_IN_A_LOOP)
    assert not outcome.passed and "[mistake:head-loop]" in outcome.message, outcome.message
    assert "split_heads" in outcome.message, outcome.message


def test_03s_calls_of_too_many_shapes_are_flagged_for_review_not_scored(mha_kernel, monkeypatch):
    """A forward pass that first calls `attention` with more different shapes than the judge counts apart
    (here 8), so that its calls per head add up under "overflow", then loops over heads and empties the
    kernel's step count: the calls decide nothing, so the kernel's report stands, and the check asks for
    a human's look."""
    monkeypatch.setattr(judge, "MAX_COUNTS", 8)
    floods = FORGES_THE_STEP_COUNT.replace(
        "        heads = [", "        [attention(*[torch.zeros(1, 3, 9 + i)] * 3) for i in range(8)]\n        heads = ["
    )
    outcome, record = _check_no_head_loop(mha_kernel, floods)
    assert outcome.passed, outcome.message
    assert len(record.review) == 1 and "more different shapes" in record.review[0], record.review
