"""Find the submissions to grade: nbgrader's folder layout, or a zip of them.

Two layouts, the ones nbgrader itself knows:

- ``submitted/<student>/<assignment>/<notebook>.ipynb`` (with an optional
  ``timestamp.txt``), as ``nbgrader collect`` leaves them, or a zip of that tree;
- flat, LMS-style file names, as an LMS's bulk download gives them, matched by
  nbgrader's ``FileNameCollectorPlugin`` and its ``named_regexp`` (the
  convention ``nbgrader zip_collect`` uses; configured in ``nbgrader_config.py``),
  in a zip or a folder.

A zip is unpacked safely (no paths outside the target, bounded sizes and
member count) and each member costs only itself: one that is damaged, has a
name the file system refuses or clashes with another is left out with a
message. Its notebooks are filed into the course's ``submitted/`` folder whole
or not at all (a temporary file renamed into place), never replacing a
different file already there unless asked. Student ids are validated whole
before they become folders or gradebook rows. Submitted files are only ever read.

Every file that cannot be used gets a message saying why, and collection goes
on: names that match nothing, unknown assignments, several candidate
notebooks. A notebook under the wrong name is graded when it is the only
notebook of that submission (it gets flagged ``wrong-file-name``). Many files
skipped for one reason make one line (``summarized``): how many, and the first
few names, so a damaged class of 100,000 files stays readable.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import zipfile
import zlib
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from course_checks.files import write_atomically

from ..flags import WRONG_FILE_NAME

MAX_FILE = 200 * 1024 * 1024
MAX_TOTAL = 2 * 1024 * 1024 * 1024
MAX_FILES = 100_000
IGNORED_PARTS = {"__MACOSX", ".ipynb_checkpoints", ".DS_Store"}
STUDENT_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@+-]{0,99}")  # a folder name, never "..", never a path
NAME_BYTES = 255  # the longest file or folder name most file systems take


def shown(name: str) -> str:
    """A submitted name as the grade command prints it: as it is when every character is printable,
    else quoted with its control characters escaped (``'notes\\x1b]0;...'``): an ANSI or OSC
    sequence, a bidirectional override or a newline in a file name never reaches the terminal."""
    return name if name.isprintable() else repr(name)


def printable_line(text: str) -> str:
    """``text`` as one line for a terminal: every character that is not printable (an escape, a bell, a
    bidirectional override, a line break) escaped."""
    return "".join(c if c.isprintable() or c == "\t" else c.encode("unicode_escape").decode("ascii") for c in text)


def printable_lines(text: str) -> str:
    """``text`` for a terminal: line breaks kept, every other character that is not printable
    escaped (``printable_line``). The grade command prints through it."""
    return "\n".join(printable_line(line) for line in text.split("\n"))


def usable_student_id(text: str) -> bool:
    """A student id that can become a folder name and a gradebook row: the whole text matches
    (no trailing newline or control character slips past an end-of-line anchor)."""
    return isinstance(text, str) and STUDENT_ID.fullmatch(text) is not None


@dataclass
class Submission:
    student: str
    assignment: str
    notebook: str
    path: Path | None  # None: nothing submitted for this notebook
    source_name: str
    timestamp: str | None = None
    notes: list = field(default_factory=list)
    flags: list = field(default_factory=list)

    def read(self) -> bytes | None:
        return None if self.path is None else self.path.read_bytes()

    def digest(self) -> str:
        hasher = hashlib.sha256()
        hasher.update((self.source_name + "\0" + (self.timestamp or "") + "\0").encode())
        hasher.update(b"-" if self.path is None else self.path.read_bytes())
        return hasher.hexdigest()


@dataclass
class Collection:
    submissions: list[Submission] = field(default_factory=list)
    messages: list[str] = field(default_factory=list)  # files that could not be used, and why


def _notebooks(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.suffix == ".ipynb" and p.is_file() and not p.name.startswith("."))


def from_tree(root: Path, notebooks: dict[str, list[str]], wanted: set[str] | None) -> Collection:
    """``root/<student>/<assignment>/...``; ``notebooks``: assignment -> its notebook names."""
    found = Collection()
    for student_dir in sorted(p for p in root.iterdir() if p.is_dir() and p.name not in IGNORED_PARTS):
        student = student_dir.name
        if not usable_student_id(student):
            found.messages.append(
                f"{student!r}: skipped, not a usable student id (letters, digits and . _ @ + -, at most 100 characters)"
            )
            continue
        for assignment_dir in sorted(p for p in student_dir.iterdir() if p.is_dir() and p.name not in IGNORED_PARTS):
            assignment = assignment_dir.name
            if assignment not in notebooks:
                found.messages.append(
                    f"{student}/{shown(assignment)}: skipped, no assignment of that name "
                    f"(known: {', '.join(sorted(notebooks))})"
                )
                continue
            if wanted and assignment not in wanted:
                continue
            timestamp = _stamp(assignment_dir)
            present = _notebooks(assignment_dir)
            expected = notebooks[assignment]
            unexpected = [p for p in present if p.stem not in expected]
            for notebook in expected:
                path = assignment_dir / f"{notebook}.ipynb"
                where = f"{student}/{assignment}/{notebook}.ipynb"
                if path.is_file():
                    found.submissions.append(Submission(student, assignment, notebook, path, where, timestamp))
                elif len(expected) == 1 and len(unexpected) == 1:
                    other = unexpected[0]
                    note = (
                        f"{student}/{assignment}: no {notebook}.ipynb; graded {shown(other.name)}, the only "
                        f"notebook submitted, in its place"
                    )
                    found.submissions.append(
                        Submission(
                            student,
                            assignment,
                            notebook,
                            other,
                            f"{student}/{assignment}/{shown(other.name)}",
                            timestamp,
                            notes=[note],
                            flags=[WRONG_FILE_NAME],
                        )
                    )
                    unexpected = []
                else:
                    reason = f"no {notebook}.ipynb was submitted" + (
                        f" (found {', '.join(shown(p.name) for p in unexpected)}; which one is it?)"
                        if unexpected
                        else ""
                    )
                    found.submissions.append(
                        Submission(
                            student,
                            assignment,
                            notebook,
                            None,
                            where,
                            timestamp,
                            notes=[f"{student}/{assignment}: {reason}"],
                        )
                    )
            for other in unexpected:
                found.messages.append(
                    f"{student}/{assignment}/{shown(other.name)}: skipped, not a notebook of {assignment}"
                )
    return found


def _collector(config):
    from nbgrader.plugins import FileNameCollectorPlugin  # here: the grade command starts without it

    return FileNameCollectorPlugin(config=config)


def from_flat(
    files: list[Path],
    notebooks: dict[str, list[str]],
    wanted: set[str] | None,
    config,
    submitted: Path,
    replace: bool,
    plugin=None,
) -> Collection:
    """LMS-style names, filed into ``submitted/<student>/<assignment>/`` (nbgrader's layout); ``plugin``:
    a platform's collector (``lms``) instead of the configured ``FileNameCollectorPlugin``."""
    found = Collection()
    plugin = plugin or _collector(config)
    owner = {nb: a for a, names in notebooks.items() for nb in names}
    if not plugin.named_regexp:
        found.messages.append("flat file names need FileNameCollectorPlugin.named_regexp in nbgrader_config.py")
        return found
    chosen: dict[tuple[str, str], tuple[Path, str | None]] = {}
    for path in files:
        info = plugin.collect(str(path) if getattr(plugin, "whole_path", False) else path.name)
        if not info:
            if path.suffix == ".ipynb":
                found.messages.append(
                    f"{shown(path.name)}: skipped, the name does not say whose notebook it is "
                    f"(expected a name matching {plugin.named_regexp})"
                )
            else:
                found.messages.append(f"{shown(path.name)}: skipped, not a notebook")
            continue
        notebook = Path(info["file_id"]).stem
        if not usable_student_id(info["student_id"]):
            found.messages.append(f"{path.name!r}: skipped, {info['student_id']!r} cannot be a student id")
            continue
        assignment = owner.get(notebook)
        if assignment is None:
            found.messages.append(f"{shown(path.name)}: skipped, {notebook!r} is not a notebook of any assignment")
            continue
        if wanted and assignment not in wanted:
            continue
        key = (info["student_id"], notebook)
        timestamp = valid_timestamp(info.get("timestamp"))
        if key in chosen and (chosen[key][1] or "") >= (timestamp or ""):
            found.messages.append(
                f"{shown(path.name)}: skipped, an equally recent or newer file for "
                f"{info['student_id']}/{shown(notebook)} is in the same collection"
            )
            continue
        chosen[key] = (path, timestamp)
    for (student, notebook), (path, timestamp) in sorted(chosen.items()):
        assignment = owner[notebook]
        folder = submitted / student / assignment
        target = folder / f"{notebook}.ipynb"
        if target.exists() and target.read_bytes() != path.read_bytes() and not replace:
            found.messages.append(
                f"{shown(path.name)}: kept the different {student}/{assignment}/{target.name} "
                "already collected (use --replace to take this one)"
            )
        else:
            if not target.exists() or target.read_bytes() != path.read_bytes():
                write_atomically(target, path)
            if timestamp:
                write_atomically(folder / "timestamp.txt", timestamp + "\n")
        found.submissions.append(
            Submission(
                student,
                assignment,
                notebook,
                target,
                f"{student}/{assignment}/{target.name}",
                timestamp or _stamp(folder),
            )
        )
    return found


def _stamp(folder: Path) -> str | None:
    path = folder / "timestamp.txt"
    return valid_timestamp(path.read_text(errors="replace").strip()) if path.is_file() else None


def valid_timestamp(text: str | None) -> str | None:
    """``text`` if nbgrader can read it as a time, else None (the submission then has no time)."""
    from nbgrader.utils import parse_utc  # here: the grade command starts without it

    if not text:
        return None
    try:
        parse_utc(text)
    except (ValueError, OverflowError):
        return None
    return text


def unzip(archive: Path, target: Path) -> tuple[Path, list[str]]:
    """Extract ``archive`` below ``target`` safely; (folder, messages about entries left out).

    Each member costs only itself: a damaged one (bad CRC, a size that lies, a compression
    error), a name the file system refuses (too long, a file where a folder of the same name is
    needed), a path outside the archive or a size over the caps is left out with a message, and
    the rest is unpacked. Members over ``MAX_FILES`` are left out too. Only an archive that cannot
    be opened at all raises ``ValueError``, with the reason.
    """
    messages = []
    try:
        digest = hashlib.sha256(archive.read_bytes()).hexdigest()[:16]
    except OSError as error:
        raise ValueError(f"{archive.name} cannot be read ({error.strerror or error})") from None
    folder = target / digest
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    total = 0
    try:
        archive_file = zipfile.ZipFile(archive)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, ValueError, EOFError, NotImplementedError) as error:
        raise ValueError(f"{archive.name} is not a readable zip file ({error})") from None
    with archive_file:
        entries = archive_file.infolist()
        if len(entries) > MAX_FILES:
            messages.append(
                f"{archive.name}: holds {len(entries)} members; only the first {MAX_FILES} were "
                "unpacked, the rest were skipped"
            )
            entries = entries[:MAX_FILES]
        for entry in entries:
            named = shown(entry.filename)
            name = PurePosixPath(entry.filename.replace("\\", "/"))
            if entry.is_dir():
                continue
            if name.is_absolute() or ".." in name.parts or not name.parts:
                messages.append(f"{named}: skipped, a path outside the archive")
                continue
            if set(name.parts) & IGNORED_PARTS:
                continue
            if any(len(part.encode("utf-8", "surrogateescape")) > NAME_BYTES for part in name.parts):
                messages.append(f"{named[:80]}...: skipped, a name longer than {NAME_BYTES} bytes")
                continue
            if entry.file_size > MAX_FILE or total + entry.file_size > MAX_TOTAL:
                messages.append(f"{named}: skipped, too large ({entry.file_size} bytes)")
                continue
            total += entry.file_size
            destination = folder.joinpath(*name.parts)
            problem = _extract(archive_file, entry, destination)
            if problem:
                messages.append(f"{named}: skipped, {problem}")
    return folder, messages


