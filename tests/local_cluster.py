"""A Dask cluster on this machine, started as an instructor starts one (docs/dask.md, "On several
machines"): ``./course scheduler`` and ``./course worker`` processes on 127.0.0.1.

Used by the Dask tests (``test_grade_distributed.py``) and the grading benchmark
(``tools/bench/grading.py``); not part of the grader.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parent.parent


class LocalCluster:
    """``./course scheduler`` and ``./course worker`` processes on 127.0.0.1, as an instructor
    starts them: the benchmark's distributed row, and the tests' cluster."""

    def __init__(self, logs: Path):
        import socket

        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.address = f"tcp://127.0.0.1:{self.port}"
        self.logs = logs
        self.processes: dict[str, subprocess.Popen] = {}
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("DASK_")}  # no address inherited
        self.env["COURSE_VENV"] = sys.prefix

    def _launch(self, name: str, *arguments: str) -> None:
        with open(self.logs / f"{name}.log", "ab") as log:
            self.processes[name] = subprocess.Popen(
                [str(REPOSITORY / "course"), *arguments],
                cwd=REPOSITORY,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def start_worker(self, name: str, *options: str) -> None:
        self._launch(name, "worker", self.address, "--host", "127.0.0.1", "--no-dashboard", "--name", name, *options)

    def wait_for_workers(self, count: int) -> None:
        from distributed import Client

        with Client(self.address, timeout=60, set_as_default=False) as client:
            client.wait_for_workers(count, timeout=300)

    def kill(self, name: str) -> None:
        """kill -9 a ``./course worker``: its nanny and worker processes at once (a machine gone)."""
        import signal

        process = self.processes.pop(name)
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()

    def __enter__(self):
        self._launch("scheduler", "scheduler", "--host", "127.0.0.1", "--port", str(self.port), "--no-dashboard")
        return self

    def __exit__(self, *exc):
        import signal

        for name in reversed(list(self.processes)):
            process = self.processes.pop(name)
            try:
                os.killpg(process.pid, signal.SIGTERM)
                process.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
