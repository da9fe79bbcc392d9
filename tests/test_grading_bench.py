"""``./course bench grading --phases``: where a notebook's grading time goes, as a user runs it.

The real command grades a tiny clean class (one student, notebook 00) with the real grader, once
with one worker and once with two, and prints the seconds each phase took; the tests read that
table. They check what the table says, never how fast anything was.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from grading_harness import sandbox_works

from autograder.worker.phases import PHASES

REPOSITORY = Path(__file__).resolve().parent.parent
NUMBER = r"(-?\d+\.\d+)\s+(-?\d+\.\d+)%"
# Phases every graded notebook goes through (a notebook without substitutes or probes skips those two).
ALWAYS = ("fork", "boot", "referee", "cells", "judge", "interpreter", "sanitize", "feedback", "writer")

pytestmark = pytest.mark.skipif(not sandbox_works(), reason="bubblewrap cannot start a sandbox here")


def run_bench(*arguments: str) -> str:
    """``./course bench grading --phases ARGUMENTS`` as a user runs it; what it printed."""
    run = subprocess.run(
        [str(REPOSITORY / "course"), "bench", "grading", "--phases", *arguments],
        cwd=REPOSITORY,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return run.stdout


@pytest.fixture(scope="module")
def bench() -> str:
    return run_bench("--students", "1", "--notebooks", "00_start_here")


def table(output: str) -> dict[str, list[tuple[float, float]]]:
    """This checkout's phase table: row name -> [(median seconds, share %) per column]."""
    section = output.split("where a notebook's time goes:", 1)[1].split("the figures every release records", 1)[0]
    rows = {}
    for line in section.splitlines():
        numbers = re.findall(NUMBER, line)
        if numbers:
            rows[line[:34].strip()] = [(float(seconds), float(share)) for seconds, share in numbers]
    return rows


def test_the_bench_grades_the_class_with_one_worker_and_with_two(bench):
    graded = re.findall(r"(\d) workers?: (\d+) notebooks of 1 x 1 graded \((\d+) flagged\)", bench)
    assert [(workers, count, flagged) for workers, count, flagged in graded] == [("1", "1", "0"), ("2", "1", "0")]
    header = bench.split("where a notebook's time goes:", 1)[1].splitlines()[1]
    assert "1 worker" in header and "2 workers" in header


def test_every_phase_has_a_row_with_a_figure_per_column_and_a_line_of_legend(bench):
    rows = table(bench)
    for name in PHASES:
        assert len(rows[name]) == 2, name
        assert all(seconds >= 0 for seconds, _ in rows[name]), name
        assert re.search(rf"^  {name}\s+\S", bench, re.MULTILINE), f"no legend for {name}"
    for name in ALWAYS:  # each was timed where it ran, in every run
        assert all(seconds > 0 for seconds, _ in rows[name]), name


def test_the_phases_add_up_to_the_notebooks_wall_time_and_the_rest_is_what_is_left(bench):
    rows = table(bench)
    for column in range(2):
        phases = sum(rows[name][column][0] for name in PHASES)
        total, rest, wall = (
            rows[name][column][0] for name in ("sum of the phases", "rest (unaccounted)", "wall (worker + writer)")
        )
        # one notebook per column: its medians are its own figures, printed to the millisecond
        assert phases == pytest.approx(total, abs=0.001 * len(PHASES))
        assert total <= wall + 0.001
        assert rest == pytest.approx(wall - total, abs=0.002)
        shares = sum(rows[name][column][1] for name in PHASES) + rows["rest (unaccounted)"][column][1]
        assert shares == pytest.approx(100.0, abs=0.1 * (len(PHASES) + 1))
        assert rows["wall (worker + writer)"][column][1] == 100.0


def test_the_figures_every_release_records_are_printed_beside_them(bench):
    outside = bench.split("the figures every release records, side by side:", 1)[1]
    for name in ("kernels started and stopped", "cells", "the rest of the worker's time", "writer"):
        assert len(re.findall(NUMBER, next(line for line in outside.splitlines() if line.startswith(name)))) == 2


@pytest.fixture(scope="module")
def four() -> str:
    """The bench on four notebooks (four students, notebook 00), one worker, comparing two at each end."""
    return run_bench("--students", "4", "--notebooks", "00_start_here", "--workers", "1", "--window", "2")


def test_each_run_says_whether_the_last_notebooks_took_as_long_as_the_first(bench, four):
    """Flatness: the first and the last notebooks graded, each over its assignment's median; the ratio
    printed is the ratio of the figures printed. One notebook is too few to say."""
    lines = re.findall(
        r"1 worker: flatness: of 4 notebooks in the order graded, the first 2 took (\d+\.\d+) and the last 2 "
        r"(\d+\.\d+) of their assignment's median \(medians; last/first (\d+\.\d+)\)",
        four,
    )
    assert len(lines) == 1, four[-3000:]
    first, last, ratio = (float(figure) for figure in lines[0])
    assert first > 0 and last > 0
    assert ratio == pytest.approx(last / first, abs=0.002)
    assert "4 notebooks of 4 x 1 graded" in four
    assert bench.count("flatness: 1 notebooks, fewer than twice the window of 20: not measured") == 2


