"""Real JupyterLab, real chromium: notebook 09's block stepper shows the running numbers of the merge.

test_browser_acceptance.py already checks that every widget renders and that every control
changes it; here the topic's own numbers are read off the page. ``ran_solution`` (conftest.py)
gives the solution notebook after its one Run All of the session; the page is shared, so each
change is undone at the end.
"""

from browser_harness import ARTIFACTS, needs_chromium

pytestmark = needs_chromium


def test_stepping_through_the_blocks_of_query_5_reaches_the_softmax(ran_solution):
    notebook = ran_solution("09_efficient_attention")
    stepper = notebook.only_explorer("block-stepper")
    first = stepper.text_of(".stepper-summary")
    assert "block 1 of 3 (keys 0–2): its own max 1.77" in first and "ℓ = 1.945" in first, first
    stepper.key_on("step-slider", "ArrowRight")  # keys 3-5: key 5 raises the max
    second = stepper.text_of(".stepper-summary")
    assert "The max rose from 1.77 to 3.01" in second and "exp(1.77 − 3.01) = 0.290" in second, second
    assert "ℓ = 1.742" in second and "o/ℓ = (4.50, 1.54)" in second, second
    stepper.key_on("step-slider", "ArrowRight")  # keys 6-7: every block merged
    last = stepper.text_of(".stepper-summary")
    assert "ℓ = 2.479" in last and "o/ℓ = (4.27, 3.32)" in last, last
    assert "the weights exp(s − m)/ℓ equal the softmax's" in last, last
    stepper.screenshot(ARTIFACTS / "block-stepper.png")
    stepper.key_on("step-slider", "ArrowLeft")
    stepper.key_on("step-slider", "ArrowLeft")
