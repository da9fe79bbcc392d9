"""A widget whose figure is drawn before its page is ready still shows it. In a real browser.

ipympl's page-side view of a figure is sized by the kernel's answer to the page's "initialized"
message. A frame the kernel draws before it has read that message is an "early frame". On a busy
machine that happens under Run All: in a run of notebooks 07 and 08 at load 10, the kernel read
the page's draw request of 07's attention maps before the page's "initialized", which had been sent
earlier (read off the websocket and the kernel), in about half the runs. ipympl 0.10 sends an
early frame as raw pixels labelled PNG; the page's image breaks, the resize that follows fails on
it, and the figure stays 0 x 0 for good: the attention maps never appeared, and no key press
changed them (course_widgets/base.py sends the PNG instead).

Here the early frame is drawn on purpose: the cell that builds a widget also pushes its figure,
while the kernel is still busy with that cell and so cannot have read anything from the page.
The cell prints whether the frame went out before the handshake, so the test knows that it ran
the case it is about.
"""

import uuid

import nbformat
from browser_harness import LabNotebook, needs_chromium

pytestmark = needs_chromium

EARLY_FRAME_CELL = """\
import torch
from course_widgets.attention import AttentionHeatmap


def attention_weights(q, k, mask=None):
    return torch.softmax(q @ k.T / k.shape[-1] ** 0.5, dim=-1)


def attention(q, k, v, mask=None):
    return attention_weights(q, k) @ v


x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
explorer = AttentionHeatmap(attention_weights, attention, x, x, x)
canvas = explorer.figure.canvas
canvas.draw()  # pushes the figure to the page now, before the page's "initialized" is read
print(f"frame sent before the page was ready: {canvas.syncing_data_url}")
explorer
"""


def test_a_figure_drawn_before_its_page_is_ready_is_shown_and_updates(lab, browser):
    notebook_file = lab.root_dir / f"early-frame-{uuid.uuid4().hex[:8]}.ipynb"
    cells = [nbformat.v4.new_code_cell("%matplotlib widget"), nbformat.v4.new_code_cell(EARLY_FRAME_CELL)]
    kernel = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
    nbformat.write(nbformat.v4.new_notebook(cells=cells, metadata={"kernelspec": kernel}), notebook_file)
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    try:
        notebook = LabNotebook(page, lab.url(notebook_file.name))
        notebook.open()
        notebook.run_all()
        assert notebook.error_outputs() == []
        assert page.get_by_text("frame sent before the page was ready: True").count() == 1
        explorer = notebook.only_explorer("attention-heatmap")
        page.wait_for_function("id => window.__courseProbe.drawn(id)", arg=explorer.id, timeout=60_000)
        explorer.key_on("query-slider", "ArrowRight")  # and it keeps answering: new pixels
    finally:
        page.close()
