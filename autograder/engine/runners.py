"""Where notebooks are graded: one contract, two runners, the same warm sandboxes underneath.

A runner (``Runner``) grades ``records.Job``s and hands each ``records.Result`` to the
command's ``on_result`` as it finishes, in the command's own process, which
commits it (``writer``). Two implement it:

- ``LocalPool`` (the default): processes on this machine, forked from a server that
  imported what grading needs once (``pool_preload``), so they share that memory;
  as root, their sandboxes' warm interpreters are forked by one host
  (``bubblewrap.SandboxHost``), so they share torch's memory too;
- ``distributed.DaskCluster`` (``--scheduler``): a Dask cluster's workers.

On the grading side both run the same code: a ``Station`` keeps one warm
sandbox (``bubblewrap.WarmSandbox``, with its own worker slot) per thread that
grades, and ``grade_at`` grades one job in one of them
(``worker.pipeline.grade_submission``). A local pool process has one thread, so one
sandbox; a Dask worker process keeps one per thread it grades with.
"""

from __future__ import annotations

import atexit
import concurrent.futures as futures
import multiprocessing
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from ..records import Job, Result
from ..sandboxing.bubblewrap import HostAddress, Limits, SandboxHost, WarmSandbox, claim_slot
from ..sandboxing.linux import die_with_parent, drop_signal_handlers, keep_only_descriptors
from .runs import SCRATCH_PREFIX


class Runner(Protocol):
    """What the grade command needs from wherever notebooks are graded."""

    def start(self, expected_jobs: int | None = None) -> None:
        """Warm up (called early, while the command still reads the gradebook)."""

    def describe(self, jobs: int) -> str:
        """Where ``jobs`` notebooks will be graded, in words."""

    def run(self, jobs: list[Job], on_result: Callable[[Result], None], progress=None) -> list[str]:
        """Grade ``jobs``; ``on_result(result)`` here as each finishes; problems in words."""

    def map(self, function: Callable, items: list) -> list:
        """``function`` of each item, in order, computed where a processor is free (after ``run``:
        the class report's charts)."""

    def idle(self, function: Callable) -> None:
        """``function()`` in each worker, if it runs ``map``'s work, once it has nothing left to grade
        during the next ``run`` (what ``map`` will need, imported early)."""

    def close(self) -> None:
        """Let the workers go without waiting for them."""

    def join(self) -> None:
        """Wait for the workers to be gone."""


# ---------------------------------------------------------------- the grading side, shared


@dataclass
class Seat:
    """One warm sandbox and the judges (one per assignment snapshot) that grade in it."""

    sandbox: WarmSandbox
    judges: dict = field(default_factory=dict)


class Station:
    """One grading process's warm sandboxes: one per thread that grades at a time.

    ``limits`` are the sandbox's own (process count, scratch size), set when
    it starts; each notebook's limits travel with its job. ``shared``: ``base``
    holds other processes' sandboxes too (a Dask worker's, in its sandbox host's
    folder), so closing removes only this station's own.
    """

    def __init__(
        self,
        course_root: Path,
        sandboxed: bool,
        limits: Limits | None = None,
        base: Path | None = None,
        host: HostAddress | None = None,
        shared: bool = False,
        slot: int | None = None,
    ):
        self.course_root, self.sandboxed, self.limits = Path(course_root), sandboxed, limits or Limits()
        self.slot = slot  # claimed already (``pin_lane``): the first sandbox's
        self.base = base or Path(tempfile.mkdtemp(prefix=f"ag-{os.getpid()}-"))
        self.shared = shared
        self.host = host  # the run's sandbox host, when one forks the interpreters
        self.idle: list[Seat] = []
        self.everyone: list[Seat] = []
        self.lock = threading.Lock()

    def _new(self) -> Seat:
        slot = self.slot if self.slot is not None else claim_slot()
        self.slot = None  # a later sandbox (one replaced) claims its own
        sandbox = WarmSandbox(
            slot, self.course_root, self.limits, sandboxed=self.sandboxed, base_dir=self.base, host=self.host
        )
        sandbox.launch()  # it imports torch while this process does other work
        seat = Seat(sandbox)
        with self.lock:
            self.everyone.append(seat)
        return seat

    def warm(self) -> None:
        """Start one sandbox now (unless there is one), so the first job finds it ready."""
        with self.lock:
            if self.everyone:
                return
        seat = self._new()
        with self.lock:
            self.idle.append(seat)

    def take(self) -> Seat:
        with self.lock:
            seat = self.idle.pop() if self.idle else None
        if seat is None:
            seat = self._new()
        if not seat.sandbox.info:  # launched, not yet heard from
            seat.sandbox.wait_ready()
        return seat

    def give_back(self, seat: Seat) -> None:
        with self.lock:
            self.idle.append(seat)

    def close(self) -> None:
        with self.lock:
            seats, self.everyone, self.idle = self.everyone, [], []
        for seat in seats:
            seat.sandbox.close()
            if self.shared:
                shutil.rmtree(seat.sandbox.run_dir, ignore_errors=True)
        if not self.shared:
            shutil.rmtree(self.base, ignore_errors=True)


