"""The single writer: results into the gradebook, graded notebooks, feedback and the ledger.

Only the grading command's main process writes, one result at a time, so
parallel workers never corrupt a SQLite gradebook (a Postgres ``db_url`` works
the same way). Everything that is a function of one graded notebook was made by
the worker that graded it (``worker.pipeline.finish``): the autograded notebook, its
scores (each test cell's from the judge's verdicts, ``worker.verdicts``) and comments as
nbgrader's ``SaveAutoGrades`` writes them, and its feedback
page, rendered by nbgrader's ``GenerateFeedback`` exporter with the course's
preprocessors (``feedback.GivenGrades`` in place of ``GetGrades``, the CSS
header, ``feedback.HideHiddenTests``). Committing a result is then cheap, in
one gradebook session kept open for the whole run and one transaction per
notebook:

- the student, the submission (with its timestamp), the scores and comments
  (as ``SaveAutoGrades`` writes them: a grade a human changed, or one the autograder
  cannot give, needs manual grading), the late penalty (``AssignLatePenalties``'
  plugin, as configured), the review flag;
- the graded notebook and the feedback page, each written whole or not at all
  (a temporary file renamed into place). When the gradebook knows more than the
  worker could (a score or comment given by hand, a late penalty) the page is
  rendered again here, with nbgrader's own ``GetGrades``, exactly as
  ``nbgrader generate_feedback`` would;
- the ledger (``coursework/.work/grading.sqlite``), last: a submission counts
  as graded only once its grades, notebook and feedback are in place, so
  killing the command at any moment and running it again grades exactly what is
  missing and ends with the same gradebook as one clean run. A rerun skips
  submissions whose file and grading setup (``AssignmentSpec.fingerprint``)
  have not changed.
"""

from __future__ import annotations

import json
import resource
import sqlite3
import sys
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from course_checks.files import write_atomically

from ..compat import late_penalty
from ..flags import REVIEW_FLAGS
from ..records import Job, Result
from .report import warm_charts
from .runs import STARTED, trace


class Ledger:
    """What has been graded, from which file, with which grading setup; and what was found."""

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(str(path), timeout=60)
        self.db.execute("""CREATE TABLE IF NOT EXISTS graded (
            student TEXT, assignment TEXT, notebook TEXT, digest TEXT, fingerprint TEXT,
            summary TEXT, graded_at REAL, PRIMARY KEY (student, assignment, notebook))""")
        self.db.commit()

    def state(self) -> dict:
        return {
            (s, a, n): (d, f)
            for s, a, n, d, f in self.db.execute(
                "SELECT student, assignment, notebook, digest, fingerprint FROM graded"
            )
        }

    def record(self, result: Result) -> None:
        summary = {
            "graded": result.graded,
            "messages": result.messages,
            "flags": result.flags,
            "checks": [asdict(c) if not isinstance(c, dict) else c for c in result.checks],
            "cell_seconds": result.cell_seconds,
            "cell_cpu_seconds": result.cell_cpu_seconds,
            "seconds": result.seconds,
            "kernels": result.kernels,
            "kernel_seconds": result.kernel_seconds,
            "faults": result.faults,
            "worker": result.worker,
            "sandbox_launch": result.sandbox_launch,
            "started": result.started,
            "phases": {name: round(seconds, 5) for name, seconds in result.phases.items()},
        }
        with self.db:
            self.db.execute(
                "INSERT OR REPLACE INTO graded VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    result.student,
                    result.assignment,
                    result.notebook,
                    result.digest,
                    result.fingerprint,
                    json.dumps(summary),
                    time.time(),
                ),
            )

    def summaries(self) -> dict:
        return {
            (s, a, n): json.loads(summary)
            for s, a, n, summary in self.db.execute("SELECT student, assignment, notebook, summary FROM graded")
        }

    def close(self) -> None:
        self.db.close()


