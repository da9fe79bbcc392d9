"""Grade on submit: ``course-grade --watch`` collects, grades and hands back feedback, pass after pass.

Each pass (every ``--interval`` seconds), holding the course's run lock (``runs.RunLock``) for
the pass only, so a ``course-grade`` typed meanwhile waits for it (``--wait``) or is told:

1. collect: nbgrader's own ``collect --update`` for every assignment (``exchange.Inbox``); a
   student's latest submission replaces the earlier one, as nbgrader's rule says;
2. grade: only the submissions that pass filed (the first pass: every submission that is new or
   changed since the ledger last saw it, as ``course-grade`` does), through the same planner,
   runner and single writer as ``course-grade`` (``plan``, ``runners``, ``writer``); a student
   who submitted fifty times since the last pass is graded once, for the latest;
3. hand back: nbgrader's ``release_feedback`` for each student whose page is new, as the
   instructor's ``--feedback`` setting says (``Handback``):
   - ``full``: the full page, with points, at once;
   - ``diagnosis`` (the default): the page without points (``diagnosis.diagnosis_page``) until
     the assignment's due date in the gradebook, then the full page, for everyone;
   - ``after-due``: nothing until the due date, then the full page.
   What was handed back is recorded (``coursework/.work/watch.sqlite``) only after it was, and
   is compared each pass with what the ledger says was graded, so a pass killed at any moment is
   finished by the next; releasing the same page twice changes nothing for the student.
4. the grades CSV and the class report, as ``course-grade`` writes them, once per pass that graded.

A submission the grader itself fails on (its worker raised or died; nbgrader's and the
worker's own "could not be graded" pages are ordinary results) is tried in two passes, then gets
a one-line page and is left alone until the student submits again. One watcher per course
(``coursework/.work/watch.lock``): a second refuses, naming the first, or waits (``--wait``).
The log (``coursework/.work/watch.log``) rotates at 1 MB, three old files kept. On a terminal,
``--watch`` redraws one screen: the setting, the last pass and the latest hand-backs, newest first;
elsewhere (a hub's service log, systemd's journal) it prints one line per event.
"""

from __future__ import annotations

import argparse
import logging
import logging.handlers
import os
import shutil
import signal
import sqlite3
import sys
import time
from collections import deque
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from course_checks.files import write_atomically

from ..records import Refused
from . import runs
from .collect import from_tree, printable_line
from .diagnosis import diagnosis_page, one_line_page
from .exchange import SECRET, STAMP, Inbox, Outbox

POLICIES = ("full", "diagnosis", "after-due")
FAILED_PASSES = 2  # a submission the grader fails on this many times gets its one-line page
LOG_BYTES, LOG_FILES = 1_000_000, 3


@dataclass
class Event:
    when: float
    student: str
    assignment: str
    what: str


class HandedBack:
    """What the watcher released, and what the grader failed on (``coursework/.work/watch.sqlite``)."""

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(str(path), timeout=60)
        self.db.execute("""CREATE TABLE IF NOT EXISTS released (
            student TEXT, assignment TEXT, version TEXT, kind TEXT, released_at REAL,
            PRIMARY KEY (student, assignment))""")
        self.db.execute("""CREATE TABLE IF NOT EXISTS failed (
            student TEXT, assignment TEXT, stamp TEXT, passes INTEGER,
            PRIMARY KEY (student, assignment))""")
        self.db.commit()

    def released(self) -> dict:
        return {
            (s, a): (v, k) for s, a, v, k in self.db.execute("SELECT student, assignment, version, kind FROM released")
        }

    def record(self, student: str, assignment: str, version: str, kind: str) -> None:
        with self.db:
            self.db.execute(
                "INSERT OR REPLACE INTO released VALUES (?, ?, ?, ?, ?)",
                (student, assignment, version, kind, time.time()),
            )

    def failures(self) -> dict:
        return {
            (s, a): (t, n) for s, a, t, n in self.db.execute("SELECT student, assignment, stamp, passes FROM failed")
        }

    def failed(self, student: str, assignment: str, stamp: str) -> int:
        before = self.failures().get((student, assignment))
        passes = before[1] + 1 if before and before[0] == stamp else 1
        with self.db:
            self.db.execute("INSERT OR REPLACE INTO failed VALUES (?, ?, ?, ?)", (student, assignment, stamp, passes))
        return passes

    def close(self) -> None:
        self.db.close()


