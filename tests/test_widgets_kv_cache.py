"""Notebook 08's widgets, without a browser: set a control, check the data shown.

The widgets get the reference solution's functions (what a learner who solved
the exercises passes in), mistaken ones (built from the catalogue's mutants),
or deliberately unfinished ones.
"""

import pytest
import torch

from autograder import reference
from autograder.exercises.kv_cache import ATTEND_MISTAKES, KV_CACHE_MISTAKES
from course_widgets.kv_cache import NEW, READ, CacheFilling, CacheMemory, cache_tensor_bytes


@pytest.fixture(scope="module")
def solved():
    return reference.load("08_kv_cache")


def mutant(catalogue, mistake_id, ref):
    return next(m for m in catalogue if m.id == mistake_id).mutant(ref)


def unimplemented(*args, **kwargs):
    raise NotImplementedError()


def filling(ref, **kwargs):
    return CacheFilling(ref.KVCache, ref.attend_with_cache, ref.GroupedQueryAttention, **kwargs)


def memory(ref, **kwargs):
    return CacheMemory(ref.KVCache, ref.attend_with_cache, ref.GroupedQueryAttention, ref.kv_cache_bytes, **kwargs)


# ---------------------------------------------------------------- CacheFilling


def test_filling_shows_read_and_new_positions_of_the_chosen_step(solved):
    widget = filling(solved, prompt=4, step=3)
    assert widget.problem == ""
    grid = widget.image.get_array()
    # step 3 after a prompt of 4: positions 0..5 read from the cache, position 6 computed now;
    # 2 kv heads -> 4 rows (2 key heads, 2 value heads), the rest empty
    assert (grid[:4, :6] == READ).all() and (grid[:4, 6] == NEW).all()
    assert (grid[4:] == 0).all() and (grid[:, 7:] == 0).all()
    text = widget.summary.value
    assert "the new token at position 6" in text and "6 read from the cache (S = 7)" in text
    assert "matches one full forward pass" in text
    # key/value vectors computed: 4 + 1 + 1 + 1 = 7 with the cache, 4 + 5 + 6 + 7 = 22 without
    assert "7 with the cache, 22 without" in text
    assert list(widget.cached_line.get_ydata()) == [4, 5, 6, 7]
    assert list(widget.uncached_line.get_ydata()) == [4, 9, 15, 22]


def test_filling_step_zero_is_the_prompt_computed_at_once(solved):
    widget = filling(solved, prompt=4, step=3)
    widget.step.value = 0
    grid = widget.image.get_array()
    assert (grid[:4, :4] == NEW).all() and (grid[:, 4:] == 0).all()
    assert "all of its positions computed at once" in widget.summary.value
    widget.prompt.value = 6
    assert (widget.image.get_array()[:4, :6] == NEW).all()
    assert "0 read from the cache (S = 6)" in widget.summary.value


def test_filling_shows_a_cache_of_repeated_heads_and_a_wrong_output(solved):
    repeated = mutant(ATTEND_MISTAKES, "cache-holds-repeated-heads", solved)
    widget = CacheFilling(solved.KVCache, repeated, solved.GroupedQueryAttention, prompt=4, step=2)
    assert (widget.image.get_array()[:8, :6] != 0).all()  # 4 heads of keys and 4 of values
    assert "The cache holds 4 heads, not the 2 kv heads" in widget.summary.value
    top_left = mutant(ATTEND_MISTAKES, "mask-top-left", solved)
    widget = CacheFilling(solved.KVCache, top_left, solved.GroupedQueryAttention, prompt=4, step=2)
    assert "differs from one full forward pass" in widget.summary.value


def test_filling_shows_a_cache_that_forgets(solved):
    replaces = mutant(KV_CACHE_MISTAKES, "cache-replaces", solved)
    widget = CacheFilling(replaces, solved.attend_with_cache, solved.GroupedQueryAttention, prompt=4, step=2)
    grid = widget.image.get_array()
    assert (grid[:4, 0] == NEW).all() and (grid[:, 1:] == 0).all()  # only the new position, nothing read
    assert "0 read from the cache (S = 1)" in widget.summary.value
    assert "differs from one full forward pass" in widget.summary.value


