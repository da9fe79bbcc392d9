"""One grading run at a time per course, each with its own scratch space, and its outputs checked first.

``RunLock`` holds an exclusive ``flock`` on ``coursework/.work/run.lock`` for
the whole run; the file says who holds it (process id, host, start time), so a
second run started on the same course refuses with a message naming the
first. The kernel drops the lock when its process dies, however it dies, so a
``kill -9`` never leaves the course locked.

Scratch: the run unpacks zips into ``coursework/.work/incoming/<pid>/`` and its
workers use ``$TMPDIR/ag-run-<pid>-*``; once the lock is held, whatever an
earlier run of this course left in ``incoming/`` is removed, and so is every
``ag-run-<pid>-*`` folder whose process is gone.

``check_outputs`` checks every place the run will write (gradebook, CSV,
report, course folders) before anything is read, filed or graded, writing nothing.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path

from ..sandboxing.bubblewrap import SCRATCH_PREFIX  # noqa: F401  (a run's scratch folder: $TMPDIR/<prefix><pid>-*)


class Busy(Exception):
    """Another run holds this course; the message names it."""


class RunLock:
    """``run.lock``: one grading run at a time; ``watch.lock`` (``what="watcher"``): one watcher."""

    def __init__(self, work: Path, name: str = "run.lock", what: str = "grading run"):
        self.path = Path(work) / name
        self.what = what
        self.handle = None

    def acquire(self, wait: float = 0.0) -> None:
        """Take the lock, waiting up to ``wait`` seconds; ``Busy`` names the holder if it stays taken."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(self.path, "a+", encoding="utf-8")
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    handle.seek(0)
                    holder = _describe(handle.read())
                    handle.close()
                    raise Busy(
                        f"another {self.what} is working on this course ({holder}); wait for it to "
                        "finish, then run the command again"
                    ) from None
                time.sleep(0.5)
        handle.seek(0)
        handle.truncate()
        handle.write(
            json.dumps(
                {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
            )
        )
        handle.flush()
        self.handle = handle

    def release(self) -> None:
        if self.handle is not None:
            self.handle.close()  # closing drops the flock
            self.handle = None


def _describe(text: str) -> str:
    try:
        holder = json.loads(text)
        return f"process {holder['pid']} on {holder['host']}, started {holder['started']}"
    except (ValueError, KeyError, TypeError):
        return "a process that has just started"


def run_scratch(work: Path) -> Path:
    """This run's own folder for unpacked zips; leftovers of earlier (killed) runs are removed.
    Call only while holding the ``RunLock``."""
    incoming = Path(work) / "incoming"
    if incoming.is_dir():
        for old in incoming.iterdir():
            if old.is_dir() and not old.is_symlink():
                shutil.rmtree(old, ignore_errors=True)
            else:
                try:
                    old.unlink()
                except OSError:
                    pass
    folder = incoming / str(os.getpid())
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def sweep_orphans(prefix: str) -> int:
    """Remove ``$TMPDIR/<prefix><pid>-*`` folders whose process is gone (killed before it could): the
    grade command's runs (``SCRATCH_PREFIX``), Dask workers' sandboxes (``distributed``)."""
    removed = 0
    for folder in Path(tempfile.gettempdir()).glob(f"{prefix}*-*"):
        pid = folder.name[len(prefix) :].split("-")[0]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(folder, ignore_errors=True)
            removed += 1
    return removed


def _try_write_into(folder: Path) -> str | None:
    """None if files can be created in ``folder`` (or in the folders that would be made for it),
    else why not. Asks the kernel (``access``, which also knows a read-only file system) and
    writes nothing: a refused run leaves every folder as it was, times included."""
    probe = Path(folder)
    while not probe.exists() and not probe.is_symlink():
        if probe.parent == probe:
            break
        probe = probe.parent
    if not probe.is_dir():
        return f"{probe} is not a folder"
    if not os.access(probe, os.W_OK | os.X_OK):
        return f"cannot write in {probe} (permission denied or a read-only file system)"
    return None


def check_file(path: Path) -> str | None:
    """None if ``path`` can be written (created or replaced), else why not."""
    path = Path(path)
    if path.is_dir():
        return f"{path} is a folder, not a file"
    if path.exists() and not os.access(path, os.W_OK):
        return f"{path} cannot be written (permission denied)"
    return _try_write_into(path.parent)


def check_folder(path: Path) -> str | None:
    path = Path(path)
    if path.exists() and not path.is_dir():
        return f"{path} is not a folder"
    return _try_write_into(path)


def sqlite_path(db_url: str) -> Path | None:
    """The file of a ``sqlite:///`` gradebook URL (None for another database or an in-memory one)."""
    if not db_url.startswith("sqlite:///"):
        return None
    rest = db_url[len("sqlite:///") :].split("?")[0]
    return Path(rest) if rest and rest != ":memory:" else None


# ---------------------------------------------------------------- the run's phases

STARTED = time.monotonic()  # as the command's process imports the engine


def trace(label: str) -> None:
    """With AUTOGRADER_TRACE=1: when each phase of the command ends."""
    if os.environ.get("AUTOGRADER_TRACE"):
        print(f"[{time.monotonic() - STARTED:7.2f} s] {label}", file=sys.stderr, flush=True)
