"""``./course grade --scheduler``: grading on a real Dask cluster.

The module starts what an instructor starts (docs/dask.md, "On several
machines"): ``./course scheduler`` and two ``./course worker`` processes, all
on 127.0.0.1 (``tests/local_cluster.py``), each worker one process with one thread. Both workers load
``tests/dask/saboteur.py``, which kills the worker grading a student named
``worker-killer*`` (and nobody else). The same synthetic class is graded
locally once (``local``) and then on the cluster; the gradebooks must agree.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest
from browser_harness import free_port
from grading_harness import UNTOUCHED, Course, grade, sandbox_works
from hostile_submissions import ASSIGNMENT, submit_all, verify
from local_cluster import LocalCluster
from processes import children, command_line, descendants, open_files

REPOSITORY = Path(__file__).resolve().parent.parent
SABOTEUR = Path(__file__).resolve().parent / "dask" / "saboteur.py"
LIMITS = ("--cell-timeout", "5", "--notebook-timeout", "120")
NO_MAX_SOFTMAX = "def softmax(x, dim=-1):\n    e = torch.exp(x)\n    return e / e.sum(dim=dim, keepdim=True)\n"
CRASHING_ATTENTION = "def attention(q, k, v):\n    return undefined_helper(q)\n"


pytestmark = pytest.mark.skipif(not sandbox_works(), reason="bubblewrap cannot start a sandbox here")


def environment() -> dict:
    """This interpreter's environment, no cluster address inherited."""
    return {k: v for k, v in os.environ.items() if not k.startswith("DASK_")}


def start_worker(cluster: LocalCluster, name: str) -> None:
    cluster.start_worker(name, "--nworkers", "1", "--preload", str(SABOTEUR))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with LocalCluster(tmp_path_factory.mktemp("dask-logs")) as running:
        start_worker(running, "wa")
        start_worker(running, "wb")
        running.wait_for_workers(2)
        yield running


def submit_class(course: Course) -> None:
    """Eleven notebooks: right, wrong, untouched, crashing, unreadable; most with a slow cell."""
    slow = nbformat.v4.new_code_cell("import time\ntime.sleep(1.5)")  # a window to kill a worker in

    def add_slow(notebook):
        notebook.cells.append(slow)

    for student in ("ann", "ben", "cid"):
        course.submit(student, "00_start_here")
    # files of any kind beside a notebook, a helper module too: the workers never see them
    (course.submission_path("ann", "00_start_here").parent / "helpers.py").write_text("x = 1\n", encoding="utf-8")
    course.submit("ann", "01_attention", edit=add_slow)
    course.submit("ben", "01_attention", {"softmax": NO_MAX_SOFTMAX}, edit=add_slow)
    course.submit("cid", "01_attention", UNTOUCHED)
    course.submit("dee", "01_attention", {"attention": CRASHING_ATTENTION}, edit=add_slow)
    course.submit("eve", "01_attention", edit=add_slow)
    course.submit("fay", "01_attention", {"softmax": NO_MAX_SOFTMAX}, edit=add_slow)
    course.submit("gus", "01_attention", edit=add_slow)
    path = course.submission_path("hal", "01_attention")
    path.parent.mkdir(parents=True)
    path.write_text('{"cells": [', encoding="utf-8")  # cut off mid-save


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    course = Course.create(tmp_path_factory.mktemp("template") / "course", ["00_start_here", "01_attention"])
    submit_class(course)
    return course.root


def copy_course(template: Path, target: Path) -> Course:
    import shutil

    shutil.copytree(template, target)
    return Course(target)


def outputs(course: Course) -> dict:
    """What grading wrote beside the gradebook: the CSV, and the feedback pages by name."""
    folder = course.root / "coursework"
    return {
        "csv": (folder / "reports" / "grades.csv").read_text(encoding="utf-8"),
        "feedback": sorted(str(p.relative_to(folder)) for p in (folder / "feedback").rglob("*.html")),
    }


