"""The students' copy of the course, and the warning when a release would hand out answers.

    ./course export-class DIR 00_start_here 01_attention    # first release: a new git repository
    ./course export-class DIR 02_causal_masking             # later: one more commit, the rest kept
    ./course export-class DIR                               # refresh what DIR already holds

The copy is a git repository for the students (to serve through nbgitpuller, Binder or a
course organisation's repository) with the released notebooks of the named assignments, the
course's kernel-side package (widgets and check helper), its environment files and a short
README: no ``solutions/``, no grader (its catalogues can rebuild answers), and so no answer in
its files or its history, except the ones the released notebooks carry on purpose. Those are
in the read-only ``setup_from_<assignment>`` cells of 02-08 (notebook N+1 holds N's reference
functions): a release is safe once the assignments whose answers it carries are past their due
date in the gradebook (``nbgrader db assignment add NAME --duedate=...``). Before it commits,
the command scans what it wrote (files and git objects) and warns, naming each assignment,
when that is not so. ``nbgrader release_assignment`` warns the same way through
``GuardedReleaseAssignment`` (set in ``nbgrader_config.py``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import shutil
import subprocess
import sys
from pathlib import Path

from .answers import answer_lines, files_under, notebook_text, scan

MARKER = ".course-export.json"
# What the students' copy holds besides notebooks/: the package a class student installs (the
# kernel side and the widgets) and what Binder builds it from (environment.yml, postBuild and
# what they read). Paths are the course folder's.
PACKAGE = [
    "course_checks",
    "course_widgets",
    "pyproject.toml",
    "LICENSE",
    "LICENSE-CC-BY-4.0",
    "environment.yml",
    "postBuild",
    "requirements/student.in",
    "requirements/student.txt",
    "tools/torch_source.py",
    "tools/lab-config",
]
SKIP = shutil.ignore_patterns("__pycache__", "*.pyc", ".ipynb_checkpoints", ".progress.json", "*.pt", "*.partial")

README = """# {course_id}: the notebooks

The notebooks of the course, as released to this class so far: {released}.

- On the class's JupyterHub, open them from the link your instructor gives you, or fetch them
  from JupyterLab's Assignments tab.