def grade_at(station: Station, job: Job) -> Result:
    """Grade ``job`` in one of ``station``'s sandboxes (restarted first if a notebook killed it)."""
    # here, on a worker: the grade command's own process, which imports this module, never imports torch
    from ..worker.pipeline import grade_submission

    began = time.monotonic()
    seat = station.take()
    try:
        seat.sandbox.ensure()
        before = time.monotonic() - began  # the interpreter checked, or replaced, before the notebook
        result = grade_submission(job, seat.sandbox, seat.judges)
        result.phases["interpreter"] = result.phases.get("interpreter", 0.0) + before
        result.seconds += before
        return result
    finally:
        station.give_back(seat)


# ---------------------------------------------------------------- this machine's processes

_station: list[Station] = []
# Imported once by the pool processes' fork server (no threads started, nothing graded yet).
POOL_PRELOAD = ["autograder.engine.pool_preload"]


def start_fork_server_here() -> bool:
    """Start the pool's fork server as a fork of this process: True if it did, False if it left
    that to multiprocessing (which starts a new interpreter).

    The server then shares what this process has imported (nbgrader: 85 MB, imported to read the
    course's configuration) with the pool processes forked from it, instead of importing a copy of its own. It
    runs exactly the command multiprocessing would have started a new interpreter with, and holds
    only the descriptors that interpreter would have had: none of the command's (the gradebook, the
    run's lock, the sandbox host's), and no signal handler of its. Nothing it inherited runs again:
    it ends with ``os._exit``, and everything this process had allocated is frozen first, so the
    collector never frees an object whose descriptor is now another file's.

    Only from a process with one thread: a fork copies the calling thread only, and a lock another
    thread held would stay held in the copy. Otherwise, or when multiprocessing does not start its
    server with ``-c`` and a command, the usual way.
    """
    if len(os.listdir("/proc/self/task")) != 1:
        return False
    from multiprocessing import forkserver, resource_tracker, util

    resource_tracker.ensure_running()  # a new interpreter, as usual (it spawns nothing after)
    usual = util.spawnv_passfds
    forked: list[int] = []

    def fork_instead(path, args, passfds):
        if args[-2:-1] != ["-c"] or "forkserver" not in args[-1]:
            return usual(path, args, passfds)
        for stream in (sys.stdout, sys.stderr):  # else the server's first flush prints ours again
            stream.flush()
        import gc

        gc.freeze()
        pid = os.fork()
        if pid == 0:
            status = 0
            try:
                _become_fork_server(args[-1], passfds)
            except SystemExit:  # how it ends: the command's end of its "alive" pipe closed
                pass
            except BaseException:
                import traceback

                traceback.print_exc()
                status = 1
            finally:
                os._exit(status)  # never back into the command's code or its exit handlers
        forked.append(pid)
        return pid

    util.spawnv_passfds = fork_instead
    try:
        forkserver.ensure_running()
    finally:
        util.spawnv_passfds = usual
    return bool(forked)


def _become_fork_server(command: str, passfds) -> None:
    """In the fork: keep only the server's descriptors, drop the command's signal handlers, run it."""
    keep_only_descriptors({0, 1, 2, *passfds})
    drop_signal_handlers()
    sys.settrace(None)
    sys.setprofile(None)
    exec(command, {"__name__": "__fork_server__"})


