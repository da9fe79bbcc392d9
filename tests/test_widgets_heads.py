"""Notebook 03's widgets, without a browser: set a control, check the data shown.

The widgets get the reference solution's functions (what a learner who solved
the exercises passes in), mistaken ones, or unfinished ones.
"""

import numpy as np
import pytest
import torch

from autograder import reference
from course_widgets.heads import TOKEN_COLOURS, HeadPatterns, ShapeWalk


@pytest.fixture(scope="module")
def solved():
    return reference.load("03_multi_head_attention")


def unimplemented(*args, **kwargs):
    raise NotImplementedError()


def patterns(solved, **changes):
    functions = dict(
        MultiHeadAttention=solved.MultiHeadAttention,
        split_heads=solved.split_heads,
        merge_heads=solved.merge_heads,
        attention_weights=solved.attention_weights,
        attention=solved.attention,
    )
    functions.update(changes)
    return HeadPatterns(**functions)


# ---------------------------------------------------------------- the shape walk


def test_shape_walk_shows_where_each_feature_of_a_token_lands(solved):
    widget = ShapeWalk(solved.split_heads, solved.merge_heads)
    assert widget.problem == ""
    assert widget.heads.value == 2 and widget.token.value == 1
    assert widget.split[0, 1, 1].tolist() == [12, 13, 14, 15]  # token 1's features 4-7, in head 1
    text = widget.walk.value
    assert "(1, 3, 8) → view → (1, 3, 2, 4) → transpose(1, 2) → (1, 2, 3, 4)" in text
    assert "round trip exact" in text
    assert "head 0 ← features 0–3 (row 1); head 1 ← features 4–7 (row 1)" in text
    shown = [t.get_text() for t in widget.cell_texts if t.get_text()]
    assert len(shown) == 4 * 3 * 8  # every number of the four panels carries its feature index


def test_shape_walk_relays_out_when_the_number_of_heads_changes(solved):
    widget = ShapeWalk(solved.split_heads, solved.merge_heads)
    widget.heads.value = 4
    # panels 8 | 3 tokens × 2 + 2 gaps | 4 heads × 2 + 3 gaps | 8, with 3 gaps of 3 between them
    assert widget.image.get_array().shape == (4, 8 + 8 + 11 + 8 + 9, 3)
    assert "head 2 ← features 4–5 (row 1)" in widget.walk.value
    assert [label.get_text() for label in widget.block_labels if label.get_text()] == [
        "t0",
        "t1",
        "t2",
        "h0",
        "h1",
        "h2",
        "h3",
    ]
    widget.heads.value = 8
    assert widget.split.shape == (1, 8, 3, 1)
    assert "head 7 ← features 7 (row 1)" in widget.walk.value


def test_shape_walk_colours_the_followed_token(solved):
    widget = ShapeWalk(solved.split_heads, solved.merge_heads)
    widget.token.value = 0
    rgb = widget.image.get_array()
    full, faded = np.array(TOKEN_COLOURS[0]), 0.25 * np.array(TOKEN_COLOURS[1]) + 0.75
    assert np.allclose(rgb[0, 0], full) and np.allclose(rgb[1, 0], faded)
    assert "“the” (token 0)" in widget.walk.value


