"""Real JupyterLab, real chromium: notebook 04's widgets show the right numbers.

test_browser_acceptance.py already checks that every widget renders and that
every control changes it; here the topic's own facts are read off the page.
``ran_solution`` (conftest.py) gives the solution notebook after its one Run
All of the session; the page is shared, so each change is undone at the end.
"""

from browser_harness import ARTIFACTS, needs_chromium

pytestmark = needs_chromium


def test_pair_0_at_position_4_has_turned_4_radians(ran_solution):
    notebook = ran_solution("04_rope")
    rotation = notebook.only_explorer("rope-rotation")
    rotation.key_on("position-slider", "ArrowRight")
    readout = rotation.text_of(".rope-rotation-readout")
    assert "4 × 1 = 4.000 rad" in readout and "(-0.654, -0.757)" in readout, readout
    rotation.screenshot(ARTIFACTS / "rope-rotation.png")
    rotation.key_on("position-slider", "ArrowLeft")


def test_score_of_query_4_against_key_1_is_at_distance_3(ran_solution):
    notebook = ran_solution("04_rope")
    scores = notebook.only_explorer("rope-scores")
    scores.key_on("m-slider", "ArrowRight")
    assert "q at position 4, k at position 1 (distance m − n = 3)" in scores.text_of(".rope-scores-readout")
    scores.screenshot(ARTIFACTS / "rope-scores.png")
    scores.key_on("m-slider", "ArrowLeft")


def test_pairing_with_16_dimensions_sends_pair_1_to_slots_1_and_9(ran_solution):
    notebook = ran_solution("04_rope")
    pairing = notebook.only_explorer("rope-pairing")
    pairing.click_on(".head-dim-choice button", has_text="16")
    readout = pairing.text_of(".rope-pairing-readout")
    assert "(1, 9)" in readout and "✓" in readout, readout
    pairing.screenshot(ARTIFACTS / "rope-pairing.png")
    pairing.click_on(".head-dim-choice button", has_text="8")
