"""Grade a whole class in one command: ``./course grade`` (``python -m autograder.grade``).

    ./course grade                         # every assignment, from coursework/submitted/
    ./course grade 01_attention            # one assignment
    ./course grade --from class.zip        # a zip (nbgrader layout or LMS-style names)
    ./course grade --workers 4 --cell-timeout 60 --force
    ./course grade --scheduler tcp://10.0.0.5:8786   # on a Dask cluster (``distributed``)
    python -m autograder.grade ...         # the same, from a course folder (its nbgrader_config.py)

Steps: find the submissions (``collect``), make sure the gradebook knows the
assignments (nbgrader's ``generate_assignment``, into a scratch release folder),
snapshot what grading needs (``job.AssignmentSpec``), grade every notebook that
is new or changed in parallel sandboxed workers (``job.grade_submission``; this
machine's own, or a Dask cluster's, see ``distributed``),
commit each result as it arrives through the single ``writer.Writer``, then
export the grades CSV and the class report (``report``) and print a summary.

The sandbox must work (bubblewrap, see ``sandbox``); if it cannot start the
command says why and refuses, unless ``--unsandboxed`` is given.
"""
from __future__ import annotations

import argparse
import concurrent.futures as futures
import hashlib
import json
import multiprocessing
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from . import reference
from .collect import collect
from .identity import code_digest
from .job import AssignmentSpec, Job, Result, grade_in_worker, worker_init, worker_pid
from .sandbox import Limits, probe
from .tamper import GradebookView
from .verdict import expected_checks

PACKAGE = Path(__file__).resolve().parent


class Course:
    """The nbgrader course the command works on: its configuration, folders and gradebook."""

    def __init__(self, root: Path, db_url: str | None = None):
        from nbgrader.coursedir import CourseDirectory
        from traitlets.config.loader import PyFileConfigLoader

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
        from nbgrader.api import Gradebook, MissingEntry
        from nbgrader.apps import NbGraderAPI
        from nbgrader.coursedir import CourseDirectory

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

    def spec(self, assignment: str, notebook: str, limits: Limits) -> AssignmentSpec:
        """Everything grading needs about one notebook, read once here."""
        import nbformat
        from nbgrader.api import Gradebook

        released_path = self.release / assignment / f"{notebook}.ipynb"
        if released_path.is_file():
            released = released_path.read_text(encoding="utf-8")
        else:  # not released into this course folder: the student version nbgrader would make
            released = _student_version(self, assignment, notebook)
        released_nb = nbformat.reads(released, as_version=4)
        order = [c.metadata.get("nbgrader", {}).get("grade_id") for c in released_nb.cells
                 if c.metadata.get("nbgrader", {}).get("grade_id")]
        with Gradebook(self.db_url) as gradebook:
            view = GradebookView.read(gradebook, assignment, notebook, order)
        expected = {c.name: expected_checks(c.source) for c in view.notebook.grade_cells
                    if c.cell_type == "code" and expected_checks(c.source)}
        os.environ["AUTOGRADER_SOLUTIONS"] = str(self.source)
        cells = reference.source_cells(assignment) if notebook == assignment else []
        files = {}
        folder = self.release / assignment
        if folder.is_dir():
            for path in sorted(folder.rglob("*")):
                if path.is_file() and path.suffix != ".ipynb" and ".ipynb_checkpoints" not in path.parts \
                        and path.stat().st_size < 50 * 1024 * 1024:
                    files[str(path.relative_to(folder))] = path.read_bytes().hex()
        arguments = list(self.config.Execute.get("extra_arguments", [])) if "Execute" in self.config else []
        hasher = hashlib.sha256()
        for part in (json.dumps(view.__dict__, default=lambda o: o.__dict__, sort_keys=True), released,
                     json.dumps(cells), json.dumps(files, sort_keys=True), json.dumps(arguments), repr(limits)):
            hasher.update(part.encode())
        hasher.update(code_digest().encode())
        return AssignmentSpec(assignment, notebook, view, released, cells, expected, files, arguments,
                              hasher.hexdigest(), self.config)


def _student_version(course: Course, assignment: str, notebook: str) -> str:
    from .release import generate

    with tempfile.TemporaryDirectory(prefix="course-student-") as scratch:
        generate([assignment], Path(scratch))
        return (Path(scratch) / assignment / f"{notebook}.ipynb").read_text(encoding="utf-8")


