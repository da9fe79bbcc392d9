"""Real JupyterLab, real chromium: notebook 03's solution runs and both widgets respond.

Fixtures ``lab`` (one JupyterLab for the session), ``browser`` and ``open_copy``
come from conftest.py.
"""
from pathlib import Path

from browser_harness import ARTIFACTS, needs_chromium

REPOSITORY = Path(__file__).resolve().parent.parent

pytestmark = needs_chromium


def press(notebook, selector: str, key: str) -> None:
    """A key press on a slider's handle (click it first, as a learner would)."""
    handle = notebook.page.locator(f"{selector} .noUi-handle")
    handle.scroll_into_view_if_needed()
    handle.focus()
    notebook.page.keyboard.press(key)


def test_notebook_03_runs_and_both_widgets_respond(open_copy):
    notebook = open_copy(REPOSITORY / "solutions" / "03_multi_head_attention" / "03_multi_head_attention.ipynb")
    notebook.run_all()
    assert notebook.error_outputs() == []
    ARTIFACTS.mkdir(exist_ok=True)

    # the shape walk: one more head (2 -> 4) re-cuts every token
    walk = ".shape-walk"
    before = notebook.canvas_pixels(walk)
    press(notebook, f"{walk} .heads-slider", "ArrowRight")
    notebook.wait_for_new_pixels(walk, before)
    text = notebook.page.locator(f"{walk} .shape-walk-text").inner_text()
    assert "(1, 4, 3, 2)" in text and "head 2 ← features 4–5 (row 1)" in text
    notebook.page.locator(walk).screenshot(path=ARTIFACTS / "shape-walk.png")

    # per-head patterns: the next query moves the frame and the bars
    patterns = ".head-patterns"
    before = notebook.canvas_pixels(patterns)
    press(notebook, f"{patterns} .query-slider", "ArrowRight")
    notebook.wait_for_new_pixels(patterns, before)
    assert "query “on”" in notebook.page.locator(f"{patterns} .head-summary").inner_text()
    # and the causal mask empties every head's upper triangle
    before = notebook.canvas_pixels(patterns)
    notebook.page.locator(f"{patterns} .causal-toggle input").click()
    notebook.wait_for_new_pixels(patterns, before)
    notebook.page.locator(patterns).screenshot(path=ARTIFACTS / "head-patterns.png")