def test_shape_walk_shows_a_split_without_the_transpose(solved):
    def split_heads(x, n_heads):  # the classic mistake: the right shape, the wrong numbers
        B, T, D = x.shape
        return x.reshape(B, n_heads, T, D // n_heads)

    widget = ShapeWalk(split_heads, solved.merge_heads)
    assert widget.problem == ""
    text = widget.walk.value
    assert "the round trip does not give x back" in text
    # token 1 holds 8..15: in the flat order, 8-11 end head 0 and 12-15 start head 1
    assert "head 0 ← features 0–3 (row 2); head 1 ← features 4–7 (row 0)" in text


def test_shape_walk_waits_for_unimplemented_functions_then_recovers(solved):
    widget = ShapeWalk(unimplemented, unimplemented)
    assert "Implement `unimplemented`" in widget.problem
    assert all(not axes.get_visible() for axes in widget.figure.axes)
    widget.split_heads, widget.merge_heads = solved.split_heads, solved.merge_heads
    widget.heads.value = 4
    assert widget.problem == "" and "has-problem" not in widget._dom_classes


def test_shape_walk_names_a_wrong_shape(solved):
    widget = ShapeWalk(lambda x, n_heads: x.reshape(1, 3, n_heads, -1), solved.merge_heads)
    assert "shape (1, 3, 2, 4)" in widget.problem and "(1, 2, 3, 4)" in widget.problem


# ---------------------------------------------------------------- per-head patterns


def test_head_patterns_shows_every_heads_weights_side_by_side(solved):
    widget = patterns(solved)
    assert widget.problem == ""
    T, H = widget.T, widget.heads.value
    picture = np.ma.filled(widget.image.get_array().astype(float), np.nan)
    assert picture.shape == (T, H * (T + 1) - 1)
    assert np.isnan(picture[:, T]).all()  # a blank column between the heads
    assert torch.allclose(widget.weights.sum(dim=-1), torch.ones(H, T, dtype=torch.float64))
    assert np.allclose(picture[:, :T], widget.weights[0].numpy())
    assert np.allclose(picture[:, T + 1 :], widget.weights[1].numpy())
    assert [t.get_text() for t in widget.head_titles if t.get_visible()] == ["head 0", "head 1"]


def test_head_patterns_follows_the_controls(solved):
    widget = patterns(solved)
    widget.heads.value = 4
    assert widget.image.get_array().shape == (6, 4 * 7 - 1)
    assert sum(t.get_visible() for t in widget.head_titles) == 4
    widget.query.value = 3
    assert widget.row_box.get_y() == pytest.approx(2.5)
    assert [bar.get_height() for bar in widget.bars] == pytest.approx(widget.merged[3].tolist())
    assert list(widget.after.get_ydata()) == pytest.approx(widget.output[3].tolist())
    assert "query “on”" in widget.summary.value and "head 3" in widget.summary.value
    # bars coloured by head: 4 numbers per head
    colours = [tuple(bar.get_facecolor()[:3]) for bar in widget.bars]
    assert colours[0] == colours[3] != colours[4] == colours[7]
    before = widget.weights.clone()
    widget.seed.value = 5
    assert not torch.allclose(before, widget.weights)


def test_head_patterns_keeps_its_bar_scale_while_the_numbers_fit(solved):
    """The bar axis snaps to 1, 2, 5, ...: every bar and dot fits, and moving through the
    queries mostly keeps the scale (so only the data is drawn again, not the figure)."""
    widget = patterns(solved)
    limits = []
    for query in range(widget.T):
        widget.query.value = query
        low, high = widget.bar_axes.get_ylim()
        shown = max(abs(widget.merged[query]).max(), abs(widget.output[query]).max())
        assert low == -high and high in (0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0) and shown <= high
        limits.append(high)
    assert len(set(limits)) < len(limits) / 2


def test_head_patterns_causal_mask_empties_the_upper_triangle(solved):
    widget = patterns(solved)
    widget.causal.value = True
    upper = torch.ones(6, 6, dtype=torch.bool).triu(1)
    assert (widget.weights[:, upper] == 0).all()
    assert torch.allclose(widget.weights[:, 0, 0], torch.ones(widget.heads.value, dtype=torch.float64))


def test_head_patterns_the_same_word_gets_the_same_weight(solved):
    """Without positions, the two 'the' keys are indistinguishable."""
    widget = patterns(solved)
    assert torch.allclose(widget.weights[..., 0], widget.weights[..., 4])


def test_head_patterns_output_is_the_learners_module(solved):
    widget = patterns(solved)
    module = widget.build_module(2, widget.seed.value)
    with torch.no_grad():
        expected = module(widget.x)[0]
    assert torch.allclose(widget.output, expected.double())
    # the bars are the heads' outputs side by side: W_O applied to them gives the dots
    assert torch.allclose(widget.merged.float() @ module.o_proj.weight.T, expected, atol=1e-5)


def test_head_patterns_waits_for_the_learner_then_recovers(solved):
    widget = patterns(solved, MultiHeadAttention=unimplemented)
    assert "Implement" in widget.problem
    widget.MultiHeadAttention = solved.MultiHeadAttention
    widget.query.value = 1
    assert widget.problem == ""


def test_head_patterns_names_a_missing_projection(solved):
    class Incomplete(torch.nn.Module):
        def __init__(self, d_model, n_heads):
            super().__init__()
            self.q_proj = torch.nn.Linear(d_model, d_model, bias=False)

    widget = patterns(solved, MultiHeadAttention=Incomplete)
    assert "no linear layer `k_proj`" in widget.problem


def test_head_patterns_names_a_failing_merge(solved):
    def merge_heads(x):
        B, H, T, Dh = x.shape
        return x.transpose(1, 2).view(B, T, H * Dh)

    widget = patterns(solved, merge_heads=merge_heads)
    assert "`merge_heads` raised RuntimeError" in widget.problem


def test_widgets_build_nothing_while_nbgrader_grades(only_notes, solved):
    ShapeWalk(solved.split_heads, solved.merge_heads)
    patterns(solved)
    assert len(only_notes()) == 2