def _pool_process_init(
    course_root: str,
    limits: Limits,
    sandboxed: bool,
    base_dir: str,
    host: HostAddress | None,
    processors: tuple[int, ...] = (),
) -> None:
    """In each pool process: die with the grader, ignore Ctrl-C (the grader handles it), warm up;
    with ``processors``, on one of them (``pin_lane``)."""

    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    slot = pin_lane(processors) if processors else None
    import torch

    # the judge's torch on one thread, as in the kernels and referees (a Dask worker's nanny sets
    # OMP_NUM_THREADS=1): with a thread per core, each worker's judge competed with the other
    # workers' kernels for the cores (08's judge 0.11 s a notebook with 1 worker, 0.55 s with 2)
    torch.set_num_threads(1)
    from ..worker import referee

    referee.start_factory()  # now, while this process has one thread: its referees are forked from it
    station = Station(Path(course_root), sandboxed, limits, Path(base_dir), host, slot=slot)
    station.warm()
    atexit.register(station.close)  # and wait for it: its CPU time is then counted as ours
    from ..worker import pipeline  # noqa: F401  (what grading imports, while the sandbox warms up)

    station.give_back(station.take())  # ready
    _station.append(station)
    if os.environ.get("AUTOGRADER_TRACE"):
        print(f"[pool process {os.getpid()}] warm", file=sys.stderr, flush=True)


def pin_lane(processors: tuple[int, ...]) -> int:
    """This process's worker slot (claimed now), and the process on one of ``processors`` (the
    command's), chosen by the slot; the referees it forks and its sandbox's kernels run there too (they
    inherit it; ``WarmSandbox`` passes it to an interpreter forked by the run's host). Called
    while the process has one thread: a thread keeps the processors it had.

    A lane's processes take turns (the kernel runs a cell while this process waits for it, the
    referee answers while the kernel waits): on one processor each hands over to the next on the
    same core, its memory still in that core's cache. Spread by the scheduler, the class of 30
    took 15.6 s on this 2-core machine against 14.7 s pinned (medians of 3, alternating, 943d21f).
    """
    slot = claim_slot()
    try:
        os.sched_setaffinity(0, {processors[slot % len(processors)]})
    except OSError:  # not one this process may use (its cpuset is not the command's): left to the scheduler
        pass
    return slot


def processors_to_pin(lanes: int) -> tuple[int, ...]:
    """The processors this process may use, when the pool's processes (one per lane) are at least as
    many (each lane is then pinned to one of them); else none: with processors to spare, the
    scheduler keeps the lanes free to move. None either where the system does not say (macOS)."""
    if not hasattr(os, "sched_getaffinity"):
        return ()
    processors = tuple(sorted(os.sched_getaffinity(0)))
    return processors if 1 < len(processors) <= lanes else ()


def _grade_in_pool(job: Job) -> Result:
    return grade_at(_station[0], job)


def _pool_process_pid() -> int:
    return os.getpid()


def _code_length(released: str) -> int:
    """The released notebook's code, in characters: what its grading costs, roughly (08's 52 000
    and 2.3 s a notebook, 07's 46 000 and 1.3 s, 00's 3 000 and 0.2 s, at 53c9880)."""
    import json

    try:
        cells = json.loads(released).get("cells", [])
        return sum(len("".join(c.get("source", ""))) for c in cells if c.get("cell_type") == "code")
    except (ValueError, AttributeError, TypeError):
        return 1