_T0 = time.monotonic()


def trace(label: str) -> None:
    """With AUTOGRADER_TRACE=1: when each phase of the command ends (for the benchmark's breakdown)."""
    if os.environ.get("AUTOGRADER_TRACE"):
        print(f"[{time.monotonic() - _T0:7.2f} s] {label}", file=sys.stderr, flush=True)


def default_workers() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


# ---------------------------------------------------------------- running the pool

class WorkerPool:
    """Grading workers: processes that each keep a warm sandbox (``job.worker_init``).

    ``start()`` launches them early, so they import torch and warm their
    sandboxes while this process still reads the gradebook; ``run()`` grades;
    ``close()`` lets them go without waiting, ``join()`` waits for them.
    """

    def __init__(self, course: Course, limits: Limits, sandboxed: bool, workers: int):
        self.course, self.limits, self.sandboxed, self.workers = course, limits, sandboxed, workers
        self.context = multiprocessing.get_context("spawn")
        self.base = Path(tempfile.mkdtemp(prefix="ag-"))
        self.executor: futures.ProcessPoolExecutor | None = None
        self.retired: list[futures.ProcessPoolExecutor] = []

    def start(self, expected_jobs: int | None = None) -> None:
        if self.executor is not None:
            return
        count = self.workers if expected_jobs is None else max(1, min(self.workers, expected_jobs))
        self.executor = futures.ProcessPoolExecutor(
            max_workers=count, mp_context=self.context, initializer=worker_init,
            initargs=(str(self.course.root), self.limits, self.sandboxed, str(self.base)))
        for _ in range(count):  # spawn them all now: each warms up while we prepare the jobs
            self.executor.submit(worker_pid)

    def run(self, jobs: list[Job], on_result, progress=None) -> list[str]:
        """Grade ``jobs``; ``on_result(result)`` here as each finishes; problems in words.

        A worker that dies (it should not: student code runs in the sandbox) is
        replaced and the unfinished jobs are tried again, at most twice.
        """
        problems = []
        pending = {id(job): job for job in jobs}
        attempts: dict[int, int] = {}
        while pending:
            self.start(len(pending))
            running = {self.executor.submit(grade_in_worker, job): key for key, job in pending.items()}
            broken = False
            for future in futures.as_completed(running):
                key = running[future]
                try:
                    result = future.result()
                except futures.process.BrokenProcessPool:
                    broken = True
                    break
                except Exception as error:
                    job = pending.pop(key)
                    problems.append(f"{job.student}/{job.assignment}: grading failed ({type(error).__name__}: {error})")
                    if progress:
                        progress.update(1)
                    continue
                pending.pop(key, None)
                on_result(result)
                if progress:
                    progress.update(1)
            if not broken:
                break
            self.close()
            for key in list(pending):
                attempts[key] = attempts.get(key, 0) + 1
                if attempts[key] > 2:
                    job = pending.pop(key)
                    problems.append(f"{job.student}/{job.assignment}: its grading worker died twice; not graded")
                    if progress:
                        progress.update(1)
        return problems

    def close(self) -> None:
        """Let the workers go (they exit in the background); ``join`` waits for them."""
        if self.executor is not None:
            self.executor.shutdown(wait=False, cancel_futures=True)
            self.retired.append(self.executor)
            self.executor = None

    def join(self) -> None:
        self.close()
        for executor in self.retired:
            executor.shutdown(wait=True)
        self.retired = []
        shutil.rmtree(self.base, ignore_errors=True)


_warming: list = []


def _warm_matplotlib() -> None:
    """The report needs pyplot; importing it while the workers grade keeps it out of the tail."""
    import threading

    if _warming:
        return
    _warming.append(True)

    def load():
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot  # noqa: F401
        except Exception:
            pass
    threading.Thread(target=load, daemon=True).start()


# ---------------------------------------------------------------- the command

