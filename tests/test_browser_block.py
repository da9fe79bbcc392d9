"""Real JupyterLab, real chromium: notebook 06's widgets show the right numbers.

test_browser_acceptance.py already checks that every widget renders and that
every control changes it; here the topic's own facts are read off the page.
``ran_solution`` (conftest.py) gives the solution notebook after its one Run
All of the session; the page is shared, so each change is undone at the end.
"""

from browser_harness import ARTIFACTS, needs_chromium

pytestmark = needs_chromium


def test_gate_explorer_shows_silu_2_times_half_and_follows_x_w1(ran_solution):
    notebook = ran_solution("06_transformer_block")
    explorer = notebook.only_explorer("silu-gate-explorer")
    readout = explorer.locator.locator(".gate-readout")
    assert "= 1.76; times x·W3 = 0.50 gives 0.88" in readout.inner_text()  # the worked example

    explorer.key_on("z-slider", "ArrowRight")
    assert "SiLU(2.10)" in readout.inner_text()
    ARTIFACTS.mkdir(exist_ok=True)
    explorer.locator.screenshot(path=ARTIFACTS / "silu-gate-explorer.png")

    explorer.key_on("z-slider", "ArrowLeft")
    assert "gives 0.88" in readout.inner_text()


def test_stream_explorer_goes_one_layer_deeper(ran_solution):
    notebook = ran_solution("06_transformer_block")
    explorer = notebook.only_explorer("residual-stream-explorer")
    stats = explorer.locator.locator(".stream-stats")
    gradient = explorer.locator.locator(".gradient-stats")
    assert "after 12 layers" in stats.inner_text()
    assert "post-norm RMS 1.00" in stats.inner_text()  # squeezed back to 1 after every sub-layer
    # the backward pass: with residuals the gradient reaches the input in scale, without it 103 times larger
    assert "pre-norm 6.2×" in gradient.inner_text() and "no residual 103×" in gradient.inner_text()

    explorer.key_on("layers-slider", "ArrowRight")
    assert "after 13 layers" in stats.inner_text()
    assert "pre-norm 6.2×" not in gradient.inner_text()  # one layer more between the loss and the input
    ARTIFACTS.mkdir(exist_ok=True)
    explorer.locator.screenshot(path=ARTIFACTS / "residual-stream-explorer.png")

    explorer.key_on("layers-slider", "ArrowLeft")
    assert "after 12 layers" in stats.inner_text()
    assert "pre-norm 6.2×" in gradient.inner_text()
