"""One sandbox host for a ``./course worker``'s worker processes: imported by their fork server
(``dask_nanny.PRELOAD``) before it forks any of them.

As root, it starts a ``bubblewrap.SandboxHost``, as a local run starts one for its pool: the warm
interpreter that imports torch and the kernel machinery once and forks each worker's sandboxed
interpreter from it, into namespaces, folders and a user of that worker's own. The worker processes
find it here (``SHARED``: its folder and address) and their sandboxes share its memory instead of
each importing its own. Without root, or where the sandbox cannot start, there is none: each worker
process starts its own (``distributed.station``), as before. Nothing here runs in a process that
did not import this module first: a worker process started otherwise never starts a host.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

from .. import REPOSITORY
from ..sandboxing.bubblewrap import HostAddress, Limits, SandboxHost, probe
from .runs import sweep_orphans

PREFIX = "ag-dask-host-"  # + the fork server's pid: a killed server's folder is swept by the next
_SERVER = os.getpid()


def _start() -> tuple[Path, HostAddress] | None:
    if os.geteuid() != 0 or probe(REPOSITORY) is not None:
        return None
    sweep_orphans(PREFIX)
    base = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{_SERVER}-"))
    host = SandboxHost(REPOSITORY, base, Limits())
    host.launch()

    def stop() -> None:  # as the server ends (its forks inherit this, and do nothing)
        if os.getpid() == _SERVER:
            host.close()
            shutil.rmtree(base, ignore_errors=True)

    atexit.register(stop)
    return base, host.address


SHARED = _start()