def read_stamp(folder: Path) -> str:
    path = folder / STAMP
    return path.read_text(encoding="utf-8", errors="replace").strip() if path.is_file() else ""


class Handback:
    """Releases each student's page as the ``--feedback`` setting says, through nbgrader's exchange."""

    def __init__(self, course, policy: str, outbox: Outbox, state: HandedBack, log: logging.Logger):
        self.course, self.policy, self.outbox, self.state, self.log = course, policy, outbox, state, log
        root = Path(course.coursedir.root)
        self.feedback = root / course.coursedir.feedback_directory
        self.pages = course.work / "watch" / "pages"  # diagnosis and one-line pages, laid out as feedback/

    def due_dates(self) -> dict:
        from nbgrader.api import Gradebook  # here: the grade command starts without it

        with Gradebook(self.course.db_url) as gradebook:
            return {a.name: a.duedate for a in gradebook.assignments}

    def kind(self, due) -> str | None:
        """What a student gets now: the full page, the diagnosis, or nothing yet."""
        if self.policy == "full" or (due is not None and due <= datetime.now(UTC).replace(tzinfo=None)):
            return "full"
        return "diagnosis" if self.policy == "diagnosis" else None

    def graded(self, ledger) -> dict:
        """(student, assignment) -> when it was last graded, from the ledger (all notebooks)."""
        latest = {}
        for student, assignment, graded_at in ledger.db.execute("SELECT student, assignment, graded_at FROM graded"):
            latest[(student, assignment)] = max(graded_at, latest.get((student, assignment), 0.0))
        return latest

    def hand_back(self, ledger) -> list[Event]:
        """Release every page whose version or kind differs from what was released."""
        events = []
        due = self.due_dates()
        released = self.state.released()
        for (student, assignment), graded_at in sorted(self.graded(ledger).items()):
            kind = self.kind(due.get(assignment))
            folder = self.feedback / student / assignment
            if kind is None or not (folder / SECRET).is_file():  # held until the due date; or not from the exchange
                continue
            version = f"{graded_at:.6f}"
            if released.get((student, assignment)) == (version, kind):
                continue
            source = self.feedback
            if kind == "diagnosis":
                source = self._stage(folder, student, assignment, due.get(assignment))
            try:
                self.outbox.release(source, student, assignment)
            except Exception as error:  # the exchange's own errors, a file it cannot read: this student only
                events.append(Event(time.time(), student, assignment, f"feedback NOT released ({error})"))
                continue
            self.state.record(student, assignment, version, kind)
            events.append(Event(time.time(), student, assignment, self._said(kind, folder)))
        return events

    def _stage(self, folder: Path, student: str, assignment: str, due) -> Path:
        when = f"after the due date, {due:%Y-%m-%d %H:%M} UTC" if due else "once your instructor sets a due date"
        target = self.pages / student / assignment
        if target.exists():
            shutil.rmtree(target)
        for page in folder.glob("*.html"):
            write_atomically(target / page.name, diagnosis_page(page.read_text(encoding="utf-8"), when))
        for name in (STAMP, SECRET):
            write_atomically(target / name, folder / name)
        return self.pages

    def _said(self, kind: str, folder: Path) -> str:
        stamp = read_stamp(folder)
        late = ""
        try:
            from nbgrader.utils import parse_utc  # here: the grade command starts without it

            late = f" ({time.time() - parse_utc(stamp).replace(tzinfo=UTC).timestamp():.0f} s after submit)"
        except (ValueError, OverflowError, TypeError):
            pass
        return {"full": "full page released", "diagnosis": "diagnosis released (no points yet)"}[kind] + late

    def one_line(self, student: str, assignment: str, notebooks: list[str], reason: str) -> Event:
        """The page of a submission the grader failed on, released at once whatever the setting."""
        submitted = self.course.submitted / student / assignment
        target = self.pages / student / assignment
        if target.exists():
            shutil.rmtree(target)
        for notebook in notebooks:
            write_atomically(target / f"{notebook}.html", one_line_page(notebook, reason))
        for name in (STAMP, SECRET):
            if (submitted / name).is_file():
                write_atomically(target / name, submitted / name)
        if not (target / SECRET).is_file():
            return Event(
                time.time(), student, assignment, f"could not be graded ({reason}); no page (not from the exchange)"
            )
        try:
            self.outbox.release(self.pages, student, assignment)
        except Exception as error:  # the exchange's own errors: this student only
            return Event(time.time(), student, assignment, f"could not be graded; page NOT released ({error})")
        return Event(time.time(), student, assignment, f"could not be graded ({reason}); its one-line page released")


