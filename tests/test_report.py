"""The class report's charts: drawn by the grading pool's processes, once they have graded, together
with the grade command's own process; the same report as one drawn here alone."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from types import SimpleNamespace

from autograder.engine import report
from autograder.engine.report import Row

REPOSITORY = Path(__file__).resolve().parent.parent


class Ledger:
    def __init__(self, summaries: dict):
        self._summaries = summaries

    def summaries(self) -> dict:
        return self._summaries


def class_rows() -> tuple[list[Row], Ledger]:
    """Two assignments, three students, one of them with a catalogued mistake."""
    rows = []
    for assignment in ("01_attention", "02_causal_masking"):
        for student, points in (("ann", 2.0), ("bob", 1.0), ("cy", 0.0)):
            mistake = "softmax-no-max-subtraction" if points < 2 else None
            rows.append(Row(student, assignment, assignment, "softmax", "test_softmax", points, 2.0, [], mistake))
            rows.append(Row(student, assignment, assignment, "attention", "test_attention", 1.0, 1.0, [], None))
    mistake = {"mistake": "softmax-no-max-subtraction", "mistake_name": "no max"}
    checks = [{"cell": "test_softmax", "passed": False, **mistake}]
    return rows, Ledger({("bob", "01_attention", "01_attention"): {"checks": checks, "flags": []}})


def course_stub() -> SimpleNamespace:
    return SimpleNamespace(coursedir=SimpleNamespace(course_id="course"), db_url="sqlite:///gradebook.db")


def without_date(document: str) -> str:
    return re.sub(r"Generated \d{4}-\d\d-\d\d \d\d:\d\d", "Generated", document)


def test_the_report_is_the_same_drawn_here_or_by_the_pool(tmp_path):
    """Every chart goes through the runner's ``map``: a real local pool draws them, and the report is
    the same, image for image, as one drawn in this process alone."""
    from autograder.engine.runners import LocalPool
    from autograder.sandboxing.bubblewrap import Limits

    rows, ledger = class_rows()
    here = tmp_path / "here.html"
    report.write_report(course_stub(), ledger, rows, here)
    pool = LocalPool(REPOSITORY, Limits(), sandboxed=False, workers=2)
    drawn_by: list = []

    def map_in_pool(function, charts):
        assert function is report.draw
        images = []
        for image, pid in pool.map(_draw_and_say_where, charts):
            images.append(image)
            drawn_by.append(pid)
        return images

    try:
        pool.start(2)
        there = tmp_path / "there.html"
        report.write_report(course_stub(), ledger, rows, there, map_charts=map_in_pool)
    finally:
        pool.join()
    assert len(drawn_by) == 3  # a chart per assignment, and the misconceptions
    assert set(drawn_by) - {os.getpid()}, "the pool drew none of them"
    document = here.read_text(encoding="utf-8")
    assert document.count("data:image/png;base64,") == 3
    assert without_date(there.read_text(encoding="utf-8")) == without_date(document)


def _draw_and_say_where(chart) -> tuple[str, int]:
    return report.draw(chart), os.getpid()


def test_a_pool_that_cannot_draw_leaves_the_drawing_here(tmp_path):
    """A runner whose workers are gone (``map`` raises) costs the report nothing: it is drawn here."""
    rows, ledger = class_rows()

    def broken(function, charts):
        raise RuntimeError("the pool is gone")

    path = tmp_path / "report.html"
    report.write_report(course_stub(), ledger, rows, path, map_charts=broken)
    assert path.read_text(encoding="utf-8").count("data:image/png;base64,") == 3


def _pid(_item) -> int:
    return os.getpid()


def _slowly(item: int) -> tuple[int, int]:
    time.sleep(0.05)
    return item, os.getpid()


def test_the_pools_map_shares_the_items_between_its_processes_and_this_one():
    """``LocalPool.map``: every item once, results in order; the pool takes from the front and the
    command's process from the back (the charts are drawn on both cores, also with one worker)."""
    from autograder.engine.runners import LocalPool
    from autograder.sandboxing.bubblewrap import Limits

    pool = LocalPool(REPOSITORY, Limits(), sandboxed=False, workers=1)
    try:
        pool.start(1)
        pool._launched()
        pool_pid = pool.lanes[0].executor.submit(_pid, None).result(timeout=120)
        results = pool.map(_slowly, list(range(20)))
    finally:
        pool.join()
    assert [item for item, _ in results] == list(range(20))
    by = [pid for _, pid in results]
    assert set(by) == {pool_pid, os.getpid()}
    first_here = by.index(os.getpid())
    assert set(by[:first_here]) == {pool_pid} and set(by[first_here:]) == {os.getpid()}, by
