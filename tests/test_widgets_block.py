"""Notebook 06's widgets, without a browser: set a control, check the data shown.

The widgets get the reference solution's classes (what a learner who solved
the exercises passes in), deliberately unfinished ones, or mistaken ones (to
show the widgets draw the learner's code, not their own).
"""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from autograder import reference
from autograder.exercises.transformer_block import BLOCK_MISTAKES
from course_widgets.block import ResidualStreamExplorer, SiluGateExplorer, _times


@pytest.fixture(scope="module")
def solved():
    return reference.load("06_transformer_block")


class Unimplemented(nn.Module):
    def __init__(self, *args, **kwargs):
        super().__init__()
        raise NotImplementedError()


def curve(line) -> torch.Tensor:
    return torch.as_tensor(line.get_ydata(), dtype=torch.float64)


# ---------------------------------------------------------------- the SiLU gate explorer


def test_gate_explorer_shows_the_worked_example(solved):
    widget = SiluGateExplorer(solved.SwiGLU)
    assert widget.problem == ""
    assert (widget.z.value, widget.up.value) == (2.0, 0.5)
    assert widget.product == pytest.approx(0.8808, abs=1e-4)
    assert "<b>1.76</b>" in widget.readout.value and "<b>0.88</b>" in widget.readout.value
    x, y = widget.product_marker.get_data()
    assert list(x) == [2.0] and y[0] == pytest.approx(0.8808, abs=1e-4)
    # the curves come from the learner's SwiGLU: SiLU, and SiLU times the gate
    assert torch.allclose(curve(widget.silu_line), F.silu(widget.grid), atol=1e-6)
    assert torch.allclose(curve(widget.product_line), 0.5 * F.silu(widget.grid), atol=1e-6)


def test_a_gate_of_zero_switches_the_entry_off_and_a_negative_one_flips_it(solved):
    widget = SiluGateExplorer(solved.SwiGLU)
    widget.up.value = 0.0
    assert widget.product == 0.0
    assert curve(widget.product_line).abs().max() == 0.0
    assert "switched off" in widget.readout.value
    widget.up.value = -1.0
    assert widget.product == pytest.approx(-1.7616, abs=1e-4)


def test_moving_x_w1_moves_the_markers(solved):
    widget = SiluGateExplorer(solved.SwiGLU)
    widget.z.value = -1.3  # near SiLU's minimum, -0.278
    x, y = widget.silu_marker.get_data()
    assert list(x) == [-1.3] and y[0] == pytest.approx(-0.2785, abs=1e-3)
    assert list(widget.guide.get_xdata()) == [-1.3, -1.3]
    assert "SiLU(-1.30)" in widget.readout.value


def test_gate_explorer_draws_the_learners_own_activation(solved):
    class ReluSwiGLU(solved.SwiGLU):  # a learner who used ReLU
        def forward(self, x):
            return self.w2(F.relu(self.w1(x)) * self.w3(x))

    widget = SiluGateExplorer(ReluSwiGLU)
    assert torch.allclose(curve(widget.silu_line), F.relu(widget.grid), atol=1e-6)
    assert widget.product == pytest.approx(1.0)


def test_gate_explorer_waits_for_swiglu_then_recovers(solved):
    widget = SiluGateExplorer(Unimplemented)
    assert "Implement `Unimplemented.__init__`" in widget.problem
    assert "has-problem" in widget._dom_classes
    assert all(not axes.get_visible() for axes in widget.figure.axes)
    widget.SwiGLU = solved.SwiGLU
    widget.z.value = 1.0  # any control change runs the class again
    assert widget.problem == "" and "has-problem" not in widget._dom_classes
    assert widget.product == pytest.approx(0.5 * 0.7311, abs=1e-4)


def test_gate_explorer_names_the_contract_when_the_layers_are_named_otherwise():
    class Renamed(nn.Module):
        def __init__(self, d_model, d_hidden):
            super().__init__()
            self.gate = nn.Linear(d_model, d_hidden, bias=False)
            self.up = nn.Linear(d_model, d_hidden, bias=False)
            self.down = nn.Linear(d_hidden, d_model, bias=False)

    widget = SiluGateExplorer(Renamed)
    assert "w1.weight, w3.weight, w2.weight" in widget.problem


# ---------------------------------------------------------------- the residual stream explorer


