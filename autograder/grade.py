"""Grade a whole class in one command: ``./course grade`` (``python -m autograder.grade``).

    ./course grade                         # every assignment, from coursework/submitted/
    ./course grade 01_attention            # one assignment
    ./course grade --from class.zip        # a zip (nbgrader layout or LMS-style names)
    ./course grade --workers 4 --cell-timeout 60 --force
    ./course grade --scheduler tcp://10.0.0.5:8786   # on a Dask cluster (``distributed``)
    python -m autograder.grade ...         # the same, from a course folder (its nbgrader_config.py)

``main`` reads as its steps: read the course (``course.CourseFolder``), try
every place the run will write (``check_outputs``), refuse
to run student code without the sandbox (``bubblewrap.probe``) unless told, choose
where to grade (a ``runners.Runner``: this machine's ``LocalPool`` or a Dask
cluster, ``distributed``; a cluster is checked before anything is written),
hold the course for this run alone, with its own scratch folder, removing what
killed runs left (``runs.RunLock``),
find the submissions (``collect``), plan the jobs (new or changed submissions,
each with its notebook's snapshot, ``job.AssignmentSpec``), grade them
(workers grade and render each notebook's feedback) while this process commits
each result as it arrives through the single ``writer.Writer``, then export the
grades CSV and the class report (``report``) and print a summary.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import REPOSITORY
from .engine.collect import Collection, collect
from .engine.course import CourseFolder
from .engine.job import Job, Result
from .sandboxing.bubblewrap import Limits, probe

_T0 = time.monotonic()


def trace(label: str) -> None:
    """With AUTOGRADER_TRACE=1: when each phase of the command ends."""
    if os.environ.get("AUTOGRADER_TRACE"):
        print(f"[{time.monotonic() - _T0:7.2f} s] {label}", file=sys.stderr, flush=True)


def default_workers() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="./course grade", description=__doc__.split("\n\n")[0])
    parser.add_argument("assignments", nargs="*", help="assignment ids (default: all)")
    parser.add_argument(
        "--from",
        dest="source",
        type=Path,
        help="a folder or a .zip of submissions (default: the course's coursework/submitted)",
    )
    parser.add_argument(
        "--workers", type=int, default=default_workers(), help="parallel workers on this machine (default: cores)"
    )
    parser.add_argument(
        "--scheduler",
        metavar="ADDRESS",
        help="grade on the Dask cluster of this scheduler, e.g. tcp://10.0.0.5:8786 (default: "
        "$DASK_SCHEDULER_ADDRESS if set, else this machine's own workers)",
    )
    parser.add_argument(
        "--local", action="store_true", help="grade on this machine even when DASK_SCHEDULER_ADDRESS is set"
    )
    parser.add_argument("--force", action="store_true", help="regrade everything, not only new or changed submissions")
    parser.add_argument("--replace", action="store_true", help="let a zip replace different files in submitted/")
    parser.add_argument("--db", help="gradebook URL, e.g. postgresql://user@host/course (default: nbgrader's sqlite)")
    parser.add_argument(
        "--unsandboxed",
        action="store_true",
        help="grade without the sandbox when it cannot start here (student code then runs "
        "with your rights: only for submissions you trust)",
    )
    parser.add_argument("--cell-timeout", type=float, help="seconds per cell (default: nbgrader's Execute.timeout, 30)")
    parser.add_argument("--notebook-timeout", type=float, default=Limits.notebook_seconds, help="seconds per notebook")
    parser.add_argument("--memory-mb", type=int, default=Limits.memory_mb, help="memory per notebook kernel")
    parser.add_argument("--report", type=Path, help="class report (default: coursework/reports/class-report.html)")
    parser.add_argument("--csv", type=Path, help="grades CSV (default: coursework/reports/grades.csv)")
    parser.add_argument(
        "--wait",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="when another run is grading this course, wait up to this long for it "
        "(default: refuse at once, naming it)",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    return parser.parse_args(argv)


class Refused(Exception):
    """The command cannot run as asked; the message says why. Nothing was written."""


# ---------------------------------------------------------------- the steps


def read_course(args) -> CourseFolder:
    """The course of the current folder (its nbgrader_config.py), else this repository's."""
    root = Path.cwd() if (Path.cwd() / "nbgrader_config.py").is_file() else REPOSITORY
    course = CourseFolder(root, args.db)
    known = course.notebooks()
    unknown = [a for a in args.assignments if a not in known]
    if unknown:
        raise Refused(f"unknown assignment(s) {', '.join(unknown)}; known: {', '.join(known)}")
    source = args.source or course.submitted
    if not source.exists():
        raise Refused(f"{source} does not exist: nothing to grade")
    return course


