"""What every widget of the course shares.

An ``Explorer`` is a column: its controls, one matplotlib figure that is built
once, and a message line. When a control changes, ``update()`` runs the
learner's own functions again and puts the new numbers into the existing
artists (``set_data``, ``set_height``): nothing is rebuilt, which keeps a key
press to new pixels fast. Two more things keep it fast (drawing dominates):

* the figure's layout (constrained) is worked out only when something it
  depends on changed (limits, ticks, labels, which axes show), not on every draw;
* on the interactive (ipympl) canvas, the data (images, lines, patches,
  collections, texts, titles, spines) is redrawn alone over a saved picture of
  the rest, the axes with their ticks and labels (blitting); when anything of
  that rest changed, or an artist came or went, the whole figure is drawn.

The learner's functions are called through ``call_learner``: while a function
is still ``raise NotImplementedError()``, or when it raises, the widget shows a
clear message instead of a traceback, and recovers once the function works.

While nbgrader grades or validates a notebook (``NBGRADER_EXECUTION`` is set)
explorers build nothing and show one line, so grading does not pay for demos.
"""

from __future__ import annotations

import contextlib
import functools
import html
import os
from collections.abc import Callable
from typing import Any

import ipywidgets as widgets
import matplotlib.pyplot as plt
import torch
from IPython.display import display
from matplotlib.layout_engine import PlaceHolderLayoutEngine

from .compat import axes_titles, send_frames_as_png, tick_labels


def grading_now() -> bool:
    """True while nbgrader autogrades or validates the notebook."""
    return bool(os.environ.get("NBGRADER_EXECUTION"))


class LearnerFunctionProblem(Exception):
    """A learner's function is not ready; the message says what to do."""


def call_learner(function: Callable, *args: Any, **kwargs: Any) -> Any:
    """Call the learner's ``function``; turn any failure into a readable message."""
    name = getattr(function, "__name__", "your function")
    try:
        return function(*args, **kwargs)
    except NotImplementedError:
        raise LearnerFunctionProblem(
            f"Implement `{name}` in its exercise cell and run that cell, then run this one again: "
            "this widget shows your own function at work."
        ) from None
    except Exception as error:
        raise LearnerFunctionProblem(
            f"`{name}` raised {type(error).__name__}: {error}. Fix it, run its cell, then run this one again."
        ) from None


def expect_tensor(name: str, value, shape, *, dtype=None, detach: bool = True):
    """The learner's ``value`` once it is a tensor of ``shape`` (and ``dtype``, when given), else a
    ``LearnerFunctionProblem`` saying what came back instead. Detached as float64 (what the widgets
    draw), unless ``detach`` is False (a value still in autograd's graph, or a mask)."""

    if not isinstance(value, torch.Tensor):
        raise LearnerFunctionProblem(f"`{name}` returned {type(value).__name__}; it should return a tensor.")
    if dtype is not None and value.dtype != dtype:
        wanted = "booleans (True = may attend)" if dtype == torch.bool else f"dtype {dtype}"
        raise LearnerFunctionProblem(f"`{name}` returned dtype {value.dtype}; it should return {wanted}.")
    if tuple(value.shape) != tuple(shape):
        raise LearnerFunctionProblem(f"`{name}` returned shape {tuple(value.shape)}; here it should be {tuple(shape)}.")
    return value.detach().to(torch.float64) if detach else value


def unfinished_exercise(error: NotImplementedError) -> str:
    """The learner's function or class that raised ``error``: where the innermost frame of its traceback is."""
    traceback = error.__traceback__
    while traceback is not None and traceback.tb_next is not None:
        traceback = traceback.tb_next
    if traceback is None:
        return "an exercise above"
    code = traceback.tb_frame.f_code
    qualname = getattr(code, "co_qualname", code.co_name).split("<locals>.")[-1]
    return qualname.split(".")[0]  # Llama.forward -> Llama


@contextlib.contextmanager
def explain_unfinished():
    """For a notebook's demo cell: while one of the learner's exercises is still
    ``raise NotImplementedError()``, print which one instead of a traceback."""
    try:
        yield
    except NotImplementedError as error:
        name = unfinished_exercise(error)
        print(
            f"This cell needs your `{name}`, which still raises NotImplementedError. Write it in its exercise "
            "cell, run that cell, then run this one again."
        )


def _is_widget_canvas(canvas) -> bool:
    return isinstance(canvas, widgets.DOMWidget)


