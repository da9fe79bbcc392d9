"""Notebook 07's widgets, without a browser: set a control, check the data shown.

The widgets get the reference solution's functions and a reference Llama
(untrained: what the widgets show is computed the same way for any weights),
or deliberately unfinished functions.
"""

import pytest
import torch

from autograder import reference
from course_widgets import explain_unfinished
from course_widgets.model import (
    CORPUS,
    NO_MODEL,
    AttentionMaps,
    GenerationExplorer,
    TrainingMonitor,
    attention_maps,
    load_corpus,
    loss_by_position,
    plot_loss_by_position,
)


@pytest.fixture(scope="module")
def solved():
    return reference.load("07_llama")


@pytest.fixture(scope="module")
def corpus():
    text = load_corpus()
    chars = sorted(set(text))
    index = {c: i for i, c in enumerate(chars)}
    return text, chars, (lambda s: [index[c] for c in s]), (lambda ids: "".join(chars[i] for i in ids))


@pytest.fixture(scope="module")
def model(solved, corpus):
    torch.manual_seed(0)
    config = solved.ModelConfig(vocab_size=len(corpus[1]), d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_hidden=64)
    return solved.Llama(config).eval()


def unimplemented(*args, **kwargs):
    raise NotImplementedError()


# ---------------------------------------------------------------- the corpus


def test_corpus_is_small_plain_text():
    text = load_corpus()
    assert CORPUS == "tiny_tales.txt" and 15_000 < len(text) < 50_000
    assert text.isascii() and len(set(text)) < 80


# ---------------------------------------------------------------- training monitor


def test_monitor_draws_each_step_its_average_and_validation():
    monitor = TrainingMonitor(unigram_entropy=2.98, total_steps=100, redraw_seconds=0)
    assert "Waiting" in monitor.stats.value
    losses = [4.0 - 0.02 * step for step in range(60)]
    for step, loss in enumerate(losses):
        monitor.record(step, loss, val_loss=loss + 0.1 if step % 50 == 0 else None)
    x, y = monitor.raw_line.get_data()
    assert list(x) == list(range(60)) and list(y) == pytest.approx(losses)
    assert list(monitor.val_line.get_data()[0]) == [0, 50]
    assert "step 59" in monitor.stats.value and "unigram entropy 2.980" in monitor.stats.value
    # the moving average over the last 10 steps of a straight line lags it by 4.5 steps
    assert monitor.smooth_line.get_data()[1][-1] == pytest.approx(losses[-1] + 0.02 * 4.5)


def test_monitor_smoothing_slider_changes_the_average():
    monitor = TrainingMonitor(unigram_entropy=3.0, total_steps=50, redraw_seconds=0)
    for step in range(40):
        monitor.record(step, 3.0 + (0.5 if step % 2 else -0.5))
    monitor.smooth.value = 1
    assert list(monitor.smooth_line.get_data()[1]) == pytest.approx(monitor.losses)
    monitor.smooth.value = 20
    assert monitor.smooth_line.get_data()[1][-1] == pytest.approx(3.0)


def test_monitor_shows_a_picture_until_the_browser_sets_the_figure_up(ipympl_canvas):
    """Under Run All the training runs before the browser's handshake with the
    figure: frames go to a PNG picture, which is hidden once the handshake is done;
    after it, frames are pushed to the canvas directly."""
    monitor = TrainingMonitor(unigram_entropy=3.0, total_steps=20, redraw_seconds=0)
    canvas = monitor.figure.canvas
    assert hasattr(canvas, "send_binary") and canvas.syncing_data_url
    monitor.record(0, 4.0, 4.1)
    first = bytes(monitor.picture.value)
    assert first.startswith(b"\x89PNG") and monitor.picture.layout.display is None
    monitor.record(1, 3.0)
    assert bytes(monitor.picture.value) != first
    canvas._size = (640, 256)  # displaying the figure sets a size too: not ready yet
    assert monitor.picture.layout.display is None
    canvas.syncing_data_url = False  # what ipympl does on the browser's "initialized"
    canvas._size = (800, 320)  # ...followed by its resize message
    assert monitor.picture.layout.display == "none"
    shown = bytes(monitor.picture.value)
    pushed = []
    canvas.draw = lambda: pushed.append(True)
    monitor.record(2, 2.5)
    assert pushed and bytes(monitor.picture.value) == shown


