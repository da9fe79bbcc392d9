"""Predict, then run (course_widgets/predict.py), without a browser: a learner's inputs set on
the controls (as a click or Enter would), the page's text read back; and the notebooks' own
questions, as written in solutions/.

The browser side: every question sits in a cell tagged ``widget``, so test_browser_acceptance.py
drives its controls in chromium, and test_browser_predict.py reads the answer off the page."""

import json
import re
from pathlib import Path

import pytest

from autograder.release import assignments
from course_widgets.predict import COMMIT, TAKE_BACK, Prediction, predict

REPOSITORY = Path(__file__).resolve().parent.parent


def shown(widget: Prediction) -> str:
    """Every text the widget puts on the page (its controls' labels and values included)."""
    parts = []

    def walk(node):
        for name in ("value", "description", "placeholder"):
            value = getattr(node, name, None)
            if isinstance(value, str):
                parts.append(value)
        parts.extend(str(option) for option in getattr(node, "options", ()))
        for child in getattr(node, "children", ()):
            walk(child)

    walk(widget)
    return "\n".join(parts)


def choice_question() -> Prediction:
    return predict(
        "What does `softmax` give for (1000, 0, 1000) without subtracting the maximum?",
        choices=["(0.5, 0, 0.5)", "nan everywhere", "(1, 0, 1)"],
        answer="nan everywhere",
        why="exp(1000) overflows to inf, and inf / inf is nan.",
    )


def test_the_answer_reaches_the_page_only_once_a_prediction_is_committed():
    widget = choice_question()
    assert "inf / inf" not in shown(widget) and "Right" not in shown(widget)
    assert widget.commit.description == COMMIT
    widget.entry.value = "(0.5, 0, 0.5)"
    assert "Your prediction: <b>(0.5, 0, 0.5)</b>. Commit it" in widget.status.value
    assert "inf / inf" not in shown(widget)
    widget.commit.value = True  # the learner presses the toggle
    assert widget.committed and widget.entry.disabled
    assert "✗ Not this time: the answer is <b>nan everywhere</b>." in widget.reveal.value
    assert "Why: exp(1000) overflows to inf, and inf / inf is nan." in widget.reveal.value
    assert "run the next cell" in widget.reveal.value
    assert widget.commit.description == TAKE_BACK


def test_taking_the_commitment_back_hides_the_answer_and_unlocks_the_choices():
    widget = choice_question()
    widget.entry.value = "nan everywhere"
    widget.commit.value = True
    assert "✓ Right: <b>nan everywhere</b>." in widget.reveal.value
    widget.commit.value = False
    assert not widget.committed and not widget.entry.disabled
    assert widget.reveal.value == "" and "inf / inf" not in shown(widget)
    widget.entry.value = "(1, 0, 1)"
    widget.commit.value = True
    assert "✗ Not this time" in widget.reveal.value


def test_pressed_before_any_prediction_it_asks_for_one_and_commits_the_next():
    widget = choice_question()
    widget.commit.value = True
    assert not widget.committed and not widget.entry.disabled
    assert "Make a prediction first" in widget.reveal.value and "inf / inf" not in shown(widget)
    widget.entry.value = "(1, 0, 1)"  # chosen while the toggle is pressed: committed at once
    assert widget.committed and "✗ Not this time" in widget.reveal.value
    widget.commit.value = False
    assert widget.reveal.value == ""


def test_the_answer_can_be_given_by_its_index_and_code_is_shown_as_code():
    widget = predict("Which axis?", choices=["dim=0", "dim=-1"], answer=1, why="The keys are on the `last` axis.")
    assert widget.answer == "dim=-1"
    assert "<code>" not in widget.prompt.value
    widget.entry.value = "dim=-1"
    widget.commit.value = True
    assert "<code>last</code>" in widget.reveal.value
    assert "<b>Predict, then run.</b> Which axis?" == widget.prompt.value


@pytest.mark.parametrize(
    "typed, right",
    [("0.41", True), ("0.4", True), ("41%", True), ("0.5", False), ("about a half", False), ("1e-5", False)],
)
def test_a_typed_number_is_judged_within_the_tolerance(typed, right):
    widget = predict("Largest weight, scaled?", answer=0.41, why="The scores spread less.", tolerance=0.05)
    widget.entry.value = typed  # typed, then Enter
    widget.commit.value = True
    assert widget.right() is right
    assert ("✓ Right" in widget.reveal.value) is right
    assert "the answer is <b>0.41</b>" in widget.reveal.value or right


def test_an_answer_in_words_is_shown_beside_the_learners_unjudged():
    widget = predict("What happens to row 0?", answer="it becomes nan", why="0 / 0.")
    widget.entry.value = "   "
    widget.commit.value = True
    assert "Make a prediction first" in widget.reveal.value  # blanks are no prediction
    widget.entry.value = "it stays finite"
    assert widget.right() is None
    assert "The answer: <b>it becomes nan</b>. Compare it with yours." in widget.reveal.value


