"""The Linux calls the sandboxing makes through libc (ctypes): one place for them."""

from __future__ import annotations

import ctypes
import os
import signal

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_CAPBSET_DROP = 24
PR_SET_CHILD_SUBREAPER = 36
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 47, 4

CLONE_NEWNS, CLONE_NEWIPC, CLONE_NEWUSER = 0x00020000, 0x08000000, 0x10000000
CLONE_NEWPID, CLONE_NEWNET = 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_BIND, MS_REC, MS_PRIVATE = 4096, 16384, 1 << 18
MNT_DETACH = 2


def libc():
    return ctypes.CDLL(None, use_errno=True)


def _checked(result: int, what: str) -> None:
    if result != 0:
        number = ctypes.get_errno()
        raise OSError(number, f"{what}: {os.strerror(number)}")


def prctl(option: int, value: int) -> None:
    """``prctl(option, value)``, best effort (a platform without it simply goes without)."""
    try:
        libc().prctl(option, value, 0, 0, 0)
    except Exception:
        pass


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """This process gets ``sig`` when the thread that started it ends (``PR_SET_PDEATHSIG``)."""
    prctl(PR_SET_PDEATHSIG, sig)


def keep_only_descriptors(keep) -> None:
    """Close every descriptor of this process but those in ``keep`` (a fork that must hold nothing
    of its parent's: files, pipes, sockets)."""
    low = 0
    for fd in [*sorted(set(keep)), os.sysconf("SC_OPEN_MAX")]:
        if low < fd:  # closerange(0, 0) closes every descriptor (close_range's last is then -1)
            os.closerange(low, fd)
        low = fd + 1


def drop_signal_handlers() -> None:
    """Every Python signal handler this process inherited back to the default (a signal ignored
    stays ignored)."""
    for number in signal.valid_signals():
        handler = signal.getsignal(number)
        if callable(handler) and handler is not signal.default_int_handler:
            signal.signal(number, signal.SIG_DFL)


def unshare(flags: int) -> None:
    _checked(libc().unshare(flags), "unshare")


def mount(source: str | None, target: str, kind: str | None, flags: int, data: str | None = None) -> None:
    encode = lambda text: text.encode() if text is not None else None  # noqa: E731
    _checked(libc().mount(encode(source), encode(target), encode(kind), flags, encode(data)), f"mount {target}")


def unmount(target: str) -> None:
    _checked(libc().umount2(target.encode(), MNT_DETACH), f"unmount {target}")


def own_user_namespace() -> bool:
    """Move this (single-threaded) process into a new user namespace that maps its own user and
    group to themselves, and give it new pid (for its children), mount and IPC namespaces owned by
    that user namespace. False, with nothing changed, where user namespaces are not allowed.

    A process made so can no longer name anything above it: its children's pids, ``kill(-1)``,
    ``setpriority(PRIO_USER)`` and pidfds reach only their own pid namespace, and System V IPC and
    POSIX message queues are its IPC namespace's, gone with its last process. The user namespace
    gives the capabilities to make the others; ``drop_capabilities`` takes them away again.
    """
    uid, gid = os.getuid(), os.getgid()
    if libc().unshare(CLONE_NEWUSER) != 0:
        return False
    # Its own /proc/self files must be its own to write: a process that changed user is undumpable
    # and they belong to root then.
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
        with open(f"/proc/self/{name}", "w") as handle:
            handle.write(text)
    unshare(CLONE_NEWPID | CLONE_NEWNS | CLONE_NEWIPC)
    return True


def drop_capabilities() -> None:
    """No capability left, now or after any exec (bounding and ambient sets emptied, no new privileges)."""
    try:
        with open("/proc/sys/kernel/cap_last_cap") as handle:
            last = int(handle.read())
    except (OSError, ValueError):
        last = 63
    for capability in range(last + 1):
        libc().prctl(PR_CAPBSET_DROP, capability, 0, 0, 0)  # fails harmlessly once nothing is left to drop
    libc().prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]

    header, data = Header(0x20080522, 0), (Data * 2)()  # _LINUX_CAPABILITY_VERSION_3: two words, all zero
    _checked(libc().capset(ctypes.byref(header), data), "capset")
    prctl(PR_SET_NO_NEW_PRIVS, 1)
