"""From and to a learning platform: its bulk download's file names in, its gradebook import CSV out.

In: each platform names the files of its "download all submissions" zip its own way. The
collectors below read those names (nbgrader's collector plugin interface, so nbgrader's own
``zip_collect`` can use them too: ``c.ZipCollectApp.collector_plugin``), and give the platform's
stable id of the student, mapped to an nbgrader student id through a roster when there is one
(``LmsCollector.roster``: a CSV with the columns ``lms_id`` and ``student_id``). The formats are
taken from each platform's own source code, not from a real export:

- **Canvas** (``lib/content_zipper.rb`` in instructure/canvas-lms): ``<name>[_LATE]_<user id>_
  <attachment id>_<file name>``, the name being the student's sortable name lowercased with every
  character that is not a letter, digit or underscore removed; with anonymous grading
  ``[LATE_]anon_<anonymous id>_...``. The user id is the student's (the same in every
  assignment); the attachment id changes with every upload, so it is not part of the identity.
  Canvas renames a re-uploaded file ``01_attention-1.ipynb``: the notebook is still 01_attention.
- **Moodle** (``mod/assign/locallib.php``, ``download_submissions``): each participant's files in a
  folder ``<full name>_<participant id>_assignsubmission_file_/`` (the default since Moodle 3.1),
  or flat, ``<full name>_<participant id>_assignsubmission_file_<file name>``; with blind marking
  the name is "Participant". Moodle's participant id is per assignment (its
  ``assign_user_mapping``), so a roster joins one student's assignments.

Blackboard's naming could not be confirmed from its documentation or code here: its downloads
go through the flat-name pattern of ``nbgrader_config.py`` (``FileNameCollectorPlugin.named_regexp``),
which already reads ``<student>_attempt_<time>_<notebook>.ipynb``.

Out: ``canvas_gradebook`` writes the CSV Canvas's gradebook imports: its own export's layout
(``lib/gradebook_exporter.rb``): ``Student, ID, SIS User ID, SIS Login ID, Section``, one column per
assignment, and a ``Points Possible`` row; the ID column (Canvas's user id) is what Canvas matches
students on.
"""

from __future__ import annotations

import csv
import io
import re
from pathlib import Path, PurePath

from nbgrader.plugins import FileNameCollectorPlugin
from traitlets import Unicode

from .collect import usable_student_id

NOTEBOOK = re.compile(r"^(?P<notebook>.+?)(?:[ _-]*\(\d+\)|-\d+)?\.ipynb$")  # a copy number is not the name


class Roster:
    """Platform id -> nbgrader student id (and back), from a CSV with ``lms_id`` and ``student_id``
    columns; other columns (a name, an e-mail address) are kept for the export."""

    def __init__(self, path: Path | str | None):
        self.to_student: dict[str, str] = {}
        self.rows: dict[str, dict] = {}  # student id -> its row
        if not path:
            return
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8-sig")
        except (OSError, UnicodeDecodeError) as error:
            raise ValueError(f"the roster {path} cannot be read ({error})") from None
        reader = csv.DictReader(io.StringIO(text))
        missing = {"lms_id", "student_id"} - set(reader.fieldnames or [])
        if missing:
            raise ValueError(
                f"the roster {path} has no {' or '.join(sorted(missing))} column (it needs lms_id,student_id)"
            )
        for number, row in enumerate(reader, start=2):
            platform, student = (row.get("lms_id") or "").strip(), (row.get("student_id") or "").strip()
            if not platform and not student:
                continue
            if not usable_student_id(student):
                raise ValueError(f"the roster {path}, line {number}: {student!r} cannot be an nbgrader student id")
            if platform in self.to_student and self.to_student[platform] != student:
                raise ValueError(f"the roster {path}, line {number}: {platform} is listed twice")
            self.to_student[platform] = student
            self.rows[student] = {**row, "lms_id": platform, "student_id": student}

    def student(self, platform_id: str) -> str:
        return self.to_student.get(platform_id, platform_id)

    def platform_id(self, student: str) -> str:
        row = self.rows.get(student)
        return row["lms_id"] if row else student


