"""A kernel cannot change what forks it (autograder/sandboxing/zygote.py, linux.py): namespaces of
its own below the warm interpreter, as root and as an ordinary user, plain children where none can
be made, and an interpreter changed during a notebook replaced. And its client reaches it as soon as
it has made its sockets."""

from __future__ import annotations

import concurrent.futures
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from autograder.sandboxing.bubblewrap import Limits, SandboxHost, WarmSandbox, claim_slot
from autograder.sandboxing.bubblewrap import probe as _probe

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
        "session nice": int((proc / "autogroup").read_text().split()[-1]),
    }


def run_apart(executor, notebook):
    """``executor.run(notebook)`` in a thread of its own: playwright's sync API (the browser tests,
    earlier in the same pytest process) leaves its event loop marked as running in the main
    thread, where ``asyncio.run`` refuses to start."""
    with concurrent.futures.ThreadPoolExecutor(1) as thread:
        return thread.submit(executor.run, notebook).result()


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
    "session": os.getsid(0) == os.getpid(),
    "nice": os.getpriority(os.PRIO_PROCESS, 0),
    "session nice": int(open("/proc/self/autogroup").read().split()[-1]),
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
        execution = run_apart(executor, notebook)
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


def _assert_contained(seen: dict, nice: int = 0) -> None:
    """``nice``: the priority the grader ran at (the kernel's session is lowered to it, never raised)."""
    kernel = seen["kernel"]
    assert kernel["session"] and kernel["nice"] == nice and kernel["session nice"] == max(nice, 0), kernel
    assert seen["before"]["session nice"] == max(nice, 0), seen["before"]  # the interpreter's session too
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
    _assert_contained(kernel_and_interpreter(str(tmp_path)), os.getpriority(os.PRIO_PROCESS, 0))


SYSTEM_PYTHON = Path(f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}")


@pytest.mark.skipif(
    bool(SANDBOX_PROBLEM) or os.geteuid() != 0 or not shutil.which("setpriv") or not SYSTEM_PYTHON.exists(),
    reason="needs root to become another user, and a system Python of this version that user can run",
)
def test_a_kernel_cannot_change_its_interpreter_without_root_either():
    """The same as an ordinary user: bubblewrap then makes a user namespace for the sandbox, the
    interpreter and its kernels share one user, and the kernel's own namespaces still keep it out. Run
    as ``nice -n 4 ./course grade`` would run it: each kernel starts a session of its own, and with the
    scheduler's autogroups the CPU is shared between sessions before nice counts, so the kernel's
    session is lowered to nice 4 as well."""
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
        unreadable = _as_nobody(venv / "bin" / "python", folder / "work", PROBE, check=False)
        if unreadable:  # a checkout in a folder of root's alone (a home, ``mktemp -d``): say so, as the hub's tests do
            pytest.skip(f"this checkout or its venv cannot be read by another user here: {unreadable}")
        seen = _as_nobody(venv / "bin" / "python", folder / "work", nice=4)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    assert seen["kernel"]["uid"] == 65534
    _assert_contained(seen, nice=min(19, 4 + os.getpriority(os.PRIO_PROCESS, 0)))


PROBE = "import sys; sys.path.insert(0, 'tests'); import torch, autograder, test_kernel_isolation; print('RESULT {}')"


def _as_nobody(python: Path, folder: Path, program: str | None = None, check: bool = True, nice: int = 0):
    """What ``program`` (by default: a kernel and its interpreter, ``kernel_and_interpreter``) reports
    when run as ``nobody`` in this checkout (``nice`` lower than this process); with ``check=False``,
    the tail of its errors when it reports nothing ("" when it does)."""
    program = program or (
        "import json, sys; sys.path.insert(0, 'tests'); import test_kernel_isolation as t; "
        f"print('RESULT', json.dumps(t.kernel_and_interpreter({str(folder)!r})))"
    )
    env = {"PATH": "/usr/bin:/bin", "HOME": str(folder), "TMPDIR": str(folder), "LANG": "C.UTF-8"}
    result = subprocess.run(
        ["nice", "-n", str(nice), "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", str(python)]
        + ["-c", program],
        cwd=REPOSITORY,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    lines = [line for line in result.stdout.splitlines() if line.startswith("RESULT ")]
    if not check:
        return "" if lines else (result.stderr.strip().splitlines() or ["no output"])[-1][-300:]
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
            execution = run_apart(executor, notebook)
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
    import test_kernel_isolation as t
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


@pytest.mark.skipif(bool(SANDBOX_PROBLEM) or os.geteuid() != 0, reason="as root, with bubblewrap")
def test_the_client_tries_the_kernels_sockets_every_5_ms(tmp_path):
    """The client connects before the kernel has bound its socket files, and zmq tries again after its
    reconnect interval: 100 ms unless told. ``ContainedExecute`` tells it 5 ms, on the context that makes
    the client's sockets: jupyter_client gives each client a context of its own, so the interval once set
    on the kernel manager's context never reached them, and every kernel answered about 0.1 s after it
    was ready (the boot phase 0.17 s a notebook then, 0.05 s since). Read from the sockets a real
    sandboxed kernel's client used."""
    import nbformat
    import zmq

    from autograder.sandboxing.bubblewrap import kernel_environment
    from autograder.worker.execute import ContainedExecute

    seen = []

    class Watched(ContainedExecute):
        async def _ready(self, deadline):
            seen.append(
                {
                    name: getattr(self.kc, name).socket.getsockopt(zmq.RECONNECT_IVL)
                    for name in ("shell_channel", "iopub_channel")
                }
            )
            return await super()._ready(deadline)

    (tmp_path / "course").mkdir()
    sandbox = WarmSandbox(claim_slot(), tmp_path / "course", Limits(), sandboxed=True, base_dir=tmp_path / "run")
    try:
        sandbox.start()
        notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print(6 * 7)")])
        executor = Watched(sandbox, Limits(), str(sandbox.work_dir("a")), kernel_environment(None), [])
        execution = run_apart(executor, notebook)
    finally:
        sandbox.close()
    assert not execution.faults, execution.faults
    assert notebook.cells[0].outputs[0]["text"] == "42\n"
    assert seen == [{"shell_channel": 5, "iopub_channel": 5}], seen
