"""Where a notebook's time goes on its worker: seconds per phase, in a plain dict (``Result.phases``).

Each phase is timed where its code runs, with the wall clock, and summed per notebook; the dict
travels with the result to the grade command (as ``kernel_seconds`` does) and into the ledger, where
``./course bench grading --phases`` reads it. ``PHASES`` names them in the pipeline's order, with
what each covers of the real code (the table's legend); the writer's phase is timed by the grade
command itself (``last-run.json``'s ``commit_each``).
"""

from __future__ import annotations

import time
from contextlib import contextmanager

PHASES = {
    "fork": "forking the kernel and making its namespaces (the warm interpreter's `spawn`)",
    "boot": "the kernel's start and boot: connection file, channels, until it answers kernel_info; "
    "its channels and files let go after the notebook",
    "referee": "the referee's start and its loading of the reference (`Referee.prepare`, before the cells "
    "and after a stopped call), and the worker's judge built once per assignment",
    "cells": "the notebook's cells: each cell's wall time, less the judge, the substitutes and the checks below",
    "judge": "the judge: the verdict server answering each check (shipment, verdict, refusals), and the "
    "verdicts applied to the graded notebook after the cells",
    "substitutes": "the substitutes' calls: the referee computing the reference's answers (`Referee.ask`)",
    "checks": "the probes and cases of each hidden check, in the kernel (from its `begin` to its result, "
    "less the substitutes); no out-of-reach check runs while grading (that scan is a test)",
    "interpreter": "the interpreter checked and, when in doubt, replaced: the ping before each kernel, the "
    "sweep after each cell, the reset after the notebook, a new interpreter when one is retired",
    "sanitize": "sanitizing: the file read, grading metadata restored, tampering inspected, nbgrader's "
    "sanitize; after the cells, nbgrader's output limits and the inert allow-list",
    "feedback": "rendering feedback: the graded notebook's JSON, its scores and comments, the HTML page",
    "writer": "the writer, in the grade command's process: gradebook rows, files, the ledger",
}


def begin(phases: dict) -> tuple[float, float]:
    """A mark to time from (``end``): now, and what ``phases`` holds so far."""
    return time.perf_counter(), sum(phases.values())


def end(phases: dict, name: str, mark: tuple[float, float]) -> None:
    """Add the seconds since ``mark`` to ``phases[name]``, less what other phases gained meanwhile
    (time timed inside counts as its own phase, never twice)."""
    add(phases, name, since(phases, mark))


def since(phases: dict, mark: tuple[float, float]) -> float:
    started, inner = mark
    return time.perf_counter() - started - (sum(phases.values()) - inner)


@contextmanager
def timed(phases: dict | None, name: str):
    """``begin``/``end`` around a ``with`` block; nothing when ``phases`` is None."""
    if phases is None:
        yield
        return
    mark = begin(phases)
    try:
        yield
    finally:
        end(phases, name, mark)


def add(phases: dict, name: str, seconds: float) -> None:
    phases[name] = phases.get(name, 0.0) + seconds
