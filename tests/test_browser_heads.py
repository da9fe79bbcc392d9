"""Real JupyterLab, real chromium: notebook 03's widgets show the right facts.

test_browser_acceptance.py already checks that every widget renders and that
every control changes it; here the topic's own facts are read off the page.
``ran_solution`` (conftest.py) gives the solution notebook after its one Run
All of the session; the page is shared, so each change is undone at the end.
"""

from browser_harness import ARTIFACTS, needs_chromium

pytestmark = needs_chromium


def test_shape_walk_with_one_more_head_recuts_every_token(ran_solution):
    notebook = ran_solution("03_multi_head_attention")
    walk = notebook.only_explorer("shape-walk")
    walk.key_on("heads-slider", "ArrowRight")  # 2 -> 4 heads
    text = walk.text_of(".shape-walk-text")
    assert "(1, 4, 3, 2)" in text and "head 2 ← features 4–5 (row 1)" in text, text
    walk.screenshot(ARTIFACTS / "shape-walk.png")
    walk.key_on("heads-slider", "ArrowLeft")


def test_head_patterns_follow_the_query_and_the_causal_mask(ran_solution):
    notebook = ran_solution("03_multi_head_attention")
    patterns = notebook.only_explorer("head-patterns")
    patterns.key_on("query-slider", "ArrowRight")
    assert "query “on”" in patterns.text_of(".head-summary")
    patterns.click_on(".causal-toggle input")  # every head's upper triangle empties
    patterns.screenshot(ARTIFACTS / "head-patterns.png")
    patterns.click_on(".causal-toggle input")
    patterns.key_on("query-slider", "ArrowLeft")
