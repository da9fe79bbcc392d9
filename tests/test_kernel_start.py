"""A graded kernel's client reaches it as soon as the kernel has made its sockets.

The client connects before the kernel has bound its socket files, and zmq tries again after its
reconnect interval: 100 ms unless told. ``ContainedExecute`` tells it 5 ms, on the context that
makes the client's sockets: jupyter_client gives each client a context of its own, so an interval
set on the kernel manager's context never reached them, and every kernel answered about 0.1 s
after it was ready (the boot phase, 0.17 s a notebook then, 0.05 s since). Checked on a real
sandboxed kernel: the sockets the client used, and that the notebook ran.
"""

from __future__ import annotations

import concurrent.futures
import os
from pathlib import Path

import pytest

from autograder.sandboxing.bubblewrap import Limits, WarmSandbox, claim_slot
from autograder.sandboxing.bubblewrap import probe as _probe

REPOSITORY = Path(__file__).resolve().parent.parent
SANDBOX_PROBLEM = _probe(REPOSITORY)


@pytest.mark.skipif(bool(SANDBOX_PROBLEM) or os.geteuid() != 0, reason="as root, with bubblewrap")
def test_the_client_tries_the_kernels_sockets_every_5_ms(tmp_path):
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
        # in a thread of its own: the browser tests' playwright leaves the main thread's event loop marked running
        with concurrent.futures.ThreadPoolExecutor(1) as thread:
            execution = thread.submit(executor.run, notebook).result()
    finally:
        sandbox.close()
    assert not execution.faults, execution.faults
    assert notebook.cells[0].outputs[0]["text"] == "42\n"
    assert seen == [{"shell_channel": 5, "iopub_channel": 5}], seen
