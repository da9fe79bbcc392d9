"""Before anything is graded: the course read, every output tried, the sandbox and the runner checked, the jobs planned.

The grade command (``autograder.grade``) calls these in order; each either returns what the
next needs or raises ``Refused`` with the reason, before the run has written anything (but for
``hold_course``, the first thing a run writes: its lock and scratch folder).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from course_checks.files import sweep_partial

from ..records import Job, Refused
from ..sandboxing.bubblewrap import Limits, probe
from . import runs
from .collect import Collection
from .course import CourseFolder
from .runners import LocalPool


def read_course(args) -> CourseFolder:
    """The course of the current folder: its nbgrader_config.py, and the source folder it names."""
    root = Path.cwd()
    if not (root / "nbgrader_config.py").is_file():
        raise Refused(
            f"{root} is not a course folder (no nbgrader_config.py): run the command in one, such as a "
            "clone of the course (see the course site: Grading a class, docs/grading.md)"
        )
    try:
        course = CourseFolder(root, args.db)
    except Exception as error:  # the instructor's own configuration file: any error it raises
        raise Refused(f"{root / 'nbgrader_config.py'} cannot be read ({type(error).__name__}: {error})") from None
    if not course.source.is_dir():
        raise Refused(
            f"{course.source} does not exist: the course's source folder (the solution notebooks, "
            "CourseDirectory.source_directory in nbgrader_config.py) is needed to grade"
        )
    known = course.notebooks()
    unknown = [a for a in args.assignments if a not in known]
    if unknown:
        raise Refused(f"unknown assignment(s) {', '.join(unknown)}; known: {', '.join(known)}")
    source = args.source or course.submitted
    if not source.exists() and not getattr(args, "watch", False):  # a watcher collects into it
        raise Refused(f"{source} does not exist: nothing to grade")
    return course


def output_paths(args, course: CourseFolder) -> tuple[Path, Path]:
    reports = Path(course.coursedir.root) / "reports"
    return args.csv or reports / "grades.csv", args.report or reports / "class-report.html"


def check_outputs(args, course: CourseFolder) -> None:
    """Everything the run will write, tried before anything is read, filed or graded."""
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
        import sqlalchemy  # here: for a database that is not SQLite only

        engine = sqlalchemy.create_engine(db_url)
        with engine.connect():
            pass
        engine.dispose()
    except Exception as error:  # any driver's error: the message is what the instructor needs
        return f"cannot connect to {db_url.split('@')[-1]} ({type(error).__name__}: {str(error).splitlines()[0][:200]})"
    return None


def hold_course(args, course: CourseFolder, say):
    """This run's lock on the course and its own scratch folder; leftovers of killed runs go."""
    lock = runs.RunLock(course.work)
    try:
        lock.acquire(wait=max(0.0, args.wait))
    except runs.Busy as busy:
        raise Refused(str(busy)) from None
    except OSError as error:
        raise Refused(f"cannot lock {lock.path} ({error.strerror or error})") from None
    scratch = runs.run_scratch(course.work)
    runs.sweep_orphans(runs.SCRATCH_PREFIX)
    sweep_partial(course.submitted)
    return lock, scratch


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


def choose_runner(args, course: CourseFolder, limits: Limits, sandboxed: bool, address: str | None, host=None):
    """This machine's pool (``host``: its sandbox host, if the command launched it already), or a
    Dask cluster, connected and checked before anything is written."""
    if not address:
        return LocalPool(course.root, limits, sandboxed, args.workers, host=host)
    from .distributed import DaskCluster  # Dask, imported only for a cluster

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
