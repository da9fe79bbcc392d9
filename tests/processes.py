"""Processes seen from outside, through /proc: which of them still run."""

from __future__ import annotations

import time


def running(pid: int) -> bool:
    """``pid`` exists and has not ended (a zombie, ended but not yet reaped by its parent, has)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def still_running(pids, seconds: float = 10.0) -> list[int]:
    """Wait up to ``seconds`` for every process of ``pids`` to end; those still running then."""
    deadline = time.monotonic() + seconds
    left = list(pids)
    while left and time.monotonic() < deadline:
        left = [pid for pid in left if running(pid)]
        if left:
            time.sleep(0.05)
    return left