def test_pre_norm_stream_grows_and_keeps_its_input_post_norm_does_not(solved):
    widget = ResidualStreamExplorer(solved.TransformerBlock)
    assert widget.problem == "" and widget.layers.value == 12
    (pre_rms, pre_cos), (post_rms, post_cos) = (widget.trajectories(1.0)[s] for s in ("pre-norm", "post-norm"))
    assert len(pre_rms) == 25 and pre_rms[0] == pytest.approx(post_rms[0])
    assert pre_rms[24] > 3.5 and all(b > a for a, b in zip(pre_rms[:6], pre_rms[1:7]))
    assert all(abs(r - 1.0) < 1e-3 for r in post_rms[1:])  # RMSNorm's weight is 1: pinned at 1
    assert pre_cos[12] > 0.2 and abs(post_cos[12]) < 0.1
    assert "after 12 layers" in widget.stats.value


def test_legends_carry_each_curves_number_at_its_marker(solved):
    """The numbers the notebook's text leaves out are in the legends: the RMS and the cosine at the chosen
    depth, and the gradient's size at the input, for the slider's settings."""
    widget = ResidualStreamExplorer(solved.TransformerBlock)
    widget.layers.value, widget.gain.value = 24, 0.25
    found, gradients = widget.trajectories(0.25), widget.gradients(0.25, 24)
    legend = {(axes, style): text.get_text() for (axes, style), text in widget.legend_texts.items()}
    for style in ("pre-norm", "post-norm"):
        rms, cos = found[style]
        assert legend[widget.size_axes, style] == f"━ {style}: RMS {rms[24]:.2f}"
        assert legend[widget.input_axes, style] == f"━ {style}: cos {cos[24]:.2f}"
    for style in ("pre-norm", "post-norm", "no residual"):
        assert legend[widget.gradient_axes, style] == f"━ {style}: {_times(gradients[style][0])} at the input"
    assert legend[widget.gradient_axes, "no residual"] != legend[widget.gradient_axes, "pre-norm"]
    widget.layers.value = 12  # the legend follows the slider
    assert widget.legend_texts[widget.size_axes, "pre-norm"].get_text() == (
        f"━ pre-norm: RMS {widget.trajectories(0.25)['pre-norm'][0][12]:.2f}"
    )


def test_layers_slider_sets_how_far_the_curves_go(solved):
    widget = ResidualStreamExplorer(solved.TransformerBlock)
    size_axes = widget.size_axes
    widget.layers.value = 5
    steps, values = widget.lines[size_axes, "pre-norm"].get_data()
    assert list(steps) == [0, 1, 2, 3, 4, 5]
    x, y = widget.markers[size_axes, "pre-norm"].get_data()
    assert list(x) == [5] and y[0] == pytest.approx(widget.trajectories(1.0)["pre-norm"][0][5])
    assert "after 5 layers" in widget.stats.value


def test_a_larger_sub_layer_grows_the_pre_norm_stream_faster(solved):
    widget = ResidualStreamExplorer(solved.TransformerBlock)
    before = widget.trajectories(1.0)["pre-norm"][0][12]
    widget.gain.value = 2.0
    after = widget.trajectories(2.0)["pre-norm"][0][12]
    assert after > 1.5 * before
    assert "sub-layer × 2.00" in widget.stats.value
    widget.gain.value = 1.0  # back: the cached curves, the same numbers
    assert widget.trajectories(1.0)["pre-norm"][0][12] == before


def test_stream_explorer_runs_the_learners_own_block(solved):
    post_norm_block = next(m for m in BLOCK_MISTAKES if m.id == "block-post-norm").mutant(solved)
    widget = ResidualStreamExplorer(post_norm_block)
    pre_rms = widget.trajectories(1.0)["pre-norm"][0]
    assert all(abs(r - 1.0) < 1e-3 for r in pre_rms[1:])  # "pre-norm" here is the learner's post-norm


def test_stream_explorer_waits_for_the_block_then_recovers(solved):
    widget = ResidualStreamExplorer(Unimplemented)
    assert "Implement `Unimplemented.__init__`" in widget.problem
    widget.TransformerBlock = solved.TransformerBlock
    widget.layers.value = 3
    assert widget.problem == ""
    assert "after 3 layers" in widget.stats.value


