"""Notebook 05's widgets, without a browser: set a control, check the data shown.

The widgets get the reference solution's functions (what a learner who solved
the exercises passes in), mistaken ones, or deliberately unfinished ones.
"""

import matplotlib.colors as mcolors
import pytest

from autograder import reference
from course_widgets.gqa import GIB, PUBLISHED_MODELS, HeadGrouping, KVCacheExplorer


@pytest.fixture(scope="module")
def solved():
    return reference.load("05_grouped_query_attention")


def unimplemented(*args, **kwargs):
    raise NotImplementedError()


def kv_centre(widget, g):
    """x of kv head g: under the middle of its block of H/G query heads."""
    size = widget.n_heads.value // widget.n_kv_heads.value
    return (g + 0.5) * size - 0.5


# ---------------------------------------------------------------- HeadGrouping


def test_grouping_shows_the_worked_example(solved):
    widget = HeadGrouping(solved.kv_head_index)
    assert (widget.n_heads.value, widget.n_kv_heads.value, widget.query_head.value) == (32, 8, 13)
    assert widget.problem == ""
    assert widget.groups == [g for g in range(8) for _ in range(4)]
    assert "Query head 13 reads <b>kv head 3</b>" in widget.summary.value
    assert "4× smaller than multi-head attention" in widget.summary.value
    assert "blocks of consecutive query heads" in widget.summary.value
    # the highlighted line runs from query head 13 down to kv head 3
    xs, ys = widget.highlight.get_data()
    assert list(xs) == [13, kv_centre(widget, 3)] and list(ys) == [0.9, 0.1]
    assert len(widget.links.get_segments()) == 32
    assert len(widget.query_boxes.get_offsets()) == 32 and len(widget.kv_boxes.get_offsets()) == 8


