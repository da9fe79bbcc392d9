"""What keeps every widget fast (course_widgets/base.py), on a real ipympl canvas
without a browser: the picture sent after a blitted update is exactly the
picture matplotlib draws of the figure, the layout runs only when decorations
change, and a change of limits (or an artist that comes) redraws everything."""

import base64
import io
import json

import numpy as np
import PIL.Image
import pytest
import torch

from autograder import reference
from course_widgets.attention import AttentionHeatmap, ScalingExplorer
from course_widgets.base import Explorer

X = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
V = torch.tensor([[1.0, 0.0], [0.0, 10.0], [5.0, 5.0]])


@pytest.fixture(scope="module")
def solved():
    return reference.load("01_attention")


class Recorder:
    """Counts how a widget's canvas is asked to draw; pictures sent go nowhere."""

    def __init__(self, widget):
        self.canvas = widget.figure.canvas
        self.full_requests = self.pictures_sent = 0
        self.canvas.send_binary = self._sent
        draw_idle = self.canvas.draw_idle
        self.canvas.draw_idle = lambda: (self._requested(), draw_idle())

    def _sent(self, _data):
        self.pictures_sent += 1

    def _requested(self):
        self.full_requests += 1

    def picture(self) -> np.ndarray:
        return np.asarray(self.canvas.get_renderer().buffer_rgba()).copy()


def plain_matplotlib_picture(widget) -> np.ndarray:
    """The figure as matplotlib draws it without any blitting."""
    animated, widget._animated = widget._animated, []
    for artist in animated:
        artist.set_animated(False)
    try:
        widget.figure.canvas.draw()
        return np.asarray(widget.figure.canvas.get_renderer().buffer_rgba()).copy()
    finally:
        for artist in animated:
            artist.set_animated(True)
        widget._animated = animated
        widget.figure.canvas.draw()


def shown_by_blitting_then_by_matplotlib(widget, change):
    """The picture after ``change`` as blitting sent it, and as matplotlib draws it."""
    recorder = Recorder(widget)
    widget.figure.canvas.draw()  # what the browser asks for when the widget appears
    # pyplot redraws stale figures in full after every message from the browser
    assert not widget.figure.stale, "the figure is stale after a full draw: it would be drawn again and again"
    requests, sent = recorder.full_requests, recorder.pictures_sent
    change()
    assert recorder.full_requests == requests, "the update asked for a full draw instead of blitting"
    assert recorder.pictures_sent == sent + 1, "the blitted picture was not sent"
    assert not widget.figure.stale, "the figure is stale after blitting: pyplot would draw it again in full"
    blitted = recorder.picture()
    return blitted, plain_matplotlib_picture(widget)


def test_heatmap_blits_the_picture_matplotlib_draws(ipympl_canvas, solved):
    widget = AttentionHeatmap(solved.attention_weights, solved.attention, X, X, V)
    for change in (lambda: setattr(widget.query, "value", 2), lambda: setattr(widget.sharpen, "value", 3.0)):
        blitted, full = shown_by_blitting_then_by_matplotlib(widget, change)
        assert np.array_equal(blitted, full)


def test_scaling_explorer_blits_the_picture_matplotlib_draws(ipympl_canvas, solved):
    widget = ScalingExplorer(solved.softmax)
    for change in (lambda: setattr(widget.scaled, "value", False), lambda: setattr(widget.d, "value", 16)):
        blitted, full = shown_by_blitting_then_by_matplotlib(widget, change)
        assert np.array_equal(blitted, full)


class Stretchy(Explorer):
    """A widget whose update also changes the y limits, or adds a line, when asked to."""

    css_class = "stretchy"

    def __init__(self):
        import ipywidgets as widgets

        self.height = widgets.FloatSlider(1.0, min=0.5, max=10.0)
        super().__init__([self.height], figsize=(3, 2))
        self.axes = self.figure.subplots()
        self.axes.set_title("bars")
        self.bars = self.axes.bar([0, 1], [0.0, 0.0])
        self.axes.set_ylim(0, 2)
        self.refresh()

    def update(self):
        for bar in self.bars:
            bar.set_height(self.height.value)
        if self.height.value > 2:
            self.axes.set_ylim(0, 2 * self.height.value)
        if self.height.value == 0.5:
            self.axes.axhline(0.5, color="black")


