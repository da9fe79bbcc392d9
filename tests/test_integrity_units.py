"""The parts of issue 15's promise that are plain functions: clean-up of any tree, the wire's bounds,
the judge's kinds, the detector of changed grading helpers, the static inspection of indirect routes.
Each is also exercised through the real command by the hostile catalogue (tests/hostile/catalogue.yml)."""

from __future__ import annotations

import json
import os
import shutil
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


# ---------------------------------------------------------------- a kernel cannot change what forks it

REPOSITORY = Path(__file__).resolve().parent.parent
SANDBOX_PROBLEM = _probe(REPOSITORY)
NAMESPACES = ("user", "pid", "ipc", "mnt")


def _outside(pid: int) -> dict:
    """What the machine says of process ``pid``: its limits, priority, CPUs, out-of-memory score."""
    proc = Path(f"/proc/{pid}")
    status = (proc / "status").read_text()
    return {
        "limits": (proc / "limits").read_text(),
        "nice": (proc / "stat").read_text().rsplit(")", 1)[1].split()[16],
        "cpus": next(line for line in status.splitlines() if line.startswith("Cpus_allowed_list")),
        "oom": (proc / "oom_score_adj").read_text(),
    }


def kernel_and_interpreter(folder: str) -> dict:
    """One notebook in a real sandboxed kernel that tries to change the interpreter forking it (the
    hostile catalogue's ``changes-its-interpreter`` cell), then reports what it is; and the
    interpreter's state as the machine shows it, before and after. Run as root by the test below, and
    as an ordinary user through ``setpriv`` (the sandbox differs there: bubblewrap's own user namespace)."""
    import nbformat
    import yaml

    from autograder.sandboxing.bubblewrap import kernel_environment
    from autograder.worker.execute import ContainedExecute

    attack = next(
        entry["code"]
        for entry in yaml.safe_load((REPOSITORY / "tests" / "hostile" / "catalogue.yml").read_text())
        if entry["id"] == "changes-its-interpreter"
    )
    report = """
import json, os
status = open("/proc/self/status").read()
print(json.dumps({
    "uid": os.getuid(), "parent": os.getppid(),
    "capabilities": [line.split()[1] for line in status.splitlines() if line.startswith(("CapEff", "CapBnd"))],
    "namespaces": {kind: os.readlink(f"/proc/self/ns/{kind}") for kind in ("user", "pid", "ipc", "mnt")},
    "sees": len([name for name in os.listdir("/proc") if name.isdigit()]),
}))
"""
    root = Path(folder)
    (root / "course").mkdir()
    sandbox = WarmSandbox(claim_slot(), root / "course", Limits(), sandboxed=True, base_dir=root / "run")
    try:
        sandbox.start()
        assert sandbox.sane()  # a request: the interpreter's pid is known from here on
        interpreter = sandbox._interpreter_pid
        before = _outside(interpreter)
        notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(code) for code in (report, attack)])
        executor = ContainedExecute(sandbox, Limits(), str(sandbox.work_dir("a")), kernel_environment(None), [])
        execution = executor.run(notebook)
        assert not execution.faults, execution.faults
        kernel = json.loads(notebook.cells[0].outputs[0]["text"])
        return {
            "kernel": kernel,
            "attack": notebook.cells[1].outputs[0]["text"],
            "interpreter": {kind: os.readlink(f"/proc/{interpreter}/ns/{kind}") for kind in NAMESPACES},
            "before": before,
            "after": _outside(interpreter),
            "launches": sandbox.launches,
            "still": sandbox.sane() and sandbox._interpreter_pid == interpreter,
        }
    finally:
        sandbox.close()


def _assert_contained(seen: dict) -> None:
    kernel = seen["kernel"]
    assert "tried on" in seen["attack"], seen["attack"]
    assert seen["after"] == seen["before"], (seen["before"], seen["after"])
    assert kernel["parent"] == 1, kernel  # its own pid namespace: the interpreter has no pid there
    assert kernel["capabilities"] == ["0000000000000000", "0000000000000000"], kernel
    for kind in NAMESPACES:
        assert kernel["namespaces"][kind] != seen["interpreter"][kind], kind
    assert seen["still"] and seen["launches"] == 1


@pytest.mark.skipif(bool(SANDBOX_PROBLEM) or os.geteuid() != 0, reason="as root, with bubblewrap")
def test_a_kernel_cannot_change_the_interpreter_forking_it(tmp_path):
    """The kernel runs in user, pid, IPC and mount namespaces of its own below its interpreter's, with no
    capability: its parent is its own init; prlimit, renice, sched_setaffinity and the out-of-memory
    score, tried on its parent and on every process it finds by the interpreter's command line, leave
    the interpreter as it was."""
    _assert_contained(kernel_and_interpreter(str(tmp_path)))


