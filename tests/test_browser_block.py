"""Real JupyterLab, real chromium: notebook 06's widgets show the right numbers.

test_browser_acceptance.py already checks that every widget renders and that
every control changes it; here the topic's own facts are read off the page.
``ran_solution`` (conftest.py) gives the solution notebook after its one Run
All of the session; the page is shared, so each change is undone at the end.
"""
from browser_harness import ARTIFACTS, needs_chromium

pytestmark = needs_chromium


def only_explorer(notebook, css_class: str):
    [explorer] = [e for e in notebook.explorers() if e.topic_class == css_class]
    explorer.locator.scroll_into_view_if_needed()
    explorer.settle()
    return explorer


def press(notebook, explorer, slider_class: str, key: str) -> None:
    """One arrow key on a slider's handle; wait until the figure's pixels change."""
    explorer.arm()
    explorer.locator.locator(f".{slider_class} .noUi-handle").focus()
    notebook.page.keyboard.press(key)
    assert explorer.wait_for_change(pixels_only=True).what == "pixels"
    explorer.settle()


def test_gate_explorer_shows_silu_2_times_half_and_follows_x_w1(ran_solution):
    notebook = ran_solution("06_transformer_block")
    explorer = only_explorer(notebook, "silu-gate-explorer")
    readout = explorer.locator.locator(".gate-readout")
    assert "= 1.76; times x·W3 = 0.50 gives 0.88" in readout.inner_text()  # the worked example

    press(notebook, explorer, "z-slider", "ArrowRight")
    assert "SiLU(2.10)" in readout.inner_text()
    ARTIFACTS.mkdir(exist_ok=True)
    explorer.locator.screenshot(path=ARTIFACTS / "silu-gate-explorer.png")

    press(notebook, explorer, "z-slider", "ArrowLeft")
    assert "gives 0.88" in readout.inner_text()


def test_stream_explorer_goes_one_layer_deeper(ran_solution):
    notebook = ran_solution("06_transformer_block")
    explorer = only_explorer(notebook, "residual-stream-explorer")
    stats = explorer.locator.locator(".stream-stats")
    assert "after 12 layers" in stats.inner_text()
    assert "post-norm RMS 1.00" in stats.inner_text()  # squeezed back to 1 after every sub-layer

    press(notebook, explorer, "layers-slider", "ArrowRight")
    assert "after 13 layers" in stats.inner_text()
    ARTIFACTS.mkdir(exist_ok=True)
    explorer.locator.screenshot(path=ARTIFACTS / "residual-stream-explorer.png")

    press(notebook, explorer, "layers-slider", "ArrowLeft")
    assert "after 12 layers" in stats.inner_text()