class LmsCollector(FileNameCollectorPlugin):
    """A platform's download names as nbgrader's collector plugin reads them: student id, file id."""

    roster = Unicode("", help="CSV with the columns lms_id,student_id (the platform's ids to nbgrader's)").tag(
        config=True
    )
    whole_path = True  # reads the folder a file is in too (Moodle's per-participant folders)
    PATTERN: re.Pattern  # the platform's naming (not the configurable named_regexp, which a course sets)

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.named_regexp = self.PATTERN.pattern  # what a message about an unmatched name shows
        self.mapping = Roster(self.roster)

    def parse(self, path: PurePath) -> tuple[str, str] | None:
        """(the platform's id of the student, the file's own name), or None."""
        raise NotImplementedError

    def collect(self, submitted_file: str) -> dict | None:
        path = PurePath(submitted_file)
        if path.suffix not in self.valid_ext:
            return None
        parsed = self.parse(path)
        if parsed is None:
            return None
        platform_id, file_name = parsed
        notebook = NOTEBOOK.match(file_name)
        if notebook is None:
            return None
        return {"student_id": self.mapping.student(platform_id), "file_id": notebook["notebook"] + ".ipynb"}


class CanvasCollector(LmsCollector):
    # anonymous grading first: "anon_..." must not be read as a name
    PATTERN = re.compile(
        r"^(?:(?:LATE_)?(?P<anonymous>anon_[A-Za-z0-9]+)|(?P<name>\w*?)_(?:LATE_)?(?P<user>\d+))"
        r"_(?P<attachment>\d+)_(?P<file_id>.+)$"
    )

    def parse(self, path):
        match = self.PATTERN.match(path.name)
        return (match["anonymous"] or match["user"], match["file_id"]) if match else None


class MoodleCollector(LmsCollector):
    PATTERN = re.compile(r"^(?P<name>.+)_(?P<student_id>\d+)_assignsubmission_file_(?P<file_id>.*)$")

    def parse(self, path):
        match = self.PATTERN.match(path.name)  # flat: the prefix on the file's own name
        if match and match["file_id"]:
            return match["student_id"], match["file_id"]
        for folder in path.parents:  # a folder per participant (the files in it keep their own folders)
            match = self.PATTERN.match(folder.name)
            if match and not match["file_id"]:
                return match["student_id"], path.name
        return None


PLATFORMS = {"canvas": CanvasCollector, "moodle": MoodleCollector}


def collector(platform: str, config, roster: Path | None = None) -> LmsCollector:
    """The collector of ``platform`` (a name of ``PLATFORMS``), with the configuration's settings and
    ``roster`` (a path given on the command line wins over ``LmsCollector.roster``)."""
    plugin = PLATFORMS[platform](config=config)
    if roster is not None:
        plugin.mapping = Roster(roster)
    return plugin


# ---------------------------------------------------------------- grades back out


def assignment_totals(course) -> tuple[dict, dict]:
    """({(student, assignment): points}, {assignment: max points}) from the gradebook."""
    from nbgrader.api import Gradebook  # here: the grade command starts without it

    totals, maxima = {}, {}
    with Gradebook(course.db_url) as gradebook:
        for assignment in gradebook.assignments:
            maxima[assignment.name] = float(assignment.max_score)
            for submission in assignment.submissions:
                # after the late penalty, as ``nbgrader export`` gives the score
                late = float(submission.late_submission_penalty or 0.0)
                totals[(submission.student.id, assignment.name)] = max(0.0, float(submission.score) - late)
    return totals, maxima


def canvas_gradebook(course, roster: Roster, path: Path) -> int:
    """The Canvas gradebook import CSV of every graded submission; how many students it holds."""
    from course_checks.files import write_atomically

    totals, maxima = assignment_totals(course)
    assignments = sorted(maxima)
    students = sorted({student for student, _ in totals})
    buffer = io.StringIO()
    out = csv.writer(buffer)
    out.writerow(["Student", "ID", "SIS User ID", "SIS Login ID", "Section", *assignments])
    out.writerow(["    Points Possible", "", "", "", "", *(f"{maxima[a]:g}" for a in assignments)])
    for student in students:
        row = roster.rows.get(student, {})
        name = row.get("name") or row.get("Student") or student
        out.writerow(
            [
                name,
                roster.platform_id(student),
                row.get("sis_user_id", ""),
                row.get("sis_login_id", ""),
                row.get("section", ""),
                *(f"{totals[(student, a)]:g}" if (student, a) in totals else "" for a in assignments),
            ]
        )
    write_atomically(path, buffer.getvalue())
    return len(students)