SYSTEM_PYTHON = Path(f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}")


@pytest.mark.skipif(
    bool(SANDBOX_PROBLEM) or os.geteuid() != 0 or not shutil.which("setpriv") or not SYSTEM_PYTHON.exists(),
    reason="needs root to become another user, and a system Python of this version that user can run",
)
def test_a_kernel_cannot_change_its_interpreter_without_root_either():
    """The same as an ordinary user: bubblewrap then makes a user namespace for the sandbox, the
    interpreter and its kernels share one user, and the kernel's own namespaces still keep it out."""
    import sysconfig
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="unprivileged-"))  # pytest's own folders are root's alone
    try:
        # This venv's interpreter may live where another user cannot read (root's home): a venv of the
        # system's Python of the same version, seeing this venv's packages, stands in for it.
        venv = folder / "venv"
        subprocess.run([str(SYSTEM_PYTHON), "-m", "venv", "--without-pip", str(venv)], check=True)
        packages = sysconfig.get_paths()["purelib"]
        (venv / Path(packages).relative_to(sys.prefix) / "course.pth").write_text(
            f"import site; site.addsitedir({packages!r})\n"
        )
        os.chmod(folder, 0o755)
        (folder / "work").mkdir()
        os.chown(folder / "work", 65534, 65534)
        seen = _as_nobody(venv / "bin" / "python", folder / "work")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    assert seen["kernel"]["uid"] == 65534
    _assert_contained(seen)


