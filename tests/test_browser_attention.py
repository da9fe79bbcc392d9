"""Real JupyterLab, real chromium: notebook 01's solution runs and its widgets respond.

Fixtures ``lab`` (one JupyterLab for the session), ``browser`` and ``open_copy``
come from conftest.py; every topic's browser test module uses them.
"""
from pathlib import Path

from browser_harness import ARTIFACTS, needs_chromium

REPOSITORY = Path(__file__).resolve().parent.parent

pytestmark = needs_chromium


def test_notebook_01_runs_and_both_widgets_respond(open_copy):
    notebook = open_copy(REPOSITORY / "solutions" / "01_attention" / "01_attention.ipynb")
    notebook.run_all()
    assert notebook.error_outputs() == []

    # the heatmap: a key press on the query slider moves to query 1
    heatmap = ".attention-heatmap"
    before = notebook.canvas_pixels(heatmap)
    notebook.page.locator(f"{heatmap} .query-slider").scroll_into_view_if_needed()
    ARTIFACTS.mkdir(exist_ok=True)
    notebook.page.locator(heatmap).screenshot(path=ARTIFACTS / "attention-heatmap.png")
    handle = notebook.page.locator(f"{heatmap} .query-slider .noUi-handle")
    handle.focus()
    notebook.page.keyboard.press("ArrowRight")
    notebook.wait_for_new_pixels(heatmap, before)
    assert "(2.20, 6.02)" in notebook.page.locator(f"{heatmap} .attention-output").inner_text()

    # the √d explorer: unticking "divide by √d" redraws the bars, now saturated
    explorer = ".scaling-explorer"
    before = notebook.canvas_pixels(explorer)
    notebook.page.locator(f"{explorer} .scale-toggle input").click()
    notebook.wait_for_new_pixels(explorer, before)
    assert "not scaled" in notebook.page.locator(f"{explorer} .scaling-stats").inner_text()
    notebook.page.locator(explorer).screenshot(path=ARTIFACTS / "scaling-explorer.png")