def test_each_run_says_what_the_grade_commands_own_process_held_at_its_peak(bench):
    """The writer's process keeps no notebook once it is committed: the figure lets a maintainer
    compare a small class with a big one."""
    peaks = re.findall(
        r"(\d) workers?: the grade command's own process \(the writer, the report\): (\d+\.\d) MB", bench
    )
    assert [workers for workers, _ in peaks] == ["1", "2"], bench[-3000:]
    assert all(float(megabytes) > 0 for _, megabytes in peaks)


# A fresh interpreter, as the bench is: what it measures are its own descendants (in the suite, the
# test process has others: JupyterLab, chromium, clusters). It loads the bench, starts a process that
# holds 200 MB and a child of it that holds 100 MB, and prints the peaks counted apart and not.
MEASURE = """
import importlib.util, json, os, signal, subprocess, sys, time
spec = importlib.util.spec_from_file_location("grading_bench", sys.argv[1])
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)
holds = "import sys, time; block = bytearray({} * 2**20); block[::4096] = b'x' * len(block[::4096]); "
child = holds.format(100) + "print('ready', flush=True); time.sleep(30)"
parent = holds.format(200) + (
    f"import subprocess; c = subprocess.Popen([sys.executable, '-c', {child!r}], stdout=subprocess.PIPE, "
    "text=True); c.stdout.readline(); print('ready', flush=True); time.sleep(30)"
)
holder = subprocess.Popen([sys.executable, "-c", parent], stdout=subprocess.PIPE, text=True, start_new_session=True)
try:
    assert holder.stdout.readline().strip() == "ready"
    with bench.PeakMemory(apart={holder.pid}) as memory:
        time.sleep(0.5)  # a few samples
finally:
    os.killpg(holder.pid, signal.SIGKILL)  # its child too
    holder.wait()
print(json.dumps([memory.peak_apart_mb, memory.peak_mb]))
"""


def test_the_peak_leaves_out_the_processes_counted_apart_and_counts_what_they_start():
    """The Dask row's split, with real processes: one counted apart (as the cluster's scheduler and
    nannies are) holds 200 MB, and a child it starts (as a nanny's worker process, which grades)
    holds 100 MB; the apart figure is the first, the peak the second."""
    run = subprocess.run(
        [sys.executable, "-c", MEASURE, str(REPOSITORY / "tools" / "bench" / "grading.py")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    apart, peak = json.loads(run.stdout.splitlines()[-1])
    assert 200 <= apart < 240, apart
    assert 100 <= peak < 140, peak


# The bench's two runs of a row, in a fresh interpreter: a command that notes when it ran (in the
# folder it runs in) is timed, then sampled; the sampler's samples are noted as they are taken.
TIMED_THEN_SAMPLED = """
import importlib.util, json, sys, time
from pathlib import Path
spec = importlib.util.spec_from_file_location("grading_bench", sys.argv[1])
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)
samples, sample = [], bench.PeakMemory._tree_mb
def noted(self):
    samples.append(time.monotonic())
    return sample(self)
bench.PeakMemory._tree_mb = noted
runs = [Path(folder) for folder in sys.argv[2:4]]
notes = "import time; from pathlib import Path; a = time.monotonic(); time.sleep(0.6); "
notes += "Path('ran').write_text(f'{a} {time.monotonic()}')"
wall, memory, cpu, result = bench.timed_then_sampled([sys.executable, "-c", notes], runs)
print(json.dumps({"wall": wall, "samples": samples, "runs": [[float(t) for t in (r / "ran").read_text().split()] for r in runs]}))
"""


def test_a_rows_wall_time_is_from_a_run_nothing_samples(tmp_path):
    """The memory sampler takes a third of a core: the bench times each row in a run of its own, and
    samples its memory and CPU in a second run, on a fresh copy of the class."""
    timed, sampled = tmp_path / "timed", tmp_path / "sampled"
    timed.mkdir(), sampled.mkdir()
    run = subprocess.run(
        [sys.executable, "-c", TIMED_THEN_SAMPLED, str(REPOSITORY / "tools" / "bench" / "grading.py"), timed, sampled],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    seen = json.loads(run.stdout.splitlines()[-1])
    (first_began, first_ended), (second_began, second_ended) = seen["runs"]
    assert first_ended <= second_began
    assert not [t for t in seen["samples"] if first_began <= t <= first_ended], "the timed run was sampled"
    assert len([t for t in seen["samples"] if second_began <= t <= second_ended]) >= 3
    assert first_ended - first_began <= seen["wall"] < second_began - first_began + 0.6
