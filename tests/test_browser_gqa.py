"""Real JupyterLab, real chromium: notebook 05's solution runs and both widgets respond."""
from pathlib import Path

from browser_harness import ARTIFACTS, needs_chromium

REPOSITORY = Path(__file__).resolve().parent.parent
NOTEBOOK = REPOSITORY / "solutions" / "05_grouped_query_attention" / "05_grouped_query_attention.ipynb"

pytestmark = needs_chromium


def press_on_slider(notebook, selector: str, key: str = "ArrowRight") -> None:
    notebook.page.locator(selector).scroll_into_view_if_needed()
    handle = notebook.page.locator(f"{selector} .noUi-handle")
    handle.focus()
    notebook.page.keyboard.press(key)


def test_notebook_05_runs_and_both_widgets_respond(open_copy):
    notebook = open_copy(NOTEBOOK)
    notebook.run_all()
    assert notebook.error_outputs() == []
    ARTIFACTS.mkdir(exist_ok=True)

    # the head grouping: a key press moves the highlight from query head 13 to 14 (still kv head 3)
    grouping = ".head-grouping"
    before = notebook.canvas_pixels(grouping)
    press_on_slider(notebook, f"{grouping} .query-head-slider")
    notebook.wait_for_new_pixels(grouping, before)
    summary = notebook.page.locator(f"{grouping} .grouping-summary")
    assert "Query head 14 reads kv head 3" in summary.inner_text()
    # one step left on G: 8 -> 4 kv heads, groups of 8, query head 14 now reads kv head 1
    before = notebook.canvas_pixels(grouping)
    press_on_slider(notebook, f"{grouping} .kv-heads-slider", "ArrowLeft")
    notebook.wait_for_new_pixels(grouping, before)
    assert "Query head 14 reads kv head 1" in summary.inner_text()
    notebook.page.locator(grouping).screenshot(path=ARTIFACTS / "gqa-head-grouping.png")

    # the cache explorer: a key press on the sequence length goes from 4096 to 8192 tokens
    explorer = ".kv-cache-explorer"
    before = notebook.canvas_pixels(explorer)
    press_on_slider(notebook, f"{explorer} .seq-len-slider")
    notebook.wait_for_new_pixels(explorer, before)
    text = notebook.page.locator(f"{explorer} .cache-summary").inner_text()
    assert "8,192 tokens" in text and "as published: 1,073,741,824 bytes" in text
    # a click on 32-bit values redraws again
    before = notebook.canvas_pixels(explorer)
    notebook.page.locator(f"{explorer} .precision-toggle button", has_text="32-bit").click()
    notebook.wait_for_new_pixels(explorer, before)
    assert "4 bytes a value" in notebook.page.locator(f"{explorer} .cache-summary").inner_text()
    notebook.page.locator(explorer).screenshot(path=ARTIFACTS / "gqa-kv-cache.png")
