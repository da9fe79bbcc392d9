"""Grade a whole class in one command: ``./course grade`` (``python -m autograder.grade``).

    ./course grade                         # every assignment, from coursework/submitted/
    ./course grade 01_attention            # one assignment
    ./course grade --from class.zip        # a zip (nbgrader layout or LMS-style names)
    ./course grade --from class.zip --lms canvas --roster roster.csv   # a platform's download (``engine.lms``)
    ./course grade export --lms canvas     # the platform's gradebook import CSV
    ./course grade --workers 4 --cell-timeout 60 --force
    ./course grade --scheduler tcp://10.0.0.5:8786   # on a Dask cluster (``distributed``)
    ./course grade --watch --interval 10   # grade on submit, from nbgrader's exchange (``engine.watch``)
    course-grade ...                       # the same, installed (pip): from a course folder
    python -m autograder.grade ...         # the same (a course folder: its nbgrader_config.py)

This module is the command line; ``main`` reads as its steps, each in ``engine``: read the
course (``plan.read_course``), try every place the run will write (``plan.check_outputs``),
refuse to run student code without the sandbox unless told (``plan.require_sandbox``), choose
where to grade (``plan.choose_runner``: this machine's ``runners.LocalPool`` or a Dask cluster,
``distributed``; a cluster is checked before anything is written), hold the course for this run
alone, with its own scratch folder, removing what killed runs left (``plan.hold_course``), find
the submissions (``collect``), plan the jobs (``plan.plan_jobs``: new or changed submissions,
each with its notebook's snapshot), grade them (workers run each notebook through
``worker.pipeline``) while this process commits each result as it arrives through the single
writer (``writer.grade_and_commit``), then export the grades CSV and the class report
(``report``) and print a summary.
"""

from __future__ import annotations

import argparse
import atexit
import os
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path

# The command line is parsed before the engine is imported (nbgrader, Dask: seconds of imports),
# so that --help and a mistyped option answer at once.
from .sandboxing.bubblewrap import SCRATCH_PREFIX, Limits, SandboxHost


def default_workers() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


def course_version() -> str:
    """The course's version (the grader's package metadata; the site and the course's package agree)."""
    from importlib.metadata import version

    return version("attention-transformers-grader")