class Writer:
    """Commits results; the only place that writes grades, graded notebooks and feedback."""

    def __init__(self, coursedir, config, db_url: str, ledger: Ledger):
        from nbgrader.api import Gradebook  # here: the grade command starts without it
        from nbgrader.preprocessors import AssignLatePenalties  # here: the grade command starts without it

        self.coursedir = coursedir
        self.config = config
        self.db_url = db_url
        self.ledger = ledger
        self.gradebook = Gradebook(db_url)
        self.late = AssignLatePenalties(config=config)
        self.late.init_plugin()
        self.students: set[str] = set()
        self._pages = None

    def close(self) -> None:
        self.gradebook.close()

    def _path(self, folder: str, result: Result, extension: str) -> Path:
        return Path(self.coursedir.format_path(folder, result.student, result.assignment)) / (
            result.notebook + extension
        )

    def commit(self, result: Result) -> None:
        needs_page = self._grades(result)
        write_atomically(self._path(self.coursedir.autograded_directory, result, ".ipynb"), result.notebook_json)
        html = result.feedback_html
        if needs_page or not html:
            html = self._gradebook_pages().render(
                result.notebook_json, result.student, result.assignment, result.notebook, db_url=self.db_url
            )
        write_atomically(self._path(self.coursedir.feedback_directory, result, ".html"), html)
        self._exchange_files(result)
        self.ledger.record(result)

    # What `nbgrader collect` files beside a submission, and `nbgrader release_feedback` reads
    # beside each feedback page (nbgrader's autograde and generate_feedback carry them over).
    EXCHANGE_FILES = ("timestamp.txt", "submission_secret.txt")

    def _exchange_files(self, result: Result) -> None:
        submitted = Path(
            self.coursedir.format_path(self.coursedir.submitted_directory, result.student, result.assignment)
        )
        for name in self.EXCHANGE_FILES:
            copies = [
                self._path(folder, result, "").parent / name
                for folder in (self.coursedir.autograded_directory, self.coursedir.feedback_directory)
            ]
            if (submitted / name).is_file():
                text = (submitted / name).read_text(encoding="utf-8")
                for copy in copies:
                    write_atomically(copy, text)
            else:  # removed from the submission: the copies follow (as the gradebook's time does)
                for copy in copies:
                    copy.unlink(missing_ok=True)

    def _grades(self, result: Result) -> bool:
        """The result into the gradebook, one transaction; whether the gradebook knows more than the
        worker did (hand-given scores or comments, a late penalty), so the page must be rendered here."""
        from nbgrader.utils import parse_utc  # here: the grade command starts without it

        gradebook = self.gradebook
        if result.student not in self.students:
            gradebook.update_or_create_student(result.student)
            self.students.add(result.student)
        # the time follows the files: a removed timestamp.txt clears the time an earlier run recorded
        submission = gradebook.update_or_create_submission(
            result.assignment, result.student, timestamp=parse_utc(result.timestamp) if result.timestamp else None
        )
        notebook = gradebook.find_submission_notebook(result.notebook, result.assignment, result.student)
        grades = {grade.name: grade for grade in notebook.grades}
        comments = {comment.name: comment for comment in notebook.comments}
        try:
            for name, (score, _) in result.scores.items():  # SaveAutoGrades._add_score
                grade = grades[name]
                grade.auto_score = score
                grade.needs_manual_grade = grade.manual_score is not None or grade.auto_score is None
            for name, comment_text in result.comments.items():  # SaveAutoGrades._add_comment
                comments[name].auto_comment = comment_text
            notebook.late_submission_penalty = None  # AssignLatePenalties, with its plugin
            if submission.total_seconds_late > 0:
                gradebook.db.flush()
                gradebook.db.refresh(notebook)  # its score, from the grades just written
                notebook.late_submission_penalty = late_penalty(
                    self.late, notebook, result.student, submission.total_seconds_late
                )
            if any(flag in REVIEW_FLAGS for flag in result.flags):
                notebook.flagged = True  # never cleared here: a human's flag stays
            knows_more = bool(
                notebook.late_submission_penalty
                or any(g.manual_score is not None or g.extra_credit for g in grades.values())
                or any(c.manual_comment for c in comments.values())
            )
            gradebook.db.commit()
        except BaseException:
            gradebook.db.rollback()
            raise
        return knows_more

    def _gradebook_pages(self):
        from ..worker.feedback import FeedbackPages  # here: the grade command starts without it

        if self._pages is None:
            self._pages = FeedbackPages(self.config, from_gradebook=True)
        return self._pages


