"""Real JupyterLab, real chromium: notebook 08's widgets show the right numbers.

test_browser_acceptance.py already checks that every widget renders and that
every control changes it; here the topic's own facts are read off the page.
``ran_solution`` (conftest.py) gives the solution notebook after its one Run
All of the session; the page is shared, so each change is undone at the end.
"""

from browser_harness import ARTIFACTS, needs_chromium

pytestmark = needs_chromium


def test_cache_filling_adds_one_new_position_per_step(ran_solution):
    notebook = ran_solution("08_kv_cache")
    filling = notebook.only_explorer("cache-filling")
    assert "the new token at position 6" in filling.text_of(".filling-summary")  # prompt 4, step 3
    filling.key_on("step-slider", "ArrowRight")  # step 4: position 7 new, 7 positions read back
    text = filling.text_of(".filling-summary")
    assert "the new token at position 7" in text and "7 read from the cache (S = 8)" in text, text
    assert "matches one full forward pass" in text and "8 with the cache, 30 without" in text, text
    filling.screenshot(ARTIFACTS / "kv-cache-filling.png")
    filling.key_on("step-slider", "ArrowLeft")


def test_cache_memory_of_the_learners_cache_halves_in_bfloat16(ran_solution):
    notebook = ran_solution("08_kv_cache")
    memory = notebook.only_explorer("cache-memory")
    assert "GQA (G = 2): your cache holds 131,072 bytes = kv_cache_bytes 131,072" in memory.text_of(".memory-summary")
    memory.click_on(".dtype-toggle button", has_text="bfloat16")
    text = memory.text_of(".memory-summary")
    assert "2 bytes a value" in text and "GQA (G = 2): your cache holds 65,536 bytes = kv_cache_bytes 65,536" in text, (
        text
    )
    memory.screenshot(ARTIFACTS / "kv-cache-memory.png")
    memory.click_on(".dtype-toggle button", has_text="float32")
