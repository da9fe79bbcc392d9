"""``./course grade``'s intake, outputs and concurrent runs: every broken input costs only itself.

One test per class of failure, through the real command (real zips, the real
bwrap sandbox, a real SQLite gradebook): damaged zip members, unusable student
ids, a run killed while it files a notebook, two runs at once and the scratch
folders of killed runs, crafted grading metadata, outputs that cannot be
written, a removed ``timestamp.txt``. Then a seeded fuzz test: a few hundred
random mutations of a valid class zip (through the command's collection step)
and of a valid notebook (through the step that reads, restores and sanitizes
it before it runs), and one real run of a class with mutated submissions.
"""

from __future__ import annotations

import csv
import json
import os
import random
import shutil
import signal
import sqlite3
import struct
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import nbformat
import pytest
from grading_harness import Course, grade, sandbox_works

ASSIGNMENT = "01_attention"
NOTEBOOK = f"{ASSIGNMENT}.ipynb"
LIMITS = ("--cell-timeout", "10", "--notebook-timeout", "120")

pytestmark = pytest.mark.skipif(not sandbox_works(), reason="bubblewrap cannot start a sandbox here")


# ---------------------------------------------------------------- helpers


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    """A course copy with 01_attention released and registered, no submissions (made once)."""
    return Course.create(tmp_path_factory.mktemp("intake") / "course", [ASSIGNMENT]).root


@pytest.fixture
def course(template, tmp_path) -> Course:
    shutil.copytree(template, tmp_path / "course")
    return Course(tmp_path / "course")


@pytest.fixture(scope="module")
def reference_bytes(template) -> bytes:
    """The released notebook with every reference answer filled in: full points."""
    course = Course(template)
    path = course.submit("_reference", ASSIGNMENT)
    data = path.read_bytes()
    shutil.rmtree(template / "coursework" / "submitted")
    return data