# ---------------------------------------------------------------- the commit loop


@dataclass
class Graded:
    results: list[Result] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    commit_seconds: float = 0.0
    commit_each: list[float] = field(default_factory=list)  # each result's commit, in the order committed
    first_result: float | None = None  # seconds from the start of the command
    interrupted: bool = False


def grade_and_commit(args, course, ledger, runner, jobs: list[Job], runner_draws: bool = True) -> Graded:
    """The runner grades; this process commits each result as it arrives (the one writer).
    ``runner_draws``: the report's charts will be drawn by the runner's ``map`` too."""
    from tqdm import tqdm  # here: the grade command starts without it

    graded = Graded()
    writer = Writer(course.coursedir, course.config, course.db_url, ledger)
    # The report's plotting library is imported while the last notebooks grade: here once a worker
    # (here or on a cluster) has nothing left to do, so that its kernel's memory is free by then,
    # and by each pool process that has nothing left to grade (the charts are drawn there too).
    workers = getattr(runner, "workers", 0)

    def commit(result: Result) -> None:
        began = time.perf_counter()
        writer.commit(result)
        graded.commit_each.append(time.perf_counter() - began)
        graded.commit_seconds += graded.commit_each[-1]
        # kept for the summary, without its notebook and page (on disk now): nothing grows with the class
        graded.results.append(replace(result, notebook_json="", feedback_html=""))
        if len(jobs) - len(graded.results) < workers:
            _warm_matplotlib()
        if graded.first_result is None:
            graded.first_result = time.monotonic() - STARTED
            trace("first result committed")

    try:
        if jobs:
            if not workers or len(jobs) < workers:
                _warm_matplotlib()
            if runner_draws:
                runner.idle(warm_charts)  # each worker too, once it has nothing left to grade
            progress = tqdm(total=len(jobs), unit="nb", disable=args.quiet, file=sys.stderr, dynamic_ncols=True)
            try:
                graded.problems = runner.run(jobs, commit, progress)
            except KeyboardInterrupt:
                graded.interrupted = True  # the workers die with this process; what is committed stays
            finally:
                progress.close()
    finally:
        writer.close()
    trace("last result committed")
    return graded


def record_run(course, graded: Graded, seconds: float) -> None:
    """What this run cost its own process (``coursework/.work/last-run.json``; the benchmark reads it)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    write_atomically(
        course.work / "last-run.json",
        json.dumps(
            {
                "notebooks": len(graded.results),
                "seconds": round(seconds, 3),
                "commit_seconds": round(graded.commit_seconds, 4),
                "commit_each": [round(seconds, 5) for seconds in graded.commit_each],
                "main_cpu_seconds": round(usage.ru_utime + usage.ru_stime, 3),
                "main_peak_mb": round(usage.ru_maxrss / 1024, 1),  # its resident peak (Linux: KiB)
                "first_result_seconds": None if graded.first_result is None else round(graded.first_result, 3),
            }
        ),
    )


_warming: list = []


def _warm_matplotlib() -> None:
    """The report draws with matplotlib's Figure on the Agg canvas (``report.draw``, here or in a
    pool process); importing them while the last workers grade keeps that out of the tail."""

    if _warming:
        return
    _warming.append(True)

    def load():
        try:
            warm_charts()
        except Exception:
            pass

    threading.Thread(target=load, daemon=True).start()
