"""Writing a file whole or not at all: the one atomic writer of the course (the learner's progress
file, and the grader's filed submissions, autograded notebooks, feedback pages and reports)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

PARTIAL = ".partial"  # the suffix of a file being written (``sweep_partial`` removes those a kill left)


def write_atomically(target: Path, data: bytes | str | Path) -> None:
    """Write ``data`` (bytes, text, or a file to copy) to ``target``: a temporary file in the same
    folder, synced, then renamed over ``target``, so a kill never leaves a partial file under its name."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=f".{target.name[:40]}.", suffix=PARTIAL, dir=target.parent)
    try:
        with os.fdopen(handle, "wb") as sink:
            if isinstance(data, Path):
                with open(data, "rb") as stream:
                    shutil.copyfileobj(stream, sink, 1 << 20)
            else:
                sink.write(data.encode("utf-8") if isinstance(data, str) else data)
            sink.flush()
            os.fsync(sink.fileno())
        os.chmod(temporary, 0o644)
        os.replace(temporary, target)
    except BaseException:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        raise


def sweep_partial(folder: Path) -> None:
    """Remove the temporary files of writes a killed process left behind below ``folder``."""
    if Path(folder).is_dir():
        for path in Path(folder).rglob(f".*{PARTIAL}"):
            try:
                path.unlink()
            except OSError:
                pass