def run(course: Course, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    result = grade(course.root, *LIMITS, *args, env=env)
    for stream in (result.stdout, result.stderr):
        assert "Traceback" not in stream, stream[-3000:]
    return result


def output(result: subprocess.CompletedProcess) -> str:
    return result.stdout + result.stderr


def full_marks(course: Course) -> float:
    return sum(course.max_scores(ASSIGNMENT).values())


def total(course: Course, student: str) -> float:
    return sum(course.scores(student, ASSIGNMENT).values())


def gradebook_students(course: Course) -> set[str]:
    db = sqlite3.connect(course.root / "coursework" / "gradebook.db")
    try:
        return {row[0] for row in db.execute("SELECT id FROM student")}
    finally:
        db.close()


def ledger_flags(course: Course) -> dict:
    db = sqlite3.connect(course.root / "coursework" / ".work" / "grading.sqlite")
    try:
        return {s: json.loads(x)["flags"] for s, x in db.execute("SELECT student, summary FROM graded")}
    finally:
        db.close()


def member(student: str) -> str:
    return f"submitted/{student}/{ASSIGNMENT}/{NOTEBOOK}"


def flip_data_byte(archive: bytes, name: str) -> bytes:
    """``archive`` with one byte of ``name``'s stored data changed (its CRC no longer matches)."""
    with zipfile.ZipFile(_io(archive)) as zf:
        info = zf.getinfo(name)
    name_length, extra_length = struct.unpack("<HH", archive[info.header_offset + 26 : info.header_offset + 30])
    at = info.header_offset + 30 + name_length + extra_length + info.compress_size // 2
    return archive[:at] + bytes([archive[at] ^ 0x20]) + archive[at + 1 :]


def lie_about_size(archive: bytes, name: str, extra: int) -> bytes:
    """``archive`` whose central directory says ``name`` is ``extra`` bytes longer than it is."""
    encoded = name.encode()
    at = 0
    while True:
        at = archive.index(b"PK\x01\x02", at)
        length = struct.unpack("<H", archive[at + 28 : at + 30])[0]
        if archive[at + 46 : at + 46 + length] == encoded:
            break
        at += 4
    compressed, size = struct.unpack("<II", archive[at + 20 : at + 28])
    return archive[: at + 20] + struct.pack("<II", compressed + extra, size + extra) + archive[at + 28 :]


def _io(data: bytes):
    import io

    return io.BytesIO(data)


def zip_bytes(members: list[tuple[str, bytes]], compression=zipfile.ZIP_STORED) -> bytes:
    buffer = _io(b"")
    with zipfile.ZipFile(buffer, "w", compression) as zf:
        for name, data in members:
            zf.writestr(name, data)
    return buffer.getvalue()


# ---------------------------------------------------------------- one test per class of failure

FORGED = ("extra", "answer", "points")
MUTANTS = 4


def forged_notebooks(course: Course, reference_bytes: bytes) -> dict[str, bytes]:
    """Correct answers, with grading metadata edited to claim points: an extra grade cell,
    ``grade: true`` on an answer cell, impossible points on two check cells."""
    released = course.released(ASSIGNMENT)
    tests = [c.metadata["nbgrader"]["grade_id"] for c in released.cells if c.metadata.get("nbgrader", {}).get("grade")]
    answer = next(
        c.metadata["nbgrader"]["grade_id"]
        for c in released.cells
        if c.metadata.get("nbgrader", {}).get("solution") and not c.metadata["nbgrader"].get("grade")
    )

    def edited(edit) -> bytes:
        notebook = nbformat.reads(reference_bytes.decode(), as_version=4)
        edit(notebook)
        return nbformat.writes(notebook).encode()

    def extra_cell(nb):
        cell = nbformat.v4.new_code_cell("assert True")
        cell.metadata["nbgrader"] = {
            "grade": True,
            "solution": False,
            "locked": True,
            "points": 1000,
            "grade_id": "bonus_points",
            "schema_version": 3,
        }
        nb.cells.append(cell)

    def graded_answer(nb):
        for cell in nb.cells:
            if cell.metadata.get("nbgrader", {}).get("grade_id") == answer:
                cell.metadata["nbgrader"].update(grade=True, points=50)

    def absurd_points(nb):
        for cell in nb.cells:
            if cell.metadata.get("nbgrader", {}).get("grade_id") == tests[0]:
                cell.metadata["nbgrader"]["points"] = "lots"
            if cell.metadata.get("nbgrader", {}).get("grade_id") == tests[1]:
                cell.metadata["nbgrader"]["points"] = -1e300

    return {"extra": edited(extra_cell), "answer": edited(graded_answer), "points": edited(absurd_points)}


@pytest.fixture(scope="module")
def graded_class(template, reference_bytes, tmp_path_factory):
    """One real run of a class zip holding every kind of broken input next to intact submissions:
    damaged members (bad CRC, a size that lies, a file and a folder of one name, a name too long,
    more members than the limit), unusable student ids, forged grading metadata, and notebooks
    mutated at random (seeded). (course, the command's result, the mutation kinds)."""
    from autograder.engine.collect import MAX_FILES

    folder = tmp_path_factory.mktemp("graded-class")
    shutil.copytree(template, folder / "course")
    course = Course(folder / "course")
    members = [
        (member("alice"), reference_bytes),
        (f"submitted/alice/{ASSIGNMENT}/timestamp.txt", b"2026-03-01 10:00:00"),
        (member("bob"), reference_bytes),
        (member("carol"), reference_bytes),
        (f"submitted/dave/{ASSIGNMENT}", b"a file where a folder should be"),
        (member("dave"), reference_bytes),
        (f"submitted/alice/{ASSIGNMENT}/" + "n" * 300 + ".txt", b"x"),
        (member("eve\n"), reference_bytes),
        (member("mallory\x07"), reference_bytes),
        (member("zoe"), reference_bytes),
    ]
    members += [(member(student), data) for student, data in forged_notebooks(course, reference_bytes).items()]
    rng = random.Random(SEED + 1)
    kinds = []
    while len(kinds) < MUTANTS:
        data, kind = mutate_notebook(rng, reference_bytes)
        if kind not in kinds and kind != "deep":
            kinds.append(kind)
            members.append((member(f"mutant{len(kinds)}"), data))
    archive = flip_data_byte(zip_bytes(members), member("bob"))
    archive = lie_about_size(archive, member("carol"), 4096)
    buffer = _io(archive)
    with zipfile.ZipFile(buffer, "a") as zf:  # more members than the limit: folder entries, cheap
        for index in range(MAX_FILES - len(members) + 5):
            zf.writestr(zipfile.ZipInfo(f"padding/{index}/"), b"")
    path = folder / "class.zip"
    path.write_bytes(buffer.getvalue())
    return course, run(course, "--from", str(path)), kinds


def test_damaged_zip_members_cost_only_themselves(graded_class):
    """Each damaged member or unusable id: one line naming it and why; everyone else graded; exit 1."""
    from autograder.engine.collect import MAX_FILES

    course, result, _ = graded_class
    text = output(result)
    assert result.returncode == 1, text[-3000:]
    assert f"{member('bob')}: skipped, damaged in the archive (Bad CRC-32" in text, text[-3000:]
    assert f"{member('carol')}: skipped, damaged in the archive" in text
    assert f"{member('dave')}: skipped, a file and a folder of the same name are in the archive" in text
    assert "skipped, a name longer than 255 bytes" in text
    assert f"only the first {MAX_FILES} were unpacked, the rest were skipped" in text
    assert "'eve\\n': skipped, not a usable student id" in text
    assert "'mallory\\x07': skipped, not a usable student id" in text
    assert total(course, "alice") == total(course, "zoe") == full_marks(course)
    students = gradebook_students(course)
    assert all(s.isprintable() for s in students) and {"alice", "zoe"} <= students
    assert all(p.name.isprintable() for p in (course.root / "coursework" / "submitted").iterdir())
    with open(course.root / "coursework" / "reports" / "grades.csv", newline="") as stream:
        assert all(row["student"].isprintable() for row in csv.DictReader(stream))
    # bob's and carol's notebooks were damaged: graded as missing, nothing half-read
    assert total(course, "bob") == total(course, "carol") == 0


def test_forged_grading_metadata_is_ignored_and_flagged(graded_class):
    """The legitimate cells are graded (full points for correct answers) and the submission is
    flagged with the reason; nothing is "damaged beyond repair"."""
    from nbgrader.api import Gradebook

    course, result, _ = graded_class
    flags = ledger_flags(course)
    for student in FORGED:
        assert total(course, student) == full_marks(course), (student, course.scores(student, ASSIGNMENT))
        assert "grading-metadata-forged" in flags[student], flags[student]
    assert "grading-metadata-forged" not in flags["zoe"]
    with Gradebook(course.db_url) as gradebook:
        for student in FORGED:
            assert gradebook.find_submission_notebook(ASSIGNMENT, ASSIGNMENT, student).flagged
        assert gradebook.find_submission(ASSIGNMENT, "extra").max_score == full_marks(course)
    db = sqlite3.connect(course.root / "coursework" / ".work" / "grading.sqlite")
    messages = {s: json.loads(x)["messages"] for s, x in db.execute("SELECT student, summary FROM graded")}
    db.close()
    assert any("'bonus_points' the assignment does not have (ignored for scoring)" in m for m in messages["extra"])
    assert any("impossible points 'lots'" in m for m in messages["points"])
    assert not any("beyond repair" in m for student in FORGED for m in messages[student])
    assert "grading-metadata-forged" in result.stdout


def test_fuzz_a_mutated_class_graded_for_real_leaves_the_others_untouched(graded_class):
    """Randomly mutated notebooks in the same real run: each graded or rejected by name, with a
    gradebook row; the intact students keep full marks."""
    course, _, kinds = graded_class
    assert {f"mutant{i}" for i in range(1, MUTANTS + 1)} <= gradebook_students(course), kinds
    for student in ("alice", "zoe"):
        assert total(course, student) == full_marks(course)
    print(f"\nmutations graded for real: {kinds}")


def test_the_gradebooks_time_follows_the_files(graded_class):
    """Removing a ``timestamp.txt`` regrades the notebook and clears its time in the gradebook."""
    from nbgrader.api import Gradebook

    course, _, _ = graded_class
    with Gradebook(course.db_url) as gradebook:
        assert gradebook.find_submission(ASSIGNMENT, "alice").timestamp is not None
    (course.root / "coursework" / "submitted" / "alice" / ASSIGNMENT / "timestamp.txt").unlink()
    again = run(course, ASSIGNMENT)
    assert "Graded 1 notebook(s)" in again.stdout, output(again)[-3000:]
    with Gradebook(course.db_url) as gradebook:
        assert gradebook.find_submission(ASSIGNMENT, "alice").timestamp is None
    assert total(course, "alice") == full_marks(course)


def test_a_class_of_many_broken_items_prints_a_few_lines(course, reference_bytes, tmp_path):
    """A zip over the member limit whose members fail by the hundred for one reason (folders of no
    assignment, names too long): the command's whole output, progress and notes included, is a few
    lines, one per reason with how many and the first names; the good submission is graded."""
    from autograder.engine.collect import MAX_FILES

    members = [(member("alice"), reference_bytes)]
    members += [(f"submitted/stray{index}/not-an-assignment/notes.txt", b"x") for index in range(300)]
    members += [(f"submitted/alice/{ASSIGNMENT}/{index:03d}" + "n" * 300 + ".txt", b"x") for index in range(40)]
    buffer = _io(zip_bytes(members))
    with zipfile.ZipFile(buffer, "a") as zf:  # over the limit: folder entries, cheap
        for index in range(MAX_FILES - len(members) + 5):
            zf.writestr(zipfile.ZipInfo(f"padding/{index}/"), b"")
    archive = tmp_path / "class.zip"
    archive.write_bytes(buffer.getvalue())
    command = [sys.executable, "-m", "autograder.grade", *LIMITS, "--from", str(archive)]  # not --quiet
    result = subprocess.run(command, cwd=course.root, capture_output=True, text=True, timeout=1500)
    text = output(result)
    assert result.returncode == 1, text[-3000:]
    shown = text.replace("\r", "\n").splitlines()
    lines = [line for line in shown if line.strip() and "%|" not in line]  # the progress bar aside
    assert len(lines) < 40, "\n".join(lines[:60])
    assert f"only the first {MAX_FILES} were unpacked" in text
    assert "300 skipped, no assignment of that name: stray0/not-an-assignment, stray1/not-an-assignment," in text
    assert "... and 297 more" in text
    assert "40 skipped, a name longer than 255 bytes:" in text
    assert total(course, "alice") == full_marks(course)


def test_summaries_fold_any_number_of_messages():
    """A hundred thousand files skipped for one reason make one line; a few stay one line each; other
    messages keep their place."""
    from autograder.engine.collect import summarized

    messages = ["class.zip: holds 100019 members; only the first 100000 were unpacked, the rest were skipped"]
    messages += [f"note{index}.txt: skipped, not a notebook" for index in range(100_000)]
    messages += [f"big{index}.ipynb: skipped, too large ({index} bytes)" for index in range(3)]
    messages += ["alice/01_attention: kept the different copy already in submitted/ (use --replace to take the zip's)"]
    shown = summarized(messages)
    assert shown == [
        messages[0],
        "100000 skipped, not a notebook: note0.txt, note1.txt, note2.txt, ... and 99997 more",
        *messages[-4:],
    ]


def test_unwritable_outputs_are_refused_before_anything_is_read_or_written(course, reference_bytes, tmp_path):
    archive = tmp_path / "class.zip"
    archive.write_bytes(zip_bytes([(member("alice"), reference_bytes)]))
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    a_folder = tmp_path / "a-folder"
    a_folder.mkdir()
    result = run(
        course,
        "--from",
        str(archive),
        "--csv",
        str(blocker / "grades.csv"),
        "--report",
        str(a_folder),
        "--db",
        f"sqlite:///{blocker}/gradebook.db",
    )
    text = output(result)
    assert result.returncode == 2, text
    assert f"--csv: {blocker} is not a folder" in text
    assert f"--report: {a_folder} is a folder, not a file" in text
    assert f"gradebook (--db): {blocker} is not a folder" in text
    assert "Nothing was graded or written." in text
    coursework = course.root / "coursework"
    assert sorted(p.name for p in coursework.iterdir()) == ["gradebook.db"]  # as it was: nothing filed
    # one bad output alone is enough, and the old report stays beside no new CSV
    reports = coursework / "reports"
    reports.mkdir()
    (reports / "class-report.html").write_text("the last run's report")
    alone = run(course, "--from", str(archive), "--csv", str(blocker / "grades.csv"))
    assert alone.returncode == 2 and f"--csv: {blocker} is not a folder" in output(alone)
    assert sorted(p.name for p in reports.iterdir()) == ["class-report.html"]
    assert not (coursework / "submitted").exists()


def dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_one_run_at_a_time_and_killed_runs_leave_no_scratch(course, reference_bytes):
    """A second run refuses, naming the first; ``--wait`` waits for it; leftovers of killed runs go, and
    the runs leave nothing of theirs in the temporary folder (their scratch; their pools' fork server's
    folder, which the interpreter's exit handlers remove before the command ends)."""
    path = course.submission_path("alice", ASSIGNMENT)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(reference_bytes)
    gone = dead_pid()
    temporary = course.root.parent / "tmp"
    temporary.mkdir()
    env = {**os.environ, "TMPDIR": str(temporary)}
    stale_tmp = temporary / f"ag-run-{gone}-leftover"
    (stale_tmp / "inner").mkdir(parents=True)
    stale_incoming = course.root / "coursework" / ".work" / "incoming" / str(gone)
    stale_incoming.mkdir(parents=True)
    (stale_incoming / "half-unpacked.ipynb").write_text("{")

    command = [sys.executable, "-m", "autograder.grade", "--quiet", *LIMITS]
    first = subprocess.Popen(
        command, cwd=course.root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    lock = course.root / "coursework" / ".work" / "run.lock"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and f'"pid": {first.pid}' not in (lock.read_text() if lock.exists() else ""):
        time.sleep(0.05)
    waiting = subprocess.Popen(
        command + ["--wait", "900"], cwd=course.root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    refused = run(course, env=env)
    assert refused.returncode == 2, output(refused)
    assert f"another grading run is working on this course (process {first.pid} on" in refused.stderr
    out, err = first.communicate(timeout=900)
    assert first.returncode == 0 and "Traceback" not in err, err[-3000:]
    out2, err2 = waiting.communicate(timeout=900)
    assert waiting.returncode == 0 and "Traceback" not in err2, err2[-3000:]
    assert "Graded 0 notebook(s)" in out2 and "1 unchanged" in out2
    assert total(course, "alice") == full_marks(course)
    assert not stale_tmp.exists() and not stale_incoming.exists()
    assert "Graded 1 notebook(s)" in out and out.rstrip().endswith("/<student>/<assignment>/"), out[-3000:]
    # all that stays is the machine's folder of worker slots (``claim_slot``: locks every grading process shares)
    assert [path.name for path in temporary.iterdir()] == [f"autograder-slots-{os.getuid()}"]


def test_a_refused_run_leaves_no_sandbox_host_and_no_scratch(course, tmp_path):
    """As root, the command launches its sandbox host first thing, before it reads the course: a run
    refused after that (here: its report cannot be written) stops the host and removes its folder."""
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    env = {**os.environ, "TMPDIR": str(temporary)}
    (course.root / "coursework" / "submitted").mkdir(parents=True, exist_ok=True)
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    refused = run(course, "--report", str(blocker / "report.html"), env=env)
    assert refused.returncode == 2 and "cannot write where this run must write" in refused.stderr, output(refused)
    assert not list(temporary.glob("ag-run-*"))
    left = []
    for entry in Path("/proc").iterdir():
        try:
            if str(temporary).encode() in (entry / "cmdline").read_bytes():
                left.append(entry.name)
        except OSError:
            continue
    assert not left, f"processes of the refused run still running: {left}"


def test_killed_while_filing_then_rerun_gives_the_clean_grades(course, reference_bytes, tmp_path):
    """``kill -9`` while the zip's notebooks are filed: never a partial file under its final name;
    the next run files and grades everything as one clean run would."""
    notebook = json.loads(reference_bytes)
    padding = next(c for c in notebook["cells"] if c["cell_type"] == "code")
    padding["outputs"] = [{"output_type": "stream", "name": "stdout", "text": "x" * (16 << 20)}]
    big = json.dumps(notebook).encode()
    students = ["alice", "bob"]
    archive = tmp_path / "download.zip"
    archive.write_bytes(zip_bytes([(f"{s}_{ASSIGNMENT}.ipynb", big) for s in students], zipfile.ZIP_DEFLATED))
    submitted = course.root / "coursework" / "submitted"
    command = [sys.executable, "-m", "autograder.grade", "--quiet", *LIMITS, "--from", str(archive)]
    process = subprocess.Popen(command, cwd=course.root, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and process.poll() is None:
        if submitted.is_dir() and any(p.name.endswith(".partial") for p in submitted.rglob("*")):
            break
        time.sleep(0.002)
    process.send_signal(signal.SIGKILL)
    process.wait()
    for path in submitted.rglob(NOTEBOOK) if submitted.is_dir() else []:
        assert path.read_bytes() == big, f"{path} is not the whole notebook"
    result = run(course, "--from", str(archive))
    text = output(result)
    assert result.returncode == 0, text[-3000:]
    assert "kept the different" not in text and "not valid JSON" not in text
    assert not any(p.name.endswith(".partial") for p in submitted.rglob("*"))
    for student in students:
        assert (submitted / student / ASSIGNMENT / NOTEBOOK).read_bytes() == big
        assert total(course, student) == full_marks(course)


# ---------------------------------------------------------------- the seeded fuzz test

ODD_NAMES = [
    "",
    " ",
    "..",
    "a/../../b",
    "/abs",
    "x" * 300,
    "naïve ünïcödé",
    "tab\there",
    "new\nline",
    "semi;colon$(rm -rf)",
    "back\\slash",
    "CON",
    ".hidden",
    "__MACOSX",
    "nul\x00byte",
]
STUDENTS = ["alice", "bob", "carol", "dmitri"]


def class_members(reference_bytes: bytes) -> list[tuple[str, bytes]]:
    members = []
    for index, student in enumerate(STUDENTS):
        members.append((member(student), reference_bytes))
        members.append((f"submitted/{student}/{ASSIGNMENT}/timestamp.txt", f"2026-03-0{index + 1} 10:00:00".encode()))
    return members


def mutate_zip(rng: random.Random, members: list[tuple[str, bytes]], reference_bytes: bytes):
    """(archive bytes, the students the mutation may touch: None when it may touch any)."""
    kind = rng.choice(["truncate", "flip", "rename", "duplicate", "odd-name", "conflict", "metadata", "drop"])
    members = list(members)
    target = rng.randrange(len(members))
    student = members[target][0].split("/")[1]
    if kind in ("truncate", "flip"):
        data = zip_bytes(members, rng.choice([zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED]))
        if kind == "truncate":
            return data[: rng.randrange(len(data))], None
        spots = [rng.randrange(len(data)) for _ in range(rng.randint(1, 3))]
        touched = _owners(data, spots)
        flipped = bytearray(data)
        for at in spots:
            flipped[at] ^= 1 << rng.randrange(8)
        return bytes(flipped), touched
    if kind == "rename":
        name, data = members[target]
        members[target] = (name.replace(student, rng.choice(["Alice", "alice ", "al!ce", "al/ice"]), 1), data)
    elif kind == "duplicate":
        name, _ = members[target]
        members.insert(rng.randrange(len(members) + 1), (name, rng.randbytes(rng.randrange(1, 200))))
    elif kind == "odd-name":
        name, data = members[target]
        parts = name.split("/")
        parts[rng.randrange(len(parts))] = rng.choice(ODD_NAMES)
        members[target] = ("/".join(parts), data)
    elif kind == "conflict":
        name, _ = members[target]
        members.insert(rng.randrange(len(members) + 1), (name.rsplit("/", 1)[0], b"file where a folder is"))
    elif kind == "metadata":
        name, _ = members[target]
        members[target] = (name, mutate_notebook(rng, reference_bytes)[0])
    elif kind == "drop":
        del members[target]
    return zip_bytes(members), {student}


def _owners(data: bytes, spots: list[int]) -> set[str] | None:
    """The students whose local entries (header and data) hold one of ``spots``; None when one
    lies in the central directory, which every member's reading depends on."""
    with zipfile.ZipFile(_io(data)) as zf:
        starts = sorted((info.header_offset, info.filename.split("/")[1]) for info in zf.infolist())
        directory = zf.start_dir
    touched = set()
    for spot in spots:
        if spot >= directory:
            return None
        touched.add(max(entry for entry in starts if entry[0] <= spot)[1])
    return touched


def mutate_notebook(rng: random.Random, data: bytes) -> tuple[bytes, str]:
    kind = rng.choice(
        [
            "truncate",
            "flip",
            "points",
            "grade-flag",
            "extra-cell",
            "meta-type",
            "duplicate",
            "delete-cell",
            "cell-type",
            "deep",
            "no-metadata",
            "ids",
        ]
    )
    if kind == "truncate":
        return data[: rng.randrange(len(data))], kind
    if kind == "flip":
        out = bytearray(data)
        for _ in range(rng.randint(1, 5)):
            at = rng.randrange(len(out))
            out[at] = rng.randrange(256)
        return bytes(out), kind
    if kind == "deep":
        return b'{"nbformat": 4, "cells": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", kind
    nb = json.loads(data)
    cells = nb["cells"]
    graded = [c for c in cells if c.get("metadata", {}).get("nbgrader")]
    cell = rng.choice(graded)
    meta = cell["metadata"]["nbgrader"]
    if kind == "points":
        meta["points"] = rng.choice(
            [-1, "lots", None, [], {"a": 1}, 1e308, float("inf"), float("nan"), True, 10**400, 0]
        )
    elif kind == "grade-flag":
        meta[rng.choice(["grade", "solution", "locked", "task"])] = rng.choice([True, False, "yes", 1, None])
    elif kind == "extra-cell":
        cells.insert(
            rng.randrange(len(cells) + 1),
            {
                "cell_type": rng.choice(["code", "markdown"]),
                "metadata": {
                    "nbgrader": {
                        "grade": True,
                        "solution": rng.choice([True, False]),
                        "locked": rng.choice([True, False]),
                        "points": rng.choice([5, 1000, -3, "x"]),
                        "grade_id": rng.choice(["bonus", "", None, 7]),
                        "schema_version": 3,
                    }
                },
                "source": "assert True",
                "outputs": [],
                "execution_count": None,
            },
        )
    elif kind == "meta-type":
        cell["metadata"]["nbgrader"] = rng.choice([[], "grade", 42, None])
    elif kind == "duplicate":
        cells.insert(rng.randrange(len(cells) + 1), json.loads(json.dumps(cell)))
    elif kind == "delete-cell":
        cells.remove(cell)
    elif kind == "cell-type":
        cell["cell_type"] = rng.choice(["markdown", "raw", "code", "nonsense"])
    elif kind == "no-metadata":
        del cell["metadata"]
    elif kind == "ids":
        meta["grade_id"] = rng.choice(["", None, 3, "x" * 5000, "../../etc", meta.get("grade_id", "") + "\n"])
    return json.dumps(nb, allow_nan=True).encode(), kind


SEED = 14
ZIP_MUTATIONS = 200
NOTEBOOK_MUTATIONS = 200


def test_fuzz_class_zips_never_crash_the_intake_or_move_a_grade(template, reference_bytes, tmp_path):
    """Seeded random mutations of a valid class zip through the command's collection: either the
    whole archive is named unreadable, or every student the mutation did not touch is filed
    byte for byte as in the valid zip, with the same time."""
    from autograder.engine.collect import collect
    from autograder.engine.course import CourseFolder

    course = CourseFolder(template)
    notebooks = course.notebooks()
    members = class_members(reference_bytes)
    rng = random.Random(SEED)
    outcomes = {"unreadable archive": 0, "collected": 0, "with messages": 0}
    for index in range(ZIP_MUTATIONS):
        archive, touched = mutate_zip(rng, members, reference_bytes)
        folder = tmp_path / str(index)
        folder.mkdir()
        path = folder / "class.zip"
        path.write_bytes(archive)
        try:
            found = collect(path, notebooks, None, course.config, folder / "submitted", folder / "scratch")
        except ValueError as error:
            assert "zip" in str(error), error
            assert touched is None, f"mutation {index}: the whole archive refused for a member's damage"
            outcomes["unreadable archive"] += 1
            continue
        outcomes["collected"] += 1
        outcomes["with messages"] += bool(found.messages)
        by_student = {s.student: s for s in found.submissions}
        for position, student in enumerate(STUDENTS):
            if touched is None or student in touched:
                continue
            submission = by_student.get(student)
            assert submission is not None and submission.path is not None, (index, student, found.messages)
            assert submission.path.read_bytes() == reference_bytes, (index, student)
            assert submission.timestamp == f"2026-03-0{position + 1} 10:00:00", (index, student)
        for student in by_student:
            assert student.isprintable() and "/" not in student and student not in ("", ".", "..")
        shutil.rmtree(folder)
    print(f"\n{ZIP_MUTATIONS} zip mutations (seed {SEED}): {outcomes}")
    assert outcomes["collected"] > ZIP_MUTATIONS // 2


def _spec(template: Path):
    from autograder.engine.course import CourseFolder
    from autograder.sandboxing.bubblewrap import Limits

    return CourseFolder(template).spec(ASSIGNMENT, ASSIGNMENT, Limits())


def test_fuzz_notebooks_are_rejected_or_graded_for_the_instructors_points(template, reference_bytes):
    """Seeded random mutations of a valid notebook through the pipeline's steps before it runs (read,
    restore, inspect, sanitize): a clear rejection, or a notebook whose graded cells are exactly the
    assignment's, with the assignment's points."""
    from autograder.records import Job, Rejected, Result
    from autograder.worker.pipeline import STEPS, Grading, execute

    spec = _spec(template)
    points = {c.name: c.max_score for c in spec.view.notebook.grade_cells}
    rng = random.Random(SEED)
    outcomes: dict[str, list[int]] = {}
    for index in range(NOTEBOOK_MUTATIONS):
        data, kind = mutate_notebook(rng, reference_bytes)
        job = Job("fuzz", ASSIGNMENT, ASSIGNMENT, data, "fuzz/01_attention.ipynb", "d", spec, None)
        result = Result("fuzz", ASSIGNMENT, ASSIGNMENT, "d", spec.fingerprint, True, "")
        resources = {"nbgrader": {"student": "fuzz", "assignment": ASSIGNMENT, "notebook": ASSIGNMENT, "db_url": None}}
        grading = Grading(job, None, {}, result, 0.0, resources=resources)
        try:
            for step in STEPS[: STEPS.index(execute)]:  # everything before student code runs
                step(grading)
            nb = grading.nb
        except Rejected as rejection:
            assert "fuzz/01_attention.ipynb" in str(rejection) or "01_attention" in str(rejection)
            outcomes.setdefault(kind, [0, 0])[1] += 1
            continue
        outcomes.setdefault(kind, [0, 0])[0] += 1
        claimed = {}
        for cell in nb.cells:
            meta = cell.metadata.get("nbgrader", {})
            if meta.get("grade"):
                claimed[meta["grade_id"]] = float(meta["points"])
        assert claimed == points, (index, kind, result.messages)
    print(f"\n{NOTEBOOK_MUTATIONS} notebook mutations (seed {SEED}), kind: [graded, rejected]: {outcomes}")
