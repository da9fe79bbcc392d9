"""./course's set-up stamp, read as ./course writes it.

Some tests need the venv that ./course set up (a copy's ./course must find it current and start
at once, or ./course lock must run on it). They call ``require_course_setup``: outside ./course
(a bare pytest) they are skipped; inside ``./course test`` a stamp that is not current fails
them, so a change to what ./course stamps cannot turn them into silent skips.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parent.parent
COURSE_SCRIPT = REPOSITORY / "course"


def entry_point(script: Path = COURSE_SCRIPT):
    """The course script (a Python file without the .py) as a module: its functions, not run."""
    loader = importlib.machinery.SourceFileLoader("course_entry_point", str(script))
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
    loader.exec_module(module)
    return module


def stamped_files() -> list[Path]:
    """The files whose bytes ./course's stamp digests, in its order."""
    return entry_point().stamped_files(REPOSITORY)


def venv() -> Path:
    return entry_point().default_venv(REPOSITORY, os.environ)


def stamp() -> list[str]:
    """The stamp's words (digest, set), or [] when there is none."""
    path = entry_point().Course(REPOSITORY, venv()).stamp
    return path.read_text().split() if path.exists() else []


def require_course_setup(wanted_set: str | None = None) -> None:
    digest = entry_point().wanted_digest(REPOSITORY)
    words = stamp()
    current = words[:1] == [digest] and (wanted_set is None or words[1:2] == [wanted_set])
    if current:
        return
    why = f"the set-up of {venv()} is not current{f' for the {wanted_set} set' if wanted_set else ''}"
    if os.environ.get("COURSE_TEST_RUN"):
        pytest.fail(f"./course test ran, yet {why}: does course_setup.stamped_files() read ./course as it stamps?")
    pytest.skip(f"this test run did not come through ./course ({why})")
