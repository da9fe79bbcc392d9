"""Real JupyterLab, real chromium: notebook 01's widgets show the right numbers.

test_browser_acceptance.py already checks that every widget renders and that
every control changes it; here the topic's own facts are read off the page.
``ran_solution`` (conftest.py) gives the solution notebook after its one Run
All of the session; the page is shared, so each change is undone at the end.
"""
from browser_harness import needs_chromium

pytestmark = needs_chromium


def only_explorer(notebook, css_class: str):
    [explorer] = [e for e in notebook.explorers() if e.topic_class == css_class]
    explorer.locator.scroll_into_view_if_needed()
    explorer.settle()
    return explorer


def test_heatmap_key_press_moves_to_query_1_and_its_output(ran_solution):
    notebook = ran_solution("01_attention")
    heatmap = only_explorer(notebook, "attention-heatmap")
    output = heatmap.locator.locator(".attention-output")
    assert "(2.41, 3.98)" in output.inner_text()  # query 0 of the worked example
    handle = heatmap.locator.locator(".query-slider .noUi-handle")

    heatmap.arm()
    handle.focus()
    notebook.page.keyboard.press("ArrowRight")
    assert heatmap.wait_for_change(pixels_only=True).what == "pixels"
    heatmap.settle()
    assert "(2.20, 6.02)" in output.inner_text()

    heatmap.arm()
    handle.focus()
    notebook.page.keyboard.press("ArrowLeft")
    heatmap.wait_for_change(pixels_only=True)
    heatmap.settle()
    assert "(2.41, 3.98)" in output.inner_text()


def test_scaling_explorer_without_the_square_root_saturates(ran_solution):
    notebook = ran_solution("01_attention")
    explorer = only_explorer(notebook, "scaling-explorer")
    stats = explorer.locator.locator(".scaling-stats")
    toggle = explorer.locator.locator(".scale-toggle input")
    assert "d = 128, divided by √d" in stats.inner_text()

    explorer.arm()
    toggle.click()
    explorer.wait_for_change(pixels_only=True)
    explorer.settle()
    assert "d = 128, not scaled" in stats.inner_text()
    assert "largest weight is 0.99" in stats.inner_text()  # one key takes nearly everything

    explorer.arm()
    toggle.click()
    explorer.wait_for_change(pixels_only=True)
    explorer.settle()
    assert "divided by √d" in stats.inner_text()