def output_paths(args, course: CourseFolder) -> tuple[Path, Path]:
    reports = Path(course.coursedir.root) / "reports"
    return args.csv or reports / "grades.csv", args.report or reports / "class-report.html"


def check_outputs(args, course: CourseFolder) -> None:
    """Everything the run will write, tried before anything is read, filed or graded."""
    from .engine import runs

    csv_path, report_path = output_paths(args, course)
    coursedir = course.coursedir
    problems = [("--csv", runs.check_file(csv_path)), ("--report", runs.check_file(report_path))]
    database = runs.sqlite_path(course.db_url)
    if database is not None:
        problems.append(("gradebook (--db)", runs.check_file(database)))
    else:
        problems.append(("gradebook (--db)", _database_problem(course.db_url)))
    for folder in (
        course.work,
        course.submitted,
        Path(coursedir.root) / coursedir.autograded_directory,
        Path(coursedir.root) / coursedir.feedback_directory,
    ):
        problems.append(("course folder", runs.check_folder(folder)))
    found = [f"{what}: {problem}" for what, problem in problems if problem]
    if found:
        raise Refused(
            "cannot write where this run must write:\n       "
            + "\n       ".join(found)
            + "\n       Nothing was graded or written."
        )


def _database_problem(db_url: str) -> str | None:
    try:
        import sqlalchemy

        engine = sqlalchemy.create_engine(db_url)
        with engine.connect():
            pass
        engine.dispose()
    except Exception as error:  # any driver's error: the message is what the instructor needs
        return f"cannot connect to {db_url.split('@')[-1]} ({type(error).__name__}: {str(error).splitlines()[0][:200]})"
    return None


def hold_course(args, course: CourseFolder, say):
    """This run's lock on the course and its own scratch folder; leftovers of killed runs go."""
    from .engine import runs
    from .engine.collect import sweep_partial

    lock = runs.RunLock(course.work)
    try:
        lock.acquire(wait=max(0.0, args.wait))
    except runs.Busy as busy:
        raise Refused(str(busy)) from None
    except OSError as error:
        raise Refused(f"cannot lock {lock.path} ({error.strerror or error})") from None
    scratch = runs.run_scratch(course.work)
    runs.sweep_temporary()
    sweep_partial(course.submitted)
    return lock, scratch


def scheduler_address(args) -> str | None:
    return None if args.local else (args.scheduler or os.environ.get("DASK_SCHEDULER_ADDRESS") or None)


def require_sandbox(course: CourseFolder, sandboxed: bool, address: str | None, say) -> None:
    """Refuse to run student code unsandboxed unless told (on a cluster each worker is checked)."""
    if sandboxed and not address:
        reason = probe(course.root)
        if reason:
            raise Refused(
                f"refusing to run student code without the sandbox: {reason}.\n"
                "       Fix that, or pass --unsandboxed to grade anyway (student code then runs with "
                "your rights and can read everything you can)."
            )
    if not sandboxed:
        say(
            "grade: WARNING: grading unsandboxed; student code runs with "
            + ("the workers' rights" if address else "your rights")
        )


def grading_limits(args, course: CourseFolder) -> Limits:
    cell_seconds = args.cell_timeout
    if cell_seconds is None:
        cell_seconds = float(course.config.Execute.get("timeout", 30)) if "Execute" in course.config else 30.0
    return Limits(cell_seconds=cell_seconds, notebook_seconds=args.notebook_timeout, memory_mb=args.memory_mb)


