"""Grade submissions with the real nbgrader commands on a temporary course copy.

Used by every notebook's grading tests:

    course = Course.create(tmp_path)            # copies the course, runs generate_assignment
    course.submit("alice", "01_attention", answers={"softmax": "def softmax(x, dim=-1): ..."})
    course.autograde("01_attention")            # nbgrader autograde + generate_feedback
    course.scores("alice", "01_attention")      # {grade cell id: points} from the SQLite gradebook
    course.feedback("alice", "01_attention")    # the feedback HTML the student gets

A submission starts from the released student notebook with every answer cell
filled in with the reference answer, then replaces the answers given, so a
test can get one exercise wrong and check that only that exercise loses points.
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

REPOSITORY = Path(__file__).resolve().parent.parent
SOLUTIONS = REPOSITORY / "solutions"
NOTEBOOKS = REPOSITORY / "notebooks"
UNTOUCHED = object()  # answers value: keep the student version's stub


@dataclass(frozen=True)
class Beside:
    """How nbgrader runs beside the session's other tests, in a thread of its own: at the lowest
    CPU priority (it takes the cores they leave idle; they keep their cores, not their caches), in
    ``environ`` (taken as the session starts: a variable a test sets for itself is not nbgrader's), and, while
    grading, with kernel timeouts long enough for a kernel that waits for the CPU (nbgrader's own
    30 s a cell is exercised by tests/test_nbgrader_fresh_clone.py).

    The lowest priority is the kernels' too (``at_lowest_priority``): nbgrader runs at nice 19, and
    its kernels, each in a session of its own, lower their sessions' share (lowest_priority_kernel.py).
    With nbgrader's nice alone, a 2-worker ``./course grade`` of 10 notebooks beside two stock
    classes took 20.5 s against 12.4 s alone; with its kernels' sessions lowered, 14.2 s."""

    environ: dict
    options: tuple = ("--Execute.timeout=1800", "--Execute.startup_timeout=600", "--Execute.iopub_timeout=300")

    @classmethod
    def at_lowest_priority(cls, environ: dict, folder: Path) -> Beside:
        """Beside the tests in ``environ``, with the "python3" kernelspec the notebooks name made in
        ``folder`` and first in JUPYTER_PATH: ipykernel's, started through lowest_priority_kernel.py."""
        spec = folder / "kernels" / "python3"
        spec.mkdir(parents=True, exist_ok=True)
        launcher = Path(__file__).with_name("lowest_priority_kernel.py")
        kernel = {
            "argv": [sys.executable, str(launcher), "-f", "{connection_file}"],
            "display_name": "Python 3 (ipykernel)",
            "language": "python",
        }
        (spec / "kernel.json").write_text(json.dumps(kernel), encoding="utf-8")
        path = os.pathsep.join(p for p in (str(folder), environ.get("JUPYTER_PATH")) if p)
        return cls({**environ, "JUPYTER_PATH": path})


def nbgrader(
    *args: str, cwd: Path, check: bool = True, env: dict | None = None, beside: Beside | None = None
) -> subprocess.CompletedProcess:
    """Run the real ``nbgrader`` command line from the course folder ``cwd``.

    The kernels it starts (in the copy's ``coursework/autograded/...``) find the reference
    solutions in the copy's own ``solutions/`` above them, so the copy is self-contained.
    ``env``: variables to set for it, beside this process's (``beside``'s, when given).
    """
    command = [str(Path(sys.executable).parent / "nbgrader"), *args]
    environ = os.environ if beside is None else beside.environ
    if beside is not None:
        command = ["nice", "-n", "19", *command]
    path = f"{Path(sys.executable).parent}{os.pathsep}{environ.get('PATH', '')}"
    env = {**environ, "PATH": path, **(env or {})}
    result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
    if check and result.returncode != 0:
        raise AssertionError(
            f"nbgrader {' '.join(args)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
        )
    return result


def grade(course_root: Path, *args: str, env: dict | None = None, timeout: float = 1500) -> subprocess.CompletedProcess:
    """The grading command as an instructor runs it (``./course grade`` runs exactly this)."""
    command = [sys.executable, "-m", "autograder.grade", "--quiet", *args]
    return subprocess.run(
        command, cwd=course_root, capture_output=True, text=True, timeout=timeout, env=env or os.environ.copy()
    )


def sandbox_works() -> bool:
    """Whether ``./course grade``'s bubblewrap sandbox starts on this machine."""
    from autograder.sandboxing.bubblewrap import probe

    return probe(REPOSITORY) is None


def answer_cells(notebook) -> dict:
    """{grade_id: cell} of the autograded answer cells."""
    found = {}
    for cell in notebook.cells:
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("solution") and not meta.get("grade"):
            found[meta["grade_id"]] = cell
    return found


def reference_answers(assignment: str) -> dict:
    """{grade_id: source} of the reference answers in solutions/."""
    notebook = nbformat.read(SOLUTIONS / assignment / f"{assignment}.ipynb", as_version=4)
    return {grade_id: cell.source for grade_id, cell in answer_cells(notebook).items()}


def grade_cells(notebook) -> dict:
    """{grade_id: points} of the graded test cells."""
    return {
        cell.metadata["nbgrader"]["grade_id"]: cell.metadata["nbgrader"]["points"]
        for cell in notebook.cells
        if cell.metadata.get("nbgrader", {}).get("grade")
    }


@dataclass
class Course:
    root: Path  # holds nbgrader_config.py, solutions/, notebooks/, coursework/
    beside: Beside | None = field(default=None, kw_only=True)  # how its nbgrader runs, beside other tests

    @classmethod
    def create(cls, directory: Path, assignments: list[str] | None = None, beside: Beside | None = None) -> Course:
        """A copy of the course in ``directory``, with a fresh gradebook and release."""
        root = Path(directory)
        root.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPOSITORY / "nbgrader_config.py", root)
        shutil.copytree(SOLUTIONS, root / "solutions", ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
        (root / "coursework").mkdir()
        course = cls(root, beside=beside)
        for assignment in assignments or sorted(p.name for p in (root / "solutions").iterdir() if p.is_dir()):
            nbgrader("generate_assignment", assignment, "--force", cwd=root, beside=beside)
        return course

    @property
    def db_url(self) -> str:
        return f"sqlite:///{self.root / 'coursework' / 'gradebook.db'}"

    def released(self, assignment: str):
        return nbformat.read(self.root / "notebooks" / assignment / f"{assignment}.ipynb", as_version=4)

    def submission_path(self, student: str, assignment: str, filename: str | None = None) -> Path:
        return self.root / "coursework" / "submitted" / student / assignment / (filename or f"{assignment}.ipynb")

    def submit(
        self,
        student: str,
        assignment: str,
        answers: dict | object | None = None,
        edit=None,
        filename: str | None = None,
    ) -> Path:
        """Write a submission: reference answers, overridden by ``answers``.

        ``answers=UNTOUCHED`` submits the student version as released.
        ``edit(notebook)`` may change the notebook further (add cells, ...).
        """
        notebook = self.released(assignment)
        if answers is not UNTOUCHED:
            chosen = {**reference_answers(assignment), **(answers or {})}
            cells = answer_cells(notebook)
            unknown = set(chosen) - set(cells)
            assert not unknown, f"no answer cells named {unknown} in {assignment}"
            for grade_id, source in chosen.items():
                cells[grade_id].source = source
        if edit is not None:
            edit(notebook)
        path = self.submission_path(student, assignment, filename)
        path.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(notebook, path)
        return path

    def autograde(self, assignment: str) -> None:
        """nbgrader autograde, then generate_feedback, for every submission."""
        options = self.beside.options + self.kernel_sockets() if self.beside else ()
        self.last_autograde = nbgrader("autograde", assignment, "--force", *options, cwd=self.root, beside=self.beside)
        nbgrader("generate_feedback", assignment, "--force", cwd=self.root, beside=self.beside)

    def kernel_sockets(self) -> tuple:
        """Options for nbgrader: its kernels listen on Unix sockets in this course's folder, not on TCP
        ports. jupyter_client picks a kernel's five ports (each bound and released) before the kernel
        binds them, and anything of the suite's binding a port meanwhile can take one: a stock class's
        kernel then fails with "Address already in use" (07's class, in one CI run). A socket's path
        is absolute, since nbgrader and its kernels run in different folders."""
        prefix = self.root / "kernel"
        assert len(str(prefix)) < 90, prefix  # a Unix socket's path holds at most 107 bytes
        return ("--KernelManager.transport=ipc", f"--KernelManager.ip={prefix}")

    def scores(self, student: str, assignment: str) -> dict:
        """{grade cell id: score} from the gradebook."""
        from nbgrader.api import Gradebook

        grade_ids = grade_cells(self.released(assignment))
        with Gradebook(self.db_url) as gradebook:
            return {
                grade_id: gradebook.find_grade(grade_id, assignment, assignment, student).score
                for grade_id in grade_ids
            }

    def max_scores(self, assignment: str) -> dict:
        return grade_cells(self.released(assignment))

    def feedback(self, student: str, assignment: str) -> str:
        path = self.root / "coursework" / "feedback" / student / assignment / f"{assignment}.html"
        return path.read_text(encoding="utf-8")

    def feedback_text(self, student: str, assignment: str) -> str:
        """The feedback page's visible text, entities decoded, tags dropped."""
        return html.unescape(re.sub(r"<[^>]+>", "", self.feedback(student, assignment)))

    def autograded(self, student: str, assignment: str) -> dict:
        path = self.root / "coursework" / "autograded" / student / assignment / f"{assignment}.ipynb"
        return json.loads(path.read_text(encoding="utf-8"))

    def gradebook_dump(self) -> dict:
        """Everything grading writes to the gradebook, comparable between two courses."""
        from nbgrader.api import Gradebook

        dump = {}
        with Gradebook(self.db_url) as gradebook:
            for assignment in gradebook.assignments:
                for submission in assignment.submissions:
                    key = (submission.student.id, assignment.name)
                    dump[key + ("timestamp",)] = submission.timestamp
                    for notebook in submission.notebooks:
                        dump[key + (notebook.name, "flagged")] = notebook.flagged
                        dump[key + (notebook.name, "late")] = notebook.late_submission_penalty
                        for grade in notebook.grades:
                            dump[key + (grade.name,)] = (grade.auto_score, grade.manual_score, grade.needs_manual_grade)
                        for comment in notebook.comments:
                            dump[key + (comment.name, "comment")] = (comment.auto_comment, comment.manual_comment)
        return dump