def _extract(archive_file: zipfile.ZipFile, entry: zipfile.ZipInfo, destination: Path) -> str | None:
    """One member to ``destination``; None, or why it could not be used (nothing is left behind)."""
    partial = destination.with_name(destination.name[:200] + ".unpacking")
    try:
        destination.parent.mkdir(parents=True, exist_ok=True)
        if destination.is_dir():
            return "a file and a folder of the same name are in the archive"
        if destination.exists():
            return "another member of the archive has the same name"
        with archive_file.open(entry) as source, open(partial, "wb") as sink:
            copied = 0
            while chunk := source.read(1 << 20):
                copied += len(chunk)
                if copied > MAX_FILE:
                    raise OverflowError
                sink.write(chunk)
        os.replace(partial, destination)
        return None
    except OverflowError:
        reason = "larger than it claims"
    except (zipfile.BadZipFile, zlib.error, EOFError) as error:
        reason = f"damaged in the archive ({error})"
    except NotImplementedError as error:
        reason = f"compressed in a way this grader cannot read ({error})"
    except RuntimeError as error:  # an encrypted member
        reason = f"cannot be read ({error})"
    except (FileExistsError, NotADirectoryError, IsADirectoryError):
        reason = "a file and a folder of the same name are in the archive"
    except OSError as error:
        reason = f"cannot be unpacked here ({error.strerror or error})"
    try:
        partial.unlink()
    except OSError:
        pass
    return reason


