"""Grading on a Dask cluster: ``./course grade --scheduler tcp://HOST:8786``.

The local mode (``runners.LocalPool``) stays the default. Given a scheduler
address (``--scheduler`` or Dask's own ``DASK_SCHEDULER_ADDRESS``), the grade
command sends each submission notebook as one ``dask.distributed`` task
instead. Nothing else changes:

- A task carries the whole ``records.Job``: the submission's bytes and the
  snapshot of its assignment (released notebook, gradebook cells, reference
  cells, released data files). Workers need no shared folder, only a checkout
  of the same course (the same grader code, checked: ``code_digest``) set up
  with ``./course worker``.
- On each worker process ``GraderPlugin`` keeps warm sandboxes
  (``runners.Station``: one per thread that grades) and grades with exactly the
  local mode's code (``runners.grade_at``), and returns a ``Result``: the graded
  notebook, its scores and its feedback page.
- Only the grade command's own process writes the gradebook, the files, the CSV
  and the report (``writer.Writer``), as results arrive.
- A worker that dies loses no work: the scheduler runs its tasks elsewhere,
  and a result is committed once, when its task's future completes. A
  submission that was running each time ``allowed-failures`` + 1 workers died
  (``./course scheduler`` sets 2: three tries) ends as ``KilledWorker``; it is
  recorded as failed (``worker.read.failed_result``: no points, flagged, the next run
  tries it again) and the run goes on.

Before anything is read or written the command connects (``DaskCluster.connect``):
an unreachable scheduler, a cluster without workers, a worker whose sandbox
cannot start or that runs other grader code, each gives a clear message and
the command stops with nothing written.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

from distributed import Client, KilledWorker, WorkerPlugin, as_completed, get_worker

from .. import REPOSITORY
from ..records import Job, Result
from ..sandboxing.bubblewrap import probe
from ..worker.read import WORKERS_DIED, failed_result
from .identity import code_digest
from .runners import Dispatch, Station, grade_at
from .runs import sweep_orphans

CONNECT_SECONDS = float(os.environ.get("AUTOGRADER_CONNECT_SECONDS", "10"))
WORKERS_SECONDS = float(os.environ.get("AUTOGRADER_WORKERS_SECONDS", "30"))


# ---------------------------------------------------------------- on the workers


DASK_PREFIX = "ag-dask-"  # + pid: a worker process's sandboxes (runs.sweep_orphans removes those of killed ones)


_stations: dict[bool, Station] = {}
_stations_lock = threading.Lock()


def station(sandboxed: bool) -> Station:
    """This worker process's warm sandboxes (``runners.Station``: one per grading thread), forked by
    the sandbox host of the fork server this process was forked from, if it started one
    (``dask_host``; in the host's folder, which is the host's to remove)."""
    with _stations_lock:
        if sandboxed not in _stations:
            sweep_orphans(DASK_PREFIX)
            hosted = sys.modules.get("autograder.engine.dask_host")  # imported by that server, not here
            shared = hosted.SHARED if hosted is not None and sandboxed else None
            if shared is not None:
                _stations[sandboxed] = Station(REPOSITORY, sandboxed, base=shared[0], host=shared[1], shared=True)
            else:
                _stations[sandboxed] = Station(
                    REPOSITORY, sandboxed, base=Path(tempfile.mkdtemp(prefix=f"{DASK_PREFIX}{os.getpid()}-"))
                )
        return _stations[sandboxed]


class GraderPlugin(WorkerPlugin):
    """Warms a sandbox when a worker starts (or joins later); stops them when it closes."""

    idempotent = True

    def __init__(self, sandboxed: bool):
        self.sandboxed = sandboxed

    def setup(self, worker) -> None:
        # Only the sandbox's process starts here: it imports torch in the background.
        station(self.sandboxed).warm()

    def teardown(self, worker) -> None:
        with _stations_lock:
            stations = list(_stations.values())
            _stations.clear()
        for each in stations:
            each.close()


def dask_setup(worker) -> None:
    """``dask worker --preload autograder.engine.distributed`` (what ``./course worker`` runs): warm up
    as the worker starts, before any grade command connects, so the first notebook waits for
    nothing. A worker whose sandbox cannot start still starts; the command's check says why."""

    from ..worker import pipeline  # noqa: F401  (torch, nbclient: what grading imports)

    reason = probe(REPOSITORY)
    if reason is None:
        station(True).warm()
    else:
        logging.getLogger("distributed.worker").warning("course grader: the sandbox cannot start here: %s", reason)