def _ticks(axis) -> tuple:
    """What an axis's tick labels depend on besides its limits: fixed ticks and
    labels by value (widgets often set the same ones again), others by kind."""
    locator, formatter = axis.get_major_locator(), axis.get_major_formatter()
    func = getattr(formatter, "func", None)
    if isinstance(func, functools.partial):  # set_xticks(ticks, labels): labels by value
        func = (func.func, repr(func.args), repr(func.keywords))
    else:
        func = id(func)
    return (
        type(locator).__name__,
        tuple(getattr(locator, "locs", ())),
        type(formatter).__name__,
        tuple(getattr(formatter, "seq", ())),
        func,
        (axis.majorTicks[0].label1.get_fontsize(), axis.majorTicks[0].label1.get_rotation()),
    )


def _limits(limits) -> tuple:
    # changes far below a pixel (a recomputed limit's last digits) change nothing shown
    return tuple(float(f"{x:.6g}") for x in limits)


def _data_artists(figure) -> list:
    """What an update may change, in drawing order: per axes (in the figure's
    order) its images, patches, lines, collections, texts, titles, and the frame
    and legend that sit on top of them, by zorder; then the figure's own texts."""
    artists = []
    for axes in sorted(figure.axes, key=lambda a: a.zorder):
        own = [
            *axes.images,
            *axes.patches,
            *axes.lines,
            *axes.collections,
            *axes.texts,
            *axes_titles(axes),
        ]
        if axes.axison and axes.get_frame_on():
            own += axes.spines.values()
        if axes.get_legend() is not None:
            own.append(axes.get_legend())
        artists += sorted(own, key=lambda a: a.zorder)
    return artists + list(figure.texts)