class Dispatch:
    """Which job each pool process grades next: one of an assignment it has graded before, where
    one is left (its judge, its reference and its pages' markup are ready there, and built once a
    process); else the costliest assignment no process has begun; else one of the assignment with
    the most work left. The costliest first, so that what is left at the end is short."""

    def __init__(self, jobs: list[Job]):
        sizes: dict[int, int] = {}  # per spec (an assignment's notebook)
        cost: dict[str, int] = {}
        self.left: dict[str, list[Job]] = {}
        for job in jobs:
            if id(job.spec) not in sizes:
                sizes[id(job.spec)] = _code_length(job.spec.released)
            self.left.setdefault(job.assignment, []).append(job)
            cost[job.assignment] = cost.get(job.assignment, 0) + sizes[id(job.spec)]
        self.per_job = {a: cost[a] / len(js) for a, js in self.left.items()}
        self.begun: set[str] = set()

    def __len__(self) -> int:
        return sum(len(jobs) for jobs in self.left.values())

    def next_for(self, warm: set[str]) -> Job | None:
        """The next job for a process that has graded ``warm``'s assignments (added to it)."""
        if not self.left:
            return None
        mine = [a for a in self.left if a in warm]
        fresh = [a for a in self.left if a not in self.begun]
        choices = mine or fresh or list(self.left)
        assignment = max(choices, key=lambda a: (self.per_job[a] * len(self.left[a]), a))
        jobs = self.left[assignment]
        job = jobs.pop(0)
        if not jobs:
            del self.left[assignment]
        warm.add(assignment)
        self.begun.add(assignment)
        return job

    def again(self, job: Job) -> None:
        """``job`` back, first of its assignment's (its process died while grading it)."""
        self.left.setdefault(job.assignment, []).insert(0, job)


@dataclass
class Lane:
    """One pool process (an executor of one), and the assignments it has graded."""

    executor: futures.ProcessPoolExecutor
    warm: set = field(default_factory=set)


