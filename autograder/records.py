"""The records every part of the grader passes around: the lowest floor, no behaviour but reading the gradebook.

- ``AssignmentSpec``: all the grader knows about one notebook of an assignment, a snapshot
  (``engine.course`` makes it once per run);
- ``Job``: one submission to grade, with its spec and limits (``engine.plan`` makes them);
- ``Result``, ``CheckRecord``: what a worker's pipeline (``worker.pipeline``) returns, which
  the one writer (``engine.writer``) commits;
- ``GradebookView`` (``NotebookRecord``, ``CellRecord``): the gradebook's source cells of a
  notebook, read once, so that a worker sanitizes without the database;
- ``Rejected``: a submission that cannot be graded; ``Refused``: a run that cannot start.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from nbgrader.api import MissingEntry

from .sandboxing.bubblewrap import Limits


class Refused(Exception):
    """The command cannot run as asked; the message says why. Nothing was written."""


class Rejected(Exception):
    """The submission cannot be graded; the message says why, for the instructor and the student."""


@dataclass
class CellRecord:
    """One of the assignment's source cells, as the gradebook holds it."""

    name: str
    cell_type: str
    locked: bool
    checksum: str | None
    source: str
    max_score: float | None = None  # grade cells only
    solution: bool = False
    task: bool = False


@dataclass
class NotebookRecord:
    name: str
    kernelspec: str | None
    source_cells: list[CellRecord]

    @property
    def grade_cells(self):
        return [c for c in self.source_cells if c.max_score is not None and not c.task]

    @property
    def solution_cells(self):
        return [c for c in self.source_cells if c.solution]

    @property
    def task_cells(self):
        return [c for c in self.source_cells if c.task]


@dataclass
class GradebookView:
    """The part of the gradebook that sanitizing reads, for one notebook; picklable."""

    assignment: str
    notebook: NotebookRecord

    @classmethod
    def read(cls, gradebook, assignment: str, notebook: str, order: list[str]) -> GradebookView:
        """From an open ``nbgrader.api.Gradebook``; cells in ``order`` (the release's)."""
        record = gradebook.find_notebook(notebook, assignment)
        points = {c.name: float(c.max_score) for c in [*record.grade_cells, *record.task_cells]}
        solutions = {c.name for c in record.solution_cells}
        tasks = {c.name for c in record.task_cells}
        position = {name: i for i, name in enumerate(order)}
        cells = sorted(record.source_cells, key=lambda c: (position.get(c.name, len(position)), c.name))
        return cls(
            assignment,
            NotebookRecord(
                notebook,
                record.kernelspec,
                [
                    CellRecord(
                        c.name,
                        c.cell_type,
                        bool(c.locked),
                        c.checksum,
                        c.source,
                        points.get(c.name),
                        c.name in solutions,
                        c.name in tasks,
                    )
                    for c in cells
                ],
            ),
        )

    # the Gradebook methods nbgrader's sanitizing preprocessors call
    def find_notebook(self, notebook: str, assignment: str) -> NotebookRecord:
        return self.notebook

    def find_source_cell(self, name: str, notebook: str, assignment: str) -> CellRecord:
        for cell in self.notebook.source_cells:
            if cell.name == name:
                return cell
        raise MissingEntry()

    def find_graded_cell(self, name: str, notebook: str, assignment: str) -> CellRecord:
        cell = self.find_source_cell(name, notebook, assignment)
        if cell.max_score is None:
            raise MissingEntry()
        return cell

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@dataclass
class AssignmentSpec:
    """All the grader needs to know about one notebook of an assignment (a snapshot)."""

    assignment: str
    notebook: str
    view: GradebookView  # the gradebook's source cells
    released: str  # the released student notebook (JSON)
    reference_cells: list  # (grade_id, source) from solutions/, for the judge only
    expected: dict  # grade cell id -> [(assignment, exercise)]
    files: dict = field(default_factory=dict)  # other released files: relative path -> hex
    kernel_arguments: list = field(default_factory=list)
    fingerprint: str = ""  # changes when anything that affects grading changes
    config: object = None  # the course's nbgrader configuration (the feedback exporter's)


@dataclass
class Job:
    student: str
    assignment: str
    notebook: str
    data: bytes | None  # the submitted file, None when there is none
    source_name: str  # where it came from, for messages
    digest: str  # of the submitted bytes (and timestamp)
    spec: AssignmentSpec
    limits: Limits
    timestamp: str | None = None
    notes: list = field(default_factory=list)  # from collection (e.g. renamed file)
    flags: list = field(default_factory=list)


@dataclass
class CheckRecord:
    cell: str
    exercise: str
    passed: bool
    message: str | None
    mistake: str | None
    mistake_name: str | None = None


@dataclass
class Result:
    student: str
    assignment: str
    notebook: str
    digest: str
    fingerprint: str
    graded: bool  # False: rejected (bad input), graded as an empty submission
    notebook_json: str  # the autograded notebook
    feedback_html: str = ""  # its feedback page (the worker's own grades; "" when not rendered)
    messages: list = field(default_factory=list)  # for the instructor
    flags: list = field(default_factory=list)
    checks: list = field(default_factory=list)  # CheckRecord
    scores: dict = field(default_factory=dict)  # grade id -> [score, max]: the auto scores (test cells': the verdicts')
    comments: dict = field(default_factory=dict)  # answer cell id -> SaveAutoGrades' auto comment (or None)
    cell_seconds: float = 0.0
    cell_cpu_seconds: float = 0.0
    kernel_seconds: float = 0.0
    seconds: float = 0.0
    kernels: int = 0
    faults: list = field(default_factory=list)
    timestamp: str | None = None
    worker: str = ""
    sandbox_launch: int = 0  # which of its worker's sandboxes it ran in (a new one after one was retired)
    started: float = 0.0  # when its worker began it (epoch seconds)
    phases: dict = field(default_factory=dict)  # phase -> seconds on its worker (``worker.phases``)
