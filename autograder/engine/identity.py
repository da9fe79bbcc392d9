"""Which grading code this is: one digest of the grader's, the kernel side's and the widgets' source files.

The grade command, every grading worker (local or on Dask) and each notebook's
``AssignmentSpec.fingerprint`` use this one digest. It reads only the Python
files of the three code packages (folders with an ``__init__.py``) and their
``templates/`` folders (the feedback page's), never anything of nbgrader's
course root (``coursework/``: submissions, gradebook, feedback), so no student
file, whatever its name or kind, can change it.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
from pathlib import Path

PACKAGES = ("autograder", "course_checks", "course_widgets")


def package_folder(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(name)
    return Path(list(spec.submodule_search_locations)[0]).resolve()


def code_files() -> list[Path]:
    """The source files of the grading code: ``.py`` files of the packages and their subpackages, and
    the files of their ``templates/`` folders."""
    files = []
    for name in PACKAGES:
        stack = [package_folder(name)]
        while stack:
            folder = stack.pop()
            for entry in sorted(folder.iterdir()):
                if entry.is_dir() and (entry / "__init__.py").is_file():
                    stack.append(entry)
                elif entry.is_dir() and entry.name == "templates":
                    files += [path for path in entry.rglob("*") if path.is_file()]
                elif entry.suffix == ".py" and entry.is_file():
                    files.append(entry)
    return sorted(files)


@functools.cache
def code_digest() -> str:
    """sha256 over the code files' package-relative names and bytes, read once per process (a
    checkout updated under a running worker still counts as what that worker loaded)."""
    hasher = hashlib.sha256()
    for name in PACKAGES:
        root = package_folder(name).parent
        for path in code_files():
            if path.is_relative_to(package_folder(name)):
                hasher.update(str(path.relative_to(root)).encode())
                hasher.update(path.read_bytes())
    return hasher.hexdigest()