def test_text_is_escaped():
    widget = predict("Is <b>this</b> bold?", choices=["<i>yes</i>", "no"], answer=1, why="a < b & c")
    assert "&lt;b&gt;this&lt;/b&gt;" in widget.prompt.value
    widget.entry.value = "<i>yes</i>"
    assert "&lt;i&gt;yes&lt;/i&gt;" in widget.status.value
    widget.commit.value = True
    assert "a &lt; b &amp; c" in widget.reveal.value


@pytest.mark.parametrize(
    "arguments, message",
    [
        ({"question": "", "answer": 1, "why": "w"}, "question must be a non-empty string"),
        ({"question": "q", "answer": 1, "why": " "}, "`why` must say"),
        ({"question": "q", "choices": ["a"], "answer": 0, "why": "w"}, "at least two choices"),
        ({"question": "q", "choices": ["a", "a"], "answer": 0, "why": "w"}, "must differ"),
        ({"question": "q", "choices": ["a", "b"], "answer": 2, "why": "w"}, "answer index 2 is not one of the 2"),
        ({"question": "q", "choices": ["a", "b"], "answer": "c", "why": "w"}, "'c' is not one of the choices"),
        ({"question": "q", "choices": ["a", "b"], "answer": True, "why": "w"}, "a choice's index or its text"),
        ({"question": "q", "answer": [1], "why": "w"}, "a number or a text"),
        ({"question": "q", "answer": 1, "why": "w", "tolerance": -1}, "0 or more"),
    ],
)
def test_bad_arguments_say_what_is_wrong(arguments, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        predict(**arguments)


def test_while_nbgrader_grades_it_checks_its_arguments_and_builds_only_a_note(grading_env):
    """Graded, a question is asked of no one: the widget is a one-line note (as an explorer's), not
    its seven controls (about 7 ms a question in a graded kernel, 81 questions in a class of 30),
    and neither the answer nor the reason is in it; a call with bad arguments fails as it would
    for the learner."""
    widget = choice_question()
    assert isinstance(widget, Prediction) and widget.skipped
    assert {"course-explorer", "course-predict"} <= set(widget._dom_classes)
    assert len(widget.children) == 1
    assert "asked when you run the notebook yourself" in shown(widget)
    assert "nan everywhere" not in shown(widget) and widget.why not in shown(widget)
    assert not hasattr(widget, "entry")
    with pytest.raises(ValueError, match="at least two choices"):
        predict("q", choices=["a"], answer=0, why="w")


def test_it_follows_the_explorer_conventions_the_browser_tests_rely_on():
    widget = choice_question()
    assert {"course-explorer", "course-predict"} <= set(widget._dom_classes)
    [controls] = [child for child in widget.children if "explorer-controls" in child._dom_classes]
    assert list(controls.children) == [widget.entry, widget.commit]


# ---------------------------------------------------------------- the notebooks' questions


def predict_cells():
    """(assignment, index, cell) of every solution-notebook cell that asks a question."""
    for assignment in assignments():
        notebook = json.loads((REPOSITORY / "solutions" / assignment / f"{assignment}.ipynb").read_text())
        for index, cell in enumerate(notebook["cells"]):
            if cell["cell_type"] == "code" and re.search(r"^predict\(", "".join(cell["source"]), re.M):
                yield assignment, index, cell


def test_notebooks_01_to_04_each_ask_two_or_three_questions():
    counts = {}
    for assignment, _, _ in predict_cells():
        counts[assignment] = counts.get(assignment, 0) + 1
    for assignment in ("01_attention", "02_causal_masking", "03_multi_head_attention", "04_rope"):
        assert 2 <= counts.get(assignment, 0) <= 3, (assignment, counts)


def test_every_question_cell_is_a_widget_cell_with_its_source_folded_and_builds():
    """Tagged ``widget`` (the browser tests drive it), the source (which holds the answer) folded
    away in JupyterLab and on the site, and the call itself valid: run on its own, it makes a Prediction."""
    cells = list(predict_cells())
    assert cells
    for assignment, index, cell in cells:
        where = f"{assignment} cell {index}"
        assert "widget" in cell["metadata"].get("tags", []), f"{where} is not tagged widget"
        assert cell["metadata"].get("jupyter", {}).get("source_hidden") is True, f"{where}: source not folded"
        assert "hide-input" in cell["metadata"]["tags"], f"{where}: the site's page would show the answer"
        widget = eval("".join(cell["source"]), {"predict": predict})
        assert isinstance(widget, Prediction), where
        assert widget.why not in shown(widget), where
