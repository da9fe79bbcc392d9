"""A Dask worker preload for the distributed grading tests (``dask worker --preload``).

The worker process kills itself (SIGKILL, as the kernel's OOM killer would)
whenever it starts grading a submission of a student whose id contains
``worker-killer``: a stand-in for a notebook whose grading brings its worker
down, which the sandbox should make impossible but the grader must survive.
"""

import os
import signal

from distributed import WorkerPlugin


class Saboteur(WorkerPlugin):
    def transition(self, key, start, finish, **kwargs):
        if finish == "executing" and "worker-killer" in str(key):
            os.kill(os.getpid(), signal.SIGKILL)


async def dask_setup(worker):
    await worker.plugin_add(plugin=Saboteur(), name="saboteur")
