"""Real JupyterLab, real chromium: notebook 05's widgets show the right numbers.

test_browser_acceptance.py already checks that every widget renders and that
every control changes it; here the topic's own facts are read off the page.
``ran_solution`` (conftest.py) gives the solution notebook after its one Run
All of the session; the page is shared, so each change is undone at the end.
"""

from browser_harness import ARTIFACTS, needs_chromium

pytestmark = needs_chromium


def test_head_grouping_follows_the_query_head_and_the_kv_heads(ran_solution):
    notebook = ran_solution("05_grouped_query_attention")
    grouping = notebook.only_explorer("head-grouping")
    grouping.key_on("query-head-slider", "ArrowRight")  # query head 13 -> 14, still kv head 3
    assert "Query head 14 reads kv head 3" in grouping.text_of(".grouping-summary")
    grouping.key_on("kv-heads-slider", "ArrowLeft")  # 8 -> 4 kv heads: groups of 8
    assert "Query head 14 reads kv head 1" in grouping.text_of(".grouping-summary")
    grouping.screenshot(ARTIFACTS / "gqa-head-grouping.png")
    grouping.key_on("kv-heads-slider", "ArrowRight")
    grouping.key_on("query-head-slider", "ArrowLeft")


def test_kv_cache_of_8192_tokens_then_32_bit_values(ran_solution):
    notebook = ran_solution("05_grouped_query_attention")
    cache = notebook.only_explorer("kv-cache-explorer")
    cache.key_on("seq-len-slider", "ArrowRight")  # 4096 -> 8192 tokens
    text = cache.text_of(".cache-summary")
    assert "8,192 tokens" in text and "as published: 1,073,741,824 bytes" in text, text
    cache.click_on(".precision-toggle button", has_text="32-bit")
    assert "4 bytes a value" in cache.text_of(".cache-summary")
    cache.screenshot(ARTIFACTS / "gqa-kv-cache.png")
    cache.click_on(".precision-toggle button", has_text="16-bit")
    cache.key_on("seq-len-slider", "ArrowLeft")
