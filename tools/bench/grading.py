"""Benchmark of ``./course grade``: ``./course bench grading`` (``python tools/bench/grading.py``).

    ./course bench grading [--students 2] [--classes clean,mixed] [--skip-stock] [--skip-distributed]
                           [--writer 400] [--keep DIR]
    ./course bench grading --phases [--students 2] [--notebooks 00_start_here,...] [--against CHECKOUT]
                           [--window 20]

For each class (``clean``: every answer right; ``mixed``: most right, some with
one or two exercises wrong, a few broken: a syntax error, the untouched release,
a file cut off mid-save), ``--students`` students over every released notebook
are graded on this machine, each row on a fresh copy of the class:

- stock nbgrader: ``nbgrader autograde`` then ``generate_feedback`` per assignment;
- ``./course grade`` with 1 and with 2 local workers;
- ``./course grade --scheduler`` on a local 2-worker Dask cluster
  (``./course scheduler`` and ``./course worker``, started before the clock).

Per row: wall time, notebooks per second, the grade command's main process
per notebook (seconds its single writer spent committing, and its CPU seconds:
what bounds the command however many workers grade), peak memory (summed over
the process tree; on Dask the cluster's scheduler and nannies apart), and whether
its grades agree with stock nbgrader's. The wall time is a run's of its own: the
peak memory and the CPU seconds come from a second run on a fresh copy, sampled
(reading every process's pages ten times a second takes a third of a core).
Before anything is timed, the grader's own packages are compiled to bytecode
(``compile_grader``), as stock nbgrader's are in site-packages.

``--writer N`` also commits N synthetic results (a graded notebook, its scores
and its feedback page, as a worker makes them) through the real writer into a
fresh gradebook: the notebooks per second one writer sustains. From that and
the measured worker seconds per notebook a sizing table follows: minutes to
grade a class of a given size with a given number of workers. Nothing is asserted.

``--phases`` grades a clean class with 1 and with ``--workers`` local workers and prints, per
phase of a notebook's grading (``autograder.worker.phases``: the kernel's fork and boot, the
referee, the cells, the judge, the substitutes, the checks, the interpreter's check, sanitizing,
feedback, the writer), the median seconds per notebook and its share of the wall time, with their
sum, the wall time and the rest. The workers time the phases as they grade (``Result.phases``, in
the ledger). ``--against CHECKOUT`` grades the same class made from another checkout (set up with
its own ``./course setup``) with that checkout's grader too; a release without the timing points
shows what every release records (kernels, cells, the rest, the writer's mean). Each run also
prints its flatness: the first ``--window`` notebooks graded against the last, each notebook's
seconds over its assignment's median (``--students 10`` over 00-09 is a class of 100).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import nbformat

REPOSITORY = Path(__file__).resolve().parents[2]  # tools/bench/grading.py
# the tests' harness (synthetic classes, the local Dask cluster) is the benchmark's too
sys.path.insert(0, str(REPOSITORY / "tests"))


# ---------------------------------------------------------------- the class


def make_course(root: Path, only: list[str] | None = None, repository: Path = REPOSITORY) -> list[str]:
    """A course copy in ``root`` (``repository``'s config and solutions, a fresh gradebook and release);
    its assignments."""
    from nbgrader.apps import NbGraderAPI
    from nbgrader.coursedir import CourseDirectory
    from traitlets.config.loader import PyFileConfigLoader

    root.mkdir(parents=True, exist_ok=True)
    shutil.copy(repository / "nbgrader_config.py", root)
    shutil.copytree(repository / "solutions", root / "solutions", ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    (root / "coursework").mkdir(exist_ok=True)
    config = PyFileConfigLoader("nbgrader_config.py", path=str(root)).load_config()
    os.environ["PATH"] = str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")
    api = NbGraderAPI(CourseDirectory(config=config), config=config)
    assignments = only or sorted(p.name for p in (root / "solutions").iterdir() if (p / f"{p.name}.ipynb").is_file())
    for assignment in assignments:
        result = api.generate_assignment(assignment, force=True, create=True)
        if not result["success"]:
            raise RuntimeError(result["error"])
    return assignments


def _answer_cells(notebook) -> dict:
    return {
        c.metadata["nbgrader"]["grade_id"]: c
        for c in notebook.cells
        if c.metadata.get("nbgrader", {}).get("solution") and not c.metadata["nbgrader"].get("grade")
    }


def _bug(kind: str, stub: str, reference: str) -> str:
    """A wrong answer of the given kind, from the released stub or the reference answer."""
    if kind == "unfinished":
        return stub
    if kind == "no-return":
        return stub.replace("raise NotImplementedError()", "pass")
    if kind == "crash":
        return stub.replace("raise NotImplementedError()", "return undefined_helper(locals())")
    if kind == "syntax-error":
        return reference.rstrip() + "\n    return (\n"
    raise ValueError(kind)


def submit_class(root: Path, assignments: list[str], students: int, seed: int, clean: bool = False) -> dict:
    """Write every student's submissions (``clean``: every answer right); {kind: count}."""
    rng = random.Random(seed)
    counts: dict[str, int] = {}
    for assignment in assignments:
        released = nbformat.read(root / "notebooks" / assignment / f"{assignment}.ipynb", as_version=4)
        solution = nbformat.read(root / "solutions" / assignment / f"{assignment}.ipynb", as_version=4)
        references = {gid: cell.source for gid, cell in _answer_cells(solution).items()}
        for number in range(students):
            student = f"student{number:03d}"
            draw = rng.random()
            notebook = nbformat.from_dict(json.loads(json.dumps(released)))
            answers = _answer_cells(notebook)
            for gid, cell in answers.items():
                cell.source = references[gid]
            names = sorted(answers)
            if clean or draw < 0.55:
                kind = "correct"
            elif draw < 0.75:
                kind = "one exercise wrong"
                gid = rng.choice(names)
                answers[gid].source = _bug(
                    rng.choice(["unfinished", "no-return", "crash"]),
                    _answer_cells(released)[gid].source,
                    references[gid],
                )
            elif draw < 0.87:
                kind = "two exercises wrong"
                for gid in rng.sample(names, min(2, len(names))):
                    answers[gid].source = _bug(
                        rng.choice(["unfinished", "no-return", "crash"]),
                        _answer_cells(released)[gid].source,
                        references[gid],
                    )
            elif draw < 0.93:
                kind = "syntax error"
                gid = rng.choice(names)
                answers[gid].source = _bug("syntax-error", "", references[gid])
            elif draw < 0.97:
                kind = "untouched"
                notebook = released
            else:
                kind = "cut off mid-save"
            counts[kind] = counts.get(kind, 0) + 1
            folder = root / "coursework" / "submitted" / student / assignment
            folder.mkdir(parents=True, exist_ok=True)
            text = nbformat.writes(notebook)
            if kind == "cut off mid-save":
                text = text[: len(text) // 3]
            (folder / f"{assignment}.ipynb").write_text(text, encoding="utf-8")
    return counts


# ---------------------------------------------------------------- measuring


def _pss(pid: int) -> int | None:
    """Proportional set size in bytes: shared pages count once in all (forked kernels share torch).
    None where this user may not read it; 0 for a process that is ending or gone (its resident
    size, still shown while it exits, would count every shared page whole)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as rollup:
            for line in rollup:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except PermissionError:
        return None
    except (OSError, ValueError, IndexError):
        return 0
    return 0


class PeakMemory:
    """Highest memory of this process's descendants, summed, sampled 10 times a second; and their CPU.

    ``peak_mb`` sums their proportional set sizes (a page shared by n processes
    counts 1/n to each: what the tree really holds); ``peak_rss_mb`` sums their
    resident sizes (a page shared by forked kernels counts once per process).
    ``cpu_seconds`` sums the CPU time each descendant had used when last seen:
    it counts processes whose parent never waits for them (a fork server's
    children, a sandbox's kernels), which the kernel's own accounting of
    waited-for children misses; only the last tenth of a second of each is lost.
    """

    def __init__(self, apart: set[int] | None = None):
        self.peak_mb = 0.0
        self.peak_rss_mb = 0.0
        # processes counted apart (a Dask cluster's scheduler and nanny, with their resource
        # trackers): their own peak, left out of the others'; whatever they start is counted as usual
        self.apart = apart or set()
        self.peak_apart_mb = 0.0
        self._ticks: dict[tuple[int, int], int] = {}  # (pid, start time) -> CPU ticks
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _counted_apart(self, pid: int, parent: int | None) -> bool:
        """One of ``apart``, or a resource tracker one of them started."""
        if pid in self.apart:
            return True
        if parent not in self.apart:
            return False
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                return b"resource_tracker" in cmdline.read()
        except OSError:
            return False

    def _tree_mb(self) -> tuple[float, float, float]:
        parents, rss, ticks = {}, {}, {}
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                with open(f"/proc/{name}/stat") as stat:
                    fields = stat.read().rsplit(")", 1)[1].split()
                parents[int(name)] = int(fields[1])
                rss[int(name)] = int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
                ticks[int(name)] = (int(fields[19]), int(fields[11]) + int(fields[12]))  # start, utime + stime
            except (OSError, IndexError, ValueError):
                continue
        me, total, proportional, apart = os.getpid(), 0, 0, 0
        for pid in rss:
            ancestor, depth = parents.get(pid), 0
            while ancestor and ancestor != me and depth < 50:
                ancestor, depth = parents.get(ancestor), depth + 1
            if ancestor == me:
                started, used = ticks[pid]
                self._ticks[(pid, started)] = max(self._ticks.get((pid, started), 0), used)
                pss = _pss(pid)
                if self._counted_apart(pid, parents.get(pid)):
                    apart += rss[pid] if pss is None else pss
                    continue
                total += rss[pid]
                proportional += rss[pid] if pss is None else pss
        return proportional / 2**20, total / 2**20, apart / 2**20

    def _run(self):
        while not self._stop.wait(0.1):
            pss, rss, apart = self._tree_mb()
            self.peak_mb, self.peak_rss_mb = max(self.peak_mb, pss), max(self.peak_rss_mb, rss)
            self.peak_apart_mb = max(self.peak_apart_mb, apart)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    @property
    def cpu_seconds(self) -> float:
        return sum(self._ticks.values()) / os.sysconf("SC_CLK_TCK")


def _run(
    command: list[str], cwd: Path, python: str = sys.executable, apart: set[int] | None = None
) -> tuple[float, tuple[float, float, float], float, subprocess.CompletedProcess]:
    """(wall seconds, (peak PSS MB, peak RSS MB, peak PSS MB of the processes ``apart``), CPU seconds
    of the whole process tree, the result); ``python``'s environment first on PATH. The wall time is
    that of a sampled run: see ``_timed``."""
    with PeakMemory(apart) as memory:
        seconds, result = _timed(command, cwd, python)
    return seconds, (memory.peak_mb, memory.peak_rss_mb, memory.peak_apart_mb), memory.cpu_seconds, result


def _timed(command: list[str], cwd: Path, python: str = sys.executable) -> tuple[float, subprocess.CompletedProcess]:
    """(wall seconds, the result) of a run nothing else measures. ``PeakMemory`` reads every process's
    pages ten times a second: a third of a core here, which a run that keeps both cores busy (two
    workers) loses, 3 s of a class's 15 (stock nbgrader, one notebook at a time, 4%)."""
    env = {**os.environ, "PATH": str(Path(python).parent) + os.pathsep + os.environ.get("PATH", "")}
    started = time.perf_counter()
    result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
    return time.perf_counter() - started, result


def timed_then_sampled(
    command: list[str], courses: tuple[Path, Path], apart: set[int] | None = None
) -> tuple[float, tuple[float, float, float], float, subprocess.CompletedProcess]:
    """``_run``'s figures, the wall time from a run of its own on ``courses[0]`` and the memory and CPU
    from a second, sampled run on ``courses[1]`` (a fresh copy); the first run's result."""
    wall, result = _timed(command, courses[0])
    _, memory, cpu, _ = _run(command, courses[1], apart=apart)
    return wall, memory, cpu, result


def grades(root: Path) -> dict:
    from nbgrader.api import Gradebook

    found = {}
    with Gradebook(f"sqlite:///{root / 'coursework' / 'gradebook.db'}") as gradebook:
        for assignment in gradebook.assignments:
            for submission in assignment.submissions:
                for notebook in submission.notebooks:
                    for grade in notebook.grades:
                        found[(submission.student.id, assignment.name, grade.name)] = grade.score
    return found


def run_stats(root: Path) -> dict:
    """What the grade command recorded about its own run (``coursework/.work/last-run.json``)."""
    path = root / "coursework" / ".work" / "last-run.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def sandboxes_started(root: Path) -> int:
    """Sandboxes the run started (from the ledger): one per worker while every notebook leaves its
    sandbox reusable, more when some were retired."""
    import sqlite3

    with sqlite3.connect(root / "coursework" / ".work" / "grading.sqlite") as db:
        summaries = [json.loads(summary) for (summary,) in db.execute("SELECT summary FROM graded")]
    return len({(s.get("worker"), s.get("sandbox_launch")) for s in summaries})


def worker_seconds(root: Path) -> list[float]:
    """Seconds each notebook took on its worker (from the ledger)."""
    import sqlite3

    with sqlite3.connect(root / "coursework" / ".work" / "grading.sqlite") as db:
        return [json.loads(summary).get("seconds", 0.0) for (summary,) in db.execute("SELECT summary FROM graded")]


# ---------------------------------------------------------------- the rows


class BenchRow:
    def __init__(
        self, label: str, wall: float, notebooks: int, memory: tuple, cpu: float, stats: dict | None, agree: str = ""
    ):
        self.label, self.wall, self.notebooks, self.memory, self.cpu = label, wall, notebooks, memory, cpu
        self.stats, self.agree = stats, agree
        self.sandboxes: int | None = None
        self.apart = ""  # what the row's peak leaves out, in words

    def line(self) -> str:
        rate = self.notebooks / self.wall if self.wall else 0.0
        if self.stats:
            commit = f"{self.stats['commit_seconds'] / max(1, self.stats['notebooks']):>13.3f}"
            main = f"{self.stats['main_cpu_seconds'] / max(1, self.stats['notebooks']):>13.3f}"
        else:
            commit = main = f"{'-':>13}"
        sandboxes = f"{self.sandboxes:>10}" if self.sandboxes is not None else f"{'-':>10}"
        return (
            f"{self.label:<34}{self.wall:>8.1f}{rate:>8.2f}{commit}{main}{self.memory[0]:>9.0f}"
            f"{self.cpu:>8.1f}{sandboxes}  {self.agree}"
        )


HEADER = (
    f"{'':<34}{'wall s':>8}{'nb/s':>8}{'commit s/nb':>13}{'main CPU/nb':>13}{'peak MB':>9}{'CPU s':>8}"
    f"{'sandboxes':>10}  grades"
)


def stock_row(courses: tuple[Path, Path], assignments: list[str], notebooks: int) -> BenchRow:
    """Each step timed in a run of its own, then run again on the second copy for its memory and CPU."""
    nbgrader = str(Path(sys.executable).parent / "nbgrader")
    wall, peak, cpu = 0.0, (0.0, 0.0), 0.0
    for assignment in assignments:
        for step in ("autograde", "generate_feedback"):
            seconds, memory, used, result = timed_then_sampled([nbgrader, step, assignment, "--force"], courses)
            wall, peak, cpu = wall + seconds, (max(peak[0], memory[0]), max(peak[1], memory[1])), cpu + used
            if result.returncode:
                last = (result.stderr.strip().splitlines() or [""])[-1][:160]
                print(
                    f"  stock nbgrader {step} {assignment} exited {result.returncode} "
                    f"(it does when a submission cannot be graded): {last}",
                    flush=True,
                )
    return BenchRow("stock nbgrader (one by one)", wall, notebooks, peak, cpu, None)


GRADE = [sys.executable, "-m", "autograder.grade", "--quiet"]


def ours_row(courses: tuple[Path, Path], notebooks: int, workers: int, reference: dict | None) -> BenchRow:
    course = courses[0]
    wall, memory, cpu, result = timed_then_sampled(GRADE + ["--local", "--workers", str(workers)], courses)
    if result.returncode:
        print(result.stdout[-1500:], result.stderr[-1500:])
    row = BenchRow(
        f"./course grade, {workers} worker(s)",
        wall,
        notebooks,
        memory,
        cpu,
        run_stats(course),
        agreement(reference, grades(course)),
    )
    row.sandboxes = sandboxes_started(course)
    return row


def dask_row(courses: tuple[Path, Path], notebooks: int, workers: int, reference: dict | None, logs: Path) -> BenchRow:
    from local_cluster import LocalCluster

    course = courses[0]
    with LocalCluster(logs) as cluster:
        cluster.start_worker("bench", "--nworkers", str(workers))
        cluster.wait_for_workers(workers)
        # the scheduler and the worker command (its nannies): the cluster's own, counted apart; the
        # worker processes the nannies start grade, and are counted with the grade command
        own = {process.pid for process in cluster.processes.values()}
        wall, memory, cpu, result = timed_then_sampled(GRADE + ["--scheduler", cluster.address], courses, own)
    if result.returncode:
        print(result.stdout[-1500:], result.stderr[-1500:])
    row = BenchRow(
        f"./course grade on Dask, {workers} workers",
        wall,
        notebooks,
        memory,
        cpu,
        run_stats(course),
        agreement(reference, grades(course)),
    )
    row.sandboxes = sandboxes_started(course)
    row.apart = f"the Dask cluster's own processes (scheduler, nannies), apart: {memory[2]:.0f} MB at their peak"
    return row


def agreement(reference: dict | None, found: dict) -> str:
    if reference is None:
        return f"{len(found)} cells"
    same = sum(1 for key in reference if key in found and abs((reference[key] or 0) - (found[key] or 0)) < 1e-9)
    return f"{same}/{len(reference)} as stock"


# ---------------------------------------------------------------- the writer alone


def writer_rate(base: Path, count: int) -> float:
    """Notebooks per second the real writer commits: ``count`` synthetic results of one assignment
    (the reference notebook, its scores, comments and feedback page made once, as a worker would)."""
    from autograder.engine.course import CourseFolder
    from autograder.engine.writer import Ledger, Writer
    from autograder.grade import quiet_library_warnings
    from autograder.records import Result
    from autograder.worker.feedback import FeedbackPages
    from autograder.worker.verdicts import grades_of

    quiet_library_warnings()
    root = base / "writer"
    assignment = "01_attention"
    shutil.rmtree(root, ignore_errors=True)
    make_course(root, [assignment])
    course = CourseFolder(root)
    released = nbformat.read(root / "notebooks" / assignment / f"{assignment}.ipynb", as_version=4)
    solution = nbformat.read(root / "solutions" / assignment / f"{assignment}.ipynb", as_version=4)
    for gid, cell in _answer_cells(released).items():
        cell.source = _answer_cells(solution)[gid].source
    text = nbformat.writes(released)
    scores, comments = grades_of(released)
    page = FeedbackPages(course.config).render(
        text, "student", assignment, assignment, grades=scores, comments=comments
    )
    ledger = Ledger(course.work / "grading.sqlite")
    writer = Writer(course.coursedir, course.config, course.db_url, ledger)
    try:
        started = time.perf_counter()
        for number in range(count):
            writer.commit(
                Result(
                    f"student{number:05d}",
                    assignment,
                    assignment,
                    f"{number}",
                    "x",
                    True,
                    text,
                    feedback_html=page,
                    scores=scores,
                    comments=comments,
                )
            )
        return count / (time.perf_counter() - started)
    finally:
        writer.close()
        ledger.close()


def sizing(worker_s: float, rate: float, start_s: float) -> list[str]:
    """Minutes for students x notebooks x workers: the workers' share, or the writer's if it is slower."""
    lines = [f"{'students':>9}{'notebooks':>10}{'workers':>8}{'minutes':>9}  (bound)"]
    for students in (40, 200, 1000):
        for notebooks in (8,):
            for workers in (2, 8, 32, 128):
                total = students * notebooks
                graders, writer = total * worker_s / workers, total / rate
                minutes = (start_s + max(graders, writer)) / 60
                lines.append(
                    f"{students:>9}{notebooks:>10}{workers:>8}{minutes:>9.1f}  "
                    f"({'writer' if writer > graders else 'workers'})"
                )
    return lines


# ---------------------------------------------------------------- where a notebook's time goes (--phases)


def graded_in_order(root: Path) -> list[dict]:
    """Each graded notebook's summary from the ledger, in the order the writer committed them."""
    import sqlite3

    with sqlite3.connect(root / "coursework" / ".work" / "grading.sqlite") as db:
        rows = db.execute("SELECT summary FROM graded ORDER BY graded_at").fetchall()
    return [json.loads(summary) for (summary,) in rows]


def notebook_phases(root: Path) -> list[dict]:
    """Per graded notebook: ``phases`` (seconds per phase, as its worker recorded them, and its
    commit by the writer), ``wall`` (its worker's seconds and its commit), ``kernel`` and ``cells``
    (the figures every release records) and ``flags``."""
    summaries = graded_in_order(root)
    stats = run_stats(root)
    commits = stats.get("commit_each")
    if commits is None or len(commits) != len(summaries):  # a release before the timing points: the mean
        commits = [stats.get("commit_seconds", 0.0) / max(1, len(summaries))] * len(summaries)
    found = []
    for summary, commit in zip(summaries, commits):
        phases = {**(summary.get("phases") or {}), "writer": commit}
        found.append(
            {
                "phases": phases,
                "wall": summary.get("seconds", 0.0) + commit,
                "kernel": summary.get("kernel_seconds", 0.0),
                "cells": summary.get("cell_seconds", 0.0),
                "worker": summary.get("seconds", 0.0),
                "flags": summary.get("flags", []),
            }
        )
    return found


def flatness(root: Path, window: int) -> str:
    """Whether anything grows with the class: each notebook's seconds on its worker over the median of
    its assignment's (notebooks differ), the first ``window`` graded against the last ``window``."""
    import sqlite3

    with sqlite3.connect(root / "coursework" / ".work" / "grading.sqlite") as db:
        rows = db.execute("SELECT assignment, summary FROM graded ORDER BY graded_at").fetchall()
    seconds = [(assignment, json.loads(summary).get("seconds", 0.0)) for assignment, summary in rows]
    if len(seconds) < 2 * window:
        return f"flatness: {len(seconds)} notebooks, fewer than twice the window of {window}: not measured"
    typical: dict[str, list[float]] = {}
    for assignment, took in seconds:
        typical.setdefault(assignment, []).append(took)
    median_of = {assignment: statistics.median(values) for assignment, values in typical.items()}
    relative = [took / median_of[assignment] for assignment, took in seconds if median_of[assignment] > 0]
    first, last = statistics.median(relative[:window]), statistics.median(relative[-window:])
    return (
        f"flatness: of {len(seconds)} notebooks in the order graded, the first {window} took {first:.3f} and the "
        f"last {window} {last:.3f} of their assignment's median (medians; last/first {last / first:.3f})"
    )


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0


def _cell(values: list[float], total: float) -> str:
    """A phase's median seconds per notebook and its share of the notebooks' summed wall time."""
    share = sum(values) / total if total else 0.0
    return f"{_median(values):>10.3f}{share:>8.1%}"


def phases_table(columns: dict[str, list[dict]]) -> list[str]:
    """Rows: each phase, their sum, the notebook's wall time and the rest; a column per run."""
    from autograder.worker.phases import PHASES

    lines = [f"{'phase':<34}" + "".join(f"{label:>18}" for label in columns)]
    lines.append(f"{'':<34}" + f"{'median s':>10}{'share':>8}" * len(columns))
    walls = {label: sum(n["wall"] for n in notebooks) for label, notebooks in columns.items()}
    recorded = {label: any(len(n["phases"]) > 1 for n in notebooks) for label, notebooks in columns.items()}

    def row(name: str, value) -> str:
        cells = []
        for label, notebooks in columns.items():
            if name in PHASES and name != "writer" and not recorded[label]:
                cells.append(f"{'-':>10}{'-':>8}")  # a release without the timing points
            else:
                cells.append(_cell([value(n) for n in notebooks], walls[label]))
        return f"{name:<34}" + "".join(cells)

    for name in PHASES:
        lines.append(row(name, lambda n, name=name: n["phases"].get(name, 0.0)))
    lines.append(row("sum of the phases", lambda n: sum(n["phases"].values())))
    lines.append(row("rest (unaccounted)", lambda n: n["wall"] - sum(n["phases"].values())))
    lines.append(row("wall (worker + writer)", lambda n: n["wall"]))
    return lines


def outside_table(columns: dict[str, list[dict]]) -> list[str]:
    """What every release records per notebook: kernels started and stopped, cells, the rest of
    its worker's time, the writer (a release without ``commit_each``: its mean)."""
    lines = [f"{'from outside':<34}" + "".join(f"{label:>18}" for label in columns)]
    lines.append(f"{'':<34}" + f"{'median s':>10}{'share':>8}" * len(columns))
    walls = {label: sum(n["wall"] for n in notebooks) for label, notebooks in columns.items()}
    rows = [
        ("kernels started and stopped", lambda n: n["kernel"]),
        ("cells", lambda n: n["cells"]),
        ("the rest of the worker's time", lambda n: n["worker"] - n["kernel"] - n["cells"]),
        ("writer", lambda n: n["phases"]["writer"]),
        ("wall (worker + writer)", lambda n: n["wall"]),
    ]
    for name, value in rows:
        cells = "".join(_cell([value(n) for n in notebooks], walls[label]) for label, notebooks in columns.items())
        lines.append(f"{name:<34}{cells}")
    return lines


def compile_grader(checkout: Path = REPOSITORY) -> None:
    """Bytecode for a checkout's own packages before anything is timed, as pip writes it at install
    and Python on a grader's first run. Stock nbgrader's come compiled (site-packages); where
    PYTHONDONTWRITEBYTECODE is set (this machine), every process of every run would otherwise
    compile the grader from source, about 0.2 s of a class of 30 on 2 workers."""
    import compileall

    from autograder.engine.identity import PACKAGES  # the grading code's packages

    for name in PACKAGES:
        if (checkout / name).is_dir():
            compileall.compile_dir(checkout / name, quiet=1)


def checkout_python(checkout: Path) -> str:
    python = checkout / ".venv" / "bin" / "python"
    if not python.is_file():
        raise SystemExit(f"{checkout} has no .venv: run ./course setup there first")
    return str(python)


def describe_checkout(checkout: Path) -> str:
    found = subprocess.run(["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(
        ["git", "-C", str(checkout), "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True
    )
    return (found.stdout.strip() or str(checkout)) + (" + changes" if dirty.stdout.strip() else "")


def phases_run(base: Path, checkout: Path, python: str, name: str, args) -> dict[str, list[dict]]:
    """Grade a clean class of ``checkout``'s notebooks (``name``: its commit) with its own grader,
    1 worker then ``args.workers``."""
    pristine = base / checkout.name / "class"
    shutil.rmtree(pristine, ignore_errors=True)
    only = [a.strip() for a in args.notebooks.split(",") if a.strip()] if args.notebooks else None
    assignments = make_course(pristine, only, repository=checkout)
    submit_class(pristine, assignments, args.students, args.seed, clean=True)
    columns = {}
    for workers in sorted({1, args.workers}):
        course = base / checkout.name / f"w{workers}"
        shutil.rmtree(course, ignore_errors=True)
        shutil.copytree(pristine, course, symlinks=True)
        load = os.getloadavg()[0]
        wall, result = _timed(
            [python, "-m", "autograder.grade", "--quiet", "--local", "--workers", str(workers)], course, python
        )
        if result.returncode:
            print(result.stdout[-1500:], result.stderr[-1500:])
        notebooks = notebook_phases(course)
        flagged = sum(1 for n in notebooks if n["flags"])
        label = f"{workers} worker{'s' if workers > 1 else ''}"
        print(
            f"  {name}, {label}: {len(notebooks)} notebooks of {args.students} x "
            f"{len(assignments)} graded ({flagged} flagged) in {wall:.1f} s; load average {load:.1f} before, "
            f"{os.getloadavg()[0]:.1f} after",
            flush=True,
        )
        print(f"  {name}, {label}: {flatness(course, args.window)}", flush=True)
        peak = run_stats(course).get("main_peak_mb")
        held = f"{peak:.1f} MB resident at its peak" if peak is not None else "not recorded by this release"
        print(f"  {name}, {label}: the grade command's own process (the writer, the report): {held}", flush=True)
        columns[label] = notebooks
    return columns


def phases_main(args) -> int:
    """``--phases``: where a notebook's time goes, for this checkout and any ``--against``."""
    from autograder.worker.phases import PHASES

    base = args.keep or Path(tempfile.mkdtemp(prefix="grading-phases-"))
    checkouts = [(REPOSITORY, sys.executable)] + [(Path(c).resolve(), checkout_python(Path(c))) for c in args.against]
    try:
        measured, names = {}, {}
        for checkout, python in checkouts:
            names[checkout] = describe_checkout(checkout)  # before grading: what was graded with
            compile_grader(checkout)
            print(f"\ngrading a clean class with {names[checkout]} ({checkout})", flush=True)
            measured[checkout] = phases_run(base, checkout, python, names[checkout], args)
        for checkout, columns in measured.items():
            print(
                f"\nwhere a notebook's time goes: {names[checkout]} ({checkout}), {len(os.sched_getaffinity(0))} cores"
            )
            print("\n".join(phases_table(columns)))
        print("\nthe figures every release records, side by side:")
        print(
            "\n".join(
                outside_table(
                    {
                        f"{names[c][:9]} {label.split()[0]}w": notebooks
                        for c, columns in measured.items()
                        for label, notebooks in columns.items()
                    }
                )
            )
        )
        print(
            "\nmedian s: the median over the graded notebooks of the seconds each spent in the phase; share: the "
            "phase's seconds summed over every notebook, over their wall times summed (so the shares and the "
            "rest make 100%). wall: the notebook's seconds on its worker (from taking its sandbox to its "
            "feedback page) and its commit by the writer; rest: the wall less every phase (the steps' glue, "
            'waits no phase names). "-": a release without the timing points. The phases:'
        )
        for name, what in PHASES.items():
            print(f"  {name:<12} {what}")
        return 0
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--students", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--classes", default="clean,mixed", help="clean, mixed or both (comma-separated)")
    parser.add_argument("--workers", type=int, default=2, help="the parallel rows' workers (default 2)")
    parser.add_argument("--writer", type=int, default=400, help="synthetic results through the writer (0: skip)")
    parser.add_argument("--keep", type=Path, help="build the classes here and keep them (default: a temporary folder)")
    parser.add_argument("--skip-stock", action="store_true", help="leave out stock nbgrader")
    parser.add_argument("--skip-distributed", action="store_true", help="leave out the local Dask cluster")
    parser.add_argument(
        "--phases", action="store_true", help="where a notebook's time goes: seconds per phase, clean class only"
    )
    parser.add_argument(
        "--against",
        action="append",
        default=[],
        metavar="CHECKOUT",
        help="with --phases: also another checkout of the course (set up), graded by its own grader",
    )
    parser.add_argument("--notebooks", help="with --phases: only these assignments (comma-separated)")
    parser.add_argument(
        "--window", type=int, default=20, help="with --phases: notebooks at each end compared for flatness (20)"
    )
    args = parser.parse_args(argv)
    if args.phases:
        return phases_main(args)
    # Stopped by a signal, as by Ctrl-C: unwind, so the local Dask cluster (its own sessions) stops too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    base = args.keep or Path(tempfile.mkdtemp(prefix="grading-bench-"))
    os.environ["PATH"] = str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")
    per_notebook, starts = [], []
    compile_grader()
    try:
        for kind in [k.strip() for k in args.classes.split(",") if k.strip()]:
            pristine = base / kind / "class"
            shutil.rmtree(pristine, ignore_errors=True)
            assignments = make_course(pristine)
            counts = submit_class(pristine, assignments, args.students, args.seed, clean=kind == "clean")
            notebooks = args.students * len(assignments)
            print(
                f"\n{kind} class: {args.students} students x {len(assignments)} notebooks = {notebooks} notebooks ("
                + ", ".join(f"{n} {what}" for what, n in sorted(counts.items(), key=lambda x: -x[1]))
                + ")",
                flush=True,
            )

            def fresh(label: str, kind: str = kind, pristine: Path = pristine) -> Path:
                target = base / kind / label
                shutil.rmtree(target, ignore_errors=True)
                shutil.copytree(pristine, target, symlinks=True)
                return target

            rows, reference = [], None
            if not args.skip_stock:
                course = fresh("stock")
                rows.append(stock_row((course, fresh("stock-sampled")), assignments, notebooks))
                reference = grades(course)
                print(rows[-1].line(), flush=True)
            for workers in sorted({1, args.workers}):
                course = fresh(f"ours-{workers}")
                rows.append(ours_row((course, fresh(f"ours-{workers}-sampled")), notebooks, workers, reference))
                print(rows[-1].line(), flush=True)
                per_notebook += worker_seconds(course)
                if rows[-1].stats.get("first_result_seconds") is not None:
                    starts.append(rows[-1].stats["first_result_seconds"])
            if not args.skip_distributed:
                rows.append(
                    dask_row((fresh("dask"), fresh("dask-sampled")), notebooks, args.workers, reference, base / kind)
                )
                print(rows[-1].line(), flush=True)
            print(
                f"\n{kind} class, {notebooks} notebooks, {len(os.sched_getaffinity(0))} cores "
                f"(load average {os.getloadavg()[0]:.1f}):"
            )
            print(HEADER)
            for row in rows:
                print(row.line())
            for row in rows:
                if row.apart:
                    print(f"{row.label}: {row.apart}")
        print(
            "\ncommit s/nb: seconds the command's single writer spent per notebook (gradebook rows, files, "
            "ledger); main CPU/nb: CPU seconds of the command's own process per notebook (everything it did, "
            "start-up and report included); peak MB: proportional set sizes summed over the process tree that "
            "grades (on Dask: the grade command and the worker processes with what they start, the cluster's "
            "scheduler and nannies apart, below the table); CPU s: "
            "every process of the run (sandboxes, kernels and the Dask row's cluster included, start-up too); "
            "sandboxes: warm sandboxes the "
            "run started (one per worker unless a notebook spoiled one)."
        )
        if args.writer:
            rate = writer_rate(base, args.writer)
            print(f"\nthe writer alone: {args.writer} synthetic results committed at {rate:.0f} notebooks/s")
            if per_notebook:
                worker_s = statistics.fmean(per_notebook)
                start_s = statistics.fmean(starts) if starts else 10.0
                print(
                    f"sizing, from {worker_s:.2f} s per notebook on a worker (mean over every graded notebook "
                    f"above), {rate:.0f} notebooks/s for the writer and {start_s:.0f} s to the first result:"
                )
                print("\n".join(sizing(worker_s, rate, start_s)))
        return 0
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