def plugin_name(sandboxed: bool) -> str:
    return "course-grader" if sandboxed else "course-grader-unsandboxed"


def check_worker(sandboxed: bool, digest: str) -> str | None:
    """On a worker: None when it can grade for this command, else why not."""
    if code_digest() != digest:
        return (
            "it runs different grading code than this command (update its checkout of the course to the "
            "same commit and restart it)"
        )
    if sandboxed:
        reason = probe(REPOSITORY)
        if reason:
            return reason
    return None


def grade_task(job: Job, digest: str, sandboxed: bool) -> Result:
    """One submission notebook, on whichever worker the scheduler chose."""
    if code_digest() != digest:
        raise RuntimeError(
            "this worker runs different grading code than the grade command; update its checkout and restart it"
        )
    result = grade_at(station(sandboxed), job)
    try:
        result.worker = f"{get_worker().name}/{result.worker}"
    except ValueError:
        pass
    return result


# ---------------------------------------------------------------- in the grade command


class DaskCluster:
    """The grade command's side: connect, check the workers, grade ``jobs`` there.

    A ``runners.Runner``, as ``runners.LocalPool`` is.
    """

    def __init__(self, address: str, sandboxed: bool):
        self.address = address
        self.sandboxed = sandboxed
        self.client = None
        self.futures: list = []
        self.digest = code_digest()
        self.workers = 0  # the cluster's threads, once connected: how many notebooks grade at once
        self._threads = (float("-inf"), 0)  # when the scheduler was last asked, and its threads then

    def connect(self) -> str | None:
        """None when the cluster is ready to grade, else what is wrong (in words)."""

        try:
            self.client = Client(self.address, timeout=CONNECT_SECONDS, set_as_default=False)
        except Exception as error:
            detail = str(error).splitlines()[0] if str(error) else type(error).__name__
            return (
                f"cannot reach the Dask scheduler at {self.address} ({detail}).\n"
                "       Is `./course scheduler` (or `dask scheduler`) running there, and can this machine "
                "reach its port?"
            )
        try:
            self.client.wait_for_workers(1, timeout=WORKERS_SECONDS)
        except Exception:
            self.close()
            return (
                f"the Dask scheduler at {self.address} has no workers (waited {WORKERS_SECONDS:.0f} s); "
                f"start some with `./course worker {self.address}`"
            )
        self.client.register_plugin(GraderPlugin(self.sandboxed), name=plugin_name(self.sandboxed))
        answers = self.client.run(check_worker, self.sandboxed, self.digest)
        refused = {worker: reason for worker, reason in answers.items() if reason}
        if refused:
            self.close()
            lines = "\n".join(f"         {worker}: {reason}" for worker, reason in sorted(refused.items()))
            return (
                f"{len(refused)} of the {len(answers)} Dask workers at {self.address} cannot grade:\n{lines}\n"
                "       Fix or stop those workers"
                + ("." if not self.sandboxed else ", or pass --unsandboxed if it is the sandbox.")
            )
        workers = self.client.scheduler_info(n_workers=-1)["workers"]
        self.workers = sum(w.get("nthreads", 0) for w in workers.values())
        return None

    def describe(self, jobs: int) -> str:
        workers = self.client.scheduler_info(n_workers=-1)["workers"] if self.client else {}
        threads = sum(w.get("nthreads", 0) for w in workers.values())
        return f"the Dask cluster at {self.address} ({len(workers)} worker(s), {threads} thread(s))"

    def start(self, expected_jobs: int | None = None) -> None:
        """Nothing to start: the workers are already up."""

    def run(self, jobs: list[Job], on_result, progress=None) -> list[str]:
        """Grade ``jobs`` on the cluster; ``on_result(result)`` here as each finishes; problems in words.

        As many notebooks are out as the cluster has threads. As each comes back, the next is the one
        ``runners.Dispatch`` picks for the worker that graded it, which has a thread free now (and
        the scheduler gives a task to a free thread): one of an assignment it has graded before,
        where its judges, references and pages are ready. No task is tied to a worker: if one is
        gone, the scheduler runs its tasks elsewhere, and a worker that joins is given its share."""

        problems = []
        run = f"course-grade-{uuid.uuid4().hex[:12]}"
        dispatch = Dispatch(jobs)
        number = {id(job): index for index, job in enumerate(jobs)}
        warm: dict[str, set] = {}  # a worker's name -> the assignments it has graded
        owner: dict = {}  # a future's key -> its job

        def send(worker: str | None):
            job = dispatch.next_for(warm.setdefault(worker, set()) if worker else set())
            if job is None:
                return None
            key = (run, number[id(job)], f"{job.student}/{job.assignment}/{job.notebook}")
            future = self.client.submit(grade_task, job, self.digest, self.sandboxed, key=key, retries=1)
            owner[future.key] = job
            self.futures.append(future)
            return future

        finished = as_completed(loop=self.client.loop)
        for _ in range(max(1, self.threads())):
            following = send(None)
            if following is not None:
                finished.add(following)
        for future in finished:
            job = owner.pop(future.key)
            label = f"{job.student}/{job.assignment}/{job.notebook}"
            worker = result = None
            try:
                result = future.result()
            except KilledWorker as error:
                tries = error.allowed_failures + 1
                result = failed_result(job, WORKERS_DIED.format(tries=tries))
                problems.append(
                    f"{label}: {tries} grading workers died while grading it; marked failed "
                    "(no points, flagged), the next run tries it again"
                )
            except Exception as error:
                problems.append(f"{label}: grading failed ({type(error).__name__}: {error}); not graded")
            else:
                worker = result.worker.rpartition("/")[0] or None  # its worker's name (``grade_task``)
                warm.setdefault(worker, set()).add(job.assignment)
            future.release()
            # one for the worker it came from, more for threads that joined since, and one at least
            # while nothing is out (the scheduler holds it until a worker can take it); sent before
            # this result is written, so that the worker grades while the gradebook is written
            for _ in range(max(self.threads() - len(owner), 0 if owner else 1)):
                following = send(worker)
                worker = None
                if following is not None:
                    finished.add(following)
            if result is not None:
                on_result(result)
            if progress:
                progress.update(1)
        self.futures = []
        return problems

    def threads(self) -> int:
        """The cluster's threads, asked of the scheduler at most once a second."""
        now = time.monotonic()
        if now - self._threads[0] > 1.0:
            workers = self.client.scheduler_info(n_workers=-1)["workers"]
            self._threads = (now, sum(max(1, w.get("nthreads", 1)) for w in workers.values()))
        return self._threads[1]

    def map(self, function, items: list) -> list:
        """Here: a chart is not worth a round trip to the cluster."""
        return [function(item) for item in items]

    def idle(self, function) -> None:
        """Nothing: ``map`` runs here."""

    def close(self) -> None:
        if self.client is not None:
            try:
                if self.futures:
                    self.client.cancel(self.futures)
                self.client.close(timeout=10)
            except Exception:
                pass
            self.client = None
            self.futures = []

    def join(self) -> None:
        self.close()
