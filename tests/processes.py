"""Processes seen from outside, through /proc: which of them still run, their children, their open files."""

from __future__ import annotations

import os
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


def children(pid: int) -> list[int]:
    """The processes ``pid``'s threads started (its children), by pid."""
    found = []
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/children") as listed:
                found += [int(child) for child in listed.read().split()]
        except OSError:
            pass
    return found


def descendants(pid: int) -> list[int]:
    """``pid``'s children, theirs, and so on."""
    found, waiting = [], [pid]
    while waiting:
        for child in children(waiting.pop()):
            found.append(child)
            waiting.append(child)
    return found


def command_line(pid: int) -> str:
    with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
        return cmdline.read().replace(b"\0", b" ").decode(errors="replace")


def open_files(pid) -> list[str]:
    """What ``pid`` (or ``"self"``) holds open: each descriptor's target (a path, ``pipe:[..]``, ``socket:[..]``)."""
    found = []
    for name in os.listdir(f"/proc/{pid}/fd"):
        try:
            found.append(os.readlink(f"/proc/{pid}/fd/{name}"))
        except OSError:
            pass
    return found