class LocalPool:
    """Grading processes on this machine, each with a warm sandbox (a ``Station`` of one).

    ``start()`` launches them early, so they warm their sandboxes while the command still reads
    the gradebook. Each process is an executor of its own (a ``Lane``), given one job at a time by
    ``Dispatch``: the notebooks of one assignment go to the process that graded it before, where
    its judge, reference and feedback pages are ready. A process that dies (it should not: student
    code runs in the sandbox) is replaced; the notebook it was grading is tried again, at most
    twice.
    """

    grade = staticmethod(_grade_in_pool)  # what a pool process does with a job

    def __init__(
        self, course_root: Path, limits: Limits, sandboxed: bool, workers: int, host: SandboxHost | None = None
    ):
        self.course_root, self.limits, self.sandboxed, self.workers = course_root, limits, sandboxed, workers
        # Forked from a server that imported what grading needs once: torch's and the executor's
        # memory is shared by every pool process instead of copied into each.
        self.context = multiprocessing.get_context("forkserver")
        self.context.set_forkserver_preload(POOL_PRELOAD)

        # As root, one warm interpreter forks every worker's (they share its memory, nothing else):
        # ``host``, if the command launched it first thing (``grade.early_host``), with its folder.
        if host is not None:
            self.base, self.host = host.base, host
        else:
            self.base = Path(tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{os.getpid()}-"))  # swept if killed
            self.host = SandboxHost(course_root, self.base, limits) if sandboxed and os.geteuid() == 0 else None
        self.lanes: list[Lane] = []
        self.processors: tuple[int, ...] = ()  # each lane pinned to one of them (``processors_to_pin``)
        self.retired: list[futures.ProcessPoolExecutor] = []
        self._launching: threading.Thread | None = None
        self._launch_error: BaseException | None = None
        self._idle: list[Lane] = []  # during ``run``: the processes with nothing left to grade
        self._when_idle: list[Callable] = []

    def describe(self, jobs: int) -> str:
        return f"{min(self.workers, max(1, jobs))} worker(s)"

    def _lane(self) -> Lane:
        host = self.host.address if self.host is not None else None
        executor = futures.ProcessPoolExecutor(
            max_workers=1,
            mp_context=self.context,
            initializer=_pool_process_init,
            initargs=(str(self.course_root), self.limits, self.sandboxed, str(self.base), host, self.processors),
        )
        executor.submit(_pool_process_pid)  # fork it now: it warms up while we prepare the jobs
        return Lane(executor)

    def start(self, expected_jobs: int | None = None) -> None:
        """Launch the pool processes in the background: forking the first waits for the fork
        server's imports, and the command reads the gradebook meanwhile."""
        if self.lanes or self._launching is not None:
            return
        count = self.workers if expected_jobs is None else max(1, min(self.workers, expected_jobs))
        self.processors = processors_to_pin(count)
        if self.host is not None and self.host.process is None:
            self.host.launch()  # here, not in the thread below: it lives with the thread that started it
        start_fork_server_here()  # here, while this process has one thread

        def launch() -> None:
            lanes: list[Lane] = []
            try:
                for _ in range(count):
                    lanes.append(self._lane())
                self.lanes = lanes
            except BaseException as error:  # raised where the pool is used (``_launched``)
                for lane in lanes:
                    lane.executor.shutdown(wait=False, cancel_futures=True)
                self._launch_error = error

        self._launching = threading.Thread(target=launch, name="pool-launch", daemon=True)
        self._launching.start()

    def _launched(self) -> None:
        """Wait for ``start``'s launch to finish (re-raising what it met)."""
        if self._launching is not None:
            self._launching.join()
            self._launching = None
        if self._launch_error is not None:
            error, self._launch_error = self._launch_error, None
            raise error

    def run(self, jobs: list[Job], on_result, progress=None) -> list[str]:
        problems: list[str] = []
        dispatch = Dispatch(jobs)
        tries: dict[int, int] = {}
        self.start(len(jobs))
        self._launched()
        running: dict[futures.Future, tuple[Lane, futures.ProcessPoolExecutor, Job]] = {}

        def feed(lane: Lane) -> None:
            job = dispatch.next_for(lane.warm)
            if job is None:
                self._idle.append(lane)
                for function in self._when_idle:
                    lane.executor.submit(function)
                return
            running[lane.executor.submit(self.grade, job)] = (lane, lane.executor, job)

        def counted() -> None:
            if progress:
                progress.update(1)

        for lane in self.lanes:
            feed(lane)
        while running:
            done, _ = futures.wait(running, return_when=futures.FIRST_COMPLETED)
            for future in done:
                lane, executor, job = running.pop(future)  # its result is let go once committed
                result = None
                try:
                    result = future.result()
                except futures.process.BrokenProcessPool:
                    tries[id(job)] = tries.get(id(job), 0) + 1
                    if tries[id(job)] > 2:
                        problems.append(f"{job.student}/{job.assignment}: its grading worker died twice; not graded")
                        counted()
                    else:
                        dispatch.again(job)
                    if lane.executor is executor:  # a new process in its place, with nothing warm
                        executor.shutdown(wait=False, cancel_futures=True)
                        self.retired.append(executor)
                        lane.executor, lane.warm = self._lane().executor, set()
                except Exception as error:
                    problems.append(f"{job.student}/{job.assignment}: grading failed ({type(error).__name__}: {error})")
                    counted()
                feed(lane)  # the process grades its next notebook while this one's result is written
                if result is not None:
                    on_result(result)
                    counted()
        self._idle, self._when_idle = [], []
        return problems

    def idle(self, function: Callable) -> None:
        """``function()`` in each pool process with nothing left to grade (during ``run``): now in
        those already idle, and in the others as they run out. Nothing waits for it: a failure
        costs only the head start."""
        if function in self._when_idle:
            return
        self._when_idle.append(function)
        for lane in self._idle:
            lane.executor.submit(function)

    def map(self, function: Callable, items: list) -> list:
        """In the pool's processes (idle once the class is graded) and in this one at once: the pool
        takes items from the front, this process from the back, until they meet."""
        self._launched()
        if not self.lanes:
            return [function(item) for item in items]
        submitted = [self.lanes[i % len(self.lanes)].executor.submit(function, item) for i, item in enumerate(items)]
        results: list = [None] * len(items)
        taken = len(items)
        while taken and submitted[taken - 1].cancel():  # not yet taken by a pool process: ours
            taken -= 1
            results[taken] = function(items[taken])
        for index in range(taken):
            results[index] = submitted[index].result()
        return results

    def close(self) -> None:
        try:
            self._launched()
        except Exception:
            pass  # nothing was launched: nothing to close
        for lane in self.lanes:
            lane.executor.shutdown(wait=False, cancel_futures=True)
            self.retired.append(lane.executor)
        self.lanes = []

    def join(self) -> None:
        self.close()
        for executor in self.retired:
            executor.shutdown(wait=True)
        self.retired = []
        if self.host is not None:
            self.host.close()
        shutil.rmtree(self.base, ignore_errors=True)
