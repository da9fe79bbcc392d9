"""Notebook 08's demo cells, each run alone with the reference answers or with a learner's.

* The context-limit cell says plainly what a ``generate_cached`` did past the
  limit: the ValueError, another error, or no error at all.
* The sliding-cache cell measures what the notebook explains: a cache that drops
  its oldest positions (the learner's ``RollingKVCache``) gives the recomputed
  window's logits with one layer (float rounding), not with two or three.
* The timing cell, with ``generate_cached`` unfinished, names it before it times
  anything (07's slow uncached ``generate`` never runs).
* The cell that fetches 07's trained model finds the file 07 saves, and without
  it says that an untrained model of the same size stands in.

The whole notebook, solution and student version, runs in test_notebooks.py.
"""

import math
import re

import pytest
import torch
from notebook_runner import solution_cell

from autograder import reference
from course_widgets import explain_unfinished
from course_widgets.model import load_corpus, load_trained_model, save_trained_model

NOTEBOOK = "08_kv_cache"
pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def ref():
    return reference.load(NOTEBOOK)


def run_cell(marker: str, namespace: dict) -> dict:
    """Run the notebook's code cell that contains ``marker`` in ``namespace`` (changed in place)."""
    exec(compile(solution_cell(NOTEBOOK, marker), f"<{NOTEBOOK} cell>", "exec"), namespace)
    return namespace


def answers(ref, **learners) -> dict:
    """What the notebook's cells find defined: the reference answers, with the learner's in their place."""
    namespace = {name: getattr(ref, name) for name in dir(ref) if not name.startswith("_")}
    namespace.update(torch=torch, math=math, explain_unfinished=explain_unfinished, grading_now=lambda: False)
    namespace.update(learners)
    return namespace


def unfinished(*args, **kwargs):
    raise NotImplementedError()


# ---------------------------------------------------------------- the context limit

LIMIT_CELL = "def outcome(max_new_tokens)"


@pytest.fixture
def limit_namespace(ref):
    """The names the limit cell reads from the cells before it: the demo model and its prompt."""

    def with_demo(**learners):
        namespace = answers(ref, **learners)
        torch.manual_seed(0)
        namespace["demo"] = ref.Llama(ref.ModelConfig(64, 64, 3, 8, 2, 172)).eval()
        namespace["prompt"] = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(1))
        return namespace

    return with_demo


def test_limit_cell_shows_the_valueerror_of_a_correct_generate_cached(ref, limit_namespace, capsys):
    run_cell(LIMIT_CELL, limit_namespace())
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        "8 + 8 = 16 tokens: (1, 16)",
        "8 + 9 = 17 tokens: ValueError: a prompt of 8 tokens plus max_new_tokens=9 is longer than the model's "
        "max_seq_len=16",
    ]


def test_limit_cell_says_plainly_when_no_valueerror_comes(ref, limit_namespace, capsys):
    def no_limit(model, tokens, max_new_tokens, temperature=1.0, top_k=None):  # the limit check forgotten
        return ref.generate(model, tokens, max_new_tokens, temperature, top_k)

    run_cell(LIMIT_CELL, limit_namespace(generate_cached=no_limit))
    out = capsys.readouterr().out
    assert "8 + 8 = 16 tokens: (1, 16)" in out
    assert "8 + 9 = 17 tokens: no ValueError. Your generate_cached returned (1, 17) for a model built for 16" in out


def test_limit_cell_names_a_limit_off_by_one_and_a_wrong_error(ref, limit_namespace, capsys):
    def off_by_one(model, tokens, max_new_tokens, temperature=1.0, top_k=None):
        if tokens.shape[1] + max_new_tokens >= model.config.max_seq_len:
            raise ValueError(f"longer than max_seq_len={model.config.max_seq_len}")
        return ref.generate_cached(model, tokens, max_new_tokens, temperature, top_k)

    def wrong_error(model, tokens, max_new_tokens, temperature=1.0, top_k=None):
        if tokens.shape[1] + max_new_tokens > model.config.max_seq_len:
            raise IndexError("too long")
        return ref.generate_cached(model, tokens, max_new_tokens, temperature, top_k)

    run_cell(LIMIT_CELL, limit_namespace(generate_cached=off_by_one))
    assert "Exactly max_seq_len tokens in all should be allowed" in capsys.readouterr().out
    run_cell(LIMIT_CELL, limit_namespace(generate_cached=wrong_error))
    assert "8 + 9 = 17 tokens: IndexError: too long. It should be a ValueError" in capsys.readouterr().out