def test_monitor_records_but_draws_nothing_while_graded(only_notes):
    monitor = TrainingMonitor(unigram_entropy=3.0, total_steps=5)
    monitor.record(0, 4.0, 4.1)
    assert monitor.losses == [4.0] and monitor.val_losses == [4.1]
    assert only_notes() == [monitor]


# ---------------------------------------------------------------- attention maps


def test_attention_maps_are_causal_distributions(solved, model, corpus):
    encode = corpus[2]
    tokens = torch.tensor([encode("The fox counted the stars.")])
    maps = attention_maps(model, tokens, solved.apply_rope, solved.attention_weights, solved.causal_mask)
    T = tokens.shape[1]
    assert maps.shape == (2, 4, T, T)
    assert torch.allclose(maps.sum(dim=-1), torch.ones(2, 4, T, dtype=torch.float64), atol=1e-5)
    assert float(maps.triu(diagonal=1).abs().max()) == 0.0


def test_attention_maps_reproduce_what_each_layer_computes(solved, model, corpus):
    """weights @ values, merged and projected, is exactly the attention layer's output."""
    tokens = torch.tensor([corpus[2]("Once there was a keeper.")])
    seen = []
    hooks = [
        layer.attn.register_forward_hook(lambda module, args, out: seen.append((args[0], out)))
        for layer in model.layers
    ]
    with torch.no_grad():
        model(tokens)
    for hook in hooks:
        hook.remove()
    maps = attention_maps(model, tokens, solved.apply_rope, solved.attention_weights, solved.causal_mask)
    for layer, (x, out), weights in zip(model.layers, seen, maps):
        attn = layer.attn
        v = attn.v_proj(x).view(1, -1, attn.n_kv_heads, attn.head_dim).transpose(1, 2)
        v = v.repeat_interleave(attn.n_heads // attn.n_kv_heads, dim=1)
        mixed = (weights.float()[None] @ v).transpose(1, 2).reshape(1, tokens.shape[1], -1)
        assert torch.allclose(attn.o_proj(mixed), out, atol=1e-5)


def test_attention_widget_follows_layer_head_and_query(solved, model, corpus):
    _, _, encode, decode = corpus
    widget = AttentionMaps(
        model,
        "The cat slept on his knees.",
        encode,
        decode,
        solved.apply_rope,
        solved.attention_weights,
        solved.causal_mask,
    )
    assert widget.problem == ""
    T = len("The cat slept on his knees.")
    assert (widget.layer.max, widget.head.max, widget.query.max) == (1, 3, T - 1)
    widget.layer.value, widget.head.value, widget.query.value = 0, 2, 5
    shown = torch.as_tensor(widget.image.get_array())
    assert torch.allclose(shown, widget.maps[0, 2])
    assert [bar.get_height() for bar in widget.bars] == pytest.approx(widget.maps[0, 2, 5].tolist())
    assert widget.row_box.get_y() == pytest.approx(4.5)
    assert "head 2 (reads kv head 1)" in widget.heat_axes.get_title()
    assert "the model expects" in widget.shaded.value


def test_attention_widget_new_text_rebuilds(solved, model, corpus):
    _, _, encode, decode = corpus
    widget = AttentionMaps(
        model, "The fox.", encode, decode, solved.apply_rope, solved.attention_weights, solved.causal_mask
    )
    widget.text.value = "A longer piece of text."
    assert widget.maps.shape[-1] == len("A longer piece of text.")
    assert widget.query.max == len("A longer piece of text.") - 1
    assert len(widget.bars) == len("A longer piece of text.")
    widget.text.value = "Zebra ~"  # '~' is not in the corpus
    assert "does not know" in widget.problem


def test_attention_widget_waits_for_the_model_and_for_functions(solved, model, corpus):
    _, _, encode, decode = corpus
    widget = AttentionMaps(
        None, "The fox.", encode, decode, solved.apply_rope, solved.attention_weights, solved.causal_mask
    )
    assert widget.problem == NO_MODEL
    widget = AttentionMaps(
        model, "The fox.", encode, decode, unimplemented, solved.attention_weights, solved.causal_mask
    )
    assert "Implement" in widget.problem and "has-problem" in widget._dom_classes
    widget.apply_rope = solved.apply_rope
    widget.head.value = 1
    assert widget.problem == "" and widget.maps is not None


# ---------------------------------------------------------------- generation


def test_generation_bars_follow_the_exact_distribution(solved, model, corpus):
    _, _, encode, decode = corpus
    widget = GenerationExplorer(solved.generate, model, encode, decode, prompt="The fox ", samples=2000)
    assert widget.problem == ""
    assert float(widget.shares.sum()) == pytest.approx(1.0)
    # 2000 samples: a share's standard deviation is at most 0.011
    assert float((widget.shares - widget.exact_probs).abs().max()) < 0.06
    heights = [bar.get_height() for bar in widget.bars]
    assert heights == pytest.approx(widget.shares[widget.order].tolist())


def test_generation_temperature_zero_and_top_k(solved, model, corpus):
    _, _, encode, decode = corpus
    widget = GenerationExplorer(solved.generate, model, encode, decode, prompt="The fox ", samples=500)
    widget.temperature.value = 0.0
    assert int((widget.shares > 0).sum()) == 1 and float(widget.shares.max()) == 1.0
    assert int(widget.shares.argmax()) == int(widget.exact_probs.argmax())
    assert "greedy" in widget.axes.get_title()
    widget.temperature.value = 1.0
    widget.top_k.value = 3
    assert int((widget.shares > 0).sum()) <= 3 and int((widget.exact_probs > 0).sum()) == 3
    assert "top-k 3" in widget.axes.get_title()


def test_generate_button_writes_text_after_the_prompt(solved, model, corpus):
    _, _, encode, decode = corpus
    widget = GenerationExplorer(solved.generate, model, encode, decode, prompt="The keeper ", length=40)
    widget.button.click()
    assert len(widget.generated) == len("The keeper ") + 40 and widget.generated.startswith("The keeper ")
    assert "<b>The keeper </b>" in widget.output.value
    first = widget.generated
    widget.button.click()
    assert widget.generated == first  # the same seed writes the same text
    widget.seed.value = 1
    widget.button.click()
    assert widget.generated != first


def test_generation_waits_for_model_and_generate_and_names_wrong_shapes(solved, model, corpus):
    _, _, encode, decode = corpus
    widget = GenerationExplorer(solved.generate, None, encode, decode)
    assert widget.problem == NO_MODEL
    widget = GenerationExplorer(unimplemented, model, encode, decode)
    assert "Implement" in widget.problem
    widget.button.click()
    assert "Implement" in widget.problem
    widget.generate = solved.generate
    widget.temperature.value = 0.5
    assert widget.problem == ""

    def only_new_tokens(model, tokens, max_new_tokens, temperature=1.0, top_k=None):
        return solved.generate(model, tokens, max_new_tokens, temperature, top_k)[:, tokens.shape[1] :]

    widget = GenerationExplorer(only_new_tokens, model, encode, decode)
    assert "the prompt followed by the new token" in widget.problem


def test_generation_bars_follow_what_generate_feeds_past_max_seq_len(solved, corpus):
    """With a prompt longer than the model's context, the exact probabilities are those of
    the last max_seq_len characters (what generate reads), not of the whole prompt."""
    _, chars, encode, decode = corpus
    torch.manual_seed(2)
    short = solved.Llama(
        solved.ModelConfig(
            vocab_size=len(chars), d_model=32, n_layers=1, n_heads=4, n_kv_heads=2, d_hidden=64, max_seq_len=4
        )
    ).eval()
    with torch.no_grad():
        for p in short.parameters():  # large weights: sharp distributions that depend on the whole context
            p.copy_(torch.randn_like(p))
    prompt = "The keeper and the fox "
    widget = GenerationExplorer(solved.generate, short, encode, decode, prompt=prompt, samples=2000)
    with torch.no_grad():
        cropped = torch.softmax(short(torch.tensor([encode(prompt[-4:])]))[0, -1].double() / 0.8, dim=-1)
        whole = torch.softmax(short(torch.tensor([encode(prompt)]))[0, -1].double() / 0.8, dim=-1)
    assert float((cropped - whole).abs().max()) > 0.1  # the two differ: the test means something
    assert torch.allclose(widget.exact_probs, cropped, atol=1e-6)
    assert float((widget.shares - widget.exact_probs).abs().max()) < 0.06


# ---------------------------------------------------------------- loss by position


def test_loss_by_position_reads_the_whole_window_or_its_last_max_seq_len(solved, corpus):
    _, chars, encode, _ = corpus
    torch.manual_seed(3)
    model = solved.Llama(
        solved.ModelConfig(
            vocab_size=len(chars), d_model=32, n_layers=1, n_heads=4, n_kv_heads=2, d_hidden=64, max_seq_len=8
        )
    ).eval()
    windows = torch.tensor([encode("Once upon a time there was a fox who lived by the sea.")[:30]] * 3)
    windows[1] = windows[1].roll(5)
    windows[2] = windows[2].roll(11)
    losses = loss_by_position(model, windows, every=4, chunk_size=2)  # chunks of 2 and 1 windows
    assert losses["max_seq_len"] == 8 and losses["whole"].shape == (29,)
    assert losses["cropped_at"] == [7, 11, 15, 19, 23, 27]
    with torch.no_grad():
        logits = model(windows[:, :-1])
    for t in (0, 7, 20):
        expected = torch.nn.functional.cross_entropy(logits[:, t], windows[:, t + 1])
        assert float(losses["whole"][t]) == pytest.approx(float(expected), abs=1e-5)
    with torch.no_grad():
        last = model(windows[:, 12:20])[:, -1]  # position 19 reading positions 12 .. 19
    assert losses["cropped"][3] == pytest.approx(
        float(torch.nn.functional.cross_entropy(last, windows[:, 20])), abs=1e-5
    )
    # at position max_seq_len - 1 both ways read the same characters
    assert losses["cropped"][0] == pytest.approx(float(losses["whole"][7]), abs=1e-5)
    figure = plot_loss_by_position(losses, unigram_entropy=3.0)
    lines = figure.axes[0].get_lines()
    assert list(lines[0].get_ydata()) == pytest.approx(losses["whole"].tolist())
    assert list(lines[1].get_xdata()) == losses["cropped_at"]


# ---------------------------------------------------------------- demos that wait for an exercise


def test_a_demo_names_the_exercise_that_is_not_written_yet(capsys):
    class ModelConfig:
        def __post_init__(self):
            raise NotImplementedError()

    def generate(model):
        raise NotImplementedError()

    with explain_unfinished():
        ModelConfig().__post_init__()
    assert "needs your `ModelConfig`" in capsys.readouterr().out
    with explain_unfinished():
        generate(None)
    assert "needs your `generate`" in capsys.readouterr().out
    with pytest.raises(ValueError):  # a real error is not hidden
        with explain_unfinished():
            raise ValueError("a bug")


def test_widgets_build_nothing_while_nbgrader_grades(only_notes, solved, model, corpus):
    _, _, encode, decode = corpus
    GenerationExplorer(solved.generate, model, encode, decode)
    AttentionMaps(model, "The fox.", encode, decode, solved.apply_rope, solved.attention_weights, solved.causal_mask)
    assert len(only_notes()) == 2


# ---------------------------------------------------------------- blitting (course_widgets/base.py)


def test_attention_maps_and_generation_blit_the_picture_matplotlib_draws(solved, model, corpus, ipympl_canvas):
    """On ipympl's canvas, another head or query, temperature or top-k changes only
    data (the generation widget's characters are texts, not tick labels): it is
    blitted over a saved picture of the rest, and what is sent is what matplotlib
    draws in full."""
    import numpy as np
    from test_widgets_base import shown_by_blitting_then_by_matplotlib

    _, _, encode, decode = corpus
    maps = AttentionMaps(
        model, "the fox and the owl", encode, decode, solved.apply_rope, solved.attention_weights, solved.causal_mask
    )
    for change in (
        lambda: setattr(maps.head, "value", 2),
        lambda: setattr(maps.query, "value", 7),
        lambda: setattr(maps.layer, "value", 0),
    ):
        blitted, full = shown_by_blitting_then_by_matplotlib(maps, change)
        assert np.array_equal(blitted, full)
    explorer = GenerationExplorer(solved.generate, model, encode, decode, prompt="the ", samples=100)
    for change in (lambda: setattr(explorer.temperature, "value", 1.5), lambda: setattr(explorer.top_k, "value", 3)):
        before = [text.get_text() for text in explorer.labels]
        blitted, full = shown_by_blitting_then_by_matplotlib(explorer, change)
        assert np.array_equal(blitted, full)
    assert [text.get_text() for text in explorer.labels] != before  # the characters moved, blitted
