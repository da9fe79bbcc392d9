"""Collecting submissions from a zip (autograder/engine/collect.py): names, layouts, replacing."""

import zipfile

import nbformat
from traitlets.config import Config

from autograder.engine.collect import collect
from autograder.engine.course import CourseFolder
from autograder.reference import REPOSITORY

NOTEBOOKS = {"00_start_here": ["00_start_here"], "01_attention": ["01_attention"]}


def notebook_bytes() -> bytes:
    return nbformat.writes(nbformat.v4.new_notebook()).encode()


def collector_config():
    return CourseFolder(REPOSITORY).config if (REPOSITORY / "nbgrader_config.py").is_file() else Config()


def test_a_zip_of_lms_style_names_is_filed_with_a_message_per_unusable_file(tmp_path):
    archive = tmp_path / "download.zip"
    with zipfile.ZipFile(archive, "w") as out:
        out.writestr("alice_01_attention.ipynb", notebook_bytes())
        out.writestr("bob_smith_attempt_2026-03-01-10-00-00_00_start_here.ipynb", notebook_bytes())
        out.writestr("carol_01_attention (1).ipynb", notebook_bytes())
        out.writestr("random notes.txt", b"hello")
        out.writestr("nobody.ipynb", notebook_bytes())
        out.writestr("dan_99_unknown.ipynb", notebook_bytes())
        out.writestr("../../escape_01_attention.ipynb", notebook_bytes())
        out.writestr("__MACOSX/._alice_01_attention.ipynb", b"junk")
    submitted = tmp_path / "submitted"
    found = collect(archive, NOTEBOOKS, None, collector_config(), submitted, tmp_path / "scratch")
    got = {(s.student, s.assignment) for s in found.submissions}
    assert got == {("alice", "01_attention"), ("bob_smith", "00_start_here"), ("carol", "01_attention")}
    assert (submitted / "alice" / "01_attention" / "01_attention.ipynb").is_file()
    assert (submitted / "bob_smith" / "00_start_here" / "timestamp.txt").read_text().strip() == "2026-03-01-10-00-00"
    text = "\n".join(found.messages)
    for name in ("random notes.txt", "nobody.ipynb", "dan_99_unknown.ipynb", "../../escape_01_attention.ipynb"):
        assert name in text, name
    assert not (tmp_path.parent / "escape_01_attention.ipynb").exists()


def test_a_zip_of_the_nbgrader_layout_and_a_wrongly_named_notebook(tmp_path):
    archive = tmp_path / "class.zip"
    with zipfile.ZipFile(archive, "w") as out:
        out.writestr("submitted/alice/01_attention/01_attention.ipynb", notebook_bytes())
        out.writestr("submitted/alice/01_attention/timestamp.txt", "2026-03-01 10:00:00")
        out.writestr("submitted/bob/01_attention/my attention.ipynb", notebook_bytes())
        out.writestr("submitted/carol/01_attention/notes.md", "no notebook")
        out.writestr("submitted/dan/99_unknown/99_unknown.ipynb", notebook_bytes())
    submitted = tmp_path / "submitted"
    found = collect(archive, NOTEBOOKS, None, collector_config(), submitted, tmp_path / "scratch")
    by_student = {s.student: s for s in found.submissions}
    assert by_student["alice"].timestamp == "2026-03-01 10:00:00"
    assert by_student["bob"].flags == ["wrong-file-name"] and by_student["bob"].path.name == "my attention.ipynb"
    assert by_student["carol"].path is None and "no 01_attention.ipynb was submitted" in by_student["carol"].notes[0]
    assert "dan" not in by_student and any("99_unknown" in m for m in found.messages)
    assert (submitted / "alice" / "01_attention" / "01_attention.ipynb").is_file()


def test_a_zip_never_replaces_a_different_collected_file_unless_asked(tmp_path):
    submitted = tmp_path / "submitted"
    (submitted / "alice" / "01_attention").mkdir(parents=True)
    existing = submitted / "alice" / "01_attention" / "01_attention.ipynb"
    existing.write_text("the first collection")
    archive = tmp_path / "again.zip"
    with zipfile.ZipFile(archive, "w") as out:
        out.writestr("alice_01_attention.ipynb", notebook_bytes())
    found = collect(archive, NOTEBOOKS, None, collector_config(), submitted, tmp_path / "scratch")
    assert existing.read_text() == "the first collection"
    assert any("--replace" in m for m in found.messages)
    collect(archive, NOTEBOOKS, None, collector_config(), submitted, tmp_path / "scratch", replace=True)
    assert existing.read_bytes() == notebook_bytes()


HOSTILE_NAMES = [
    "notes\x1b]0;grades are final\x07\x1b[2K.ipynb",  # OSC: sets the terminal's title; then erases the line
    "\x1b[31mred\x1b[0m.ipynb",  # ANSI colour
    "cod\u202egnp.yppy.ipynb",  # a right-to-left override: the name reads backwards from there
    "a\u2066isolate\u2069\u200b.ipynb",  # an isolate and a zero-width space
    "line\nbreak.ipynb",
]


def test_names_the_grade_command_prints_have_their_control_characters_escaped(tmp_path):
    """A submitted file or folder whose name holds ANSI or OSC sequences, bidirectional overrides or a
    line break: every message naming it shows the characters escaped, never raw (the CSV and the report
    escape them their own way)."""
    from autograder.engine.collect import printable_lines

    folder = tmp_path / "submitted" / "alice" / "01_attention"
    folder.mkdir(parents=True)
    (folder / "01_attention.ipynb").write_bytes(notebook_bytes())
    for name in HOSTILE_NAMES:
        (folder / name).write_bytes(notebook_bytes())
    (tmp_path / "submitted" / "alice" / "\x1b[2J\u202eassignment").mkdir()
    found = collect(tmp_path / "submitted", NOTEBOOKS, None, collector_config(), tmp_path / "x", tmp_path / "s")
    assert [s.student for s in found.submissions] == ["alice"]
    assert len(found.messages) == len(HOSTILE_NAMES) + 1, found.messages
    for message in found.messages:
        assert message.isprintable(), message
    text = "\n".join(found.messages)
    for shown in (r"notes\x1b]0;grades are final\x07\x1b[2K.ipynb", r"cod\u202egnp", r"line\nbreak", r"\x1b[2J"):
        assert shown in text, shown
    printed = printable_lines("one\x1b[2K line\nand \u202eanother\tone")
    assert printed == "one\\x1b[2K line\nand \\u202eanother\tone"


def test_the_watch_screen_escapes_what_a_submission_named():
    """``./course grade --watch`` shows one line per event, whose text may name a submitted file."""
    from autograder.engine.watch import Event, line

    event = Event(0.0, "alice", "01_attention", "could not be graded (notes\x1b]0;pwned\x07\u202e.ipynb)")
    shown = line(event)
    assert shown.isprintable() and r"notes\x1b]0;pwned\x07\u202e.ipynb" in shown
