"""Benchmark: how long ./course takes to answer --help and ./course grade --help, and a set-up with nothing to do.

    ./course bench startup [--repeat N]

Each command runs N times as a user runs it (./course through its shebang, so through whatever
`python3` PATH finds first) and once more through the venv's Python directly; the median and the
slowest of the wall times are printed with the machine's load, never asserted.
"""

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[2]


def wall_times(command: list[str], repeat: int) -> list[float]:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        subprocess.run(command, cwd=REPOSITORY, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        times.append(time.perf_counter() - started)
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=9)
    args = parser.parse_args()
    course = str(REPOSITORY / "course")
    commands = {
        "./course --help": [course, "--help"],
        "python course --help": [sys.executable, course, "--help"],
        "./course grade --help": [course, "grade", "--help"],
        "python course grade --help": [sys.executable, course, "grade", "--help"],
        "python -m autograder.grade --help": [sys.executable, "-m", "autograder.grade", "--help"],
        "./course setup student (nothing to do)": [course, "setup", "student"],
        "python -c pass (the interpreter alone)": [sys.executable, "-c", "pass"],
    }
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; {args.repeat} runs each")
    print(f"{'command':<40} {'median s':>9} {'slowest s':>10}")
    for name, command in commands.items():
        times = wall_times(command, args.repeat)
        print(f"{name:<40} {statistics.median(times):>9.3f} {max(times):>10.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