def parse_args(argv):
    parser = argparse.ArgumentParser(prog="./course grade", description=__doc__.split("\n\n")[0])
    parser.add_argument("assignments", nargs="*", help="assignment ids (default: all)")
    parser.add_argument("--from", dest="source", type=Path,
                        help="a folder or a .zip of submissions (default: the course's coursework/submitted)")
    parser.add_argument("--workers", type=int, default=default_workers(),
                        help="parallel workers on this machine (default: cores)")
    parser.add_argument("--scheduler", metavar="ADDRESS",
                        help="grade on the Dask cluster of this scheduler, e.g. tcp://10.0.0.5:8786 (default: "
                             "$DASK_SCHEDULER_ADDRESS if set, else this machine's own workers)")
    parser.add_argument("--local", action="store_true",
                        help="grade on this machine even when DASK_SCHEDULER_ADDRESS is set")
    parser.add_argument("--force", action="store_true", help="regrade everything, not only new or changed submissions")
    parser.add_argument("--replace", action="store_true", help="let a zip replace different files in submitted/")
    parser.add_argument("--db", help="gradebook URL, e.g. postgresql://user@host/course (default: nbgrader's sqlite)")
    parser.add_argument("--unsandboxed", action="store_true",
                        help="grade without the sandbox when it cannot start here (student code then runs "
                             "with your rights: only for submissions you trust)")
    parser.add_argument("--cell-timeout", type=float, help="seconds per cell (default: nbgrader's Execute.timeout, 30)")
    parser.add_argument("--notebook-timeout", type=float, default=Limits.notebook_seconds, help="seconds per notebook")
    parser.add_argument("--memory-mb", type=int, default=Limits.memory_mb, help="memory per notebook kernel")
    parser.add_argument("--report", type=Path, help="class report (default: coursework/reports/class-report.html)")
    parser.add_argument("--csv", type=Path, help="grades CSV (default: coursework/reports/grades.csv)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    from tqdm import tqdm

    from .report import export_csv, summary, write_report
    from .writer import Ledger, Writer

    args = parse_args(argv)
    started = time.monotonic()
    _quiet_library_warnings()
    # nbgrader runs tools such as alembic by name: this interpreter's scripts come first.
    os.environ["PATH"] = str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")
    root = Path.cwd() if (Path.cwd() / "nbgrader_config.py").is_file() else PACKAGE.parent
    course = Course(root, args.db)
    say = (lambda text: print(text, file=sys.stderr)) if not args.quiet else (lambda text: None)
    sandboxed = not args.unsandboxed
    address = None if args.local else (args.scheduler or os.environ.get("DASK_SCHEDULER_ADDRESS") or None)
    if sandboxed and not address:  # on a cluster, each worker's sandbox is checked when connecting
        reason = probe(course.root)
        if reason:
            print(f"grade: refusing to run student code without the sandbox: {reason}.\n"
                  "       Fix that, or pass --unsandboxed to grade anyway (student code then runs with "
                  "your rights and can read everything you can).", file=sys.stderr)
            return 2
    if not sandboxed:
        say("grade: WARNING: grading unsandboxed; student code runs with "
            + ("the workers' rights" if address else "your rights"))
    cell_seconds = args.cell_timeout
    if cell_seconds is None:
        cell_seconds = float(course.config.Execute.get("timeout", 30)) if "Execute" in course.config else 30.0
    limits = Limits(cell_seconds=cell_seconds, notebook_seconds=args.notebook_timeout, memory_mb=args.memory_mb)
    notebooks = course.notebooks()
    unknown = [a for a in args.assignments if a not in notebooks]
    if unknown:
        print(f"grade: unknown assignment(s) {', '.join(unknown)}; known: {', '.join(notebooks)}", file=sys.stderr)
        return 2
    wanted = set(args.assignments) or None
    source = args.source or course.submitted
    if not source.exists():
        print(f"grade: {source} does not exist: nothing to grade", file=sys.stderr)
        return 2
    cluster = None
    if address:  # before anything is read or written: an unusable cluster changes nothing
        from .distributed import DaskCluster

        cluster = DaskCluster(address, sandboxed)
        problem = cluster.connect()
        if problem:
            print(f"grade: {problem}\n       Nothing was graded or written.", file=sys.stderr)
            return 2
    trace("configuration read, sandbox probed")
    collection = collect(source, notebooks, wanted, course.config, course.submitted, course.work / "incoming",
                         replace=args.replace)
    trace("submissions collected")
    ledger = Ledger(course.work / "grading.sqlite")
    done = ledger.state()
    digests = {id(s): s.digest() for s in collection.submissions}
    pool = cluster or WorkerPool(course, limits, sandboxed, args.workers)
    changed = [s for s in collection.submissions
               if args.force or done.get((s.student, s.assignment, s.notebook), ("",))[0] != digests[id(s)]]
    if changed:  # warm the workers up while the gradebook is read
        pool.start(len(changed))
        _warm_matplotlib()
    interrupted = False
    try:
        assignments = sorted({s.assignment for s in collection.submissions})
        notes = course.register(assignments) if assignments else []
        specs = {(a, n): course.spec(a, n, limits) for a in assignments for n in notebooks[a]}
        graded_in_book = _graded_in_gradebook(course)
        trace("gradebook read, assignments snapshot")
        jobs, skipped = [], 0
        for submission in collection.submissions:
            spec = specs[(submission.assignment, submission.notebook)]
            digest = digests[id(submission)]
            key = (submission.student, submission.assignment, submission.notebook)
            if not args.force and done.get(key) == (digest, spec.fingerprint) and key in graded_in_book:
                skipped += 1
                continue
            jobs.append(Job(submission.student, submission.assignment, submission.notebook, submission.read(),
                            submission.source_name, digest, spec, limits, submission.timestamp,
                            list(submission.notes), list(submission.flags)))
        for note in notes + collection.messages:
            say(f"grade: {note}")
        where = cluster.describe() if cluster else f"{min(args.workers, max(1, len(jobs)))} worker(s)"
        say(f"grade: {len(jobs)} notebook(s) to grade, {skipped} unchanged since the last run; "
            f"{where}, {'sandboxed' if sandboxed else 'UNSANDBOXED'}")
        writer = Writer(course.coursedir, course.config, course.db_url, ledger)
        results: list[Result] = []

        def commit(result: Result) -> None:
            writer.commit(result)
            results.append(result)
            if len(results) == 1:
                trace("first result committed")

        problems = []
        if jobs:
            _warm_matplotlib()
            progress = tqdm(total=len(jobs), unit="nb", disable=args.quiet, file=sys.stderr, dynamic_ncols=True)
            try:
                problems = pool.run(jobs, commit, progress)
            except KeyboardInterrupt:
                progress.close()
                print(f"grade: interrupted after {len(results)} notebook(s); run the same command again to "
                      "grade the rest", file=sys.stderr)
                pool.close()
                interrupted = True  # the workers die with this process; what is committed stays
                return 130
            finally:
                progress.close()
        writer.close()
        trace("last result committed")
        pool.close()  # the workers wind down while the CSV and the report are written
        reports = Path(course.coursedir.root) / "reports"
        csv_path = args.csv or reports / "grades.csv"
        report_path = args.report or reports / "class-report.html"
        rows = export_csv(course, ledger, csv_path)
        write_report(course, ledger, rows, report_path)
        trace("CSV and report written")
        print(summary(course, rows, ledger_summaries=ledger.summaries(), graded_now=results, skipped=skipped,
                      problems=problems + collection.messages, seconds=time.monotonic() - started,
                      csv_path=csv_path, report_path=report_path))
        return 1 if problems else 0
    finally:
        ledger.close()
        if not interrupted:
            pool.join()
            trace("workers gone")


def _quiet_library_warnings() -> None:
    """nbgrader's own API warns on every new submission (SQLAlchemy autoflush), nbformat on
    duplicated cell ids (which a submission may well have): noise on the instructor's screen."""
    import warnings

    warnings.filterwarnings("ignore", message=".*not in session.*")
    warnings.filterwarnings("ignore", message=".*Non-unique cell id.*")


def _graded_in_gradebook(course: Course) -> set:
    """(student, assignment, notebook) that have autograded scores in the gradebook."""
    from nbgrader.api import Gradebook, Grade, Notebook, SubmittedAssignment, SubmittedNotebook, Assignment, Student

    found = set()
    try:
        with Gradebook(course.db_url) as gradebook:
            rows = (gradebook.db.query(Student.id, Assignment.name, Notebook.name)
                    .select_from(SubmittedNotebook)
                    .join(SubmittedAssignment, SubmittedNotebook.assignment_id == SubmittedAssignment.id)
                    .join(Student, SubmittedAssignment.student_id == Student.id)
                    .join(Assignment, SubmittedAssignment.assignment_id == Assignment.id)
                    .join(Notebook, SubmittedNotebook.notebook_id == Notebook.id)
                    .join(Grade, Grade.notebook_id == SubmittedNotebook.id)
                    .filter(Grade.auto_score.isnot(None)).distinct().all())
            found = {tuple(row) for row in rows}
    except Exception:
        pass
    return found


if __name__ == "__main__":
    sys.exit(main())