def test_query_heads_take_the_colour_of_their_kv_head(solved):
    widget = HeadGrouping(solved.kv_head_index)
    query_colours = [mcolors.to_hex(c) for c in widget.query_boxes.get_facecolors()]
    kv_colours = [mcolors.to_hex(c) for c in widget.kv_boxes.get_facecolors()]
    assert len(set(kv_colours)) == 8
    assert query_colours == [kv_colours[h // 4] for h in range(32)]


def test_grouping_extremes_are_multi_head_and_multi_query(solved):
    widget = HeadGrouping(solved.kv_head_index)
    widget.n_kv_heads.value = 32
    assert widget.groups == list(range(32))
    assert "multi-head attention" in widget.summary.value
    assert "as large as with multi-head attention" in widget.summary.value
    widget.n_kv_heads.value = 1
    assert widget.groups == [0] * 32
    assert "multi-query attention" in widget.summary.value and "32× smaller" in widget.summary.value


def test_changing_h_keeps_g_a_divisor_and_the_query_head_in_range(solved):
    widget = HeadGrouping(solved.kv_head_index)
    calls = []
    original = widget.update
    widget.update = lambda: (calls.append(1), original())[1]
    widget.n_heads.value = 12
    assert calls == [1]  # one redraw, not one per adjusted control
    assert list(widget.n_kv_heads.options) == [1, 2, 3, 4, 6, 12]
    assert widget.n_kv_heads.value == 6  # the largest divisor not above the previous G = 8
    assert widget.query_head.max == 11 and widget.query_head.value == 11
    assert widget.groups == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5]
    assert sum(text.get_visible() for text in widget.query_labels) == 12
    assert sum(text.get_visible() for text in widget.kv_labels) == 6
    widget.n_heads.value = 64
    assert widget.n_kv_heads.value == 4 and widget.query_head.value == 11
    assert len(widget.links.get_segments()) == 64


def test_picking_a_query_head_moves_the_highlight(solved):
    widget = HeadGrouping(solved.kv_head_index)
    widget.query_head.value = 30
    xs, _ = widget.highlight.get_data()
    assert list(xs) == [30, kv_centre(widget, 7)]
    assert "Query head 30 reads <b>kv head 7</b>" in widget.summary.value


def test_a_round_robin_mapping_shows_crossing_lines_and_a_note():
    widget = HeadGrouping(lambda h, n_heads, n_kv_heads: h % n_kv_heads)
    assert widget.problem == ""
    assert widget.groups[:9] == [0, 1, 2, 3, 4, 5, 6, 7, 0]
    # query head 1 is drawn down to kv head 1, which sits under heads 4 to 7
    (start, end) = widget.links.get_segments()[1]
    assert tuple(start) == (1, 0.9) and tuple(end) == (kv_centre(widget, 1), 0.1)
    assert "not blocks of consecutive heads" in widget.summary.value
    assert "Query head 13 reads <b>kv head 5</b>" in widget.summary.value


def test_grouping_waits_for_kv_head_index_then_recovers(solved):
    widget = HeadGrouping(unimplemented)
    assert "Implement `unimplemented`" in widget.problem
    assert "has-problem" in widget._dom_classes
    assert all(not axes.get_visible() for axes in widget.figure.axes)
    widget.kv_head_index = solved.kv_head_index
    widget.query_head.value = 12  # any control change runs the function again
    assert widget.problem == "" and "has-problem" not in widget._dom_classes
    assert widget.groups[12] == 3


def test_grouping_explains_indices_that_are_not_kv_heads():
    widget = HeadGrouping(lambda h, n_heads, n_kv_heads: h / (n_heads / n_kv_heads))
    assert "kv_head_index(1, 32, 8) returned 0.25, not a whole number" in widget.problem
    widget = HeadGrouping(lambda h, n_heads, n_kv_heads: h // n_kv_heads + 5)
    assert "kv_head_index(0, 32, 8) returned 5" not in widget.problem  # 5 is a valid kv head of 8
    assert "kv_head_index(24, 32, 8) returned 8, but the kv heads are numbered 0 to 7" in widget.problem
    widget = HeadGrouping(lambda h, n_heads, n_kv_heads: None)
    assert "returned NoneType" in widget.problem


def test_grouping_accepts_a_float_that_is_a_whole_number():
    widget = HeadGrouping(lambda h, n_heads, n_kv_heads: h // (n_heads / n_kv_heads))
    assert widget.problem == "" and widget.groups[13] == 3


# ---------------------------------------------------------------- KVCacheExplorer


def test_cache_explorer_shows_llama_3_8b_against_mha_and_mqa(solved):
    widget = KVCacheExplorer(solved.kv_cache_bytes)
    assert (widget.model.value, widget.seq_len.value, widget.batch.value, widget.precision.value) == (
        "LLaMA-3-8B",
        4096,
        1,
        2,
    )
    assert widget.problem == ""
    assert widget.markers["MHA"].get_data()[1][0] == pytest.approx(2.0)  # GiB
    assert widget.markers["GQA"].get_data()[1][0] == pytest.approx(0.5)
    assert widget.markers["MQA"].get_data()[1][0] == pytest.approx(1 / 16)
    summary = widget.summary.value
    assert "GQA (G = 8) (as published) <b>512 MiB</b>" in summary
    assert "as published: 536,870,912 bytes" in summary
    assert "MQA is 32× smaller than MHA" in summary
    assert widget.lines["GQA"].get_linewidth() > widget.lines["MHA"].get_linewidth()
    texts = [t.get_text() for t in widget.legend.get_texts()]
    assert texts == ["MHA (G = 32)", "GQA (G = 8), as published", "MQA (G = 1)"]


def test_cache_curves_are_the_learners_numbers(solved):
    seen = []

    def kv_cache_bytes(*args, **kwargs):
        seen.append((args, kwargs))
        return solved.kv_cache_bytes(*args, **kwargs)

    widget = KVCacheExplorer(kv_cache_bytes)
    assert ((32, 8, 128, 4096), {"batch_size": 1, "bytes_per_value": 2}) in seen
    xs, ys = widget.lines["MHA"].get_data()
    assert list(xs) == list(KVCacheExplorer.SEQ_LENS)
    assert list(ys) == pytest.approx([solved.kv_cache_bytes(32, 32, 128, n) / GIB for n in xs])


def test_cache_grows_with_batch_and_precision(solved):
    widget = KVCacheExplorer(solved.kv_cache_bytes)
    widget.batch.value = 8
    assert widget.markers["GQA"].get_data()[1][0] == pytest.approx(4.0)
    widget.precision.value = 4
    assert widget.markers["GQA"].get_data()[1][0] == pytest.approx(8.0)
    widget.seq_len.value = 131072
    assert widget.markers["MHA"].get_data()[0][0] == 131072
    assert "131,072 tokens, batch 8, 4 bytes a value" in widget.summary.value


def test_cache_presets_mark_the_published_variant(solved):
    widget = KVCacheExplorer(solved.kv_cache_bytes)
    widget.model.value = "LLaMA-2-7B"
    assert "MHA (G = 32) (as published) <b>2.00 GiB</b>" in widget.summary.value
    assert "as published: 2,147,483,648 bytes" in widget.summary.value
    widget.model.value = "LLaMA-2-70B"
    assert "MHA (G = 64)" in widget.summary.value and "GQA (G = 8) (as published)" in widget.summary.value
    widget.model.value = "Falcon-7B"  # 71 query heads: G = 8 is not a grouping of them
    assert widget.lines["GQA"].get_data()[0] == [] or len(widget.lines["GQA"].get_data()[0]) == 0
    assert widget.legend.get_texts()[1].get_text() == "GQA: G = 8 does not divide H = 71"
    assert "MQA (G = 1) (as published) <b>32 MiB</b>" in widget.summary.value  # 4096 tokens x 8 KiB
    assert set(PUBLISHED_MODELS) == set(widget.model.options)


def test_cache_explorer_waits_for_kv_cache_bytes_then_recovers(solved):
    widget = KVCacheExplorer(unimplemented)
    assert "Implement `unimplemented`" in widget.problem
    widget.kv_cache_bytes = solved.kv_cache_bytes
    widget.batch.value = 2
    assert widget.problem == "" and "has-problem" not in widget._dom_classes


def test_cache_explorer_names_a_wrong_return_value():
    widget = KVCacheExplorer(lambda *args, **kwargs: None)
    assert "returned NoneType; it should return a number of bytes" in widget.problem
    widget = KVCacheExplorer(lambda *args, **kwargs: -1)
    assert "a cache size is a positive number of bytes" in widget.problem


def test_widgets_build_nothing_while_nbgrader_grades(only_notes, solved):
    HeadGrouping(solved.kv_head_index)
    KVCacheExplorer(solved.kv_cache_bytes)
    assert len(only_notes()) == 2
