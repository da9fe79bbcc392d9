"""Benchmark: every widget's latency in a real browser, from an input to the changed pixels.

    ./course bench widgets [--inputs N] [--per-control] [assignment ...]

Starts JupyterLab on 127.0.0.1 and Debian's chromium (as the browser tests do),
opens each solution notebook that has widgets and runs it (Run All). Each
widget then gets N real inputs: its controls in turn, each input followed by
the one that undoes it (a key press on a slider, a click on a checkbox, ...;
see explorer_driver.py). Each input is timed in the page, from the input event
to the drawing call that put the new picture on the widget's canvas (for a
widget without a canvas, to the change of its text); the widget settles (kernel
idle, nothing drawn for 300 ms) before the next input.

Prints a table: per widget, the median and 90th percentile in milliseconds
(with --per-control, per control too). Printed, never asserted: the figures
for the README and for issue notes. The course aims at a median of at most
150 ms for every widget on a 2-core machine.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

# the tests' harness (notebook runner, browser driver, synthetic classes) is the benchmark's too
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from browser_harness import (  # noqa: E402
    CHROMIUM,
    REPOSITORY,
    JupyterLab,
    LabNotebook,
    launch_browser,
    link_assets,
    place_in_lab,
)

from autograder.release import assignments  # noqa: E402

TARGET_MS = 150


def has_widgets(assignment: str) -> bool:
    notebook = json.loads((REPOSITORY / "solutions" / assignment / f"{assignment}.ipynb").read_text())
    return any("widget" in cell.get("metadata", {}).get("tags", []) for cell in notebook["cells"])


def p90(values: list[float]) -> float:
    return statistics.quantiles(values, n=10, method="inclusive")[-1] if len(values) > 1 else values[0]


def measure(explorer, inputs: int) -> dict[str, list[float]]:
    """{control: [latency ms, ...]}: ``inputs`` timed inputs over the widget's controls,
    each control's input followed by its undo."""
    pixels_only = explorer.canvas_count() > 0
    timings: dict[str, list[float]] = defaultdict(list)
    controls = explorer.controls()
    given = 0
    for control in itertools.cycle(controls):
        undo = None
        for step in ("input", "undo"):
            if given >= inputs or (step == "undo" and undo is None):
                break
            explorer.settle()
            explorer.arm()
            if step == "input":
                undo = explorer.give_input(control)
            else:
                undo()
            change = explorer.wait_for_change(pixels_only=pixels_only)
            given += 1
            if change.latency_ms is not None:
                timings[str(control)].append(change.latency_ms)
        if given >= inputs:
            break
    explorer.settle()
    return timings


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inputs", type=int, default=12, help="timed inputs per widget (default 12)")
    parser.add_argument("--per-control", action="store_true", help="also print a row per control")
    parser.add_argument("assignments", nargs="*")
    args = parser.parse_args()
    if not Path(CHROMIUM).exists():
        print(f"{CHROMIUM} is missing: ./course setup installs it", file=sys.stderr)
        return 1
    chosen = [a for a in (args.assignments or assignments()) if has_widgets(a)]

    from playwright.sync_api import sync_playwright

    rows = []
    with (
        tempfile.TemporaryDirectory(prefix="course-bench-") as root,
        JupyterLab(link_assets(Path(root))) as lab,
        sync_playwright() as playwright,
    ):
        browser = launch_browser(playwright)
        for assignment in chosen:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            notebook = LabNotebook(
                page, lab.url(place_in_lab(lab, REPOSITORY / "solutions" / assignment / f"{assignment}.ipynb"))
            )
            notebook.open()
            started = time.perf_counter()
            notebook.run_all(timeout_s=900)
            print(f"{assignment}: Run All in the browser {time.perf_counter() - started:.1f} s", file=sys.stderr)
            for explorer in notebook.explorers():
                explorer.locator.scroll_into_view_if_needed()
                page.wait_for_function("id => window.__courseProbe.drawn(id)", arg=explorer.id, timeout=60_000)
                timings = measure(explorer, args.inputs)
                rows.append((assignment, explorer.topic_class, timings))
            page.close()
        browser.close()

    print(f"\n{'notebook':<28} {'widget':<26} {'inputs':>6} {'median ms':>10} {'p90 ms':>8}")
    for assignment, widget, timings in rows:
        values = [v for vs in timings.values() for v in vs]
        if not values:
            print(f"{assignment:<28} {widget:<26} {0:>6} {'-':>10} {'-':>8}")
            continue
        median = statistics.median(values)
        flag = "" if median <= TARGET_MS else f"  over {TARGET_MS} ms"
        print(f"{assignment:<28} {widget:<26} {len(values):>6} {median:>10.0f} {p90(values):>8.0f}{flag}")
        if args.per_control:
            for control, vs in timings.items():
                print(f"{'':<28}   {control[:23]:<23} {len(vs):>6} {statistics.median(vs):>10.0f} {p90(vs):>8.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
