"""Real JupyterLab, real chromium: notebook 01's widgets show the right numbers.

test_browser_acceptance.py already checks that every widget renders and that
every control changes it; here the topic's own facts are read off the page.
``ran_solution`` (conftest.py) gives the solution notebook after its one Run
All of the session; the page is shared, so each change is undone at the end.
"""

from browser_harness import needs_chromium

pytestmark = needs_chromium


def test_heatmap_key_press_moves_to_query_1_and_its_output(ran_solution):
    notebook = ran_solution("01_attention")
    heatmap = notebook.only_explorer("attention-heatmap")
    assert "(2.41, 3.98)" in heatmap.text_of(".attention-output")  # query 0 of the worked example
    heatmap.key_on("query-slider", "ArrowRight")
    assert "(2.20, 6.02)" in heatmap.text_of(".attention-output")
    heatmap.key_on("query-slider", "ArrowLeft")
    assert "(2.41, 3.98)" in heatmap.text_of(".attention-output")


def test_scaling_explorer_without_the_square_root_saturates(ran_solution):
    notebook = ran_solution("01_attention")
    explorer = notebook.only_explorer("scaling-explorer")
    assert "d = 128, divided by √d" in explorer.text_of(".scaling-stats")
    explorer.click_on(".scale-toggle input")
    stats = explorer.text_of(".scaling-stats")
    assert "d = 128, not scaled" in stats
    assert "largest weight is 0.99" in stats  # one key takes nearly everything
    explorer.click_on(".scale-toggle input")
    assert "divided by √d" in explorer.text_of(".scaling-stats")