- On your own machine, with Python 3.11 or newer: `pip install .` in a fresh virtual environment
  (on Linux, add `--extra-index-url https://download.pytorch.org/whl/cpu` for PyTorch's CPU build),
  then `jupyter lab notebooks/`.
- Work in the exercise cells, run the check cell under each, and press Validate before you hand
  a notebook in. The hidden checks and the solutions stay with your instructor.

Licences: the code is MIT (`LICENSE`), the course text CC BY 4.0 (`LICENSE-CC-BY-4.0`).
"""


class ExportError(Exception):
    """Something the instructor must fix first: the message says what."""


def due_dates(course: Path, db_url: str | None = None) -> dict[str, datetime.datetime | None]:
    """{assignment: its due date (UTC, naive as nbgrader keeps it), or None} from the gradebook."""
    if db_url is None:
        gradebook = course / "coursework" / "gradebook.db"
        if not gradebook.is_file():
            return {}
        db_url = f"sqlite:///{gradebook}"
    from nbgrader.api import Gradebook  # here: the command's help needs none of nbgrader

    with Gradebook(db_url) as gradebook:
        return {assignment.name: assignment.duedate for assignment in gradebook.assignments}


def course_answers(course: Path) -> dict[str, set[str]]:
    """The course's answer lines, less what the students' package shows anyway."""
    package = files_under(course / name for name in PACKAGE)
    return answer_lines(course / "solutions", course / "notebooks", package)


def not_yet_due(carried: set[str], dates: dict, now: datetime.datetime) -> list[str]:
    """A line per carried assignment whose answers may not go out yet."""
    lines = []
    for assignment in sorted(carried):
        due = dates.get(assignment)
        if due is None:
            lines.append(f"{assignment} has no due date in the gradebook")
        elif due > now:
            lines.append(f"{assignment} is due {due:%Y-%m-%d %H:%M} UTC")
    return lines


def carried_answers(released: Path, assignment: str, answers: dict[str, set[str]]) -> set[str]:
    """The other assignments whose answer lines the released files of ``assignment`` hold."""
    texts = (
        (str(path), notebook_text(path.read_text(encoding="utf-8", errors="replace")))
        for path in sorted(released.rglob("*"))
        if path.is_file()
    )
    return {found for _, found, _ in scan(texts, answers)} - {assignment}


def warnings_for(course: Path, assignments: list[str], dates: dict, now: datetime.datetime) -> list[str]:
    """One warning per released assignment whose set-up cells carry answers that are not yet due."""
    answers = course_answers(course)
    warnings = []
    for assignment in assignments:
        reasons = not_yet_due(carried_answers(course / "notebooks" / assignment, assignment, answers), dates, now)
        if reasons:
            warnings.append(
                f"{assignment}'s read-only set-up cells hold the reference answers of earlier assignments "
                f"({'; '.join(reasons)}): students who get {assignment} now can read those answers"
            )
    return warnings


def _git(folder: Path, *args: str, capture: bool = True) -> str:
    identity = []
    for key, fallback in (("user.name", "course export-class"), ("user.email", "course@localhost")):
        known = subprocess.run(["git", "-C", str(folder), "config", key], capture_output=True, text=True)
        if known.returncode != 0:
            identity += ["-c", f"{key}={fallback}"]
    result = subprocess.run(["git", *identity, "-C", str(folder), *args], capture_output=capture, text=True)
    if result.returncode != 0:
        raise ExportError(f"git {' '.join(args)} failed in {folder}: {(result.stderr or '').strip()}")
    return result.stdout or ""


def _source_commit(course: Path) -> str:
    result = subprocess.run(["git", "-C", str(course), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return result.stdout.strip() if result.returncode == 0 else "not a git checkout"


def git_objects_text(folder: Path) -> list[tuple[str, str]]:
    """Every blob in the repository's object store (its whole history), as (object id, text)."""
    listing = _git(folder, "cat-file", "--batch-all-objects", "--batch-check=%(objectname) %(objecttype)")
    blobs = [line.split()[0] for line in listing.splitlines() if line.endswith(" blob")]
    batch = subprocess.run(
        ["git", "-C", str(folder), "cat-file", "--batch"], input="\n".join(blobs).encode(), capture_output=True
    ).stdout
    texts, at = [], 0
    for blob in blobs:  # each: "<id> blob <size>\n<content>\n"
        header_end = batch.index(b"\n", at)
        size = int(batch[at:header_end].split()[2])
        content = batch[header_end + 1 : header_end + 1 + size]
        at = header_end + 1 + size + 1
        texts.append((f"git object {blob}", notebook_text(content.decode("utf-8", errors="replace"))))
    return texts


def export(course: Path, target: Path, wanted: list[str], db_url: str | None = None, now=None) -> dict:
    """Write (or update) the students' copy at ``target``; returns what was done and the warnings."""
    now = now or datetime.datetime.now(datetime.UTC).replace(tzinfo=None)
    available = sorted(p.name for p in (course / "notebooks").iterdir() if (p / f"{p.name}.ipynb").is_file())
    unknown = sorted(set(wanted) - set(available))
    if unknown:
        known = ", ".join(available)
        raise ExportError(f"no released notebook for {', '.join(unknown)} in notebooks/ (known: {known})")
    marker = target / MARKER
    if target.exists() and any(target.iterdir()) and not marker.is_file():
        raise ExportError(f"{target} exists and is not a students' copy made by this command: choose a new folder")
    before = json.loads(marker.read_text())["assignments"] if marker.is_file() else []
    assignments = sorted(set(before) | set(wanted))
    if not assignments:
        raise ExportError("name the assignments to release, e.g. 00_start_here 01_attention")
    warnings = warnings_for(course, assignments, due_dates(course, db_url), now)

    target.mkdir(parents=True, exist_ok=True)
    if not (target / ".git").exists():
        _git(target, "init", "--quiet", "--initial-branch=main")
    for name in ["notebooks", *PACKAGE]:  # what this command manages; anything else in the copy is kept
        path = target / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
    for name in PACKAGE:
        source, destination = course / name, target / name
        destination.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, destination, ignore=SKIP)
        else:
            shutil.copy2(source, destination)
    for assignment in assignments:
        shutil.copytree(course / "notebooks" / assignment, target / "notebooks" / assignment, ignore=SKIP)
    readme = README.format(course_id="Attention & Transformers", released=", ".join(assignments))
    (target / "README.md").write_text(readme)
    (target / ".gitignore").write_text(".venv/\n__pycache__/\n.ipynb_checkpoints/\n.progress.json\n*.pt\n")
    source = _source_commit(course)
    marker.write_text(json.dumps({"assignments": assignments, "source": source}, indent=1) + "\n")

    _git(target, "add", "--all")
    changed = bool(_git(target, "status", "--porcelain").strip())
    if changed:
        _git(target, "commit", "--quiet", "-m", f"Release {', '.join(assignments)} (from the course at {source})")
    # the whole history, whatever put it there: answers of assignments not yet due, beyond those named above
    answers = course_answers(course)
    anywhere = {found for _, found, _ in scan(git_objects_text(target), answers)}
    named = set()
    for assignment in assignments:
        named |= carried_answers(course / "notebooks" / assignment, assignment, answers)
    for reason in not_yet_due(anywhere - named, due_dates(course, db_url), now):
        warnings.append(f"the copy's history holds reference answers ({reason})")
    return {
        "assignments": assignments,
        "new": sorted(set(assignments) - set(before)),
        "committed": changed,
        "warnings": warnings,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="./course export-class",
        description="Write the students' copy of the course (a git repository without solutions/ or the grader) "
        "holding the released notebooks of the named assignments; run again to release more.",
    )
    parser.add_argument("folder", type=Path, help="the students' copy (made on the first run)")
    parser.add_argument("assignments", nargs="*", help="assignments to add, e.g. 00_start_here 01_attention")
    parser.add_argument("--db", help="the gradebook with the due dates (default: coursework/gradebook.db)")
    args = parser.parse_args(argv)
    course = Path.cwd()
    if not (course / "nbgrader_config.py").is_file() or not (course / "notebooks").is_dir():
        print(f"export-class: {course} is not a course folder (no nbgrader_config.py or notebooks/)", file=sys.stderr)
        return 2
    try:
        done = export(course, args.folder.resolve(), args.assignments, args.db)
    except ExportError as error:
        print(f"export-class: {error}", file=sys.stderr)
        return 2
    for warning in done["warnings"]:
        print(f"export-class: warning: {warning}", file=sys.stderr)
    what = "committed" if done["committed"] else "unchanged"
    print(
        f"export-class: {args.folder} holds {', '.join(done['assignments'])} ({what}); publish it with "
        f"git -C {args.folder} push (after adding your class repository as a remote)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