class Explorer(widgets.VBox):
    """Controls, one figure built once, and a message line.

    Subclasses set ``css_class``; their ``__init__`` returns at once if
    ``self.skip_while_graded()``, then makes its controls, calls
    ``super().__init__(controls, figsize)``, draws its artists on ``self.figure``,
    and implements ``update()``; then calls ``self.refresh()`` once.
    """

    css_class = "course-explorer"

    def skip_while_graded(self) -> bool:
        """Whether nbgrader grades the notebook now: then this explorer is a one-line note, made before
        any control. Each control is a message from the kernel to the grader and state the graded
        notebook keeps: built and never shown, a cell's controls took 12 to 19 ms in a graded kernel."""
        self.skipped = grading_now()
        if self.skipped:
            note = widgets.HTML("<i>(interactive widget: not built while the notebook is graded)</i>")
            widgets.VBox.__init__(self, [note])
        return self.skipped

    def __init__(self, controls: list[widgets.Widget], figsize=(8, 3.2), title: str | None = None):
        if self.skip_while_graded():
            return
        self.controls = controls
        self.message = widgets.HTML("").add_class("explorer-message")
        with plt.ioff():
            self.figure = plt.figure(figsize=figsize, layout="constrained")
        canvas = self.figure.canvas
        if _is_widget_canvas(canvas):  # ipympl (%matplotlib widget)
            canvas.header_visible = False
            canvas.footer_visible = False
            canvas.toolbar_visible = False
            canvas.resizable = False
            # frames drawn before the page is ready reach it as pictures (see _send_frame)
            send_frames_as_png(canvas)
            view = canvas
        else:  # any other backend: a static picture, redrawn on demand
            view = widgets.Output()
        self.view = view
        self._animated: list = []
        self._background = None  # the figure without its animated artists, for blitting
        self._layout_engine = None  # the figure's own engine, run by _lay_out when needed
        self._drawn_decorations = None
        self._laid_out_for = None  # what the layout was computed for (see _layout_key)
        canvas.mpl_connect("draw_event", self._on_full_draw)
        children = [widgets.HBox(controls).add_class("explorer-controls"), view, self.message]
        if title:
            children.insert(0, widgets.HTML(f"<b>{html.escape(title)}</b>"))
        super().__init__(children)
        self.add_class("course-explorer")
        self.add_class(self.css_class)
        for control in controls:
            if hasattr(control, "value"):
                control.observe(self._on_change, names="value")

    # -- subclasses implement
    def update(self) -> None:
        raise NotImplementedError

    # -- machinery
    def _on_change(self, _change=None) -> None:
        self.refresh()

    def refresh(self) -> None:
        """Recompute with the learner's functions and show the result (or the problem)."""
        if self.skipped:
            return
        try:
            self.update()
        except LearnerFunctionProblem as problem:
            self.show_problem(str(problem))
        else:
            self.clear_problem()
        self.draw()

    def _decorations(self, data: list) -> tuple:
        """What the layout and the picture behind the data depend on: the data
        artists there are, and for each axes its limits, scales, ticks, labels,
        which titles are set (not what they say: they are redrawn with the data)."""
        key = [tuple(self.figure.get_size_inches()), self.figure.dpi, tuple(map(id, data))]
        for axes in self.figure.axes:
            legend = axes.get_legend()
            key.append(
                (
                    axes.get_visible(),
                    _limits(axes.get_xlim()),
                    _limits(axes.get_ylim()),
                    axes.get_xscale(),
                    axes.get_yscale(),
                    axes.get_xlabel(),
                    axes.get_ylabel(),
                    _ticks(axes.xaxis),
                    _ticks(axes.yaxis),
                    *(bool(t.get_text()) for t in axes_titles(axes)),
                    tuple(t.get_text() for t in legend.get_texts()) if legend else None,
                )
            )
        return tuple(key)

    def _layout_key(self) -> tuple:
        """What the layout depends on: the figure's size, which axes are shown,
        their labels, titles and legends, and per axis whether it has tick labels
        and how long the longest is. Limits that move the ticks without changing
        that (0 5 10 becoming 1 6 11, or 5 ticks becoming 9) keep the layout: a
        new layout costs as much as drawing the whole figure again."""
        key = [tuple(self.figure.get_size_inches()), self.figure.dpi]
        for axes in self.figure.axes:
            legend = axes.get_legend()
            shape = []
            for axis in (axes.xaxis, axes.yaxis):
                labels = tick_labels(axis) if axes.get_visible() else []
                tick = axis.majorTicks[0].label1
                shape.append(
                    (
                        bool(labels),
                        max(map(len, labels), default=0),
                        axis.get_label_text(),
                        tick.get_fontsize(),
                        tick.get_rotation(),
                        axis.get_visible(),
                    )
                )
            key.append(
                (
                    axes.get_visible(),
                    *shape,
                    *((bool(text), text.count("\n")) for text in (t.get_text() for t in axes_titles(axes))),
                    tuple(t.get_text() for t in legend.get_texts()) if legend else None,
                )
            )
        return tuple(key)

    def _lay_out(self) -> None:
        """Run the figure's layout engine now, and keep it from running on every draw."""
        if self._layout_engine is None:
            engine = self.figure.get_layout_engine()
            if engine is None or isinstance(engine, PlaceHolderLayoutEngine):
                return
            self._layout_engine = engine
            self.figure.set_layout_engine("none")
        self._layout_engine.execute(self.figure)

    def _draw_animated(self) -> None:
        for artist in self._animated:
            if artist.get_visible() and (artist.axes is None or artist.axes.get_visible()):
                self.figure.draw_artist(artist)
        # The picture is now current. Drawing marks some artists (a legend's parts)
        # stale, and with them the figure; pyplot (%matplotlib widget) redraws stale
        # figures in full after every message from the browser, and a full draw
        # ends here again: an endless loop, and a full draw after every blit.
        self.figure.stale = False

    def _on_full_draw(self, _event) -> None:
        """After the whole figure is drawn (without animated artists): save it, add them."""
        if self._animated:
            self._background = self.figure.canvas.copy_from_bbox(self.figure.bbox)
            self._draw_animated()

    def draw(self) -> None:
        canvas = self.figure.canvas
        data = _data_artists(self.figure)
        decorations = self._decorations(data)
        changed = decorations != self._drawn_decorations
        if changed:
            layout_key = self._layout_key()
            if layout_key != self._laid_out_for:
                self._lay_out()
                self._laid_out_for = layout_key
            self._drawn_decorations = decorations
        if _is_widget_canvas(canvas):
            if changed:  # left out of the full drawing, drawn over it (_on_full_draw)
                for artist in data:
                    artist.set_animated(True)
                self._animated = data
            if changed or self._background is None:
                self._background = None  # blit again only over a picture of the new decorations
                canvas.draw_idle()
            else:  # blit: the saved picture, the animated artists over it, sent at once
                canvas.restore_region(self._background)
                self._draw_animated()
                canvas.blit(self.figure.bbox)
        else:
            self.view.clear_output(wait=True)
            with self.view:
                display(self.figure)

    @property
    def problem(self) -> str:
        """The message shown instead of results, or '' when all is well."""
        return self._problem if hasattr(self, "_problem") else ""

    def show_problem(self, text: str) -> None:
        self._problem = text
        self.message.value = f'<div class="explorer-problem">⚠ {html.escape(text)}</div>'
        self.add_class("has-problem")
        for axes in self.figure.axes:
            axes.set_visible(False)
        self._notice().set_text("waiting for your function: see the message below")

    def clear_problem(self) -> None:
        self._problem = ""
        self.message.value = ""
        self.remove_class("has-problem")
        for axes in self.figure.axes:
            axes.set_visible(True)
        self._notice().set_text("")

    def _notice(self):
        if not hasattr(self, "_notice_text"):
            self._notice_text = self.figure.text(0.5, 0.5, "", ha="center", va="center", color="0.4")
        return self._notice_text
