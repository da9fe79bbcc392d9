"""Notebook 02's widgets, without a browser: set a control, check the data shown.

The widgets get the reference solution's functions (what a learner who solved
the exercises passes in) or deliberately unfinished or mistaken ones.
"""

import numpy as np
import pytest
import torch

from autograder import reference
from course_widgets.masking import CacheMaskViewer, MaskExplorer

X5 = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [1.0, -1.0], [-0.5, 1.0]])
V5 = torch.tensor([[1.0, 0.0], [0.0, 10.0], [5.0, 5.0], [2.0, -4.0], [-3.0, 3.0]])


@pytest.fixture(scope="module")
def solved():
    return reference.load("02_causal_masking")


def unimplemented(*args, **kwargs):
    raise NotImplementedError()


def explorer(solved, causal_mask=None, token=2):
    return MaskExplorer(
        causal_mask or solved.causal_mask, solved.attention_weights, solved.attention, X5, V5, token=token
    )


def test_explorer_shows_the_worked_example(solved):
    widget = explorer(solved)
    assert widget.problem == ""
    weights = torch.as_tensor(np.ma.filled(widget.weight_image.get_array(), 0.0))
    assert torch.allclose(
        weights[:3, :3].float(), torch.tensor([[1.0, 0.0, 0.0], [0.33, 0.67, 0.0], [0.25, 0.25, 0.50]]), atol=0.005
    )
    scores = widget.score_image.get_array()
    assert bool(scores.mask[0, 1]) and not bool(scores.mask[1, 0])  # -inf above the diagonal, shown grey
    texts = {cell: text.get_text() for cell, text in widget.score_texts.items()}
    assert texts[0, 0] == "0.71" and texts[0, 1] == "-inf" and texts[2, 2] == "1.41"
    assert texts[1, 0] == "0.00" and texts[1, 2] == "-inf"
    assert [bar.get_height() for bar in widget.bars] == [0.0] * 5  # nothing edited yet


def test_changing_a_token_moves_only_that_output_and_the_later_ones(solved):
    widget = explorer(solved)
    widget.change.value = 1.0
    assert widget.changed == [2, 3, 4]
    heights = [bar.get_height() for bar in widget.bars]
    assert heights[0] == heights[1] == 0.0 and min(heights[2:]) > 0.01
    assert [bar.get_facecolor() != widget.bars[0].get_facecolor() for bar in widget.bars] == [False] * 2 + [True] * 3
    assert "tokens <b>2, 3, 4</b> moved" in widget.summary.value
    assert "tokens <b>0, 1</b> did not move" in widget.summary.value
    assert widget.frames[0].get_x() == pytest.approx(1.5)
    widget.token.value = 4
    assert widget.changed == [4]
    assert widget.frames[1].get_x() == pytest.approx(3.5)
    widget.token.value = 0
    assert widget.changed == [0, 1, 2, 3, 4]


def test_without_the_mask_every_output_moves(solved):
    widget = explorer(solved, token=3)
    widget.change.value = -1.5
    assert widget.changed == [3, 4]
    widget.causal.value = False
    assert widget.changed == [0, 1, 2, 3, 4]
    assert "earlier tokens see the future" in widget.summary.value
    assert "-inf" not in [text.get_text() for text in widget.score_texts.values()]


def test_explorer_uses_the_learners_mask(solved):
    """An upper-triangle mask lets the early tokens see the future: the explorer shows it."""
    widget = explorer(solved, causal_mask=lambda T, S=None: torch.ones(T, T, dtype=torch.bool).triu(), token=3)
    widget.change.value = 1.0
    assert widget.changed == [0, 1, 2, 3]


def test_explorer_waits_for_causal_mask_then_recovers(solved):
    widget = explorer(solved, causal_mask=unimplemented)
    assert "Implement `unimplemented`" in widget.problem
    assert "has-problem" in widget._dom_classes
    widget.causal_mask = solved.causal_mask
    widget.change.value = 0.5
    assert widget.problem == "" and widget.message.value == ""
    assert widget.changed == [2, 3, 4]


def test_explorer_explains_a_mask_of_floats(solved):
    widget = explorer(solved, causal_mask=lambda T, S=None: torch.ones(T, T).tril())
    assert "dtype torch.float32" in widget.problem and "booleans" in widget.problem


def test_cache_viewer_shows_the_bottom_right_triangle(solved):
    widget = CacheMaskViewer(solved.causal_mask, T=2, S=5)
    assert widget.problem == ""
    shown = widget.image.get_array()
    assert shown.shape == (2, 5)
    assert shown.tolist() == [[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]
    assert "3 keys come from the cache" in widget.summary.value
    assert "may attend to <b>4</b> keys" in widget.summary.value
    assert widget.cache_line.get_visible() and list(widget.cache_line.get_xdata()) == [2.5, 2.5]


def test_cache_viewer_follows_the_sliders(solved):
    widget = CacheMaskViewer(solved.causal_mask, T=3, S=7)
    widget.query_slider.value = 4
    assert widget.image.get_array().shape == (4, 7)
    assert widget.image.get_extent() == [-0.5, 6.5, 3.5, -0.5]
    widget.key_slider.value = 4  # nothing cached: the square mask
    assert widget.image.get_array().tolist() == torch.ones(4, 4).tril().tolist()
    assert not widget.cache_line.get_visible()
    widget.query_slider.value = 6  # more queries than keys: the keys follow
    assert widget.key_slider.value == 6 and widget.image.get_array().shape == (6, 6)
    assert widget.problem == ""


def test_cache_viewer_shows_a_top_left_mask_as_it_is(solved):
    widget = CacheMaskViewer(lambda T, S=None: torch.ones(T, S or T, dtype=torch.bool).tril(), T=1, S=6)
    assert widget.image.get_array().tolist() == [[1, 0, 0, 0, 0, 0]]
    assert "to <b>1</b> of 6" in widget.summary.value


def test_cache_viewer_waits_for_causal_mask(solved):
    widget = CacheMaskViewer(unimplemented)
    assert "Implement" in widget.problem
    assert all(not axes.get_visible() for axes in widget.figure.axes)
    widget.causal_mask = solved.causal_mask
    widget.key_slider.value = 8
    assert widget.problem == "" and widget.mask.shape == (3, 8)


def test_widgets_build_nothing_while_nbgrader_grades(only_notes, solved):
    explorer(solved)
    CacheMaskViewer(solved.causal_mask)
    assert len(only_notes()) == 2
