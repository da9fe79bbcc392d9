"""Real JupyterLab, real chromium: notebook 06's solution runs and both widgets respond."""
from pathlib import Path

from browser_harness import ARTIFACTS, needs_chromium

REPOSITORY = Path(__file__).resolve().parent.parent

pytestmark = needs_chromium


def press(notebook, selector: str, key: str) -> None:
    handle = notebook.page.locator(f"{selector} .noUi-handle")
    handle.scroll_into_view_if_needed()
    handle.focus()
    notebook.page.keyboard.press(key)


def test_notebook_06_runs_and_both_widgets_respond(open_copy):
    notebook = open_copy(REPOSITORY / "solutions" / "06_transformer_block" / "06_transformer_block.ipynb")
    notebook.run_all()
    assert notebook.error_outputs() == []
    ARTIFACTS.mkdir(exist_ok=True)

    # the SiLU gate explorer: one key press on "x·W1" moves z from 2.0 to 2.1
    gate = ".silu-gate-explorer"
    readout = notebook.page.locator(f"{gate} .gate-readout")
    assert "0.88" in readout.inner_text()
    before = notebook.canvas_pixels(gate)
    notebook.page.locator(gate).screenshot(path=ARTIFACTS / "silu-gate-explorer.png")
    press(notebook, f"{gate} .z-slider", "ArrowRight")
    notebook.wait_for_new_pixels(gate, before)
    assert "SiLU(2.10)" in readout.inner_text()

    # the residual stream: one key press on "layers" goes from 12 to 13 layers
    stream = ".residual-stream-explorer"
    stats = notebook.page.locator(f"{stream} .stream-stats")
    assert "after 12 layers" in stats.inner_text()
    before = notebook.canvas_pixels(stream)
    press(notebook, f"{stream} .layers-slider", "ArrowRight")
    notebook.wait_for_new_pixels(stream, before)
    assert "after 13 layers" in stats.inner_text()
    notebook.page.locator(stream).screenshot(path=ARTIFACTS / "residual-stream-explorer.png")