def verdicts(course: Course) -> dict:
    """Each graded notebook's check cells and the errors they show (what the feedback explains)."""
    found = {}
    for path in sorted((course.root / "coursework" / "autograded").glob("*/*/*.ipynb")):
        student, assignment = path.parts[-3], path.parts[-2]
        cells = nbformat.read(path, as_version=4).cells
        found[(student, assignment)] = {
            cell.metadata["nbgrader"]["grade_id"]: [
                o.get("evalue", "") for o in cell.get("outputs", []) if o.get("output_type") == "error"
            ]
            for cell in cells
            if cell.metadata.get("nbgrader", {}).get("grade")
        }
    return found


@pytest.fixture(scope="module")
def local(tmp_path_factory, template) -> Course:
    """The class graded by the local mode: what the cluster must reproduce."""
    course = copy_course(template, tmp_path_factory.mktemp("local") / "course")
    result = grade(course.root, *LIMITS)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Graded 11 notebook(s)" in result.stdout
    return course


def test_the_cluster_gives_the_local_gradebook(cluster, local, template, tmp_path):
    course = copy_course(template, tmp_path / "course")
    result = grade(course.root, *LIMITS, "--scheduler", cluster.address)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Graded 11 notebook(s)" in result.stdout
    assert course.gradebook_dump() == local.gradebook_dump()
    assert outputs(course) == outputs(local)
    assert verdicts(course) == verdicts(local)
    with sqlite3.connect(course.root / "coursework" / ".work" / "grading.sqlite") as db:
        workers = {
            json.loads(summary)["worker"].split("/")[0] for (summary,) in db.execute("SELECT summary FROM graded")
        }
    assert workers == {"wa", "wb"}  # both workers graded, and nothing was graded elsewhere
    assert any("max" in message for message in verdicts(course)[("ben", "01_attention")]["test_softmax"])
    rerun = grade(course.root, *LIMITS, "--scheduler", cluster.address)
    assert rerun.returncode == 0 and "11 unchanged" in rerun.stdout, rerun.stdout


def test_a_workers_processes_are_forked_from_warm_ones(cluster, template, tmp_path):
    """``./course worker``'s worker process is forked from a fork server that imported torch and the
    grader once (``dask_nanny``), and its referees from a copy of it (no fresh interpreter for either,
    which would import its own torch); that copy holds nothing of theirs but its channel. As root,
    the worker's sandboxed interpreter is forked by the server's sandbox host (``dask_host``), not
    started by the worker process."""
    course = copy_course(template, tmp_path / "course")
    result = grade(course.root, *LIMITS, "--scheduler", cluster.address, "00_start_here")
    assert result.returncode == 0, result.stderr[-3000:]
    for name in ("wa", "wb"):
        command_pid = cluster.processes[name].pid
        processes = {pid: command_line(pid) for pid in descendants(command_pid)}
        servers = [pid for pid in children(command_pid) if "multiprocessing.forkserver" in processes[pid]]
        assert len(servers) == 1, processes  # the nanny's (its forks run the same command line)
        workers = [pid for pid in children(servers[0]) if processes[pid] == processes[servers[0]]]
        assert len(workers) == 1, processes  # --nworkers 1: the worker process, a fork of the server
        worker = workers[0]
        with open(f"/proc/{servers[0]}/maps") as maps:
            assert "libtorch" in maps.read()  # torch, imported by the server before it forked the worker
        assert not [c for c in processes.values() if "autograder.worker.referee" in c]  # no fresh referee
        copies = [pid for pid in children(worker) if processes.get(pid) == processes[worker]]
        assert len(copies) == 1, processes  # the referees' factory: a fork of the worker process
        referees = children(copies[0])
        assert referees and all(processes.get(pid) == processes[worker] for pid in referees), processes
        kept = open_files(copies[0])
        assert len(kept) == 4 and sum(f.startswith("socket:") for f in kept) >= 1, kept  # 0, 1, 2, its channel
        if os.geteuid() == 0:
            interpreters = [pid for pid, command in processes.items() if "autograder.sandboxing.zygote" in command]
            assert interpreters and all("--host" in processes[pid] for pid in interpreters), processes
            assert not set(interpreters) & set(descendants(worker)), "the worker process started its own sandbox"
    # and Dask's statistical profiler is off (it sampled the grading thread's stack every 10 ms)
    from distributed import Client

    with Client(cluster.address, timeout=30) as client:
        # (a lambda: the workers cannot import this module, and Dask sends a lambda whole)
        profiling = client.run(lambda dask_worker: "profile" in dask_worker.periodic_callbacks)
    assert len(profiling) == 2 and not any(profiling.values()), profiling


