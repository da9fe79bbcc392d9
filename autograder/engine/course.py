"""The course the grade command works on: nbgrader's configuration, folders and gradebook.

``CourseFolder(root)`` reads ``root/nbgrader_config.py``: nbgrader's course
root (``coursework/``: submissions, graded notebooks, feedback, the gradebook,
reports and the command's ``.work/`` folder: data only, never code), the
source (``solutions/``) and release (``notebooks/``) folders. ``spec`` takes
the snapshot of one notebook that every grading job carries
(``records.AssignmentSpec``): the gradebook's cells, the released notebook, the
reference cells, the released data files and the one fingerprint of all that
grading depends on, the grading code's digest (``identity``) included.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from pathlib import Path

from course_checks.verdict import expected_checks

from .. import reference
from ..cells import grade_id
from ..records import AssignmentSpec, GradebookView
from ..sandboxing.bubblewrap import Limits
from .identity import code_digest


class CourseFolder:
    """The nbgrader course the command works on: its configuration, folders (the course root,
    ``coursework/``, holds the class's data) and gradebook."""

    def __init__(self, root: Path, db_url: str | None = None):
        from nbgrader.coursedir import CourseDirectory  # here: the grade command starts without it
        from traitlets.config.loader import PyFileConfigLoader  # here: the grade command starts without it

        self.root = Path(root).resolve()
        self.config = PyFileConfigLoader("nbgrader_config.py", path=str(self.root)).load_config()
        if db_url:
            self.config.CourseDirectory.db_url = db_url
        self.coursedir = CourseDirectory(config=self.config)
        self.db_url = self.coursedir.db_url
        self.work = Path(self.coursedir.root) / ".work"

    @property
    def source(self) -> Path:
        return Path(self.coursedir.source_directory)

    @property
    def release(self) -> Path:
        return Path(self.coursedir.release_directory)

    @property
    def submitted(self) -> Path:
        return Path(self.coursedir.root) / self.coursedir.submitted_directory

    def notebooks(self) -> dict[str, list[str]]:
        """Assignment -> its notebook names, from the source folder."""
        found = {}
        for folder in sorted(p for p in self.source.iterdir() if p.is_dir()):
            names = sorted(p.stem for p in folder.glob("*.ipynb"))
            if names:
                found[folder.name] = names
        return found

    def register(self, assignments: list[str]) -> list[str]:
        """Make sure the gradebook knows these assignments (nbgrader generate_assignment)."""
        from nbgrader.api import Gradebook, MissingEntry  # here: the grade command starts without it
        from nbgrader.apps import NbGraderAPI  # here: the grade command starts without it
        from nbgrader.coursedir import CourseDirectory  # here: the grade command starts without it

        notes = []
        missing = []
        with Gradebook(self.db_url) as gradebook:
            for assignment in assignments:
                try:
                    known = {n.name for n in gradebook.find_assignment(assignment).notebooks}
                except MissingEntry:
                    known = set()
                if not set(self.notebooks()[assignment]) <= known:
                    missing.append(assignment)
        if missing:
            with tempfile.TemporaryDirectory(prefix="course-release-") as scratch:
                config = self.config.copy()
                config.CourseDirectory.release_directory = scratch
                api = NbGraderAPI(CourseDirectory(config=config), config=config)
                for assignment in missing:
                    result = api.generate_assignment(assignment, force=True, create=True)
                    if not result["success"]:
                        raise RuntimeError(f"nbgrader generate_assignment {assignment} failed:\n{result['error']}")
                    notes.append(f"{assignment}: added to the gradebook (nbgrader generate_assignment)")
        return notes

    def graded_in_gradebook(self) -> set:
        """(student, assignment, notebook) that have autograded scores in the gradebook."""
        from nbgrader.api import (  # here: the grade command starts without it
            Assignment,
            Grade,
            Gradebook,
            Notebook,
            Student,
            SubmittedAssignment,
            SubmittedNotebook,
        )

        found = set()
        try:
            with Gradebook(self.db_url) as gradebook:
                rows = (
                    gradebook.db.query(Student.id, Assignment.name, Notebook.name)
                    .select_from(SubmittedNotebook)
                    .join(SubmittedAssignment, SubmittedNotebook.assignment_id == SubmittedAssignment.id)
                    .join(Student, SubmittedAssignment.student_id == Student.id)
                    .join(Assignment, SubmittedAssignment.assignment_id == Assignment.id)
                    .join(Notebook, SubmittedNotebook.notebook_id == Notebook.id)
                    .join(Grade, Grade.notebook_id == SubmittedNotebook.id)
                    .filter(Grade.auto_score.isnot(None))
                    .distinct()
                    .all()
                )
                found = {tuple(row) for row in rows}
        except Exception:
            pass
        return found

    def spec(self, assignment: str, notebook: str, limits: Limits) -> AssignmentSpec:
        """Everything grading needs about one notebook, read once here."""
        import nbformat  # here: the grade command starts without it
        from nbgrader.api import Gradebook  # here: the grade command starts without it

        released_path = self.release / assignment / f"{notebook}.ipynb"
        if released_path.is_file():
            released = released_path.read_text(encoding="utf-8")
        else:  # not released into this course folder: the student version nbgrader would make
            released = _student_version(self, assignment, notebook)
        released_nb = nbformat.reads(released, as_version=4)
        order = [grade_id(c) for c in released_nb.cells if grade_id(c)]
        with Gradebook(self.db_url) as gradebook:
            view = GradebookView.read(gradebook, assignment, notebook, order)
        expected = {
            c.name: expected_checks(c.source)
            for c in view.notebook.grade_cells
            if c.cell_type == "code" and expected_checks(c.source)
        }
        cells = reference.source_cells(assignment, self.source) if notebook == assignment else []
        files = {}
        folder = self.release / assignment
        if folder.is_dir():
            for path in sorted(folder.rglob("*")):
                if (
                    path.is_file()
                    and path.suffix != ".ipynb"
                    and ".ipynb_checkpoints" not in path.parts
                    and path.stat().st_size < 50 * 1024 * 1024
                ):
                    files[str(path.relative_to(folder))] = path.read_bytes().hex()
        arguments = list(self.config.Execute.get("extra_arguments", [])) if "Execute" in self.config else []
        hasher = hashlib.sha256()
        for part in (
            json.dumps(view.__dict__, default=lambda o: o.__dict__, sort_keys=True),
            released,
            json.dumps(cells),
            json.dumps(files, sort_keys=True),
            json.dumps(arguments),
            repr(limits),
        ):
            hasher.update(part.encode())
        hasher.update(code_digest().encode())
        return AssignmentSpec(
            assignment, notebook, view, released, cells, expected, files, arguments, hasher.hexdigest(), self.config
        )


def _student_version(course: CourseFolder, assignment: str, notebook: str) -> str:
    from ..release import generate  # here: the grade command starts without it

    with tempfile.TemporaryDirectory(prefix="course-student-") as scratch:
        generate([assignment], Path(scratch))
        return (Path(scratch) / assignment / f"{notebook}.ipynb").read_text(encoding="utf-8")
