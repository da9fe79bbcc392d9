"""Predict, then run: a question asked before a demo cell, answered once the learner has committed a guess.

A notebook asks one with ``predict`` in a cell of its own, tagged ``widget``, just above the
cell whose output answers it::

    predict(
        "What does `softmax` give for the scores (1000, 0, 1000) without subtracting the maximum?",
        choices=["(0.5, 0, 0.5)", "nan everywhere", "(1, 0, 1)"],
        answer="nan everywhere",       # or its index, 1
        why="exp(1000) overflows float32 to inf, and inf / inf is nan.",
    )

Without ``choices`` the learner types the prediction. A numeric ``answer`` then judges it:
right when it is within ``tolerance`` (relative) of the answer; an ``answer`` that is text is
shown beside the learner's words, unjudged.

What the learner sees: the question, the choices (or a text box) and a toggle, **Commit my
prediction**. Choosing or typing echoes the prediction in the line below. Pressing the toggle
commits it: the choices lock, and the answer appears with whether the prediction was right,
the reason (``why``) and an invitation to run the next cell. Pressing it again takes the
commitment back (the answer goes, the choices unlock), to predict again. Pressed before any
prediction, the toggle asks for one and shows no answer; a prediction made while it is pressed
is committed at once.

Neither the answer nor the reason reaches the page before the commitment: they are put into
the widget only then, and taken out again when it is taken back. They are in the cell's source
all along, though (a notebook cannot keep a secret from its reader), so the course folds the
source of these cells away (``"jupyter": {"source_hidden": true}`` in JupyterLab, the tag
``hide-input`` on the site's pages) and relies on nothing more: a question is an invitation to
think first, not a test.

Class mode and self-study behave the same. A prediction is not graded and is recorded nowhere
(no progress file, no gradebook), and its answer is not a solution to any exercise, so there is
nothing to hold back from a class student: with or without ``solutions/`` the answer shows
after the commitment. While nbgrader grades or validates (``NBGRADER_EXECUTION`` is set) the
arguments are checked as always, and the widget is a one-line note instead of its controls, as
an explorer's is: no one is there to answer, and its seven controls cost about 7 ms a question
in a graded kernel (a question's cell 15.8 ms, 9.2 ms as a note).

The widget follows the course's explorer conventions (``base.Explorer``): an element with the
classes ``course-explorer`` and ``course-predict``, its controls in ``.explorer-controls``, so
the browser tests drive it like any other widget; it draws no figure.
"""

from __future__ import annotations

import html
import math
import re
from collections.abc import Sequence

import ipywidgets as widgets

from .base import grading_now

COMMIT = "Commit my prediction"
TAKE_BACK = "Predict again"