def _looks_like_tree(folder: Path, notebooks: dict[str, list[str]]) -> Path | None:
    """The folder holding ``<student>/<assignment>/`` below ``folder``, if there is one: the one
    holding the most such pairs (the shallowest of equals), so one oddly named member never
    decides where everyone else's submissions are looked for."""
    candidates = [folder] + sorted(
        p for p in folder.rglob("*") if p.is_dir() and not p.is_symlink() and len(p.relative_to(folder).parts) <= 3
    )
    best, best_count = None, 0
    for candidate in candidates:
        count = sum(
            1
            for student in candidate.iterdir()
            if student.is_dir() and not student.is_symlink()
            for a in notebooks
            if (student / a).is_dir()
        )
        if count > best_count:
            best, best_count = candidate, count
    return best


SKIPPED = ": skipped, "
ONE_BY_ONE = 10  # more items (files, folders, members) than this skipped for one reason make one line
NAMED = 3  # the names that line shows


def summarized(messages: list[str]) -> list[str]:
    """``messages`` with those of items skipped for one reason folded into one line when there are
    more than ``ONE_BY_ONE`` of them: how many, the reason and the first names, where the first stood.
    The reason is what follows "skipped, ", without the details in parentheses (each file's size, its
    archive's error)."""
    reasons: dict[int, str] = {}
    groups: dict[str, list[int]] = defaultdict(list)
    for index, message in enumerate(messages):
        name, found, reason = message.partition(SKIPPED)
        if found and name:
            reasons[index] = re.sub(r"\s*\(.*\)\s*$", "", reason)
            groups[reasons[index]].append(index)
    lines = []
    for index, message in enumerate(messages):
        indexes = groups[reasons[index]] if index in reasons else []
        if len(indexes) <= ONE_BY_ONE:
            lines.append(message)
        elif index == indexes[0]:
            names = ", ".join(messages[i].partition(SKIPPED)[0] for i in indexes[:NAMED])
            lines.append(f"{len(indexes)} skipped, {reasons[index]}: {names}, ... and {len(indexes) - NAMED} more")
    return lines