def choose_runner(args, course: CourseFolder, limits: Limits, sandboxed: bool, address: str | None):
    """This machine's pool, or a Dask cluster, connected and checked before anything is written."""
    if not address:
        from .engine.runners import LocalPool

        return LocalPool(course.root, limits, sandboxed, args.workers)
    from .engine.distributed import DaskCluster

    cluster = DaskCluster(address, sandboxed)
    problem = cluster.connect()
    if problem:
        raise Refused(f"{problem}\n       Nothing was graded or written.")
    return cluster


@dataclass
class Plan:
    jobs: list[Job]
    skipped: int
    notes: list[str] = field(default_factory=list)


def plan_jobs(args, course: CourseFolder, collection: Collection, done: dict, limits: Limits, runner) -> Plan:
    """A job per submission that is new or changed (its file, or anything its grading depends on)."""
    digests, readable = {}, []
    for submission in collection.submissions:  # a file that vanished or cannot be read costs only itself
        try:
            digests[id(submission)] = submission.digest()
            readable.append(submission)
        except OSError as error:
            collection.messages.append(f"{submission.source_name}: skipped, cannot be read ({error.strerror or error})")
    collection.submissions = readable
    changed = [
        s
        for s in collection.submissions
        if args.force or done.get((s.student, s.assignment, s.notebook), ("",))[0] != digests[id(s)]
    ]
    if changed:  # the workers warm up while the gradebook is read
        runner.start(len(changed))
    assignments = sorted({s.assignment for s in collection.submissions})
    notes = course.register(assignments) if assignments else []
    notebooks = course.notebooks()
    specs = {(a, n): course.spec(a, n, limits) for a in assignments for n in notebooks[a]}
    graded_in_book = course.graded_in_gradebook()
    jobs, skipped = [], 0
    for submission in collection.submissions:
        spec = specs[(submission.assignment, submission.notebook)]
        digest = digests[id(submission)]
        key = (submission.student, submission.assignment, submission.notebook)
        if not args.force and done.get(key) == (digest, spec.fingerprint) and key in graded_in_book:
            skipped += 1
            continue
        try:
            data = submission.read()
        except OSError as error:
            collection.messages.append(f"{submission.source_name}: skipped, cannot be read ({error.strerror or error})")
            continue
        jobs.append(
            Job(
                submission.student,
                submission.assignment,
                submission.notebook,
                data,
                submission.source_name,
                digest,
                spec,
                limits,
                submission.timestamp,
                list(submission.notes),
                list(submission.flags),
            )
        )
    return Plan(jobs, skipped, notes + collection.messages)


@dataclass
class Graded:
    results: list[Result] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    commit_seconds: float = 0.0
    first_result: float | None = None  # seconds from the start of the command
    interrupted: bool = False


def grade_and_commit(args, course: CourseFolder, ledger, runner, jobs: list[Job]) -> Graded:
    """The runner grades; this process commits each result as it arrives (the one writer)."""
    from tqdm import tqdm

    from .judging.writer import Writer

    graded = Graded()
    writer = Writer(course.coursedir, course.config, course.db_url, ledger)
    # The report's plotting library is imported while the last notebooks grade: once a local
    # worker has nothing left to do (its memory is free by then); on a cluster, at once.
    workers = getattr(runner, "workers", 0)

    def commit(result: Result) -> None:
        began = time.perf_counter()
        writer.commit(result)
        graded.commit_seconds += time.perf_counter() - began
        graded.results.append(result)
        if len(jobs) - len(graded.results) < workers:
            _warm_matplotlib()
        if graded.first_result is None:
            graded.first_result = time.monotonic() - _T0
            trace("first result committed")

    try:
        if jobs:
            if not workers or len(jobs) < workers:
                _warm_matplotlib()
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


def record_run(course: CourseFolder, graded: Graded, seconds: float) -> None:
    """What this run cost its own process (``coursework/.work/last-run.json``; the benchmark reads it)."""
    from .judging.writer import write_atomically

    usage = resource.getrusage(resource.RUSAGE_SELF)
    write_atomically(
        course.work / "last-run.json",
        json.dumps(
            {
                "notebooks": len(graded.results),
                "seconds": round(seconds, 3),
                "commit_seconds": round(graded.commit_seconds, 4),
                "main_cpu_seconds": round(usage.ru_utime + usage.ru_stime, 3),
                "first_result_seconds": None if graded.first_result is None else round(graded.first_result, 3),
            }
        ),
    )


