"""./course's set-up stamp, read as ./course writes it.

Some tests need the venv that ./course set up (a copy's ./course must find it current and start
at once, or ./course lock must run on it). They call ``require_course_setup``: outside ./course
(a bare pytest) they are skipped; inside ``./course test`` a stamp that is not current fails
them, so a change to what ./course stamps cannot turn them into silent skips.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parent.parent
COURSE_SCRIPT = REPOSITORY / "course"


def stamped_files() -> list[Path]:
    """The files whose bytes ./course's stamp digests, in its order (read from the script itself)."""
    [command] = re.findall(r'wanted="\$\(cat (.*?) \| sha256sum', COURSE_SCRIPT.read_text().replace("\\\n", " "))
    files = []
    for word in command.split():
        relative = word.strip('"').replace("$here", "").replace('"', "").lstrip("/")
        files += sorted(REPOSITORY.glob(relative)) if "*" in relative else [REPOSITORY / relative]
    return files


def venv() -> Path:
    return Path(os.environ.get("COURSE_VENV", REPOSITORY / ".venv"))


def stamp() -> list[str]:
    """The stamp's words (digest, set), or [] when there is none."""
    path = venv() / ".course-installed"
    return path.read_text().split() if path.exists() else []


def require_course_setup(wanted_set: str | None = None) -> None:
    digest = hashlib.sha256(b"".join(path.read_bytes() for path in stamped_files())).hexdigest()
    words = stamp()
    current = words[:1] == [digest] and (wanted_set is None or words[1:2] == [wanted_set])
    if current:
        return
    why = f"the set-up of {venv()} is not current{f' for the {wanted_set} set' if wanted_set else ''}"
    if os.environ.get("COURSE_TEST_RUN"):
        pytest.fail(f"./course test ran, yet {why}: does course_setup.stamped_files() read ./course as it stamps?")
    pytest.skip(f"this test run did not come through ./course ({why})")