def test_a_change_of_limits_redraws_everything_and_lays_the_figure_out_when_tick_labels_grow(
    ipympl_canvas, monkeypatch
):
    widget = Stretchy()
    layouts = []
    execute = widget._layout_engine.execute
    monkeypatch.setattr(widget._layout_engine, "execute", lambda figure: (layouts.append(1), execute(figure)))
    recorder = Recorder(widget)
    widget.figure.canvas.draw()
    widget.height.value = 1.5  # the bars only: blitted, no new layout
    assert (recorder.full_requests, len(layouts)) == (0, 0)
    widget.height.value = 4.0  # y limits 0-8: tick labels 0 2 4 6 8 instead of 0.00 0.25 ...: laid out again
    assert (recorder.full_requests, len(layouts)) == (1, 1)
    widget.figure.canvas.draw()
    widget.height.value = 4.5  # 0-9: other limits, same tick labels: drawn in full, the layout kept
    assert (recorder.full_requests, len(layouts)) == (2, 1)
    widget.figure.canvas.draw()
    widget.height.value = 6.0  # 0-12: a tick label of two digits: laid out again
    assert (recorder.full_requests, len(layouts)) == (3, 2)
    widget.figure.canvas.draw()
    widget.height.value = 0.5  # a new line: drawn in full, and animated from then on
    assert recorder.full_requests == 4
    assert widget.axes.lines[0] in widget._animated and widget.axes.lines[0].get_animated()


def test_figures_are_laid_out_once_not_on_every_draw(solved):
    widget = AttentionHeatmap(solved.attention_weights, solved.attention, X, X, V)
    assert widget.figure.get_layout_engine().__class__.__name__ == "PlaceHolderLayoutEngine"
    assert widget._layout_engine.__class__.__name__ == "ConstrainedLayoutEngine"
    # laid out: every axes, tick labels and titles included, fits inside the figure
    renderer = widget.figure.canvas.get_renderer()
    for axes in widget.figure.axes:
        box = axes.get_tightbbox(renderer)
        assert widget.figure.bbox.x0 <= box.x0 and box.x1 <= widget.figure.bbox.x1
        assert widget.figure.bbox.y0 <= box.y0 and box.y1 <= widget.figure.bbox.y1


def test_a_picture_sent_before_the_page_is_ready_is_a_png_and_its_copy_a_data_url(ipympl_canvas, solved):
    """Until the page's view says it is ready, ipympl 0.10 sends each picture it draws as raw pixels
    (the page cannot decode them: the figure stays 0 x 0 for good, see tests/test_browser_early_frames.py)
    and keeps a copy in the canvas's `_data_url` as bare base64 (a view made later cannot load it).
    A widget's first pictures go out as PNG, and the copy is a data: URL of the whole picture."""
    widget = AttentionHeatmap(solved.attention_weights, solved.attention, X, X, V)
    canvas = widget.figure.canvas
    sent = []
    canvas.send = lambda content, buffers=None: sent.append((json.loads(content["data"]), buffers))
    assert canvas.syncing_data_url  # no page has said it is ready
    canvas.draw()  # drawn, and pushed to the page at once
    [picture] = [bytes(buffers[0]) for content, buffers in sent if content["type"] == "binary"]
    width, height = canvas.get_width_height(physical=True)
    assert picture.startswith(b"\x89PNG\r\n\x1a\n")
    assert PIL.Image.open(io.BytesIO(picture)).size == (width, height)
    assert canvas._data_url.startswith("data:image/png;base64,")
    copy = PIL.Image.open(io.BytesIO(base64.b64decode(canvas._data_url.split(",", 1)[1])))
    assert copy.size == (width, height)
    assert np.array_equal(np.asarray(copy), np.asarray(PIL.Image.open(io.BytesIO(picture))))
