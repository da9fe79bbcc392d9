"""Notebook 09's widget and measurements, without a browser: set a control, check the data shown; count
the memory of calls whose tensors are known.

The widget gets the reference solution's functions (what a learner who solved the exercises passes
in) or deliberately unfinished or mistaken ones.
"""

import math
import sys

import pytest
import torch

from autograder import reference
from autograder.exercises.efficient_attention import MERGE_MISTAKES
from course_widgets.blockwise import BlockStepper, peak_resident_mb, working_memory

X8 = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [1.0, -1.0], [-0.5, 1.0], [2.0, 0.5], [0.0, -1.0], [1.5, 1.5]])
V8 = torch.tensor([[1.0, 0.0], [0.0, 10.0], [5.0, 5.0], [2.0, -4.0], [-3.0, 3.0], [6.0, 1.0], [-2.0, -2.0], [4.0, 8.0]])


@pytest.fixture(scope="module")
def solved():
    return reference.load("09_efficient_attention")


def unimplemented(*args, **kwargs):
    raise NotImplementedError()


def stepper(solved, merge_partials=None, **kwargs):
    return BlockStepper(merge_partials or solved.merge_partials, solved.softmax, X8, V8, **kwargs)


def test_the_first_block_shows_its_own_max_sum_and_output(solved):
    widget = stepper(solved, query=5, block_size=3, step=1)
    assert widget.problem == ""
    scores = X8 @ X8[5] / math.sqrt(2)
    m, total, out = widget.trail[0]
    assert float(m) == pytest.approx(float(scores[:3].max()))  # key 2: 2.5 / √2 = 1.77
    assert float(total) == pytest.approx(float(torch.exp(scores[:3] - scores[:3].max()).sum()))
    assert "block 1 of 3 (keys 0–2): its own max 1.77" in widget.summary.value
    assert widget.max_line.get_visible() and widget.max_line.get_ydata()[0] == pytest.approx(1.768, abs=1e-3)
    heights = [bar.get_height() for bar in widget.weight_bars]
    assert heights[3:] == [0.0] * 5 and sum(heights[:3]) == pytest.approx(1.0)  # weights so far, over keys 0-2
    assert len(widget.path.get_xdata()) == 1


def test_a_block_that_raises_the_max_shrinks_the_earlier_sum(solved):
    widget = stepper(solved, query=5, block_size=3, step=1)
    widget.step.value = 2  # keys 3-5 hold key 5, whose score 4.25 / √2 = 3.01 is the largest
    assert "The max rose from 1.77 to 3.01" in widget.summary.value
    assert "multiplied by exp(1.77 − 3.01) = 0.290" in widget.summary.value
    assert float(widget.trail[1][0]) == pytest.approx(4.25 / math.sqrt(2))


def test_after_the_last_block_the_weights_are_the_softmaxs_and_the_path_ends_on_the_output(solved):
    widget = stepper(solved, query=5, block_size=3, step=1)
    widget.step.value = 3
    softmax = torch.softmax(X8 @ X8[5] / math.sqrt(2), dim=-1)
    heights = torch.tensor([bar.get_height() for bar in widget.weight_bars], dtype=torch.float64)
    assert torch.allclose(heights, softmax.double(), atol=1e-7)
    assert torch.allclose(torch.as_tensor(widget.softmax_marks.get_ydata()), softmax.double(), atol=1e-7)
    output = softmax @ V8
    assert widget.path.get_xdata()[-1] == pytest.approx(float(output[0]), abs=1e-6)
    assert widget.path.get_ydata()[-1] == pytest.approx(float(output[1]), abs=1e-6)
    assert widget.target.get_xdata()[0] == pytest.approx(float(output[0]), abs=1e-6)
    assert "the weights exp(s − m)/ℓ equal the softmax's" in widget.summary.value


def test_any_cut_and_any_query_end_on_the_same_output(solved):
    widget = stepper(solved, query=5, block_size=3, step=1)
    for query in (0, 2, 7):
        widget.query.value = query
        outputs = []
        for size in (1, 3, 5, 8):
            widget.block_size.value = size
            assert widget.step.max == math.ceil(8 / size)
            widget.step.value = widget.step.max
            outputs.append((widget.path.get_xdata()[-1], widget.path.get_ydata()[-1]))
        expected = torch.softmax(X8 @ X8[query] / math.sqrt(2), dim=-1) @ V8
        for x, y in outputs:
            assert (x, y) == pytest.approx((float(expected[0]), float(expected[1])), abs=1e-6)


