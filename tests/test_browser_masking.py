"""Real JupyterLab, real chromium: notebook 02's solution runs and its widgets respond.

Fixtures ``lab``, ``browser`` and ``open_copy`` come from conftest.py.
"""
from pathlib import Path

from browser_harness import ARTIFACTS, needs_chromium

REPOSITORY = Path(__file__).resolve().parent.parent

pytestmark = needs_chromium


def test_notebook_02_runs_and_both_widgets_respond(open_copy):
    notebook = open_copy(REPOSITORY / "solutions" / "02_causal_masking" / "02_causal_masking.ipynb")
    notebook.run_all()
    assert notebook.error_outputs() == []
    ARTIFACTS.mkdir(exist_ok=True)

    # the mask explorer: a key press on "change by" edits token 2; outputs 2 to 4 move, 0 and 1 do not
    explorer = ".mask-explorer"
    before = notebook.canvas_pixels(explorer)
    notebook.page.locator(f"{explorer} .change-slider").scroll_into_view_if_needed()
    handle = notebook.page.locator(f"{explorer} .change-slider .noUi-handle")
    handle.focus()
    notebook.page.keyboard.press("ArrowRight")
    notebook.wait_for_new_pixels(explorer, before)
    summary = notebook.page.locator(f"{explorer} .mask-summary").inner_text()
    assert "tokens 2, 3, 4 moved" in summary and "tokens 0, 1 did not move" in summary, summary
    notebook.page.locator(explorer).screenshot(path=ARTIFACTS / "mask-explorer.png")

    # the cache mask: a key press on "queries T" shows 4 queries against the 7 keys
    viewer = ".cache-mask-viewer"
    before = notebook.canvas_pixels(viewer)
    notebook.page.locator(f"{viewer} .queries-slider").scroll_into_view_if_needed()
    notebook.page.locator(f"{viewer} .queries-slider .noUi-handle").focus()
    notebook.page.keyboard.press("ArrowRight")
    notebook.wait_for_new_pixels(viewer, before)
    assert "3 keys come from the cache and 4 from the new tokens" in \
        notebook.page.locator(f"{viewer} .cache-summary").inner_text()
    notebook.page.locator(viewer).screenshot(path=ARTIFACTS / "cache-mask-viewer.png")
