"""What every widget of the course shares.

An ``Explorer`` is a column: its controls, one matplotlib figure that is built
once, and a message line. When a control changes, ``update()`` runs the
learner's own functions again and puts the new numbers into the existing
artists (``set_data``, ``set_height``): nothing is redrawn from scratch, which
keeps a key press to new pixels fast.

The learner's functions are called through ``call_learner``: while a function
is still ``raise NotImplementedError()``, or when it raises, the widget shows a
clear message instead of a traceback, and recovers once the function works.

While nbgrader grades or validates a notebook (``NBGRADER_EXECUTION`` is set)
explorers build nothing and show one line, so grading does not pay for demos.
"""
from __future__ import annotations

import html
import os
from typing import Any, Callable

import ipywidgets as widgets
import matplotlib.pyplot as plt


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


def _is_widget_canvas(canvas) -> bool:
    return isinstance(canvas, widgets.DOMWidget)


class Explorer(widgets.VBox):
    """Controls, one figure built once, and a message line.

    Subclasses set ``css_class``, call ``super().__init__(controls, figsize)``,
    return at once if ``self.skipped``, draw their artists on ``self.figure``,
    and implement ``update()``; then call ``self.refresh()`` once.
    """

    css_class = "course-explorer"

    def __init__(self, controls: list[widgets.Widget], figsize=(8, 3.2), title: str | None = None):
        self.skipped = grading_now()
        if self.skipped:
            super().__init__([widgets.HTML("<i>(interactive widget: not built while the notebook is graded)</i>")])
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
            view = canvas
        else:  # any other backend: a static picture, redrawn on demand
            view = widgets.Output()
        self.view = view
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

    def draw(self) -> None:
        if _is_widget_canvas(self.figure.canvas):
            self.figure.canvas.draw_idle()
        else:
            from IPython.display import display

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
