"""Notebook 01's widgets, without a browser: set a control, check the data shown.

The widgets get the reference solution's functions (what a learner who solved
the exercises passes in) or deliberately unfinished ones.
"""

import pytest
import torch

from autograder import reference
from course_widgets.attention import AttentionHeatmap, ScalingExplorer

X = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
V = torch.tensor([[1.0, 0.0], [0.0, 10.0], [5.0, 5.0]])


@pytest.fixture(scope="module")
def solved():
    return reference.load("01_attention")


def unimplemented(*args, **kwargs):
    raise NotImplementedError()


def test_heatmap_shows_the_worked_example(solved):
    widget = AttentionHeatmap(solved.attention_weights, solved.attention, X, X, V)
    assert widget.problem == ""
    shown = torch.as_tensor(widget.image.get_array())
    assert torch.allclose(shown[0].float(), torch.tensor([0.40, 0.20, 0.40]), atol=0.005)
    assert [round(bar.get_height(), 2) for bar in widget.bars] == [0.40, 0.20, 0.40]
    assert "(2.41, 3.98)" in widget.output_line.value


def test_picking_a_query_moves_the_frame_bars_and_output(solved):
    widget = AttentionHeatmap(solved.attention_weights, solved.attention, X, X, V)
    widget.query.value = 1
    assert [round(bar.get_height(), 2) for bar in widget.bars] == [0.20, 0.40, 0.40]
    assert widget.row_box.get_y() == pytest.approx(0.5)
    assert "(2.20, 6.02)" in widget.output_line.value


def test_sharpening_the_queries_concentrates_the_weights(solved):
    widget = AttentionHeatmap(solved.attention_weights, solved.attention, X, X, V)
    widget.query.value = 2
    before = max(bar.get_height() for bar in widget.bars)
    widget.sharpen.value = 4.0
    after = max(bar.get_height() for bar in widget.bars)
    assert before == pytest.approx(0.5, abs=0.01) and after > 0.85


def test_heatmap_waits_for_unimplemented_functions_then_recovers(solved):
    widget = AttentionHeatmap(unimplemented, unimplemented, X, X, V)
    assert "Implement `unimplemented`" in widget.problem
    assert "has-problem" in widget._dom_classes
    assert "Implement" in widget.message.value
    widget.attention_weights, widget.attention = solved.attention_weights, solved.attention
    widget.query.value = 1  # any control change runs the functions again
    assert widget.problem == "" and "has-problem" not in widget._dom_classes
    assert widget.message.value == ""


def test_heatmap_names_a_function_that_raises_or_returns_the_wrong_shape(solved):
    def attention_weights(q, k, mask=None):
        raise ValueError("shapes do not line up")

    widget = AttentionHeatmap(attention_weights, solved.attention, X, X, V)
    assert "`attention_weights` raised ValueError: shapes do not line up" in widget.problem
    widget = AttentionHeatmap(lambda q, k, mask=None: (q @ k.T)[0], solved.attention, X, X, V)
    assert "shape (3,)" in widget.problem and "(3, 3)" in widget.problem


def test_scaling_explorer_saturates_without_the_square_root(solved):
    widget = ScalingExplorer(solved.softmax)
    assert widget.d.value == 128 and widget.scaled.value
    scaled_max = max(bar.get_height() for bar in widget.bars)
    widget.scaled.value = False
    unscaled_max = max(bar.get_height() for bar in widget.bars)
    assert unscaled_max > 0.99 > 0.8 > scaled_max
    # the averaged curves: flat when scaled, climbing towards 1 when not
    assert widget.curves[False][-1] > 0.95 and widget.curves[True][-1] < 0.6
    assert "d = 128, not scaled" in widget.stats.value


def test_scaling_explorer_marks_the_chosen_dimension(solved):
    widget = ScalingExplorer(solved.softmax)
    widget.d.value = 8
    x, y = widget.marker.get_data()
    assert list(x) == [8]
    assert y[0] == pytest.approx(widget.curves[True][ScalingExplorer.DIMENSIONS.index(8)])
    scores = widget.scores(8)
    assert scores.shape == (200, 8)
    assert abs(float(scores.var()) - 8) < 2  # q·k of N(0, 1) entries has variance d


def test_scaling_explorer_waits_for_softmax():
    widget = ScalingExplorer(unimplemented)
    assert "Implement" in widget.problem
    assert all(not axes.get_visible() for axes in widget.figure.axes)


def test_widgets_build_nothing_while_nbgrader_grades(only_notes, solved):
    ScalingExplorer(solved.softmax)
    AttentionHeatmap(solved.attention_weights, solved.attention, torch.eye(3), torch.eye(3), torch.eye(3))
    assert len(only_notes()) == 2
