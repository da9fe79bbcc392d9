"""The Linux calls the sandboxing makes through libc (ctypes): one place for them."""

from __future__ import annotations

import ctypes
import signal

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4


def libc():
    return ctypes.CDLL(None, use_errno=True)


def prctl(option: int, value: int) -> None:
    """``prctl(option, value)``, best effort (a platform without it simply goes without)."""
    try:
        libc().prctl(option, value, 0, 0, 0)
    except Exception:
        pass


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """This process gets ``sig`` when the thread that started it ends (``PR_SET_PDEATHSIG``)."""
    prctl(PR_SET_PDEATHSIG, sig)