def _as_nobody(python: Path, folder: Path) -> dict:
    program = (
        "import json, sys; sys.path.insert(0, 'tests'); import test_integrity_units as t; "
        f"print('RESULT', json.dumps(t.kernel_and_interpreter({str(folder)!r})))"
    )
    env = {"PATH": "/usr/bin:/bin", "HOME": str(folder), "TMPDIR": str(folder), "LANG": "C.UTF-8"}
    result = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", str(python), "-c", program],
        cwd=REPOSITORY,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    lines = [line for line in result.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, result.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT ") :])


def plain_kernels(folder: str) -> dict:
    """Two notebooks on one worker where no user namespace can be made: the hostile catalogue's
    ``changes-its-interpreter`` cell, then the same again; what each kernel says of its parent, what
    the attack printed, and the worker's log."""
    import nbformat
    import yaml

    from autograder.sandboxing.bubblewrap import kernel_environment
    from autograder.worker.execute import ContainedExecute

    attack = next(
        entry["code"]
        for entry in yaml.safe_load((REPOSITORY / "tests" / "hostile" / "catalogue.yml").read_text())
        if entry["id"] == "changes-its-interpreter"
    )
    root = Path(folder)
    (root / "course").mkdir()
    sandbox = WarmSandbox(claim_slot(), root / "course", Limits(), sandboxed=True, base_dir=root / "run")
    seen = {"parents": [], "attacks": [], "launches": []}
    try:
        sandbox.start()
        for _ in range(2):
            cells = [nbformat.v4.new_code_cell(code) for code in ("import os; print(os.getppid())", attack)]
            notebook = nbformat.v4.new_notebook(cells=cells)
            executor = ContainedExecute(sandbox, Limits(), str(sandbox.work_dir("a")), kernel_environment(None), [])
            execution = executor.run(notebook)
            assert not execution.faults, execution.faults
            seen["parents"].append(int(notebook.cells[0].outputs[0]["text"]))
            seen["attacks"].append(notebook.cells[1].outputs[0]["text"])
            seen["launches"].append(sandbox.launches)
        seen["log"] = sandbox.log_tail(40)
    finally:
        sandbox.close()
    return seen


# In a user namespace of its own that maps root's first 65536 users and groups to themselves (so that
# the sandbox runs as it does as root) and allows no further user namespace.
WITHOUT_USER_NAMESPACES = """
import ctypes, json, os, sys, time
reader, writer = os.pipe()
child = os.fork()
if child == 0:
    os.close(writer)
    if ctypes.CDLL(None, use_errno=True).unshare(0x10000000) != 0:  # CLONE_NEWUSER
        os._exit(3)
    os.read(reader, 1)
    with open("/proc/sys/user/max_user_namespaces", "w") as handle:
        handle.write("0")
    sys.path.insert(0, "tests")
    import test_integrity_units as t
    print("RESULT", json.dumps(t.plain_kernels(FOLDER)), flush=True)
    os._exit(0)
os.close(reader)
while os.readlink(f"/proc/{child}/ns/user") == os.readlink("/proc/self/ns/user"):
    time.sleep(0.001)
for name in ("uid_map", "gid_map"):
    with open(f"/proc/{child}/{name}", "w") as handle:
        handle.write("0 0 65536")
os.write(writer, b"x")
sys.exit(os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]))
"""


@pytest.mark.skipif(bool(SANDBOX_PROBLEM) or os.geteuid() != 0, reason="as root, with bubblewrap")
def test_where_user_namespaces_are_not_allowed_kernels_are_plain_children(tmp_path):
    """Where no user namespace can be made (``user.max_user_namespaces`` 0 here; Ubuntu's AppArmor
    default for an ordinary user), each kernel is a plain child of its interpreter, the worker's log says
    so once per interpreter, and the check after the notebook still finds what the kernel changed and
    replaces the interpreter before the next notebook."""
    program = WITHOUT_USER_NAMESPACES.replace("FOLDER", repr(str(tmp_path)))
    result = subprocess.run(
        [sys.executable, "-c", program], cwd=REPOSITORY, capture_output=True, text=True, timeout=600
    )
    if result.returncode == 3:
        pytest.skip("no user namespace can be made here, so none can be refused either")
    lines = [line for line in result.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, (result.returncode, result.stderr[-3000:])
    seen = json.loads(lines[-1][len("RESULT ") :])
    assert all(parent != 1 for parent in seen["parents"]), seen  # no pid namespace of its own
    assert all("tried on" in attack for attack in seen["attacks"]), seen
    assert seen["launches"] == [1, 2], seen  # replaced after the first notebook
    assert seen["log"].count("kernels run without namespaces of their own") == 2, seen["log"]
    assert seen["log"].count("changed during a notebook") == 2, seen["log"]


@pytest.mark.skipif(
    bool(SANDBOX_PROBLEM) or os.geteuid() != 0 or not shutil.which("nsenter") or not shutil.which("ipcmk"),
    reason="the sandbox host runs as root, with bubblewrap; util-linux's nsenter and ipcmk",
)
def test_an_interpreter_changed_during_a_notebook_is_replaced(tmp_path):
    """Whatever changed the interpreter while a notebook ran (here a process of its own user: its process
    limit, priority and CPUs; the test itself: its out-of-memory score, a System V object in its IPC
    namespace), the check after the notebook finds it and the worker replaces the interpreter with a
    fresh one, as it was."""

    def as_its_user(code: str):
        def change(pid: int, uid: int) -> None:
            program = f"import os, resource; pid = {pid}; {code}"
            command = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "/usr/bin/python3", "-c"]
            subprocess.run([*command, program], check=True, capture_output=True)

        return change

    base = tmp_path / "run"
    base.mkdir()
    host = SandboxHost(tmp_path, base, Limits())
    changes = {
        "limits": as_its_user("resource.prlimit(pid, resource.RLIMIT_NPROC, (0, 0))"),
        "priority": as_its_user("os.setpriority(os.PRIO_PROCESS, pid, 19)"),
        "oom score": lambda pid, uid: Path(f"/proc/{pid}/oom_score_adj").write_text("1000"),
        "System V IPC": lambda pid, uid: subprocess.run(
            ["nsenter", "--ipc", "--target", str(pid), "ipcmk", "--shmem", "4096"], check=True, capture_output=True
        ),
    }
    if len(os.sched_getaffinity(0)) > 1:
        changes["cpus"] = as_its_user("os.sched_setaffinity(pid, {min(os.sched_getaffinity(pid))})")
    try:
        host.launch()
        worker = WarmSandbox(claim_slot(), tmp_path, Limits(), sandboxed=True, base_dir=base, host=host.address)
        worker.start()
        for number, (what, change) in enumerate(changes.items(), start=1):
            assert worker.reset(None)["clean"]
            change(worker.process.pid, worker.uid)
            reply = worker.reset(None)
            assert not reply["clean"] and reply["changed"] == [what], reply
            assert worker.retired == number and not worker.alive()
            worker.ensure()  # a fresh interpreter for the next notebook
            assert worker.launches == number + 1
        assert worker.reset(None)["clean"]
        assert "changed during a notebook" in (base / f"w{worker.slot}.log").read_text()
    finally:
        worker.close()
        host.close()


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
        # the comparison and the catalogue's types, which a stock-nbgrader check runs in the kernel
        ("import autograder.compare as c\nc.close = lambda *a: None", "autograder.compare.close"),
        ("import course_checks.cases as c\nc.Case.run = lambda self, f: 0", "Case.run"),
        ("import autograder.local_judge as j\nj.LocalJudge.result = lambda *a: None", "LocalJudge.result"),
    ],
)
def test_changes_to_the_grading_helpers_are_detected(code, found):
    assert checks._replaced() == []
    assert found in _forked(code)


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