def parse_args(argv):
    # named as the instructor called it: ./course grade, or the installed console script
    prog = "course-grade" if Path(sys.argv[0]).name == "course-grade" else "./course grade"
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("assignments", nargs="*", help="assignment ids (default: all)")
    parser.add_argument("--version", action="version", version=f"course-grade {course_version()}")
    parser.add_argument(
        "--from",
        dest="source",
        type=Path,
        help="a folder or a .zip of submissions (default: the course's coursework/submitted)",
    )
    parser.add_argument(
        "--lms",
        choices=["canvas", "moodle"],
        help="--from is that learning platform's download of submissions (its own file names)",
    )
    parser.add_argument(
        "--roster", type=Path, help="with --lms: a CSV with the columns lms_id,student_id (the platform's ids)"
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
    watching = parser.add_argument_group("grade on submit (a JupyterHub with nbgrader's exchange)")
    watching.add_argument(
        "--watch",
        action="store_true",
        help="collect from the exchange, grade what is new and release its feedback, every --interval seconds",
    )
    watching.add_argument("--interval", type=float, default=10.0, metavar="SECONDS", help="between passes (default 10)")
    watching.add_argument(
        "--feedback",
        default="diagnosis",
        choices=["full", "diagnosis", "after-due"],
        help="what a student gets back before the assignment's due date: the full page with points, "
        "the diagnosis without points (default), or nothing; after it, the full page",
    )
    watching.add_argument("--once", action="store_true", help="with --watch: one pass, then exit (for a timer)")
    args = parser.parse_args(argv)
    if (args.lms or args.roster) and not args.source:
        parser.error("--lms and --roster read a platform's download: give it with --from")
    if args.roster and not args.lms:
        parser.error("--roster maps a platform's ids: say which platform with --lms")
    if args.watch and args.source:
        parser.error("--watch collects from nbgrader's exchange; --from is for a folder or a zip")
    if args.watch and args.scheduler:
        parser.error("--watch grades on this machine")
    return args


# The exit status of the command, once ``main`` has returned it (``_end_at_once`` reads it).
_ENDED: list[int] = []


def _end_at_once() -> None:
    """The last exit handler (registered first): the command's output out, the process ends with its status.

    By then every other exit handler has run (the pool's fork server's folder removed, logs flushed): what
    is left is the interpreter tearing down its 1,500 modules one by one, 0.4 s at the end of every run.
    """
    if not _ENDED:
        return  # main did not return (an exception): the usual ending, with its traceback
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed, or a reader that went away
            pass
    os._exit(_ENDED[-1])


def main(argv=None) -> int:
    atexit.register(_end_at_once)  # before anything else registers one: it runs last
    status = _main(argv)
    _ENDED.append(status)
    return status


def _main(argv) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["export"]:
        return export(argv[1:])
    args = parse_args(argv)
    host = early_host(args)
    try:
        status = _run(args, host)
    finally:
        if host is not None and not host.adopted:  # refused before a pool took it over
            host.close()
            shutil.rmtree(host.base, ignore_errors=True)
    return status


def scheduler_address(args) -> str | None:
    return None if args.local else (args.scheduler or os.environ.get("DASK_SCHEDULER_ADDRESS") or None)


def early_host(args) -> SandboxHost | None:
    """As root, grading on this machine in the sandbox: the sandbox host, which every local worker's
    interpreter is forked from, launched first thing. It imports torch and the kernel's machinery
    (about 2 s) on one core while this process imports nbgrader and reads the course on the other;
    launched with the pool (``LocalPool.start``), it was the last thing the first notebook waited
    for. None otherwise (a refused run closes it and removes its folder)."""
    if args.unsandboxed or args.watch or scheduler_address(args) or os.geteuid() != 0:
        return None
    if not Path("nbgrader_config.py").is_file():  # not a course folder: refused below
        return None
    base = Path(tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{os.getpid()}-"))  # swept by a later run if killed
    host = SandboxHost(Path.cwd(), base, Limits())  # of the limits, the host's sandbox uses only its own
    try:
        host.launch()
    except OSError:  # no bubblewrap: the sandbox's probe says so below
        shutil.rmtree(base, ignore_errors=True)
        return None
    return host


def _run(args, host: SandboxHost | None) -> int:
    from .engine.collect import printable_lines
    from .engine.plan import (
        check_outputs,
        choose_runner,
        grading_limits,
        hold_course,
        read_course,
        require_sandbox,
    )
    from .records import Refused

    started = time.monotonic()
    quiet_library_warnings()
    # nbgrader runs tools such as alembic by name: this interpreter's scripts come first.
    os.environ["PATH"] = str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")
    # what a submission named (a file, a folder) may hold terminal control sequences: never printed raw
    say = (lambda text: print(printable_lines(text), file=sys.stderr)) if not args.quiet else (lambda text: None)
    for stream in (sys.stdout, sys.stderr):  # a file name that is not valid text still prints
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
    sandboxed, address = not args.unsandboxed, scheduler_address(args)
    try:
        course = read_course(args)
        check_outputs(args, course)
        require_sandbox(course, sandboxed, address, say)
        limits = grading_limits(args, course)
        if args.watch:
            from .engine.watch import watch  # here: the grade command starts without it

            return watch(args, course, limits, sandboxed, address, say)
        runner = choose_runner(args, course, limits, sandboxed, address, host)
        if host is not None:
            host.adopted = True  # the pool closes it
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
    from .engine.collect import collect, printable_lines
    from .engine.plan import output_paths, plan_jobs
    from .engine.report import export_csv, summary, write_report
    from .engine.runs import trace
    from .engine.writer import Graded, Ledger, grade_and_commit, record_run

    trace("configuration read, sandbox probed")
    try:
        plugin = None
        if args.lms:
            from .engine.lms import collector  # here: the grade command starts without it

            plugin = collector(args.lms, course.config, args.roster)
        collection = collect(
            args.source or course.submitted,
            course.notebooks(),
            set(args.assignments) or None,
            course.config,
            course.submitted,
            scratch,
            replace=args.replace,
            plugin=plugin,
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
        csv_path, report_path = output_paths(args, course)
        rows = export_csv(course, ledger, csv_path)
        write_report(course, ledger, rows, report_path, map_charts=runner.map)  # the idle workers draw
        trace("CSV and report written")
        runner.close()
        seconds = time.monotonic() - started
        record_run(course, graded, seconds)
        print(
            printable_lines(
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
        )
        return 1 if graded.problems or collection.messages else 0
    finally:
        ledger.close()
        if not graded.interrupted:
            runner.join()
            trace("workers gone")


def export(argv) -> int:
    """``course-grade export --lms canvas``: the gradebook's totals as the platform's import CSV."""
    prog = "course-grade export" if Path(sys.argv[0]).name == "course-grade" else "./course grade export"
    parser = argparse.ArgumentParser(prog=prog, description=export.__doc__.split(": ", 1)[1])
    parser.add_argument("--lms", choices=["canvas"], required=True, help="the platform whose import format to write")
    parser.add_argument("--roster", type=Path, help="a CSV with lms_id,student_id (and name, sis_user_id, ...)")
    parser.add_argument("--db", help="gradebook URL (default: nbgrader's sqlite)")
    parser.add_argument("--csv", type=Path, help="where (default: coursework/reports/<lms>-grades.csv)")
    args = parser.parse_args(argv)
    from .engine.lms import Roster, canvas_gradebook  # here: the grade command starts without it
    from .engine.plan import read_course
    from .records import Refused

    try:
        course = read_course(argparse.Namespace(db=args.db, assignments=[], source=None))
        roster = Roster(args.roster)
        path = args.csv or Path(course.coursedir.root) / "reports" / f"{args.lms}-grades.csv"
        students = canvas_gradebook(course, roster, path)
    except (Refused, ValueError, OSError) as error:
        print(f"grade export: {error}", file=sys.stderr)
        return 2
    print(f"{students} student(s) written to {path} (Canvas: Grades, Import)")
    return 0


def quiet_library_warnings() -> None:
    """nbgrader's own API warns on every new submission (SQLAlchemy autoflush), nbformat on
    duplicated cell ids (which a submission may well have): noise on the instructor's screen."""

    warnings.filterwarnings("ignore", message=".*not in session.*")
    warnings.filterwarnings("ignore", message=".*Non-unique cell id.*")


if __name__ == "__main__":
    sys.exit(main())
