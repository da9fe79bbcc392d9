"""Real JupyterLab, real chromium: a predict-then-run question of notebook 01 keeps its answer off
the page until the learner commits a prediction.

test_browser_acceptance.py already drives every question's controls (they sit in cells tagged
``widget``); here a learner's whole round is read off the page: choose, commit, read the answer,
take it back. ``ran_solution`` (conftest.py) gives the solution notebook after its one Run All of
the session; the page is shared, so the round ends with the question as it was found.
"""

import json
import re
from pathlib import Path

from browser_harness import ARTIFACTS, needs_chromium

from course_widgets.predict import COMMIT, TAKE_BACK, predict

pytestmark = needs_chromium

REPOSITORY = Path(__file__).resolve().parent.parent
ASSIGNMENT = "01_attention"


def first_question():
    """(cell index, the Prediction its source makes) of notebook 01's first question."""
    notebook = json.loads((REPOSITORY / "solutions" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb").read_text())
    for index, cell in enumerate(notebook["cells"]):
        source = "".join(cell["source"])
        if cell["cell_type"] == "code" and re.match(r"predict\(", source):
            return index, eval(source, {"predict": predict})
    raise AssertionError("notebook 01 asks no question")


def test_a_question_shows_its_answer_only_after_a_committed_prediction(ran_solution):
    notebook = ran_solution(ASSIGNMENT)
    index, question = first_question()
    [explorer] = notebook.explorers(index)
    assert explorer.topic_class == "course-predict"
    explorer.locator.scroll_into_view_if_needed()
    toggle = explorer.locator.locator(".predict-commit")
    if toggle.inner_text().strip() == TAKE_BACK:  # left pressed by an earlier test: start afresh
        explorer.arm()
        toggle.click()
        explorer.wait_for_change()
        explorer.settle()
    assert toggle.inner_text().strip() == COMMIT
    assert explorer.text_of(".predict-answer").strip() == ""
    assert question.why.split(":")[0] not in explorer.locator.inner_text()

    right = explorer.locator.get_by_role("radio", name=question.answer, exact=True)
    if right.is_checked():  # chosen by an earlier test: choose another first, so that choosing it changes the page
        explorer.arm()
        explorer.locator.get_by_role("radio").and_(explorer.locator.locator("input:not(:checked)")).first.check()
        explorer.wait_for_change()
        explorer.settle()
    explorer.arm()
    right.check()
    explorer.wait_for_change()
    explorer.settle()
    assert f"Your prediction: {question.answer}. Commit it to see the answer." in explorer.text_of(".predict-status")
    assert explorer.text_of(".predict-answer").strip() == ""

    explorer.arm()
    toggle.click()
    explorer.wait_for_change()
    explorer.settle()
    answer = explorer.text_of(".predict-answer")
    assert f"✓ Right: {question.answer}." in answer and "Why: " in answer, answer
    assert right.is_disabled()
    explorer.screenshot(ARTIFACTS / "predict-then-run.png")

    explorer.arm()
    toggle.click()  # take it back: the answer goes, the choices unlock
    explorer.wait_for_change()
    explorer.settle()
    assert explorer.text_of(".predict-answer").strip() == ""
    assert right.is_enabled()