def test_hostile_integrity_class_on_the_cluster(cluster, local, template, tmp_path):
    """The catalogue's integrity fixtures (issue 15), graded on the two workers among the class:
    each hostile one gets what its own answers earn and its flags; nobody else loses anything."""
    course = copy_course(template, tmp_path / "course")
    entries = submit_all(course, only=lambda entry: entry.get("integrity"))
    assert len(entries) >= 9
    result = grade(course.root, *LIMITS, "--scheduler", cluster.address)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"Graded {11 + len(entries)} notebook(s)" in result.stdout, result.stdout[-2000:]
    with sqlite3.connect(course.root / "coursework" / ".work" / "grading.sqlite") as db:
        summaries = {(s, a): json.loads(x) for s, a, x in db.execute("SELECT student, assignment, summary FROM graded")}
    for entry in entries:
        verify(course, entry, summaries[(entry["id"], ASSIGNMENT)])
    hostile = {entry["id"] for entry in entries}
    others = {k: v for k, v in course.gradebook_dump().items() if k[0] not in hostile}
    assert others == local.gradebook_dump()
    assert course.scores("ann", ASSIGNMENT) == course.max_scores(ASSIGNMENT)
    # Those that try to change their worker (issue 23) were followed on it by other notebooks, graded as above
    # (each hostile one by its expectations, every other as locally), by the same warm interpreter.
    by_worker: dict = {}
    for (student, _), summary in summaries.items():
        by_worker.setdefault(summary["worker"], []).append((summary["started"], student, summary))
    followed = 0
    for runs in by_worker.values():
        runs.sort()
        for (_, student, before), (_, _, after) in zip(runs, runs[1:]):
            if any(entry["id"] == student and entry.get("worker_changing") for entry in entries):
                followed += 1
                assert after["sandbox_launch"] == before["sandbox_launch"], (student, after["messages"])
    assert followed >= 1


