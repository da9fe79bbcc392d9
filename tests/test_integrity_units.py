"""The parts of issue 15's promise that are plain functions: clean-up of any tree, the wire's bounds,
the judge's kinds, the detector of changed grading helpers, the static inspection of indirect routes.
Each is also exercised through the real command by the hostile catalogue (tests/hostile/catalogue.yml)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

import course_checks.kernel_boot  # noqa: F401 (seals the grading helpers here, as in a graded kernel)
from autograder import compare
from autograder.sandboxing.bubblewrap import HostAddress, Limits, SandboxHost, WarmSandbox, claim_slot
from autograder.sandboxing.bubblewrap import probe as _probe
from autograder.sandboxing.zygote import _wipe
from autograder.worker.tamper import forges_helpers, suspicious_code
from course_checks import checks, verdict


def test_clean_up_removes_any_tree(tmp_path):
    scratch = tmp_path / "tmp"
    keep = scratch / "ag-run" / "w0"
    keep.mkdir(parents=True)
    (keep / "verdicts.sock").write_text("kept")
    (scratch / "ag-run" / "stray").write_text("x")
    here = os.getcwd()
    os.chdir(scratch)
    try:
        for _ in range(3000):  # deeper than the recursion limit, paths longer than PATH_MAX
            os.mkdir("d")
            os.chdir("d")
        os.mkfifo("fifo")
        with socket.socket(socket.AF_UNIX) as server:
            server.bind("sock")
        for i in range(2000):
            open(f"f{i}", "w").close()
        os.chmod(".", 0o500)
        os.chdir(scratch)
        os.chmod("d", 0)
        os.symlink("/etc", "to-etc")
    finally:
        os.chdir(here)
    assert _wipe(str(scratch), keep=[str(keep)])
    assert sorted(p.name for p in scratch.rglob("*")) == ["ag-run", "verdicts.sock", "w0"]
    assert os.path.exists("/etc/passwd")  # a symlink is removed, never followed


def test_clean_up_that_cannot_finish_says_so(tmp_path):
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    here = os.getcwd()
    os.chdir(scratch)
    try:
        for _ in range(50):
            os.mkdir("d")
            os.chdir("d")
    finally:
        os.chdir(here)
    assert not _wipe(str(scratch), budget=[20])  # out of budget: reported, so the sandbox is retired
    assert _wipe(str(scratch))


@pytest.mark.skipif(bool(_probe(Path(__file__).resolve().parent.parent)), reason="bubblewrap cannot run here")
def test_clean_up_in_a_real_sandbox_proves_it_clean_with_mounts_under_tmp(tmp_path):
    """A checkout, a virtualenv or a course under /tmp is mounted inside the sandbox's own /tmp: the
    clean-up between notebooks wipes around those mount points and says the sandbox is clean (else
    every notebook would retire its sandbox and the next would wait for a fresh one)."""
    course = tmp_path / "course"
    (course / "assets").mkdir(parents=True)  # mounted read-only at the same path, inside /tmp
    (course / "assets" / "data.txt").write_text("the course's data")
    sandbox = WarmSandbox(claim_slot(), course, Limits(), sandboxed=True, base_dir=tmp_path / "run")
    try:
        sandbox.launch()
        sandbox.wait_ready()
        first = sandbox.reset(None)
        assert first["clean"], first
        assert sandbox.sane() and sandbox.retired == 0 and sandbox.launches == 1
    finally:
        sandbox.close()
    assert (course / "assets" / "data.txt").read_text() == "the course's data"


def _smaps(pid: int) -> dict:
    fields = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        name, value = line.split()[:2]
        fields[name.rstrip(":")] = int(value) // 1024  # MB
    return fields


@pytest.mark.skipif(
    bool(_probe(Path(__file__).resolve().parent.parent)) or os.geteuid() != 0,
    reason="the sandbox host runs as root, with bubblewrap",
)
def test_one_host_forks_workers_that_share_its_memory_and_nothing_else(tmp_path):
    """As root, one warm interpreter forks every local worker's. Each is pid 1 of its own processes and
    runs as its own user, with its own /tmp, notebook folder, network and IPC; it sees neither the other
    worker's folder nor the host's socket; it holds torch in pages shared with the host; a reset wipes
    its files and proves it, and retiring one leaves the other working."""
    course = tmp_path / "course"
    (course / "assets").mkdir(parents=True)  # a course under /tmp: mounted inside the workers' own /tmp
    (course / "assets" / "data.txt").write_text("the course's data")
    base = tmp_path / "run"
    base.mkdir()
    host = SandboxHost(course, base, Limits())
    workers = []
    try:
        host.launch()
        for _ in range(2):
            worker = WarmSandbox(claim_slot(), course, Limits(), sandboxed=True, base_dir=base, host=host.address)
            workers.append(worker)
            worker.launch()
            worker.wait_ready()
        a, b = workers
        assert a.info["pid"] == b.info["pid"] == 1 and a.process.pid != b.process.pid

        def inside(worker, path) -> Path:
            return Path(f"/proc/{worker.process.pid}/root") / str(path).lstrip("/")

        for worker in workers:
            status = Path(f"/proc/{worker.process.pid}/status").read_text()
            assert f"Uid:\t{worker.uid}\t" in status and "CapEff:\t0000000000000000" in status
            assert not inside(worker, host.socket).exists() and not inside(worker, base / "host.log").exists()
            assert inside(worker, worker.run_dir).is_dir()
            assert (inside(worker, course / "assets" / "data.txt")).read_text() == "the course's data"
            assert sorted(int(p.name) for p in inside(worker, "/proc").iterdir() if p.name.isdigit()) == [1]
            memory = _smaps(worker.process.pid)
            assert memory["Rss"] > 150 and memory["Private_Dirty"] < memory["Rss"] / 3, memory  # torch is shared
        for kind in ("pid", "mnt", "net", "ipc"):
            spaces = {os.readlink(f"/proc/{w.process.pid}/ns/{kind}") for w in workers}
            assert len(spaces) == 2 and os.readlink(f"/proc/self/ns/{kind}") not in spaces, kind
        assert not inside(a, b.run_dir).exists() and not inside(b, a.run_dir).exists()

        for folder in ("/tmp", a.notebooks_dir):  # what a notebook leaves (as the worker's user)
            (inside(a, folder) / "left-behind").write_text("for the next notebook")
            os.chown(inside(a, folder) / "left-behind", a.uid, a.uid)
            assert not (inside(b, folder) / "left-behind").exists()
        assert a.reset(None)["clean"]
        assert not (inside(a, "/tmp") / "left-behind").exists()
        assert not (inside(a, a.notebooks_dir) / "left-behind").exists()

        retired = a.process.pid
        a.close()
        for _ in range(100):  # dead at once; gone once the process above it has reaped it
            if not Path(f"/proc/{retired}").exists():
                break
            time.sleep(0.05)
        assert not Path(f"/proc/{retired}").exists()
        assert b.sane() and b.reset(None)["clean"]
        a.start()  # a fresh one from the same host
        assert a.sane() and a.process.pid != retired
    finally:
        for worker in workers:
            worker.close()
        host.close()
    assert (course / "assets" / "data.txt").read_text() == "the course's data"


@pytest.mark.skipif(
    bool(_probe(Path(__file__).resolve().parent.parent)) or os.geteuid() != 0,
    reason="the sandbox host runs as root, with bubblewrap",
)
def test_a_worker_whose_host_is_gone_starts_a_sandbox_of_its_own(tmp_path):
    ended = subprocess.Popen(["true"])
    ended.wait()
    base = tmp_path / "run"
    base.mkdir()
    worker = WarmSandbox(
        claim_slot(), tmp_path, Limits(), sandboxed=True, base_dir=base, host=HostAddress(base / "host.sock", ended.pid)
    )
    try:
        worker.start()
        assert worker.host is None and worker.sane() and worker.reset(None)["clean"]
        assert "this worker starts its own" in (base / f"w{worker.slot}.log").read_text()
    finally:
        worker.close()


def test_the_judge_checks_the_kind_before_the_values():
    real = torch.softmax(torch.randn(3, 4), dim=-1)
    assert compare.close(torch.complex(real, torch.ones_like(real)), real, 1e-6, 1e-5).startswith("returned complex")
    assert "integer" in compare.close(torch.ones(3, dtype=torch.int64), torch.ones(3), 1e-6, 1e-5)
    assert compare.close(real.double(), real, 1e-6, 1e-5) is None  # a wider float is the same kind
    assert compare.close(1 + 2j, 1.0, 1e-6, 1e-5) is not None


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


def _kernel_like(code: str, first: str = "course_checks.kernel_boot") -> subprocess.CompletedProcess:
    """``code`` after the grading helpers load (``first`` first; graded kernels start with
    ``kernel_boot``), in a fresh interpreter; prints what the detector finds."""
    program = (
        f"import {first}\nimport course_checks.kernel_boot, course_checks.checks, course_checks.trusted\n"
        + textwrap.dedent(code)
        + ("\nprint(course_checks.checks._replaced())")
    )
    return subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("first", ["course_checks.kernel_boot", "course_checks.trusted", "course_checks.checks"])
def test_an_untouched_kernel_shows_no_change(first):
    result = _kernel_like("", first)
    assert result.stdout.strip().splitlines()[-1] == "[]", result.stderr


def test_pickling_a_tensor_is_no_tampering():
    """Pickling or deep-copying a tensor (torch.save, copy.deepcopy) makes Python cache
    ``__slotnames__`` on the tensor classes: a learner's legitimate code, not a change to watch.
    A method added to the class still is one."""
    result = _kernel_like("""
        import copy, pickle, torch
        pickle.dumps(torch.nn.Parameter(torch.ones(2)))
        copy.deepcopy(torch.nn.Parameter(torch.ones(2)))
        assert "__slotnames__" in vars(torch.Tensor)
        import course_checks.cases
        pickle.dumps(course_checks.cases.Case("a case", (torch.ones(1),)))  # a helper class's instance, too
        assert "__slotnames__" in vars(course_checks.cases.Case)
        print(course_checks.checks._replaced())
        torch.Tensor.item = lambda self: 0.0
    """)
    untouched, patched = result.stdout.strip().splitlines()[-2:]
    assert untouched == "[]", result.stderr
    assert "torch.Tensor.item" in patched


def _forked(code: str) -> str:
    """What the detector finds after ``code`` runs in a fork of this process (whose helpers
    were sealed when it imported them): the change stays in the fork."""
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            exec(textwrap.dedent(code), {})
            os.write(writer, repr(checks._replaced()).encode())
        finally:
            os._exit(0)
    os.close(writer)
    with os.fdopen(reader) as handle:
        found = handle.read()
    os.waitpid(pid, 0)
    return found


@pytest.mark.parametrize(
    "code, found",
    [
        ("m = __import__('course_' + 'checks.checks', fromlist=['x'])\nsetattr(m, 'observe', print)", "observe"),
        ("import course_checks.verdict as v\nv.Link.result = lambda *a: None", "Link.result"),
        ("import course_checks.verdict as v\nv.encode.__code__ = v.encode.__code__.replace()", "encode"),
        (
            "import sys, types\nsys.modules['course_checks.verdict'] = types.ModuleType('course_checks.verdict')",
            "sys.modules['course_checks.verdict']",
        ),
        ("import course_checks.trusted as t\nt.replaced = lambda: []", "course_checks.trusted.replaced"),
        ("import json\njson.dumps = repr", "json.dumps"),
        ("import json.encoder\njson.encoder.c_make_encoder = None", "json.encoder.c_make_encoder"),
        ("import json.encoder\njson.encoder.JSONEncoder.encode = repr", "json.encoder.JSONEncoder.encode"),
        ("import socket\nsocket.create_connection = print", "socket.create_connection"),
        ("import course_checks.proxies as p\np.Given._ask = lambda *a, **k: 0", "Given._ask"),
        ("import course_checks.probes as p\np.HeadLoop.run = lambda *a: {}", "HeadLoop.run"),
        # the comparison and the catalogue's types, which a stock-nbgrader check runs in the kernel
        ("import autograder.compare as c\nc.close = lambda *a: None", "autograder.compare.close"),
        ("import course_checks.cases as c\nc.Case.run = lambda self, f: 0", "Case.run"),
        ("import autograder.local_judge as j\nj.LocalJudge.result = lambda *a: None", "LocalJudge.result"),
        # the standard library the kernel side's cases, probes and substitutes call
        ("import ast\nast.walk = lambda node: iter(())", "ast.walk"),
        ("import inspect\ninspect.getsource = lambda f: ''", "inspect.getsource"),
        ("import textwrap\ntextwrap.dedent = str", "textwrap.dedent"),
        ("import io\nio.BytesIO = list", "io.BytesIO"),
        ("import copy\ncopy.deepcopy = lambda x, memo=None: x", "copy.deepcopy"),
        ("import dataclasses\ndataclasses.fields = lambda c: ()", "dataclasses.fields"),
    ],
)
def test_changes_to_the_grading_helpers_are_detected(code, found):
    assert checks._replaced() == []
    assert found in _forked(code)


def test_the_head_loop_probe_counts_with_the_tracer_it_bound_before_student_code(monkeypatch):
    """A notebook that swaps ``sys.settrace`` / ``sys.gettrace`` (keeping the counter instead of
    installing it, and handing it back when asked) leaves the probe counting: it bound them when
    it was imported, before any student code."""
    from torch import nn

    from course_checks import probes

    kept = []
    monkeypatch.setattr(sys, "settrace", kept.append)
    monkeypatch.setattr(sys, "gettrace", lambda: kept[-1] if kept else None)

    class Looping(nn.Module):
        def __init__(self, width, n_heads):
            super().__init__()
            self.n_heads, self.proj = n_heads, nn.Linear(width, width)

        def forward(self, x):
            return sum(self.proj(x) / (h + 1) for h in range(self.n_heads))

    few, many = (probes.HeadLoop().steps(Looping, h) for h in (2, 8))
    assert sum(many.values()) > sum(few.values()) > 0
    assert kept == []


def test_the_wire_writes_and_reads_with_what_it_bound_before_student_code():
    """A notebook that patches json (its encoder, its decoder) or base64 changes nothing the wire
    writes or reads: it bound their C parts when it was imported. (The change is reported too.)"""
    found = _forked("""
        import base64, json, json.decoder, json.encoder
        json.encoder.c_make_encoder = None
        json.encoder.JSONEncoder.encode = lambda self, o: '{"tampered": []}'
        json.dumps = lambda *a, **k: '{"tampered": []}'
        json.decoder.JSONDecoder.decode = lambda self, s: {}
        json.loads = lambda *a, **k: {}
        base64.b64encode = lambda data: b""
        from course_checks import verdict
        message = {"op": "result", "tampered": ["torch.allclose"], "outputs": [verdict.encode(1.5)]}
        assert verdict.dumps(message) == b'{"op":"result","tampered":["torch.allclose"],"outputs":[{"value":1.5}]}'
        assert verdict.loads(verdict.dumps(message)) == message
        import torch
        assert verdict.decode(verdict.encode(torch.arange(3.0))).tolist() == [0.0, 1.0, 2.0]
    """)
    assert "json.encoder.c_make_encoder" in found and "json.loads" in found and "base64.b64encode" in found


@pytest.mark.parametrize(
    "source",
    [
        "f.__code__ = g.__code__",
        "import sys\nm = sys.modules['course_' + 'checks.checks']",
        "setattr(__import__('x'), 'check', None)",
        "exec('import autograder')",
    ],
)
def test_indirect_routes_to_the_helpers_are_named(source):
    found = suspicious_code([source])
    assert found and any(forges_helpers(f) for f in found), found


def test_reload_helpers_are_flagged_but_cost_nothing():
    found = suspicious_code(["import importlib\nimportlib.reload(mymodule)", "from autograder import reference"])
    assert found and not any(forges_helpers(f) for f in found), found