def test_stream_explorer_names_a_forward_that_raises(solved):
    class Broken(solved.TransformerBlock):
        def forward(self, x, positions=None):
            raise RuntimeError("shapes do not line up")

    widget = ResidualStreamExplorer(Broken)
    assert "`TransformerBlock.forward` raised RuntimeError: shapes do not line up" in widget.problem


def test_widgets_build_nothing_while_nbgrader_grades(only_notes, solved):
    SiluGateExplorer(solved.SwiGLU)
    ResidualStreamExplorer(solved.TransformerBlock)
    assert len(only_notes()) == 2


# ---------------------------------------------------------------- the residual stream explorer: gradients


def test_gradient_arrives_whole_at_the_top_and_the_residual_keeps_it_in_scale(solved):
    widget = ResidualStreamExplorer(solved.TransformerBlock)
    gradients = widget.gradients(1.0, 24)
    assert set(gradients) == {"pre-norm", "post-norm", "no residual"}
    for sizes in gradients.values():
        assert len(sizes) == 25 and sizes[24] == pytest.approx(1.0)  # the loss reads the top: the probe itself
    # with the identity route of x + f(x), 24 layers change the gradient by a modest factor;
    # without it, the product of 24 derivatives is off by orders of magnitude
    assert 1.0 < gradients["pre-norm"][0] < 30 and 1.0 < gradients["post-norm"][0] < 30
    assert gradients["no residual"][0] > 20 * max(gradients["pre-norm"][0], gradients["post-norm"][0])


def test_smaller_sub_layers_bring_the_residual_gradient_towards_the_identity(solved):
    widget = ResidualStreamExplorer(solved.TransformerBlock)
    widget.layers.value = 24
    widget.gain.value = 0.25  # d(x + f(x))/dx = I + f'(x), with f' small
    gradients = widget.gradients(0.25, 24)
    assert gradients["pre-norm"][0] < 3 and gradients["post-norm"][0] < 3
    assert gradients["no residual"][0] > 100  # no identity to fall back on
    assert "<b>no residual</b>" in widget.gradient_stats.value


def test_gradient_panel_follows_the_layers_slider(solved):
    widget = ResidualStreamExplorer(solved.TransformerBlock)
    line = widget.lines[widget.gradient_axes, "pre-norm"]
    assert list(line.get_xdata()) == list(range(13))
    first = widget.gradient_stats.value
    widget.layers.value = 5
    steps, sizes = line.get_data()
    assert list(steps) == [0, 1, 2, 3, 4, 5]
    assert list(sizes) == pytest.approx(widget.gradients(1.0, 5)["pre-norm"])
    assert list(widget.loss_line.get_xdata()) == [5, 5]
    assert widget.gradient_stats.value != first
    low, high = widget.gradient_axes.get_ylim()
    assert low <= min(min(s) for s in widget.gradients(1.0, 5).values()) and high >= 1.0


def test_gradient_panel_runs_the_learners_own_block(solved):
    post_norm_block = next(m for m in BLOCK_MISTAKES if m.id == "block-post-norm").mutant(solved)
    widget = ResidualStreamExplorer(post_norm_block)
    gradients = widget.gradients(1.0, 12)
    # "pre-norm" is the learner's forward, which here is post-norm
    assert gradients["pre-norm"] == pytest.approx(gradients["post-norm"], rel=1e-5)
    solved_pre_norm = ResidualStreamExplorer(solved.TransformerBlock).gradients(1.0, 12)["pre-norm"]
    assert gradients["pre-norm"] != pytest.approx(solved_pre_norm, rel=1e-2)


def test_gradient_panel_names_a_forward_that_cuts_the_gradient(solved):
    class Detached(solved.TransformerBlock):
        def forward(self, x, positions=None):
            return super().forward(x, positions).detach()

    widget = ResidualStreamExplorer(Detached)
    assert "No gradient flows through TransformerBlock.forward" in widget.problem


def test_gradient_panel_explains_a_forward_that_writes_into_x(solved):
    class InPlace(solved.TransformerBlock):
        def forward(self, x, positions=None):
            x += self.attn(self.attn_norm(x), positions)
            return x + self.mlp(self.mlp_norm(x))

    widget = ResidualStreamExplorer(InPlace)
    assert "Write x = x + ... instead" in widget.problem