def collect(
    source: Path,
    notebooks: dict[str, list[str]],
    wanted: set[str] | None,
    config,
    submitted: Path,
    scratch: Path,
    replace: bool = False,
    plugin=None,
) -> Collection:
    """The submissions in ``source`` (a folder or a zip) for the ``wanted`` assignments (None: all);
    ``plugin``: a platform's collector for flat names (``lms``)."""
    source = Path(source)
    if not source.exists():
        raise FileNotFoundError(f"{source} does not exist")
    messages = []
    if source.is_file():
        if source.suffix.lower() != ".zip":
            raise ValueError(f"{source} is neither a folder nor a .zip file")
        source, messages = unzip(source, scratch)
        tree = None if plugin else _looks_like_tree(source, notebooks)
        if tree is not None:
            found = from_tree(tree, notebooks, wanted)
            found = _file_tree(found, submitted, replace)
            found.messages = summarized(messages + found.messages)
            return found
    else:
        tree = None if plugin else _looks_like_tree(source, notebooks)
        if tree is not None:
            found = from_tree(tree, notebooks, wanted)
            found.messages = summarized(messages + found.messages)
            return found
    files = sorted(p for p in source.rglob("*") if p.is_file() and not set(p.relative_to(source).parts) & IGNORED_PARTS)
    found = from_flat(files, notebooks, wanted, config, submitted, replace, plugin)
    found.messages = summarized(messages + found.messages)
    return found


def _file_tree(found: Collection, submitted: Path, replace: bool) -> Collection:
    """Copy a zip's ``<student>/<assignment>/`` tree into the course's submitted folder."""
    filed = Collection(messages=found.messages)
    for submission in found.submissions:
        if submission.path is None:
            filed.submissions.append(submission)
            continue
        folder = submitted / submission.student / submission.assignment
        target = folder / submission.path.name
        if target.exists() and target.read_bytes() != submission.path.read_bytes() and not replace:
            filed.messages.append(
                f"{submission.source_name}: kept the different copy already in submitted/ "
                "(use --replace to take the zip's)"
            )
        else:
            write_atomically(target, submission.path)
            stamp = submission.path.parent / "timestamp.txt"
            if stamp.is_file():
                write_atomically(folder / "timestamp.txt", stamp)
        submission.path = target
        filed.submissions.append(submission)
    return filed