def test_step_zero_is_the_empty_partial(solved):
    widget = stepper(solved, step=0)
    assert "nothing merged yet" in widget.summary.value
    assert not widget.max_line.get_visible()
    assert [bar.get_height() for bar in widget.weight_bars] == [0.0] * 8
    assert len(widget.path.get_xdata()) == 0


def test_a_smaller_block_size_keeps_the_step_a_larger_one_clamps_it(solved):
    widget = stepper(solved, block_size=2, step=3)
    widget.block_size.value = 4  # 2 blocks now: the step is clamped to 2
    assert widget.step.max == 2 and widget.step.value == 2
    assert "block 2 of 2" in widget.summary.value


def test_a_mistaken_merge_shows_weights_that_are_not_the_softmaxs(solved):
    [mistake] = [m for m in MERGE_MISTAKES if m.id == "sum-not-rescaled"][:1]
    widget = stepper(solved, merge_partials=mistake.mutant(solved), query=5, block_size=3, step=3)
    assert "differ from the softmax's" in widget.summary.value
    assert "check how your merge_partials rescales" in widget.summary.value


def test_the_widget_waits_for_merge_partials_then_recovers(solved):
    widget = stepper(solved, merge_partials=unimplemented)
    assert "Implement `unimplemented`" in widget.problem
    assert all(not axes.get_visible() for axes in widget.figure.axes)
    widget.merge_partials = solved.merge_partials
    widget.step.value = 2
    assert widget.problem == "" and widget.message.value == ""


def test_the_widget_explains_a_merge_that_returns_the_wrong_thing(solved):
    widget = stepper(solved, merge_partials=lambda *args: args[3])
    assert "`merge_partials` returned Tensor" in widget.problem and "(m, l, o)" in widget.problem
    widget.merge_partials = lambda m_a, l_a, o_a, m_b, l_b, o_b: (m_b, l_b, o_b[0])
    widget.step.value = 2
    assert "returned shape (2,)" in widget.problem


def test_the_widget_builds_nothing_while_nbgrader_grades(only_notes, solved):
    stepper(solved)
    assert len(only_notes()) == 1


# ---------------------------------------------------------------- the measurements


def test_working_memory_counts_attentions_four_tables_and_nothing_of_its_inputs_or_output(solved):
    for T in (64, 256):
        q, k, v = (torch.randn(1, 2, T, 64) for _ in range(3))
        out, used = working_memory(solved.attention, q, k, v)
        assert torch.equal(out, solved.attention(q, k, v))
        table = 2 * T * T * 4
        assert 4 * table <= used < 4 * table + 64 * 1024, (T, used / table)  # 4 tables, and row maxima and sums


def test_working_memory_of_blockwise_attention_stays_flat_in_t(solved):
    used = {}
    for T in (256, 512, 1024):
        q, k, v = (torch.randn(1, 2, T, 64) for _ in range(3))
        _, used[T] = working_memory(solved.blockwise_attention, q, k, v, 128)
    assert used[256] == used[512] == used[1024], used
    assert used[1024] < 2 * 128 * 128 * 4 * 8  # a few tiles of 2 heads, 128 x 128 float32


def test_working_memory_leaves_out_the_result_and_views_but_counts_temporaries():
    x = torch.randn(1000)
    assert working_memory(lambda: torch.ones(1000))[1] == 0  # the result itself
    assert working_memory(lambda t: t.view(10, 100)[2:5].T, x)[1] == 0  # views of the input
    assert working_memory(lambda t: (t * 2).sum(), x)[1] == 4000  # a temporary of 1000 float32


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the peak resident memory is read from /proc")
def test_peak_resident_memory_sees_a_large_temporary():
    assert peak_resident_mb(lambda: torch.ones(16 * 2**20).sum()) >= 60  # 64 MB made, touched and freed
