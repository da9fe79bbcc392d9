"""The stock nbgrader runs graded beside the other tests (``stock_graded`` in conftest.py) take only
the CPU those leave idle: their kernels as well as nbgrader itself (``grading_harness.Beside``)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from grading_harness import Beside
from jupyter_client.manager import start_new_kernel

TESTS = Path(__file__).resolve().parent


@pytest.mark.skipif(not Path("/proc/self/autogroup").exists(), reason="a system without scheduler autogroups")
def test_a_stock_kernel_beside_the_tests_lowers_its_sessions_share_of_the_cpu(tmp_path, monkeypatch):
    beside = Beside.at_lowest_priority(dict(os.environ), tmp_path / "jupyter")
    monkeypatch.setenv("JUPYTER_PATH", beside.environ["JUPYTER_PATH"])
    manager, client = start_new_kernel(kernel_name="python3")  # the name the notebooks give
    printed = []
    try:
        client.execute_interactive(
            "import json, os, sys\n"
            "print(json.dumps([open('/proc/self/autogroup').read(), os.getsid(0) == os.getpid(), sys.path]))",
            output_hook=lambda message: printed.append(message["content"].get("text", "")),
            timeout=60,
        )
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)
    autogroup, own_session, path = json.loads("".join(printed))
    assert own_session  # jupyter_client starts it in a session of its own: nbgrader's nice is not its share
    assert autogroup.split()[-2:] == ["nice", "19"], autogroup
    assert str(TESTS) not in path  # the launcher's folder: the suite's modules (tests/dask/...) are not the kernel's


def test_a_class_graded_beside_talks_to_its_kernels_over_unix_sockets(tmp_path):
    """No TCP port for another of the suite's processes to take between jupyter_client's choosing it
    and the kernel's binding it (``Course.kernel_sockets``)."""
    import nbformat
    from grading_harness import UNTOUCHED, Course

    beside = Beside.at_lowest_priority(dict(os.environ), tmp_path / "jupyter")
    course = Course.create(tmp_path / "course", ["00_start_here"], beside)
    show = "import json, ipykernel.connect\nprint(json.dumps(json.load(open(ipykernel.connect.get_connection_file()))))"
    course.submit("alice", "00_start_here", UNTOUCHED, edit=lambda nb: nb.cells.append(nbformat.v4.new_code_cell(show)))
    course.autograde("00_start_here")
    graded = course.autograded("alice", "00_start_here")
    outputs = [o for c in graded["cells"] if c["cell_type"] == "code" for o in c["outputs"]]
    connection = json.loads("".join(outputs[-1]["text"]))
    assert connection["transport"] == "ipc"
    assert connection["ip"] == str(course.root / "kernel")
    assert not list(course.root.glob("kernel-*"))  # each kernel's sockets removed as it stops