# ---------------------------------------------------------------- the screen and the log


def open_log(course) -> logging.Logger:
    log = logging.getLogger(f"course-grade.watch.{course.root}")
    log.setLevel(logging.INFO)
    log.propagate = False
    if not log.handlers:
        course.work.mkdir(parents=True, exist_ok=True)
        handler = logging.handlers.RotatingFileHandler(
            course.work / "watch.log", maxBytes=LOG_BYTES, backupCount=LOG_FILES, encoding="utf-8"
        )
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        log.addHandler(handler)
    return log


class Screen:
    """One screen on a terminal (redrawn each pass), one line per event elsewhere."""

    def __init__(self, header: str, stream=None):
        self.stream = stream or sys.stdout
        self.header = header
        self.tty = self.stream.isatty()
        self.events: deque[Event] = deque(maxlen=200)
        self.status = "starting"
        if not self.tty:
            self._print(header)

    def _print(self, text: str) -> None:
        print(text, file=self.stream, flush=True)

    def show(self, events: list[Event], status: str) -> None:
        self.status = status
        self.events.extendleft(events)
        if not self.tty:
            for event in events:
                self._print(line(event))
            return
        rows = shutil.get_terminal_size((100, 30)).lines - 5
        shown = [line(event) for event in list(self.events)[: max(rows, 1)]]
        self.stream.write("\033[H\033[2J" + "\n".join([self.header, status, "", *shown]) + "\n")
        self.stream.flush()


def line(event: Event) -> str:
    """One event on the screen, whatever a submission named (its control characters escaped)."""
    when = time.strftime("%H:%M:%S", time.localtime(event.when))
    return printable_line(f"{when}  {event.student:<16} {event.assignment:<22} {event.what}")


# ---------------------------------------------------------------- the loop


def watch(args, course, limits, sandboxed: bool, address: str | None, say) -> int:
    """Pass after pass until stopped (``--once``: one pass, for a timer)."""
    if args.feedback not in POLICIES:
        raise Refused(f"--feedback must be one of {', '.join(POLICIES)}")
    watcher = runs.RunLock(course.work, "watch.lock", "watcher")
    try:
        watcher.acquire(wait=max(0.0, args.wait))
    except runs.Busy as busy:
        raise Refused(str(busy)) from None
    log = open_log(course)
    signal.signal(signal.SIGTERM, _stop)  # a hub or systemd stops its service so: end as Ctrl-C does
    state = HandedBack(course.work / "watch.sqlite")
    inbox, outbox = Inbox(course, log), Outbox(course, log)
    handback = Handback(course, args.feedback, outbox, state, log)
    screen = Screen(
        f"course-grade --watch: {course.coursedir.course_id} in {course.root}, every {args.interval:g} s; "
        f"feedback: {describe(args.feedback)}; log {course.work / 'watch.log'}"
    )
    log.info("watching %s (pid %s), feedback %s, every %s s", course.root, os.getpid(), args.feedback, args.interval)
    runs.sweep_orphans(runs.SCRATCH_PREFIX)  # what killed runs left in $TMPDIR
    first = True
    try:
        while True:
            began = time.monotonic()
            try:
                events, status = one_pass(args, course, limits, sandboxed, address, inbox, handback, state, first, log)
                first = False
            except Refused as refusal:  # another run holds the course past --wait: try again next pass
                events, status = [], f"pass skipped: {refusal}"
            except Exception as error:  # a pass that breaks: logged, and the next pass tries again
                log.exception("pass failed")
                events, status = [], f"pass failed ({type(error).__name__}: {error}); see the log"
            for event in events:
                log.info("%s/%s: %s", event.student, event.assignment, event.what)
            took = time.monotonic() - began
            status = f"last pass {time.strftime('%H:%M:%S')} ({took:.1f} s): {status}"
            screen.show(events, status if args.once else f"{status}; next in {max(0.0, args.interval - took):.0f} s")
            if args.once:
                return 0
            time.sleep(max(0.5, args.interval - took))
    except KeyboardInterrupt:
        log.info("stopped")
        return 0
    finally:
        state.close()
        watcher.release()