def main(argv=None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    quiet_library_warnings()
    # nbgrader runs tools such as alembic by name: this interpreter's scripts come first.
    os.environ["PATH"] = str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")
    say = (lambda text: print(text, file=sys.stderr)) if not args.quiet else (lambda text: None)
    for stream in (sys.stdout, sys.stderr):  # a file name that is not valid text still prints
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
    sandboxed, address = not args.unsandboxed, scheduler_address(args)
    try:
        course = read_course(args)
        check_outputs(args, course)
        require_sandbox(course, sandboxed, address, say)
        limits = grading_limits(args, course)
        runner = choose_runner(args, course, limits, sandboxed, address)
    except Refused as refusal:
        print(f"grade: {refusal}", file=sys.stderr)
        return 2
    try:
        lock, scratch = hold_course(args, course, say)  # the first thing this run writes
    except Refused as refusal:
        runner.close()
        runner.join()
        print(f"grade: {refusal}", file=sys.stderr)
        return 2
    try:
        return _graded_run(args, course, limits, runner, scratch, sandboxed, say, started)
    finally:
        lock.release()


def _graded_run(args, course, limits, runner, scratch, sandboxed, say, started) -> int:
    from .judging.report import export_csv, summary, write_report
    from .judging.writer import Ledger

    trace("configuration read, sandbox probed")
    try:
        collection = collect(
            args.source or course.submitted,
            course.notebooks(),
            set(args.assignments) or None,
            course.config,
            course.submitted,
            scratch,
            replace=args.replace,
        )
    except (ValueError, OSError) as error:
        runner.close()
        runner.join()
        print(f"grade: {error}; nothing was graded", file=sys.stderr)
        return 2
    trace("submissions collected")
    ledger = Ledger(course.work / "grading.sqlite")
    graded = Graded()
    try:
        plan = plan_jobs(args, course, collection, ledger.state(), limits, runner)
        trace("gradebook read, assignments snapshot")
        for note in plan.notes:
            say(f"grade: {note}")
        say(
            f"grade: {len(plan.jobs)} notebook(s) to grade, {plan.skipped} unchanged since the last run; "
            f"{runner.describe(len(plan.jobs))}, {'sandboxed' if sandboxed else 'UNSANDBOXED'}"
        )
        graded = grade_and_commit(args, course, ledger, runner, plan.jobs)
        if graded.interrupted:
            print(
                f"grade: interrupted after {len(graded.results)} notebook(s); run the same command again to "
                "grade the rest",
                file=sys.stderr,
            )
            runner.close()
            return 130
        runner.close()  # the workers wind down while the CSV and the report are written
        csv_path, report_path = output_paths(args, course)
        rows = export_csv(course, ledger, csv_path)
        write_report(course, ledger, rows, report_path)
        trace("CSV and report written")
        seconds = time.monotonic() - started
        record_run(course, graded, seconds)
        print(
            summary(
                course,
                rows,
                ledger_summaries=ledger.summaries(),
                graded_now=graded.results,
                skipped=plan.skipped,
                problems=graded.problems + collection.messages,
                seconds=seconds,
                csv_path=csv_path,
                report_path=report_path,
            )
        )
        return 1 if graded.problems or collection.messages else 0
    finally:
        ledger.close()
        if not graded.interrupted:
            runner.join()
            trace("workers gone")


# ---------------------------------------------------------------- helpers

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


def quiet_library_warnings() -> None:
    """nbgrader's own API warns on every new submission (SQLAlchemy autoflush), nbformat on
    duplicated cell ids (which a submission may well have): noise on the instructor's screen."""
    import warnings

    warnings.filterwarnings("ignore", message=".*not in session.*")
    warnings.filterwarnings("ignore", message=".*Non-unique cell id.*")


if __name__ == "__main__":
    sys.exit(main())