def _inline(text: str) -> str:
    """``text`` as HTML: escaped, with `backticks` as code."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(text))


def _number(text: str) -> float | None:
    """The number a learner typed ("0.41", "1e-5", "41%", "1,024"), or None."""
    cleaned = text.strip().replace(",", "").replace("−", "-")
    scale = 1.0
    if cleaned.endswith("%"):
        cleaned, scale = cleaned[:-1], 0.01
    try:
        return float(cleaned) * scale
    except ValueError:
        return None


class Prediction(widgets.VBox):
    """One predict-then-run question (see the module's docstring); made by ``predict``."""

    css_class = "course-predict"

    def __init__(
        self,
        question: str,
        *,
        answer,
        why: str,
        choices: Sequence[str] | None = None,
        tolerance: float = 0.05,
    ):
        if not isinstance(question, str) or not question.strip():
            raise ValueError("predict: the question must be a non-empty string")
        if not isinstance(why, str) or not why.strip():
            raise ValueError("predict: `why` must say, in a sentence, why the answer is what it is")
        if choices is not None:
            choices = [str(choice) for choice in choices]
            if len(choices) < 2:
                raise ValueError(f"predict: give at least two choices, got {len(choices)}")
            if len(set(choices)) != len(choices):
                raise ValueError(f"predict: the choices must differ from one another, got {choices}")
            if isinstance(answer, bool) or not isinstance(answer, (int, str)):
                raise ValueError(f"predict: with choices, `answer` is a choice's index or its text, got {answer!r}")
            if isinstance(answer, int):
                if not 0 <= answer < len(choices):
                    raise ValueError(f"predict: answer index {answer} is not one of the {len(choices)} choices")
                answer = choices[answer]
            elif answer not in choices:
                raise ValueError(f"predict: the answer {answer!r} is not one of the choices {choices}")
        elif isinstance(answer, bool) or not isinstance(answer, (int, float, str)):
            raise ValueError(f"predict: a free answer is a number or a text, got {answer!r}")
        if not tolerance >= 0:
            raise ValueError(f"predict: the tolerance is a relative error, 0 or more, got {tolerance!r}")

        self.question = question
        self.choices = choices
        self.answer = answer
        self.why = why
        self.tolerance = tolerance
        self.skipped = grading_now()
        if self.skipped:  # asked of no one: a note, as an explorer leaves (its controls cost 7 ms a question)
            super().__init__([widgets.HTML("<i>(a question: asked when you run the notebook yourself)</i>")])
            self.add_class("course-explorer")
            self.add_class(self.css_class)
            return

        if choices is not None:
            self.entry = widgets.RadioButtons(options=choices, value=None, layout={"width": "auto"})
        else:
            # value changes on Enter (or leaving the box), not on every key
            self.entry = widgets.Text(
                value="", placeholder="your prediction, then Enter", continuous_update=False
            ).add_class("predict-entry")
        self.commit = widgets.ToggleButton(
            value=False, description=COMMIT, icon="lock", layout={"width": "auto", "margin": "0 0 0 1em"}
        ).add_class("predict-commit")
        self.prompt = widgets.HTML(f"<b>Predict, then run.</b> {_inline(question)}").add_class("predict-question")
        self.status = widgets.HTML("").add_class("predict-status")
        self.reveal = widgets.HTML("").add_class("predict-answer")
        controls = widgets.HBox([self.entry, self.commit]).add_class("explorer-controls")
        super().__init__([self.prompt, controls, self.status, self.reveal])
        self.add_class("course-explorer")
        self.add_class(self.css_class)
        self.entry.observe(self._on_change, names="value")
        self.commit.observe(self._on_change, names="value")
        self._show()

    # -- state
    @property
    def prediction(self) -> str:
        """What the learner chose or typed ('' for nothing yet)."""
        value = self.entry.value
        return "" if value is None else str(value).strip()

    @property
    def committed(self) -> bool:
        """The learner has committed a prediction: the answer shows."""
        return bool(self.commit.value) and self.prediction != ""

    def right(self) -> bool | None:
        """Whether the committed prediction is right; None when it cannot be judged (a text answer)."""
        if self.choices is not None:
            return self.prediction == self.answer
        if isinstance(self.answer, str):
            return None
        guess = _number(self.prediction)
        if guess is None:
            return False
        if math.isnan(self.answer) or math.isnan(guess):
            return math.isnan(self.answer) and math.isnan(guess)
        if self.answer == 0:
            return abs(guess) <= self.tolerance
        return abs(guess - self.answer) <= self.tolerance * abs(self.answer)

    # -- view
    def _on_change(self, _change=None) -> None:
        self._show()

    def _show(self) -> None:
        """Put the state (prediction, toggle) on the page; the answer only once committed."""
        prediction = self.prediction
        committed = self.committed
        self.entry.disabled = committed
        self.commit.description = TAKE_BACK if self.commit.value else COMMIT
        if not prediction:
            kind = "choose one" if self.choices is not None else "type it and press Enter"
            self.status.value = f"<i>Your prediction: none yet ({kind}), then commit it.</i>"
            self.reveal.value = (
                '<div class="predict-waiting">Make a prediction first: the answer shows once it is committed.</div>'
                if self.commit.value
                else ""
            )
            self.remove_class("predict-committed")
            return
        self.status.value = f"Your prediction: <b>{_inline(prediction)}</b>" + (
            "" if committed else ". Commit it to see the answer."
        )
        if not committed:
            self.reveal.value = ""
            self.remove_class("predict-committed")
            return
        verdict = self.right()
        answer = self.answer if isinstance(self.answer, str) else f"{self.answer:g}"
        if verdict is None:
            head = f"The answer: <b>{_inline(answer)}</b>. Compare it with yours."
        elif verdict:
            head = f"✓ Right: <b>{_inline(answer)}</b>."
        else:
            head = f"✗ Not this time: the answer is <b>{_inline(answer)}</b>."
        self.reveal.value = (
            f'<div class="predict-verdict">{head}</div>'
            f'<div class="predict-why">Why: {_inline(self.why)}</div>'
            "<div><i>Now run the next cell and see it happen.</i></div>"
        )
        self.add_class("predict-committed")


def predict(
    question: str,
    *,
    answer,
    why: str,
    choices: Sequence[str] | None = None,
    tolerance: float = 0.05,
) -> Prediction:
    """Ask ``question`` before the next cell runs; show ``answer`` and ``why`` once the learner commits a prediction.

    ``choices``: the options to pick from (``answer`` is one of them, by index or text); without
    them the learner types a prediction, judged against a numeric ``answer`` within ``tolerance``
    (relative), or shown beside a text ``answer``. Bad arguments raise ``ValueError`` saying which.
    """
    return Prediction(question, answer=answer, why=why, choices=choices, tolerance=tolerance)