def _stop(signum, frame):
    raise KeyboardInterrupt


def describe(policy: str) -> str:
    return {
        "full": "full pages with points, at once",
        "diagnosis": "the diagnosis without points until each due date, then the full pages",
        "after-due": "nothing until each due date, then the full pages",
    }[policy]


def one_pass(args, course, limits, sandboxed, address, inbox, handback, state, everything: bool, log):
    """Collect, grade what is new, hand back; (events, a status line)."""
    from .plan import output_paths
    from .report import export_csv, write_report  # matplotlib: imported once a pass has graded
    from .writer import Ledger

    lock = runs.RunLock(course.work)
    try:
        lock.acquire(wait=max(0.0, args.wait))
    except runs.Busy as busy:
        raise Refused(str(busy)) from None
    ledger = Ledger(course.work / "grading.sqlite")
    try:
        filed, problems = inbox.collect(sorted(course.notebooks()))
        for problem in problems:
            log.warning(problem)
        events = [
            Event(time.time(), s, a, f"collected (submitted {read_stamp(course.submitted / s / a)})")
            for s, a in sorted(filed)
        ]
        graded, failed = _grade(args, course, limits, sandboxed, address, ledger, state, filed, everything, log)
        events += [Event(time.time(), r.student, r.assignment, _scored(r)) for r in graded]
        events += [handback.one_line(s, a, course.notebooks()[a], reason) for s, a, reason in failed]
        events += handback.hand_back(ledger)
        if graded:  # after the hand-back: a student waits for none of this
            csv_path, report_path = output_paths(args, course)
            write_report(course, ledger, export_csv(course, ledger, csv_path), report_path)  # drawn here
        released = sum("released" in event.what for event in events)
        return events, f"{len(filed)} collected, {len(graded)} graded, {released} released"
    finally:
        ledger.close()
        lock.release()


def _grade(args, course, limits, sandboxed, address, ledger, state, filed, everything, log):
    """Grade the submissions this pass filed (the first pass: every new or changed one), and those the
    grader failed on once; (results, [(student, assignment, reason) given up on now])."""
    from .plan import choose_runner, plan_jobs
    from .writer import grade_and_commit

    if not course.submitted.is_dir():
        return [], []
    collection = from_tree(course.submitted, course.notebooks(), None)
    failures = state.failures()
    wanted = []
    for submission in collection.submissions:
        key = (submission.student, submission.assignment)
        stamp, (failed_stamp, passes) = read_stamp(course.submitted / key[0] / key[1]), failures.get(key, ("", 0))
        if failed_stamp == stamp and passes >= FAILED_PASSES:
            continue  # its one-line page is out: until the student submits again
        if everything or key in filed or failed_stamp == stamp:
            wanted.append(submission)
    if not wanted:
        return [], []
    collection.submissions = wanted
    pass_args = argparse.Namespace(**{**vars(args), "quiet": True, "force": args.force and everything})
    runner = choose_runner(pass_args, course, limits, sandboxed, address)
    try:
        plan = plan_jobs(pass_args, course, collection, ledger.state(), limits, runner)
        result = grade_and_commit(pass_args, course, ledger, runner, plan.jobs, runner_draws=False)
    finally:
        runner.close()
        runner.join()
    if result.interrupted:
        raise KeyboardInterrupt
    for note in plan.notes:
        log.warning(note)
    done = {(r.student, r.assignment) for r in result.results}
    given_up = []
    for key in sorted({(job.student, job.assignment) for job in plan.jobs} - done):
        passes = state.failed(*key, read_stamp(course.submitted / key[0] / key[1]))
        said = [p.split(": ", 1)[1] for p in result.problems if p.startswith(f"{key[0]}/{key[1]}:")]
        reason = said[0] if said else "the grader failed on it"
        log.error("%s/%s: %s (pass %d of %d)", *key, reason, passes, FAILED_PASSES)
        if passes >= FAILED_PASSES:
            given_up.append((*key, "the grader failed on it"))
    return result.results, given_up


def _scored(result) -> str:
    if not result.graded:
        return f"graded: could not be graded ({'; '.join(result.messages)[:120]})"
    score = sum(s or 0.0 for s, _ in result.scores.values())
    top = sum(m or 0.0 for _, m in result.scores.values())
    return f"graded {result.notebook}: {score:g}/{top:g} points"
