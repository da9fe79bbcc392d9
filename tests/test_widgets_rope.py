"""Notebook 04's widgets, without a browser: set a control, check the data shown.

The widgets get the reference solution's functions (what a learner who solved
the exercises passes in), deliberately unfinished ones, or mistaken ones.
"""

import math

import numpy as np
import pytest
import torch

from autograder import reference
from course_widgets.rope import PairingExplorer, PairRotation, RelativeScores


@pytest.fixture(scope="module")
def solved():
    return reference.load("04_rope")


def unimplemented(*args, **kwargs):
    raise NotImplementedError()


# ---------------------------------------------------------------- PairRotation


def test_rotation_shows_pair_i_turned_by_m_theta(solved):
    widget = PairRotation(solved.apply_rope, solved.rope_frequencies, head_dim=16)
    assert widget.problem == ""
    widget.position.value = 20
    widget.pair.value = 2  # θ_2 = 10000^(-4/16) = 0.1: angle 2 rad
    x, y = widget.tip.get_data()
    assert (x[0], y[0]) == pytest.approx((math.cos(2.0), math.sin(2.0)), abs=1e-6)
    assert list(widget.arrow.get_xdata()) == pytest.approx([0.0, math.cos(2.0)])
    trail_x, trail_y = widget.trail.get_data()
    assert len(trail_x) == 21  # positions 0 .. 20
    assert np.allclose(np.hypot(trail_x, trail_y), 1.0)  # a turn keeps the length
    assert "2.000 rad" in widget.readout.value and "θ<sub>2</sub>" in widget.readout.value
    assert f"({math.cos(2.0):.3f}, {math.sin(2.0):.3f})" in widget.readout.value


def test_rotation_dials_show_every_pair_and_frame_the_chosen_one(solved):
    widget = PairRotation(solved.apply_rope, solved.rope_frequencies, head_dim=16)
    widget.position.value = 10
    widget.pair.value = 7
    xs, ys = widget.hands.get_data()
    hands = [(xs[3 * j + 1] - xs[3 * j], ys[3 * j + 1]) for j in range(8)]
    theta = 10000.0 ** (-np.arange(0, 16, 2) / 16)
    assert np.allclose(hands, np.stack([np.cos(10 * theta), np.sin(10 * theta)], -1), atol=1e-6)
    chosen_x, chosen_y = widget.chosen_hand.get_data()
    assert chosen_x[0] == pytest.approx(widget.dial_centres[7])
    assert chosen_y[1] == pytest.approx(math.sin(10 * theta[7]), abs=1e-6)
    assert widget.dial_labels[7].get_color() == "crimson"


def test_rotation_waits_for_the_learner_then_recovers(solved):
    widget = PairRotation(unimplemented, solved.rope_frequencies)
    assert "Implement `unimplemented`" in widget.problem
    assert "has-problem" in widget._dom_classes
    assert all(not axes.get_visible() for axes in widget.figure.axes)
    widget.apply_rope = solved.apply_rope
    widget.position.value = 5
    assert widget.problem == "" and "has-problem" not in widget._dom_classes
    assert all(axes.get_visible() for axes in widget.figure.axes)


def test_rotation_shows_a_clockwise_mistake(solved):
    """A learner whose sin terms are flipped sees the pair turn the other way."""

    def clockwise(x, positions, base=10000.0):
        return solved.apply_rope(x, -positions, base)

    widget = PairRotation(clockwise, solved.rope_frequencies)
    widget.position.value = 1
    _, y = widget.tip.get_data()
    assert y[0] == pytest.approx(-math.sin(1.0), abs=1e-6)


def test_rotation_names_a_wrong_shape(solved):
    widget = PairRotation(lambda x, positions, base=10000.0: x[..., :2], solved.rope_frequencies)
    assert "`apply_rope` returned shape (4, 2)" in widget.problem


# ---------------------------------------------------------------- RelativeScores


def test_scores_reproduce_the_worked_example(solved):
    widget = RelativeScores(solved.apply_rope)
    assert widget.problem == ""
    scores = widget.scores
    assert scores.shape == (16, 16)
    assert float(scores[3, 1]) == pytest.approx(-1.506, abs=1e-3)
    assert float(scores[7, 5]) == pytest.approx(-1.506, abs=1e-3)
    assert float(scores[5, 7]) == pytest.approx(6.909, abs=1e-3)
    assert float(scores[4, 4]) == pytest.approx(5.0, abs=1e-5)  # same position: no rotation between them
    assert "<b>-1.506</b>" in widget.readout.value
    widget.query_position.value, widget.key_position.value = 5, 7
    assert "<b>6.909</b>" in widget.readout.value
    assert widget.cell_box.get_xy() == (6.5, 4.5)
    assert list(widget.chosen.get_xdata()) == [-2]


