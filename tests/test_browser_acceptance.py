"""Acceptance in a real browser, for every notebook in solutions/ and every widget in it.

Each solution notebook is opened in JupyterLab (chromium) and run with Run All
once per session (the ``ran_solution`` fixture, shared with each topic's own
browser tests). Then:

* Run All finished with no error output, and every course widget on the page
  sits in a cell tagged ``widget`` (so the tests below cover it);
* every widget cell shows its widget(s): no "implement this first" message, and
  every figure canvas drawn;
* every control of every widget takes one real input (a key press, a click, a
  choice, see explorer_driver.py) and the widget visibly changes (pixels, or
  text outside its controls); the undoing input changes it again, which leaves
  the shared notebook as it was.

A screenshot of each widget is saved in test-artifacts/widgets/, and one of each widget cell's
output, as drawn before any input, in test-artifacts/widgets/cells/<assignment>--<cell id>.png:
the site shows those in place of the live widgets (`./course docs --screenshots` copies them to
assets/screenshots/widgets/, where the README's pictures are too).

Nothing here knows a topic: a new notebook with widgets is covered as soon as
it is in solutions/ with its widget cells tagged.
"""

import json
from pathlib import Path

import pytest
from browser_harness import ARTIFACTS, needs_chromium

from autograder.release import assignments

REPOSITORY = Path(__file__).resolve().parent.parent
SCREENSHOTS = ARTIFACTS / "widgets"

pytestmark = needs_chromium


def widget_cells(assignment: str) -> list[int]:
    """Indices of the cells tagged ``widget`` in the solution notebook."""
    notebook = json.loads((REPOSITORY / "solutions" / assignment / f"{assignment}.ipynb").read_text())
    return [i for i, cell in enumerate(notebook["cells"]) if "widget" in cell.get("metadata", {}).get("tags", [])]


def cell_id(assignment: str, index: int) -> str:
    """The cell's nbformat id, which the released notebook keeps (the site finds its screenshot by it)."""
    notebook = json.loads((REPOSITORY / "solutions" / assignment / f"{assignment}.ipynb").read_text())
    return notebook["cells"][index]["id"]


ASSIGNMENTS = assignments()
WIDGET_CELLS = [(assignment, cell) for assignment in ASSIGNMENTS for cell in widget_cells(assignment)]


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_run_all_completes_without_error_output(ran_solution, assignment):
    notebook = ran_solution(assignment)
    assert notebook.error_outputs() == []
    notebook_json = json.loads((REPOSITORY / "solutions" / assignment / f"{assignment}.ipynb").read_text())
    assert notebook.cells().count() == len(notebook_json["cells"])
    # every widget on the page is in a tagged cell, so the tests below reach it
    tagged = sum(len(notebook.explorers(cell)) for cell in widget_cells(assignment))
    assert len(notebook.explorers()) == tagged, "a course widget sits in a cell not tagged `widget`"


@pytest.mark.parametrize("assignment, cell", WIDGET_CELLS, ids=[f"{a}-cell{c}" for a, c in WIDGET_CELLS])
def test_widget_renders_and_each_control_visibly_changes_it(ran_solution, assignment, cell):
    notebook = ran_solution(assignment)
    explorers = notebook.explorers(cell)
    assert explorers, f"cell {cell} is tagged `widget` but shows no course widget (class course-explorer)"
    for explorer in explorers:
        name = explorer.topic_class
        assert explorer.problem == "", f"{name} waits for a function in the solution notebook: {explorer.problem}"
        explorer.locator.scroll_into_view_if_needed()
        notebook.page.wait_for_function("id => window.__courseProbe.drawn(id)", arg=explorer.id, timeout=30_000)
        explorer.screenshot(SCREENSHOTS / f"{assignment}--{name}.png")
    output = notebook.cells().nth(cell).locator(".jp-Cell-outputWrapper")
    output.scroll_into_view_if_needed()
    (SCREENSHOTS / "cells").mkdir(parents=True, exist_ok=True)
    output.screenshot(path=SCREENSHOTS / "cells" / f"{assignment}--{cell_id(assignment, cell)}.png")
    failures = []
    for explorer in explorers:
        name = explorer.topic_class
        controls = explorer.controls()
        assert controls, f"{name} has no enabled control in .explorer-controls"
        for control in controls:
            try:
                explorer.settle()
                explorer.arm()
                undo = explorer.give_input(control)
                explorer.wait_for_change()
                if undo is not None:
                    explorer.settle()
                    explorer.arm()
                    undo()
                    explorer.wait_for_change()
                explorer.settle()
            except AssertionError as error:
                failures.append(f"{name}, {control}: {error}")
    assert failures == []