def test_killing_a_worker_mid_run_loses_nothing(cluster, local, template, tmp_path):
    course = copy_course(template, tmp_path / "course")
    command = [sys.executable, "-m", "autograder.grade", "--quiet", *LIMITS, "--scheduler", cluster.address]
    process = subprocess.Popen(command, cwd=course.root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ledger = course.root / "coursework" / ".work" / "grading.sqlite"
    committed, deadline = 0, time.monotonic() + 300
    try:
        while committed < 2 and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
            if ledger.exists():
                try:
                    with sqlite3.connect(ledger) as db:
                        committed = db.execute("SELECT COUNT(*) FROM graded").fetchone()[0]
                except sqlite3.Error:
                    continue
        assert process.poll() is None, "the run ended before a worker could be killed"
        cluster.kill("wb")
        stdout, stderr = process.communicate(timeout=600)
    finally:
        if process.poll() is None:
            process.kill()
        start_worker(cluster, "wb")  # the next test has two workers again
    assert process.returncode == 0, stderr[-3000:]
    assert "Graded 11 notebook(s)" in stdout, stdout
    assert course.gradebook_dump() == local.gradebook_dump()
    assert outputs(course) == outputs(local)
    with sqlite3.connect(ledger) as db:
        rows = db.execute("SELECT student, assignment, notebook, COUNT(*) FROM graded GROUP BY 1, 2, 3").fetchall()
    assert len(rows) == 11 and all(count == 1 for *_, count in rows)


def test_a_submission_that_keeps_killing_workers_is_marked_failed(cluster, local, template, tmp_path):
    cluster.wait_for_workers(2)
    course = copy_course(template, tmp_path / "course")
    course.submit("worker-killer", "01_attention")  # a correct notebook: the saboteur does the killing
    result = grade(course.root, *LIMITS, "--scheduler", cluster.address)
    assert result.returncode == 1, result.stderr[-3000:]
    assert "worker-killer/01_attention/01_attention: 3 grading workers died while grading it" in result.stdout
    dump = course.gradebook_dump()
    ours = {k: v for k, v in dump.items() if k[0] == "worker-killer"}
    assert ours[("worker-killer", "01_attention", "01_attention", "flagged")] is True
    scores = [v[0] for k, v in ours.items() if len(k) == 3 and k[2] != "timestamp"]
    assert scores and all(score == 0 for score in scores)
    assert "stopped the grading worker 3 times" in course.feedback_text("worker-killer", "01_attention")
    # everybody else: exactly the local mode's grades
    assert {k: v for k, v in dump.items() if k[0] != "worker-killer"} == local.gradebook_dump()
    # the next run tries it again (here on this machine, where nothing kills its worker)
    again = grade(course.root, *LIMITS, "--local")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "Graded 1 notebook(s)" in again.stdout and "11 unchanged" in again.stdout, again.stdout
    assert course.scores("worker-killer", "01_attention") == course.scores("ann", "01_attention")


def test_an_unreachable_scheduler_changes_nothing(template, tmp_path):
    course = copy_course(template, tmp_path / "course")

    def snapshot() -> dict:
        return {
            str(p.relative_to(course.root)): (p.stat().st_mtime_ns, p.read_bytes() if p.is_file() else None)
            for p in sorted(course.root.rglob("*"))
        }

    before = snapshot()
    env = {
        **environment(),
        "DASK_SCHEDULER_ADDRESS": f"tcp://127.0.0.1:{free_port()}",
        "AUTOGRADER_CONNECT_SECONDS": "3",
    }
    started = time.monotonic()
    result = grade(course.root, *LIMITS, env=env)
    assert result.returncode == 2
    assert f"cannot reach the Dask scheduler at {env['DASK_SCHEDULER_ADDRESS']}" in result.stderr
    assert "Nothing was graded or written" in result.stderr
    assert "Traceback" not in result.stderr
    assert time.monotonic() - started < 60
    assert snapshot() == before


def test_workers_running_other_grading_code_are_refused(cluster, template, tmp_path):
    """The instructor updated the grader but not the workers: they would grade differently."""
    import shutil

    cluster.wait_for_workers(2)
    newer = tmp_path / "newer"
    for package in ("autograder", "course_checks", "course_widgets"):
        shutil.copytree(REPOSITORY / package, newer / package, ignore=shutil.ignore_patterns("__pycache__"))
    checks = newer / "autograder" / "worker" / "judge.py"
    checks.write_text(checks.read_text(encoding="utf-8") + "\n# a newer grader\n", encoding="utf-8")
    course = copy_course(template, tmp_path / "course")
    before = sorted(course.root.rglob("*"))
    env = {**environment(), "PYTHONPATH": str(newer)}
    result = grade(course.root, *LIMITS, "--scheduler", cluster.address, env=env)
    assert result.returncode == 2, result.stdout + result.stderr[-3000:]
    assert "2 of the 2 Dask workers" in result.stderr and "different grading code" in result.stderr
    assert "Nothing was graded or written" in result.stderr
    assert sorted(course.root.rglob("*")) == before