@pytest.mark.parametrize("missing", ["KVCache", "attend_with_cache"])
def test_filling_waits_for_unimplemented_functions_and_recovers(solved, missing):
    functions = {"KVCache": solved.KVCache, "attend_with_cache": solved.attend_with_cache, missing: unimplemented}
    widget = CacheFilling(functions["KVCache"], functions["attend_with_cache"], solved.GroupedQueryAttention)
    assert "Implement `unimplemented`" in widget.problem
    assert "has-problem" in widget._dom_classes
    assert not widget.grid_axes.get_visible()
    if missing == "KVCache":
        widget.KVCache = solved.KVCache
    else:
        widget.attend_with_cache = solved.attend_with_cache
    widget.step.value = 4
    assert widget.problem == "" and widget.grid_axes.get_visible()


# ---------------------------------------------------------------- CacheMemory


def test_memory_measures_the_learners_cache_against_kv_cache_bytes(solved):
    widget = memory(solved, tokens=128)
    assert widget.problem == ""
    # 4 layers x 2 (k and v) x G heads x 16 numbers x 128 tokens x 4 bytes
    assert widget.measured == {
        "MHA": 2 * 4 * 8 * 16 * 128 * 4,
        "GQA": 2 * 4 * 2 * 16 * 128 * 4,
        "MQA": 2 * 4 * 1 * 16 * 128 * 4,
    }
    assert widget.measured == {k: int(v) for k, v in widget.predicted.items()}
    x, y = widget.dots["GQA"].get_data()
    assert list(x) == [128] and y[0] == pytest.approx(widget.measured["GQA"] / 2**20)
    assert "GQA (G = 2): your cache holds <b>131,072</b> bytes = kv_cache_bytes 131,072" in widget.summary.value


def test_memory_halves_in_bfloat16_and_grows_with_tokens(solved):
    widget = memory(solved, tokens=128)
    float32 = dict(widget.measured)
    widget.dtype.value = "bfloat16"
    assert widget.measured == {k: v // 2 for k, v in float32.items()}
    assert "2 bytes a value" in widget.summary.value
    widget.tokens.value = 512
    assert widget.measured["MQA"] == 2 * 4 * 1 * 16 * 512 * 2
    _, line = widget.lines["MHA"].get_data()
    assert line[-1] == pytest.approx(2 * 4 * 8 * 16 * 512 * 2 / 2**20)


def test_memory_shows_a_cache_of_repeated_heads_as_too_large(solved):
    repeated = mutant(ATTEND_MISTAKES, "cache-holds-repeated-heads", solved)
    widget = CacheMemory(solved.KVCache, repeated, solved.GroupedQueryAttention, solved.kv_cache_bytes, tokens=64)
    assert widget.measured["GQA"] == 4 * int(widget.predicted["GQA"])  # H = 8 heads kept instead of G = 2
    assert widget.measured["MHA"] == int(widget.predicted["MHA"])
    assert "<b>≠</b>" in widget.summary.value


def test_memory_waits_for_an_unimplemented_cache(solved):
    widget = CacheMemory(unimplemented, solved.attend_with_cache, solved.GroupedQueryAttention, solved.kv_cache_bytes)
    assert "Implement `unimplemented`" in widget.problem
    widget.KVCache = solved.KVCache
    widget.tokens.value = 32
    assert widget.problem == ""


def test_cache_tensor_bytes_counts_every_storage_once():
    shared = torch.zeros(10, 4)  # 160 bytes

    class Holder:
        def __init__(self):
            self.keys = {0: shared, 1: torch.zeros(3, dtype=torch.float64)}
            self.values = [shared[:5], (torch.zeros(2, dtype=torch.bfloat16),)]
            self.length = 7

    assert cache_tensor_bytes(Holder()) == 160 + 24 + 4
    assert cache_tensor_bytes(object()) == 0


def test_widgets_build_nothing_while_nbgrader_grades(only_notes, solved):
    filling(solved)
    memory(solved)
    assert len(only_notes()) == 2
