"""Benchmark: grade a synthetic class with stock nbgrader and with ``./course grade``.

    ./course bench grading [--students 40] [--seed 1] [--keep DIR] [--skip-stock]

Builds a class of ``--students`` students over every released notebook, a
realistic mix: most submissions correct, some with one or two exercises
wrong (left unfinished, a missing ``return``, a crash), a few broken (a syntax
error, the untouched release, a file cut off mid-save). Two copies of that
course are graded on this machine, one after the other:

- stock: ``nbgrader autograde`` per assignment (one notebook after another,
  each in a fresh kernel), then ``nbgrader generate_feedback``;
- ours: ``./course grade`` (sandboxed, parallel, feedback, CSV and report);
- distributed: ``./course grade --scheduler`` on a local Dask cluster
  (``./course scheduler`` and ``./course worker``, as many one-thread workers
  as the local run has; started before the clock, as a cluster would be).

Printed: wall time of each and their ratio, the overhead per notebook beyond
the time its own cells take, the hand-off between two notebooks on one worker
(median; for the cluster, Dask's scheduling round trip), peak memory (summed over the process tree, as
proportional and as resident set sizes), CPU time, and whether the two agree on every grade. Nothing is asserted.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

import nbformat

REPOSITORY = Path(__file__).resolve().parent.parent


# ---------------------------------------------------------------- the class

def make_course(root: Path) -> list[str]:
    """A course copy in ``root`` (config, solutions, a fresh gradebook and release); its assignments."""
    from traitlets.config.loader import PyFileConfigLoader

    from nbgrader.apps import NbGraderAPI
    from nbgrader.coursedir import CourseDirectory

    root.mkdir(parents=True, exist_ok=True)
    shutil.copy(REPOSITORY / "nbgrader_config.py", root)
    shutil.copytree(REPOSITORY / "solutions", root / "solutions", ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    (root / "autograder").mkdir(exist_ok=True)
    config = PyFileConfigLoader("nbgrader_config.py", path=str(root)).load_config()
    os.environ["PATH"] = str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")
    api = NbGraderAPI(CourseDirectory(config=config), config=config)
    assignments = sorted(p.name for p in (root / "solutions").iterdir() if (p / f"{p.name}.ipynb").is_file())
    for assignment in assignments:
        result = api.generate_assignment(assignment, force=True, create=True)
        if not result["success"]:
            raise RuntimeError(result["error"])
    return assignments


def _answer_cells(notebook) -> dict:
    return {c.metadata["nbgrader"]["grade_id"]: c for c in notebook.cells
            if c.metadata.get("nbgrader", {}).get("solution") and not c.metadata["nbgrader"].get("grade")}


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


def submit_class(root: Path, assignments: list[str], students: int, seed: int) -> dict:
    """Write every student's submissions; {kind: count}."""
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
            if draw < 0.55:
                kind = "correct"
            elif draw < 0.75:
                kind = "one exercise wrong"
                gid = rng.choice(names)
                answers[gid].source = _bug(rng.choice(["unfinished", "no-return", "crash"]),
                                           _answer_cells(released)[gid].source, references[gid])
            elif draw < 0.87:
                kind = "two exercises wrong"
                for gid in rng.sample(names, min(2, len(names))):
                    answers[gid].source = _bug(rng.choice(["unfinished", "no-return", "crash"]),
                                               _answer_cells(released)[gid].source, references[gid])
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
            folder = root / "autograder" / "submitted" / student / assignment
            folder.mkdir(parents=True, exist_ok=True)
            text = nbformat.writes(notebook)
            if kind == "cut off mid-save":
                text = text[: len(text) // 3]
            (folder / f"{assignment}.ipynb").write_text(text, encoding="utf-8")
    return counts


# ---------------------------------------------------------------- measuring

def _pss(pid: int) -> int | None:
    """Proportional set size in bytes: shared pages count once in all (forked kernels share torch)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as rollup:
            for line in rollup:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


class PeakMemory:
    """Highest memory of this process's descendants, summed, sampled 10 times a second.

    ``peak_mb`` sums their proportional set sizes (a page shared by n processes
    counts 1/n to each: what the tree really holds); ``peak_rss_mb`` sums their
    resident sizes (a page shared by forked kernels counts once per process).
    """

    def __init__(self):
        self.peak_mb = 0.0
        self.peak_rss_mb = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _tree_mb(self) -> tuple[float, float]:
        parents, rss = {}, {}
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                with open(f"/proc/{name}/stat") as stat:
                    fields = stat.read().rsplit(")", 1)[1].split()
                parents[int(name)] = int(fields[1])
                rss[int(name)] = int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
            except (OSError, IndexError, ValueError):
                continue
        me, total, proportional = os.getpid(), 0, 0
        for pid in rss:
            ancestor, depth = parents.get(pid), 0
            while ancestor and ancestor != me and depth < 50:
                ancestor, depth = parents.get(ancestor), depth + 1
            if ancestor == me:
                total += rss[pid]
                pss = _pss(pid)
                proportional += rss[pid] if pss is None else pss
        return proportional / 2 ** 20, total / 2 ** 20

    def _run(self):
        while not self._stop.wait(0.1):
            pss, rss = self._tree_mb()
            self.peak_mb, self.peak_rss_mb = max(self.peak_mb, pss), max(self.peak_rss_mb, rss)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def _cpu_of_children() -> float:
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _run(command: list[str], cwd: Path) -> tuple[float, tuple[float, float], float, subprocess.CompletedProcess]:
    """(wall seconds, (peak PSS MB, peak RSS MB), CPU seconds of the whole process tree, the result)."""
    # nbgrader puts the course folder first on sys.path, where autograder/ is only a work folder
    # in a copy of the course: the package must come from this repository, or stock nbgrader's
    # generate_feedback imports autograder/feedback/ (the output folder) and fails.
    path = os.pathsep.join(p for p in (str(REPOSITORY), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""),
           "PYTHONPATH": path}
    cpu = _cpu_of_children()
    with PeakMemory() as memory:
        started = time.perf_counter()
        result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
        seconds = time.perf_counter() - started
    return seconds, (memory.peak_mb, memory.peak_rss_mb), _cpu_of_children() - cpu, result


def _stamp(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def stock_cell_seconds(root: Path) -> float:
    """Time nbgrader's kernels spent in cells (from nbclient's timing metadata)."""
    total = 0.0
    for path in (root / "autograder" / "autograded").rglob("*.ipynb"):
        notebook = json.loads(path.read_text(encoding="utf-8"))
        for cell in notebook["cells"]:
            timing = cell.get("metadata", {}).get("execution", {})
            if "iopub.status.busy" in timing and "iopub.status.idle" in timing:
                total += max(0.0, _stamp(timing["iopub.status.idle"]) - _stamp(timing["iopub.status.busy"]))
    return total


def grades(root: Path) -> dict:
    from nbgrader.api import Gradebook

    found = {}
    with Gradebook(f"sqlite:///{root / 'autograder' / 'gradebook.db'}") as gradebook:
        for assignment in gradebook.assignments:
            for submission in assignment.submissions:
                for notebook in submission.notebooks:
                    for grade in notebook.grades:
                        found[(submission.student.id, assignment.name, grade.name)] = grade.score
    return found


def handoff_seconds(summaries: dict) -> float | None:
    """Median idle time of a worker between two notebooks: from the end of one to the start
    of the next (the pool's or the Dask scheduler's round trip, and the job's transfer)."""
    import statistics

    by_worker: dict[str, list] = {}
    for summary in summaries.values():
        if summary.get("worker") and summary.get("started"):
            by_worker.setdefault(summary["worker"], []).append((summary["started"], summary["seconds"]))
    gaps = []
    for runs in by_worker.values():
        runs.sort()
        gaps += [start - (previous + seconds) for (previous, seconds), (start, _) in zip(runs, runs[1:])]
    return statistics.median(gaps) if gaps else None


class LocalCluster:
    """``./course scheduler`` and ``./course worker`` processes on 127.0.0.1, as an instructor
    starts them: the benchmark's distributed row, and the tests' cluster."""

    def __init__(self, logs: Path):
        import socket

        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.address = f"tcp://127.0.0.1:{self.port}"
        self.logs = logs
        self.processes: dict[str, subprocess.Popen] = {}
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("DASK_")}  # no address inherited
        self.env["COURSE_VENV"] = sys.prefix

    def _launch(self, name: str, *arguments: str) -> None:
        with open(self.logs / f"{name}.log", "ab") as log:
            self.processes[name] = subprocess.Popen(
                [str(REPOSITORY / "course"), *arguments], cwd=REPOSITORY, env=self.env, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True)

    def start_worker(self, name: str, *options: str) -> None:
        self._launch(name, "worker", self.address, "--host", "127.0.0.1", "--no-dashboard", "--name", name,
                     *options)

    def wait_for_workers(self, count: int) -> None:
        from distributed import Client

        with Client(self.address, timeout=60, set_as_default=False) as client:
            client.wait_for_workers(count, timeout=300)

    def kill(self, name: str) -> None:
        """kill -9 a ``./course worker``: its nanny and worker processes at once (a machine gone)."""
        import signal

        process = self.processes.pop(name)
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()

    def __enter__(self):
        self._launch("scheduler", "scheduler", "--host", "127.0.0.1", "--port", str(self.port), "--no-dashboard")
        return self

    def __exit__(self, *exc):
        import signal

        for name in reversed(list(self.processes)):
            process = self.processes.pop(name)
            try:
                os.killpg(process.pid, signal.SIGTERM)
                process.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--students", type=int, default=40)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--workers", type=int, help="for ./course grade (default: the machine's cores)")
    parser.add_argument("--keep", type=Path, help="build the class here and keep it (default: a temporary "
                                                  "folder); a class already built there is reused")
    parser.add_argument("--skip-stock", action="store_true", help="leave out stock nbgrader")
    parser.add_argument("--skip-distributed", action="store_true", help="leave out the local Dask cluster")
    args = parser.parse_args(argv)
    base = args.keep or Path(tempfile.mkdtemp(prefix="grading-bench-"))
    try:
        pristine = base / "class"
        mix = base / "mix.json"
        if not mix.is_file():
            print(f"building a class of {args.students} students in {pristine} ...", flush=True)
            shutil.rmtree(pristine, ignore_errors=True)
            built = make_course(pristine)
            mix.write_text(json.dumps(submit_class(pristine, built, args.students, args.seed)))
        counts = json.loads(mix.read_text())
        assignments = sorted(p.name for p in (pristine / "notebooks").iterdir())
        students = sorted(p.name for p in (pristine / "autograder" / "submitted").iterdir())
        for label, wanted in (("ours", True), ("stock", not args.skip_stock),
                              ("distributed", not args.skip_distributed)):
            shutil.rmtree(base / label, ignore_errors=True)
            if wanted:
                shutil.copytree(pristine, base / label, symlinks=True)
        notebooks = len(students) * len(assignments)
        print(f"{notebooks} notebooks ({', '.join(assignments)}): "
              + ", ".join(f"{n} {kind}" for kind, n in sorted(counts.items(), key=lambda x: -x[1])), flush=True)
        cores = len(os.sched_getaffinity(0))
        figures = {}
        if not args.skip_stock:
            nbgrader = str(Path(sys.executable).parent / "nbgrader")
            started = time.perf_counter()
            peak, cpu = (0.0, 0.0), 0.0
            for assignment in assignments:
                for step in ("autograde", "generate_feedback"):
                    _, memory, used, result = _run([nbgrader, step, assignment, "--force"], base / "stock")
                    peak, cpu = (max(peak[0], memory[0]), max(peak[1], memory[1])), cpu + used
                    if result.returncode:
                        last = (result.stderr.strip().splitlines() or [""])[-1][:200]
                        print(f"  stock nbgrader {step} {assignment} exited {result.returncode} "
                              f"(it does when a submission cannot be graded): {last}")
            figures["stock"] = (time.perf_counter() - started, peak, stock_cell_seconds(base / "stock"), 1, cpu)
            print(f"stock nbgrader: {figures['stock'][0]:.1f} s", flush=True)
        from .writer import Ledger

        def ledger_of(label: str) -> tuple[dict, list]:
            ledger = Ledger(base / label / "autograder" / ".work" / "grading.sqlite")
            try:
                return ledger.summaries(), sorted(t for (t,) in ledger.db.execute("SELECT graded_at FROM graded"))
            finally:
                ledger.close()

        command = [sys.executable, "-P", "-m", "autograder.grade", "--quiet"]
        workers = args.workers or cores
        launched = time.time()
        seconds, peak, cpu, result = _run(command + ["--local", "--workers", str(workers)], base / "ours")
        if result.returncode:
            print(result.stdout[-2000:], result.stderr[-2000:])
        summaries, committed = ledger_of("ours")
        cell_seconds = sum(s.get("cell_seconds", 0.0) for s in summaries.values())
        cell_cpu = sum(s.get("cell_cpu_seconds", 0.0) for s in summaries.values())
        figures["ours"] = (seconds, peak, cell_seconds, workers, cpu)
        handoffs = {"ours": handoff_seconds(summaries)}
        steadies = {"ours": (launched, seconds, committed, cell_seconds)}
        print(f"./course grade: {seconds:.1f} s", flush=True)
        if not args.skip_distributed:
            cpu_before, started = _cpu_of_children(), time.perf_counter()
            with LocalCluster(base) as cluster:
                cluster.start_worker("bench", "--nworkers", str(workers))
                cluster.wait_for_workers(workers)
                warm = time.perf_counter() - started
                launched_d = time.time()
                wall, memory, _, result = _run(command + ["--scheduler", cluster.address], base / "distributed")
            if result.returncode:
                print(result.stdout[-2000:], result.stderr[-2000:])
            summaries_d, committed_d = ledger_of("distributed")
            cells_d = sum(s.get("cell_seconds", 0.0) for s in summaries_d.values())
            figures["distributed"] = (wall, memory, cells_d, workers, _cpu_of_children() - cpu_before)
            steadies["distributed"] = (launched_d, wall, committed_d, cells_d)
            handoffs["distributed"] = handoff_seconds(summaries_d)
            print(f"./course grade --scheduler: {wall:.1f} s (the cluster took {warm:.1f} s to start, "
                  "before the clock)", flush=True)
        print()
        print(f"{'':<34}{'wall s':>9}{'cells s':>9}{'overhead s/nb':>15}{'hand-off ms':>13}{'peak MB':>9}"
              f"{'CPU s':>9}{'CPU s/nb':>10}{'peak RSS MB':>13}")
        names = {"stock": "stock nbgrader (one by one)", "ours": f"./course grade ({workers} workers)",
                 "distributed": f"  on Dask ({workers} workers)"}
        for label, (wall, (memory, resident), cells, slots, used) in figures.items():
            overhead = (wall * slots - cells) / notebooks
            handoff = handoffs.get(label)
            handoff_text = f"{handoff * 1000:>13.0f}" if handoff is not None else f"{'':>13}"
            print(f"{names[label]:<34}{wall:>9.1f}{cells:>9.1f}{overhead:>15.2f}{handoff_text}{memory:>9.0f}"
                  f"{used:>9.1f}{used / notebooks:>10.2f}{resident:>13.0f}")
        for label, (launch, wall, commits, cells) in steadies.items():
            if len(commits) > 2 * workers:
                # Steady state: between the first results and the last, leaving out the one-time
                # start of the workers (torch imported, sandboxes warmed) and the final CSV and report.
                steady = commits[-1] - commits[workers - 1]
                count = len(commits) - workers
                share = steady * workers / count - cells / len(commits)
                first, tail = commits[0] - launch, launch + wall - commits[-1]
                name = "  steady state" + (" (Dask)" if label == "distributed" else "")
                print(f"{name:<34}{steady:>9.1f}{'':>9}{share:>15.2f}   "
                      f"({count} notebooks; {first:.1f} s to the first result, {tail:.1f} s after the last)")
        print(f"{'  CPU beyond the cells':<34}{'':>9}{cell_cpu:>9.1f}{(cpu - cell_cpu) / notebooks:>15.2f}   "
              f"(CPU s the kernels spent in cells; the rest, per notebook: what the load cannot inflate)")
        if "stock" in figures:
            print(f"speed-up: {figures['stock'][0] / figures['ours'][0]:.2f}x on {cores} cores")
            stock, ours = grades(base / "stock"), grades(base / "ours")
            same = sum(1 for key in stock if key in ours and abs((stock[key] or 0) - (ours[key] or 0)) < 1e-9)
            print(f"grades agree on {same} of {len(stock)} graded cells"
                  + ("" if same == len(stock) else f" ({len(stock) - same} differ: see {base})"))
        print("overhead per notebook = (wall time x parallel slots - time spent in cells) / notebooks: "
              "starting kernels, sanitizing, checking, scoring, feedback, and for ours the workers' start and the report.")
        if "distributed" in figures:
            ours, theirs = grades(base / "ours"), grades(base / "distributed")
            print(f"the Dask cluster's gradebook {'equals' if ours == theirs else 'DIFFERS FROM'} the local mode's "
                  f"({len(theirs)} graded cells)")
            extra = figures["distributed"][0] - figures["ours"][0]
            print(f"scheduling on Dask: {extra / notebooks:+.2f} s per notebook of wall time against the local mode "
                  f"(whose time includes starting its workers; the cluster's were already up); hand-off = median "
                  "time a worker waits between two notebooks (Dask: result to scheduler, next task to worker). "
                  "The Dask row's CPU s includes starting and stopping the cluster.")
        print("peak MB: proportional set sizes summed over the process tree (a page shared by forked "
              "kernels counts once); peak RSS MB sums resident sizes (shared pages once per process).")
        print(f"CPU s: user + system time of every process involved; the machine's load average was "
              f"{os.getloadavg()[0]:.1f} (other work slows both runs alike)")
        return 0
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
