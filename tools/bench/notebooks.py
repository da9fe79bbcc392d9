"""Benchmark: run every solution notebook and print its run time and peak memory.

    ./course bench [--repeat N]

Run time is the median over N runs of executing all cells (kernel start
excluded); peak memory is the kernel's high-water mark of resident memory.
Both are printed, never asserted: figures for the site (docs/figures.md) and issue notes.
"""

import argparse
import statistics
import sys
from pathlib import Path

# the tests' harness (notebook runner, browser driver, synthetic classes) is the benchmark's too
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from notebook_runner import REPOSITORY, execute  # noqa: E402

from autograder.release import assignments  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("assignments", nargs="*")
    args = parser.parse_args()
    print(f"{'notebook':<20} {'median s':>9} {'peak MB':>8}  (solution versions, {args.repeat} runs)")
    for assignment in args.assignments or assignments():
        runs = [execute(REPOSITORY / "solutions" / assignment / f"{assignment}.ipynb") for _ in range(args.repeat)]
        failed = [error for run in runs for error in run.errors()]
        print(
            f"{assignment:<20} {statistics.median(r.seconds for r in runs):>9.2f} "
            f"{max(r.peak_rss_mb for r in runs):>8.0f}" + (f"  ERRORS: {failed[:2]}" if failed else "")
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
