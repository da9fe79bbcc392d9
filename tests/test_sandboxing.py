"""The sandbox's own parts (autograder/sandboxing/): a clean-up that removes any tree or says why
not, one host forking workers that share its memory and nothing else, a worker without its host."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autograder.sandboxing.bubblewrap import HostAddress, Limits, SandboxHost, WarmSandbox, claim_slot
from autograder.sandboxing.bubblewrap import probe as _probe
from autograder.sandboxing.zygote import _wipe


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
    assert os.getcwd() == here  # the caller's working folder, as it was


def test_clean_up_of_the_callers_own_folder_leaves_it_at_the_root(tmp_path):
    scratch = tmp_path / "tmp"
    (scratch / "inside").mkdir(parents=True)
    here = os.getcwd()
    os.chdir(scratch / "inside")
    try:
        assert _wipe(str(scratch))
        assert os.getcwd() == "/" and not (scratch / "inside").exists()
    finally:
        os.chdir(here)


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
    allowed = sorted(os.sched_getaffinity(0))
    try:
        host.launch()
        for index in range(2):
            # launched from a thread on one processor, as a pinned lane's pool process is (``pin_lane``)
            os.sched_setaffinity(0, {allowed[index % len(allowed)]})
            try:
                worker = WarmSandbox(claim_slot(), course, Limits(), sandboxed=True, base_dir=base, host=host.address)
                workers.append(worker)
                worker.launch()
                worker.wait_ready()  # where the host is asked for it
            finally:
                os.sched_setaffinity(0, allowed)
        a, b = workers
        assert a.info["pid"] == b.info["pid"] == 1 and a.process.pid != b.process.pid
        # each forked by the host, on its launcher's processor (the kernels it forks inherit it)
        assert os.sched_getaffinity(a.process.pid) == {allowed[0]}
        assert os.sched_getaffinity(b.process.pid) == {allowed[1 % len(allowed)]}
        assert os.sched_getaffinity(host.process.pid) == set(allowed)

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


FORKED_KERNEL_START = """
import json, os, sys
from autograder.sandboxing.bubblewrap import PRELOAD
from autograder.sandboxing.zygote import _warm_up
from jupyter_client.connect import write_connection_file

failed = {name: how for name, how in _warm_up(PRELOAD).items() if isinstance(how, str)}
connection, _ = write_connection_file(sys.argv[1] + "/kernel.json", ip="127.0.0.1")
child = os.fork()
if child == 0:
    from ipykernel.kernelapp import IPKernelApp

    from autograder.sandboxing.zygote import KERNEL_OPTIONS

    before = set(sys.modules)
    IPKernelApp.instance().initialize(["-f", connection, *KERNEL_OPTIONS])  # as the zygote's forked kernel does
    with open(sys.argv[1] + "/imported.json", "w") as out:
        json.dump({"failed": failed, "imported": sorted(set(sys.modules) - before)}, out)
    os._exit(0)
os.waitpid(child, 0)
"""


def test_a_kernel_forked_from_the_warm_interpreter_imports_nothing_as_it_starts(tmp_path):
    """What the kernel app imports on its way up is in the sandbox's preload list: imported once in
    the warm interpreter, not again in each notebook's kernel (psutil, for the machine's addresses,
    was 20 ms of every kernel's boot)."""
    subprocess.run(
        [sys.executable, "-c", FORKED_KERNEL_START, str(tmp_path)], check=True, capture_output=True, timeout=300
    )
    seen = json.loads((tmp_path / "imported.json").read_text())
    assert seen == {"failed": {}, "imported": []}


CELL_OUTPUTS = """
import sys
print("out", {n})
sys.stderr.write("err {n}\\n")
display({n})
print("after", {n})
"""


def test_a_graded_kernel_sends_every_output_of_a_cell_before_it_says_idle(tmp_path):
    """The kernel the warm interpreter becomes (``Zygote._become_kernel``), with the grader's options
    (``zygote.KERNEL_OPTIONS``: no sleep before a reply): each cell's prints, stderr and displays all
    arrive before its idle status, which is where the grader takes a cell as done, each stream in
    order and the display after what was written before it; a cell with no output sends none."""
    from jupyter_client import BlockingKernelClient
    from jupyter_client.connect import write_connection_file

    connection, _ = write_connection_file(str(tmp_path / "kernel.json"), transport="ipc", ip=str(tmp_path / "k"))
    request = {
        "cwd": str(tmp_path),
        "env": dict(os.environ),
        "connection_file": connection,
        "limits": {"memory_mb": 2048, "cpu_seconds": 600, "file_mb": 64},
        "log": str(tmp_path / "kernel.log"),
    }
    become = "import json, sys\nfrom autograder.sandboxing.zygote import Zygote\n"
    become += "Zygote({})._become_kernel(json.loads(sys.argv[1]), contained=False)"
    kernel = subprocess.Popen([sys.executable, "-c", become, json.dumps(request)])
    client = BlockingKernelClient(connection_file=connection)
    client.load_connection_file()
    client.start_channels()

    def run(code: str) -> list:
        sent = client.execute(code)
        outputs = []
        while True:
            message = client.get_iopub_msg(timeout=30)
            if message["parent_header"].get("msg_id") != sent:
                continue
            kind, content = message["msg_type"], message["content"]
            if kind == "status" and content["execution_state"] == "idle":
                break
            if kind == "stream":
                outputs.append((content["name"], content["text"]))
            elif kind in ("display_data", "execute_result", "error"):
                outputs.append((kind, content.get("data", {}).get("text/plain", content.get("ename"))))
        assert client.get_shell_msg(timeout=30)["parent_header"]["msg_id"] == sent
        return outputs

    def text(outputs: list, name: str) -> str:
        return "".join(text for kind, text in outputs if kind == name)

    try:
        client.wait_for_ready(timeout=120)
        assert run("print(get_ipython().kernel._execute_sleep)") == [("stdout", "0.0\n")]
        for n in range(200):
            outputs = run(CELL_OUTPUTS.format(n=n))
            shown = outputs.index(("display_data", str(n)))
            before, after = outputs[:shown], outputs[shown + 1 :]
            assert (text(before, "stdout"), text(before, "stderr")) == (f"out {n}\n", f"err {n}\n"), outputs
            assert after == [("stdout", f"after {n}\n")] or text(after, "stdout") == f"after {n}\n", outputs
            assert {kind for kind, _ in after} == {"stdout"}, outputs
            assert run("x = 1") == []
    finally:
        client.stop_channels()
        kernel.kill()
        kernel.wait()
