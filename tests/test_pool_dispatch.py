"""How the local pool hands out notebooks (``runners.Dispatch``, ``runners.LocalPool``).

Each pool process grades the notebooks of the assignments it has graded before, where its judge,
its reference and its feedback pages are ready; the costliest assignments are begun first; a
process with nothing of its own left takes from the assignment with the most work left. A pool
process that dies is replaced, the notebook it was grading tried again (at most twice), and the
others are graded as usual.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from autograder.engine.runners import Dispatch, LocalPool
from autograder.sandboxing.bubblewrap import Limits

REPOSITORY = Path(__file__).resolve().parents[1]


def released(code_length: int) -> str:
    """A released notebook whose code cells hold ``code_length`` characters (and some text)."""
    cells = [
        {"cell_type": "markdown", "source": "x" * 5000, "metadata": {}},
        {"cell_type": "code", "source": ["a" * (code_length // 2), "b" * (code_length - code_length // 2)]},
    ]
    return json.dumps({"cells": cells})


def job(student: str, assignment: str, spec, **extra) -> SimpleNamespace:
    return SimpleNamespace(student=student, assignment=assignment, notebook=assignment, spec=spec, **extra)


def class_of(costs: dict[str, int], students: int) -> list:
    specs = {a: SimpleNamespace(released=released(cost)) for a, cost in costs.items()}
    return [job(f"s{n}", a, specs[a]) for n in range(students) for a in costs]


def take(dispatch: Dispatch, warm: set) -> str:
    picked = dispatch.next_for(warm)
    return f"{picked.assignment}/{picked.student}"


def test_each_process_keeps_to_the_assignments_it_began_the_costliest_first():
    dispatch = Dispatch(class_of({"00": 3000, "07": 46000, "08": 52000, "01": 12000}, students=3))
    first, second = set(), set()
    assert take(dispatch, first) == "08/s0"  # the costliest
    assert take(dispatch, second) == "07/s0"  # the costliest no process has begun
    assert take(dispatch, first) == "08/s1"  # its own, in the class's order
    assert take(dispatch, second) == "07/s1"
    assert take(dispatch, second) == "07/s2"
    assert take(dispatch, second) == "01/s0"  # its own are done: the costliest not begun
    assert first == {"08"} and second == {"07", "01"}
    assert len(dispatch) == 6


def test_a_process_with_nothing_of_its_own_left_takes_from_the_most_work_left():
    dispatch = Dispatch(class_of({"08": 52000, "00": 3000}, students=4))
    first, second = set(), set()
    assert take(dispatch, first) == "08/s0"
    assert take(dispatch, second) == "00/s0"
    for student in ("s1", "s2", "s3"):
        assert take(dispatch, second) == f"00/{student}"
    # nothing of its own and nothing new: the other's assignment, of which three are left
    assert take(dispatch, second) == "08/s1"
    assert second == {"00", "08"}
    assert take(dispatch, first) == "08/s2"
    assert take(dispatch, second) == "08/s3"
    assert dispatch.next_for(first) is None and dispatch.next_for(second) is None
    assert len(dispatch) == 0


def test_a_job_given_back_is_the_next_of_its_assignment():
    dispatch = Dispatch(class_of({"01": 12000, "02": 15000}, students=2))
    warm: set = set()
    given = dispatch.next_for(warm)
    assert (given.assignment, given.student) == ("02", "s0")
    dispatch.again(given)
    assert len(dispatch) == 4
    assert dispatch.next_for({"02"}) is given
    assert take(dispatch, {"02"}) == "02/s1"
    assert take(dispatch, set()) == "01/s0"


def test_a_notebook_that_cannot_be_read_as_json_costs_the_least():
    broken = SimpleNamespace(released="{not json")
    dispatch = Dispatch([job("s0", "bad", broken), *class_of({"00": 10}, students=1)])
    assert take(dispatch, set()) == "00/s0"
    assert take(dispatch, set()) == "bad/s0"


# ---------------------------------------------------------------- a real pool


def _grade(job) -> SimpleNamespace:
    """In a pool process: the job's name, this process, its assignments so far; ``die`` names a file
    whose absence makes the first try die (``always``: every try)."""
    if job.die and (job.always or not os.path.exists(job.die)):
        Path(job.die).touch()
        os._exit(3)  # as a pool process killed mid-notebook
    time.sleep(0.05)
    _seen.append(job.assignment)
    return SimpleNamespace(name=f"{job.assignment}/{job.student}", pid=os.getpid(), seen=list(_seen))


_seen: list[str] = []


def _warm() -> None:
    _seen.append("idle")


class ShownPool(LocalPool):
    grade = staticmethod(_grade)


def run_pool(jobs, workers=2, when_idle=None):
    pool = ShownPool(REPOSITORY, Limits(), sandboxed=False, workers=workers)
    results: list = []
    try:
        pool.start(len(jobs))
        if when_idle:
            pool.idle(when_idle)
        problems = pool.run(jobs, results.append)
        after = [lane.executor.submit(_seen_now).result(timeout=60) for lane in pool.lanes]
    finally:
        pool.join()
    return results, problems, after


def _seen_now() -> list[str]:
    return list(_seen)


def test_a_pool_grades_each_assignment_in_the_process_that_began_it(tmp_path):
    spec_a, spec_b = SimpleNamespace(released=released(9000)), SimpleNamespace(released=released(1000))
    jobs = [job(f"s{n}", a, s, die="", always=False) for n in range(3) for a, s in (("a", spec_a), ("b", spec_b))]
    results, problems, after = run_pool(jobs, when_idle=_warm)
    assert not problems
    assert sorted(r.name for r in results) == sorted(f"{j.assignment}/{j.student}" for j in jobs)
    by_process: dict[int, set] = {}
    for result in results:
        by_process.setdefault(result.pid, set()).add(result.name.split("/")[0])
    # two processes; "a" (the costlier) begun by one, "b" by the other; a process may take over the
    # other's last notebook once its own are done, never the other way round
    assert len(by_process) == 2
    first = {r.pid for r in results if r.name == "a/s0"}
    assert {r.pid for r in results if r.name == "b/s0"} != first
    for result in results:
        # what a process had graded when it took each notebook: its own assignment's first
        seen = [a for a in result.seen if a != "idle"]
        assert seen == sorted(seen, key=lambda a: a != seen[0]), result.seen
    # ``idle``'s function ran in each process once it had nothing left to grade, and only then
    assert [seen[-1] for seen in after] == ["idle", "idle"] and all(seen.count("idle") == 1 for seen in after)


def test_a_process_that_dies_is_replaced_and_its_notebook_tried_again(tmp_path):
    spec = SimpleNamespace(released=released(1000))
    once, always = tmp_path / "died-once", tmp_path / "dies-always"
    jobs = [
        job("s0", "a", spec, die="", always=False),
        job("s1", "a", spec, die=str(once), always=False),
        job("s2", "a", spec, die=str(always), always=True),
        job("s3", "a", spec, die="", always=False),
    ]
    results, problems, _ = run_pool(jobs)
    assert sorted(r.name for r in results) == ["a/s0", "a/s1", "a/s3"]
    assert problems == ["s2/a: its grading worker died twice; not graded"]
    assert once.exists()
    assert len({r.pid for r in results}) >= 2  # the dead processes' places were taken


def _grade_and_mark(job) -> SimpleNamespace:
    Path(job.mark).touch()  # begun
    return SimpleNamespace(name=f"{job.assignment}/{job.student}")


class MarkingPool(LocalPool):
    grade = staticmethod(_grade_and_mark)


def test_a_process_grades_its_next_notebook_while_the_last_result_is_written(tmp_path):
    """The command writes a result (the gradebook, the feedback files) after giving that result's
    process its next notebook, not before: with one process, each notebook but the last is begun
    while the one before it is being written (here the writing waits up to 60 s to see it begun)."""
    spec = SimpleNamespace(released=released(1000))
    jobs = [job(f"s{n}", "a", spec, mark=str(tmp_path / f"s{n}")) for n in range(4)]
    begun_while_written = []

    def write(result) -> None:
        following = jobs.index(next(j for j in jobs if f"a/{j.student}" == result.name)) + 1
        if following < len(jobs):
            deadline = time.monotonic() + 60
            while not Path(jobs[following].mark).exists() and time.monotonic() < deadline:
                time.sleep(0.01)
            begun_while_written.append(Path(jobs[following].mark).exists())

    pool = MarkingPool(REPOSITORY, Limits(), sandboxed=False, workers=1)
    try:
        pool.start(len(jobs))
        assert pool.run(jobs, write) == []
    finally:
        pool.join()
    assert begun_while_written == [True, True, True]


def _grade_where(job) -> SimpleNamespace:
    """In a pool process: the processors it may use, and those of a process it forks (as its
    referees are forked)."""
    child = os.fork()
    if child == 0:
        os._exit(0 if os.sched_getaffinity(0) == os.sched_getaffinity(os.getppid()) else 1)
    inherited = os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]) == 0
    time.sleep(0.2)  # the other process takes a notebook meanwhile
    return SimpleNamespace(name=job.student, processors=os.sched_getaffinity(0), inherited=inherited)


class WherePool(LocalPool):
    grade = staticmethod(_grade_where)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="one processor: nothing to pin")
@pytest.mark.parametrize("workers", [2, 1])
def test_lanes_as_many_as_the_processors_are_each_pinned_to_one(workers):
    """With as many pool processes as the processors the command may use (two of them here), each
    process, and what it forks, runs on one of them; with fewer, the scheduler keeps them free."""
    allowed = os.sched_getaffinity(0)
    two = set(sorted(allowed)[:2])
    spec = SimpleNamespace(released=released(1000))
    jobs = [job(f"s{n}", "a", spec) for n in range(4)]
    os.sched_setaffinity(0, two)
    try:
        pool = WherePool(REPOSITORY, Limits(), sandboxed=False, workers=workers)
        results: list = []
        try:
            pool.start(len(jobs))
            assert not pool.run(jobs, results.append)
        finally:
            pool.join()
    finally:
        os.sched_setaffinity(0, allowed)
    assert len(results) == 4 and all(r.inherited for r in results)
    if workers == 2:
        assert pool.processors == tuple(sorted(two))
        assert all(len(r.processors) == 1 and r.processors <= two for r in results), results
    else:
        assert pool.processors == () and all(len(r.processors) > 1 for r in results), results
