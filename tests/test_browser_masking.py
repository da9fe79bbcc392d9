"""Real JupyterLab, real chromium: notebook 02's widgets show the right facts.

test_browser_acceptance.py already checks that every widget renders and that
every control changes it; here the topic's own facts are read off the page.
``ran_solution`` (conftest.py) gives the solution notebook after its one Run
All of the session; the page is shared, so each change is undone at the end.
"""

from browser_harness import ARTIFACTS, needs_chromium

pytestmark = needs_chromium


def test_editing_token_2_moves_only_the_outputs_from_2_on(ran_solution):
    notebook = ran_solution("02_causal_masking")
    explorer = notebook.only_explorer("mask-explorer")
    explorer.key_on("change-slider", "ArrowRight")
    summary = explorer.text_of(".mask-summary")
    assert "tokens 2, 3, 4 moved" in summary and "tokens 0, 1 did not move" in summary, summary
    explorer.screenshot(ARTIFACTS / "mask-explorer.png")
    explorer.key_on("change-slider", "ArrowLeft")


def test_cache_mask_with_4_new_queries_against_7_keys(ran_solution):
    notebook = ran_solution("02_causal_masking")
    viewer = notebook.only_explorer("cache-mask-viewer")
    viewer.key_on("queries-slider", "ArrowRight")
    assert "3 keys come from the cache and 4 from the new tokens" in viewer.text_of(".cache-summary")
    viewer.screenshot(ARTIFACTS / "cache-mask-viewer.png")
    viewer.key_on("queries-slider", "ArrowLeft")
