"""Real JupyterLab, real chromium: notebook 04's solution runs and its three widgets respond.

Fixtures ``lab``, ``browser`` and ``open_copy`` come from conftest.py.
"""
from pathlib import Path

from browser_harness import ARTIFACTS, needs_chromium

REPOSITORY = Path(__file__).resolve().parent.parent

pytestmark = needs_chromium


def press_on_slider(notebook, selector: str, key: str = "ArrowRight") -> None:
    handle = notebook.page.locator(f"{selector} .noUi-handle")
    handle.scroll_into_view_if_needed()
    handle.focus()
    notebook.page.keyboard.press(key)


def test_notebook_04_runs_and_its_three_widgets_respond(open_copy):
    notebook = open_copy(REPOSITORY / "solutions" / "04_rope" / "04_rope.ipynb")
    notebook.run_all()
    assert notebook.error_outputs() == []
    ARTIFACTS.mkdir(exist_ok=True)

    # a pair turning: one step right on "position m" turns pair 0 to position 4 (4 rad)
    rotation = ".rope-rotation"
    before = notebook.canvas_pixels(rotation)
    press_on_slider(notebook, f"{rotation} .position-slider")
    notebook.wait_for_new_pixels(rotation, before)
    readout = notebook.page.locator(f"{rotation} .rope-rotation-readout").inner_text()
    assert "4 × 1 = 4.000 rad" in readout and "(-0.654, -0.757)" in readout
    notebook.page.locator(rotation).screenshot(path=ARTIFACTS / "rope-rotation.png")

    # the score over (m, n): query at m = 4 against the key at n = 1
    scores = ".rope-scores"
    before = notebook.canvas_pixels(scores)
    press_on_slider(notebook, f"{scores} .m-slider")
    notebook.wait_for_new_pixels(scores, before)
    readout = notebook.page.locator(f"{scores} .rope-scores-readout").inner_text()
    assert "q at position 4, k at position 1 (distance m − n = 3)" in readout
    notebook.page.locator(scores).screenshot(path=ARTIFACTS / "rope-scores.png")

    # neighbour vs half-split: clicking head_dim 16 redraws 16 dimensions
    pairing = ".rope-pairing"
    before = notebook.canvas_pixels(pairing)
    notebook.page.locator(f"{pairing} .head-dim-choice button", has_text="16").click()
    notebook.wait_for_new_pixels(pairing, before)
    readout = notebook.page.locator(f"{pairing} .rope-pairing-readout").inner_text()
    assert "(1, 9)" in readout and "✓" in readout
    notebook.page.locator(pairing).screenshot(path=ARTIFACTS / "rope-pairing.png")