def test_scores_are_constant_along_diagonals_and_under_a_shift(solved):
    widget = RelativeScores(solved.apply_rope)
    widget.example.value = "random q, k with d = 64"
    before = widget.scores.clone()
    for offset in range(-15, 16):
        diagonal = torch.diagonal(before, offset)
        assert float(diagonal.max() - diagonal.min()) < 1e-4
    widget.offset.value = 2000
    assert torch.allclose(widget.scores, before, atol=2e-3)  # float32 angles near 2000 rad
    assert widget.heat_axes.get_xticklabels()[0].get_text() == "2000"
    assert np.allclose(widget.image.get_array(), widget.scores.numpy())
    assert widget.diagonal_spread < 1e-3
    assert "q at position 2003, k at position 2001" in widget.readout.value


def test_scores_expose_a_rotation_that_is_not_relative(solved):
    """A broken RoPE (odd positions turned, even ones not) makes the diagonals differ."""

    def broken(x, positions, base=10000.0):
        return solved.apply_rope(x, positions * (positions % 2), base)  # odd positions only

    widget = RelativeScores(broken)
    assert widget.diagonal_spread > 0.1


def test_scores_wait_for_apply_rope(solved):
    widget = RelativeScores(unimplemented)
    assert "Implement" in widget.problem
    widget.apply_rope = solved.apply_rope
    widget.offset.value = 100
    assert widget.problem == ""


# ---------------------------------------------------------------- PairingExplorer


def test_pairing_shows_the_reordering_and_frames_the_pair(solved):
    widget = PairingExplorer(solved.neighbour_to_half_split)
    assert widget.problem == ""
    assert widget.permutation.tolist() == [0, 2, 4, 6, 1, 3, 5, 7]
    assert widget.top.get_array().tolist() == [[0, 0, 1, 1, 2, 2, 3, 3]]
    assert widget.bottom.get_array().tolist() == [[0, 1, 2, 3, 0, 1, 2, 3]]  # pair i at slots i and i + 4
    assert [t.get_text() for t in widget.bottom_texts[:8]] == ["0", "2", "4", "6", "1", "3", "5", "7"]
    frames = [frame.get_xy() for frame in widget.frames]
    assert frames == [(2, 2), (3, 2), (1, 0), (5, 0)]  # pair 1
    assert "<b>(1, 5)</b>" in widget.readout.value and "✓" in widget.readout.value
    segments = widget.links.get_segments()
    assert len(segments) == 8 and segments[1][0].tolist() == [2.5, 2] and segments[1][1].tolist() == [1.5, 1]


def test_pairing_follows_head_dim_and_clamps_the_pair(solved):
    widget = PairingExplorer(solved.neighbour_to_half_split)
    widget.pair.value = 3
    widget.head_dim.value = 16
    assert widget.pair.max == 7 and widget.pair.value == 3
    assert widget.bottom.get_array().shape == (1, 16)
    assert "<b>(3, 11)</b>" in widget.readout.value
    assert sum(t.get_visible() for t in widget.top_texts) == 16
    widget.head_dim.value = 4
    assert widget.pair.max == 1 and widget.pair.value == 1
    assert widget.permutation.tolist() == [0, 2, 1, 3]
    assert sum(t.get_visible() for t in widget.top_texts) == 4
    assert "<b>(1, 3)</b>" in widget.readout.value


def test_pairing_flags_the_inverse_reordering(solved):
    def inverse(x):
        half = x.shape[-1] // 2
        return torch.stack((x[..., :half], x[..., half:]), dim=-1).flatten(-2)

    widget = PairingExplorer(inverse)
    assert widget.problem == ""
    assert "✗" in widget.readout.value


def test_pairing_waits_for_a_reordering(solved):
    widget = PairingExplorer(unimplemented)
    assert "Implement" in widget.problem
    widget.neighbour_to_half_split = lambda x: x * 2
    widget.pair.value = 0
    assert "each appearing once" in widget.problem
    widget.neighbour_to_half_split = solved.neighbour_to_half_split
    widget.pair.value = 2
    assert widget.problem == ""


def test_widgets_build_nothing_while_nbgrader_grades(only_notes, solved):
    PairRotation(solved.apply_rope, solved.rope_frequencies)
    RelativeScores(solved.apply_rope)
    PairingExplorer(solved.neighbour_to_half_split)
    assert len(only_notes()) == 3