def test_limit_cell_names_an_unfinished_generate_cached(limit_namespace, capsys):
    run_cell(LIMIT_CELL, limit_namespace(generate_cached=unfinished))
    assert capsys.readouterr().out.startswith("This cell needs your `unfinished`")


# ---------------------------------------------------------------- why the cache does not slide


def test_sliding_cache_matches_the_recomputed_window_with_one_layer_only(ref, capsys):
    run_cell("def sliding_vs_recomputed", answers(ref))
    found = dict(re.findall(r"^(\d) layers?\s*: largest logit difference (\S+)", capsys.readouterr().out, re.M))
    difference = {int(layers): float(value) for layers, value in found.items()}
    assert sorted(difference) == [1, 2, 3]
    assert difference[1] < 1e-5  # float32 rounding: the same numbers
    # a different function: about 0.07 and 0.14 on logits that spread about 0.6
    assert difference[2] > 1e-2 and difference[3] > 1e-2


def test_sliding_cache_cell_explains_code_that_assumes_a_cache_of_every_position(ref, capsys):
    def attend_reading_s_from_positions(attn, x, positions, cache, layer):  # right with a cache that keeps all
        B, T, _ = x.shape
        H, G, Dh = attn.n_heads, attn.n_kv_heads, attn.head_dim
        q = ref.apply_rope(attn.q_proj(x).view(B, T, H, Dh).transpose(1, 2), positions, attn.rope_base)
        k = ref.apply_rope(attn.k_proj(x).view(B, T, G, Dh).transpose(1, 2), positions, attn.rope_base)
        k, v = cache.update(layer, k, attn.v_proj(x).view(B, T, G, Dh).transpose(1, 2))
        S = int(positions[-1]) + 1
        out = ref.attention(q, ref.repeat_kv(k, H // G), ref.repeat_kv(v, H // G), ref.causal_mask(T, S))
        return attn.o_proj(out.transpose(1, 2).reshape(B, T, H * Dh))

    @torch.no_grad()
    def forward_cached(model, tokens, cache):
        positions = torch.arange(cache.length, cache.length + tokens.shape[1])
        x = model.embed(tokens)
        for i, block in enumerate(model.layers):
            x = x + attend_reading_s_from_positions(block.attn, block.attn_norm(x), positions, cache, i)
            x = x + block.mlp(block.mlp_norm(x))
        return model.lm_head(model.norm(x))

    run_cell("def sliding_vs_recomputed", answers(ref, forward_cached=forward_cached))
    out = capsys.readouterr().out
    assert out.startswith("With a cache that keeps only the last 16 positions your forward_cached or attend_with_cache")
    assert "read S from the keys cache.update returns" in out and "largest logit difference" not in out


# ---------------------------------------------------------------- attention sinks


def test_sink_cache_gives_one_layer_the_sinks_and_the_recent_window_at_places_inside_it(ref, capsys):
    """StreamingLLM's cache, as the notebook builds it: with one layer, the logits through it are those of the
    model run on the first 3 tokens followed by the last 5 (positions 0 to 7 of a window of 8): the sinks sit
    right before the recent window, whatever the true positions."""
    namespace = run_cell("class SinkCache", answers(ref, story_model=None))
    assert capsys.readouterr().out == "No model to measure: see the cell above.\n"
    torch.manual_seed(0)
    model = ref.Llama(ref.ModelConfig(40, 32, 1, 4, 2, 64, max_seq_len=8)).eval()
    tokens = torch.randint(0, 40, (2, 30), generator=torch.Generator().manual_seed(4))
    cache = namespace["SinkCache"](8, 3, model.config.rope_base)
    ref.forward_cached(model, tokens[:, :8], cache)
    largest = 0.0
    for t in range(8, 30):
        through_cache = ref.forward_cached(model, tokens[:, t : t + 1], cache)[:, -1]
        with torch.no_grad():
            sinks_then_recent = model(torch.cat([tokens[:, :3], tokens[:, t - 4 : t + 1]], dim=1))[:, -1]
        largest = max(largest, float((through_cache - sinks_then_recent).abs().max()))
    assert largest < 1e-5
    assert cache.length == 30 and [k.shape[2] for k, _ in cache.held.values()] == [8]


def test_sinks_cell_measures_three_ways_past_the_window(ref, monkeypatch, capsys):
    """On a small model of 07's shape, the cell prints the loss at position 63 and over 64-127 and 128-191 for the
    plain window, the sinks and the cropped context, and says that an untrained model's numbers mean nothing."""
    chars = sorted(set(load_corpus()))
    torch.manual_seed(0)
    model = ref.Llama(ref.ModelConfig(len(chars), 32, 2, 4, 2, 64, max_seq_len=64)).eval()
    namespace = answers(ref, story_model=model, chars=chars, steps_trained=0, load_corpus=load_corpus)
    namespace.update(F=torch.nn.functional, plt=__import__("matplotlib.pyplot").pyplot)
    monkeypatch.setattr(namespace["plt"], "show", lambda: None)
    run_cell("class SinkCache", namespace)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("(07's trained model is missing")
    assert lines[1].split("|")[1:] == ["      63 ", "  64-127 ", " 128-191"]
    rows = {line.split("|")[0].strip(): [float(x) for x in line.split("|")[1:]] for line in lines[2:5]}
    assert lines[5].startswith("(each the mean over the positions 63, 71, 79, ..., 191: every 8th")
    assert list(rows) == [
        "plain window (RollingKVCache)",
        "4 sinks + last 60 (SinkCache)",
        "full context cropped (07's way)",
    ]
    # at position 63 nothing has left the window yet: the three read the same 64 characters
    assert rows["plain window (RollingKVCache)"][0] == pytest.approx(
        rows["full context cropped (07's way)"][0], abs=1e-4
    )
    assert rows["4 sinks + last 60 (SinkCache)"][0] == pytest.approx(
        rows["full context cropped (07's way)"][0], abs=1e-4
    )


# ---------------------------------------------------------------- the timing cell


def test_timing_cell_names_an_unfinished_generate_cached_before_timing_anything(ref, capsys):
    uncached_calls = []

    def spied_generate(*args, **kwargs):
        uncached_calls.append(args[2])
        return ref.generate(*args, **kwargs)

    namespace = run_cell(
        "def seconds(generator, length)", answers(ref, generate_cached=unfinished, generate=spied_generate)
    )
    assert capsys.readouterr().out.splitlines() == [
        "This cell needs your `unfinished`, which still raises NotImplementedError. Write it in its exercise "
        "cell, run that cell, then run this one again."
    ]
    assert uncached_calls == [] and namespace["timings"] == []


@pytest.mark.parametrize("graded, calls", [(False, 46), (True, 5)])
def test_timing_cell_times_each_generation_briefly_while_graded(ref, graded, calls, capsys):
    """Each generator is timed until 50 ms of processor time have passed, 5 ms while graded (a table
    nobody reads then, in every graded 08): on a clock that moves 1.1 ms a generation, 46 calls and 5."""
    clock = [0.0]
    made: dict = {}

    def generator(name):
        def generate(model, prompt, new_tokens, **kwargs):
            clock[0] += 0.0011
            made[name, new_tokens] = made.get((name, new_tokens), 0) + 1
            return torch.zeros(prompt.shape[0], prompt.shape[1] + new_tokens, dtype=torch.long)

        return generate

    fake_time = type("time", (), {"process_time": lambda: clock[0], "perf_counter": lambda: clock[0]})
    namespace = answers(ref, generate=generator("generate"), generate_cached=generator("cached"), time=fake_time)
    namespace["grading_now"] = lambda: graded
    run_cell("def seconds(generator, length)", namespace)
    lengths = (16, 24) if graded else (32, 64, 128, 256, 512)
    assert [row[0] for row in namespace["timings"]] == list(lengths)
    timed_calls = {key: count for key, count in made.items() if key != ("cached", 1)}  # the cell's first try
    assert timed_calls == {(name, n - 8): calls for name in ("generate", "cached") for n in lengths}
    assert "speed-up" in capsys.readouterr().out


@pytest.mark.parametrize("graded", [False, True])
def test_chart_cell_draws_nothing_while_graded(ref, graded, capsys):
    """While graded (a chart nobody reads then, half a second of each graded 08), the cell says it
    skipped and makes no figure; otherwise it draws the measured times and the FLOP counts."""
    import matplotlib

    matplotlib.use("agg")
    import matplotlib.pyplot as plt
    import numpy as np

    torch.manual_seed(0)
    bench = ref.Llama(ref.ModelConfig(256, 128, 2, 8, 2, 344, max_seq_len=1024)).eval()
    namespace = answers(ref, np=np, plt=plt, bench=bench, bench_prompt=torch.zeros(1, 8, dtype=torch.long))
    namespace["grading_now"] = lambda: graded
    namespace["timings"] = [(16, 0.004, 0.002), (24, 0.007, 0.003)]
    before = plt.get_fignums()
    run_cell("axes.loglog(length_array", namespace)
    made = [n for n in plt.get_fignums() if n not in before]
    plt.close("all")
    printed = capsys.readouterr().out
    if graded:
        assert printed == "(skipped while the notebook is graded)\n" and made == []
    else:
        assert printed.startswith("fitted slopes of log time against log length, 16 to 24 tokens") and len(made) == 1


# ---------------------------------------------------------------- 07's trained model

LOAD_CELL = "story_model = None"


def test_load_cell_finds_the_model_notebook_07_saved(ref, tmp_path, monkeypatch, capsys):
    notebooks = tmp_path / "notebooks"
    (notebooks / "07_llama").mkdir(parents=True)
    (notebooks / NOTEBOOK).mkdir()
    chars = sorted(set(load_corpus()))
    torch.manual_seed(3)
    trained = ref.Llama(ref.ModelConfig(len(chars), 32, 2, 4, 2, 64, max_seq_len=64)).eval()
    monkeypatch.chdir(notebooks / "07_llama")  # 07 saves from its folder ...
    save_trained_model(trained, chars, steps=250)
    monkeypatch.chdir(notebooks / NOTEBOOK)  # ... and 08 finds it from its own
    namespace = run_cell(LOAD_CELL, answers(ref, load_trained_model=load_trained_model, load_corpus=load_corpus))
    assert capsys.readouterr().out == f"07's trained model (250 training steps), {len(chars)} characters\n"
    tokens = torch.randint(0, len(chars), (2, 10))
    with torch.no_grad():
        assert torch.equal(namespace["story_model"](tokens), trained(tokens))
    assert namespace["chars"] == chars


def test_load_cell_says_when_an_untrained_model_stands_in(ref, tmp_path, monkeypatch, capsys):
    (tmp_path / NOTEBOOK).mkdir()
    monkeypatch.chdir(tmp_path / NOTEBOOK)
    namespace = run_cell(LOAD_CELL, answers(ref, load_trained_model=load_trained_model, load_corpus=load_corpus))
    assert capsys.readouterr().out == (
        "no trained model from 07 (07 has not saved one): an untrained model of the same size stands in\n"
    )
    config = namespace["story_model"].config
    assert (config.d_model, config.n_layers, config.max_seq_len) == (96, 3, 64)  # 07's sizes
