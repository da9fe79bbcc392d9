"""Widgets for notebook 07, the full LLaMA-style model.

* ``TrainingMonitor``: the loss while the model trains, redrawn in place
  (``record`` is called from the training loop);
* ``AttentionMaps``: the attention weights of the trained model on real text,
  per layer, head and query, recomputed with the learner's ``apply_rope`` and
  ``attention_weights`` from what each attention layer receives;
* ``GenerationExplorer``: a prompt, temperature and top-k, the learner's
  ``generate`` writing text, and the next character's distribution estimated
  from samples drawn with that same ``generate``.

``load_corpus`` reads the course's small text corpus, package data of ``course_widgets``
(``data/tiny_tales.txt``, found with ``importlib.resources`` wherever the package is installed);
``loss_by_position`` and ``plot_loss_by_position`` show what a model does with
a context longer than the one it was trained on. ``save_trained_model`` keeps
07's trained model beside the notebook folders, where notebook 08's
``load_trained_model`` finds it.
"""

from __future__ import annotations

import dataclasses
import html
import io
import math
import os
import re
import time
from importlib import resources
from pathlib import Path

import ipywidgets as widgets
import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from matplotlib.patches import Rectangle

from .base import Explorer, LearnerFunctionProblem, call_learner
from .plots import heatmap

CORPUS = "tiny_tales.txt"  # in the package's data/

NO_MODEL = (
    "Train the model first: run the training cells above (they need your `ModelConfig`, `Llama`, "
    "`lm_loss` and `lr_at`), then run this cell again."
)


def load_corpus(path: Path | str | None = None) -> str:
    """The text of the course's corpus (short stories written for the course), or of the file ``path``."""
    if path is not None:
        return Path(path).read_text(encoding="utf-8")
    return resources.files(__package__).joinpath("data", CORPUS).read_text(encoding="utf-8")


def show_char(c: str) -> str:
    """A character as a tick label: spaces and newlines made visible."""
    return {" ": "␣", "\n": "⏎"}.get(c, c)


def _is_model(model) -> bool:
    return isinstance(model, torch.nn.Module)


def _context(model, tokens: torch.Tensor) -> torch.Tensor:
    """The last max_seq_len tokens: what ``generate`` feeds the model."""
    max_seq_len = getattr(getattr(model, "config", None), "max_seq_len", None)
    return tokens if max_seq_len is None else tokens[:, -max_seq_len:]


# ---------------------------------------------------------------- the trained model, kept for notebook 08

TRAINED_MODEL = "07_llama_trained.pt"


def course_folder() -> Path:
    """The folder that holds the notebook folders (a notebook's kernel runs in one of them)."""
    here = Path.cwd()
    return here.parent if re.match(r"\d\d_", here.name) else here


def save_trained_model(model, chars: list[str], steps: int) -> Path:
    """Write ``model`` (its config, a dataclass, and its weights), its characters and its number of
    training steps to ``TRAINED_MODEL`` in the course folder; return the file's path."""
    path = course_folder() / TRAINED_MODEL
    saved = {
        "config": dataclasses.asdict(model.config),
        "state_dict": model.state_dict(),
        "chars": list(chars),
        "steps": int(steps),
    }
    # written beside it, then renamed into place: a run killed while saving, or a notebook 08 that
    # loads it meanwhile, never finds half a file
    partial = path.with_name(f".{TRAINED_MODEL}.{os.getpid()}.partial")
    torch.save(saved, partial)
    os.replace(partial, path)
    return path


def load_trained_model(ModelConfig, Llama) -> tuple:
    """(model, chars, steps): the model ``save_trained_model`` kept, rebuilt with the given classes
    and in eval mode. Raises FileNotFoundError when there is none, another error when it does not fit."""
    saved = torch.load(course_folder() / TRAINED_MODEL, weights_only=True)  # tensors and plain values only
    model = Llama(ModelConfig(**saved["config"]))
    model.load_state_dict(saved["state_dict"])
    return model.eval(), list(saved["chars"]), int(saved["steps"])


# ---------------------------------------------------------------- loss by position


@torch.no_grad()
def loss_by_position(model, windows: torch.Tensor, every: int = 8, chunk_size: int = 16) -> dict:
    """The cross-entropy of predicting token t + 1 at each position t of ``windows`` (N, L).

    ``whole``: (L - 1,) the model reads the whole window at once, so position t
    sees t + 1 tokens, as many as there are (for t >= max_seq_len, more than it
    was trained on). ``cropped``: at positions ``cropped_at`` (every ``every``-th
    one from max_seq_len on), the model reads only the last max_seq_len tokens
    up to t, as ``generate`` feeds it.
    """
    model.eval()
    max_seq_len = model.config.max_seq_len
    cropped_at = list(range(max_seq_len - 1, windows.shape[1] - 1, every))
    whole, cropped = torch.zeros(windows.shape[1] - 1, dtype=torch.float64), torch.zeros(len(cropped_at))
    for chunk in windows.split(chunk_size):  # a few windows at a time: the attention weights stay small
        logits = model(chunk[:, :-1])  # (n, L-1, V)
        losses = F.cross_entropy(logits.transpose(1, 2), chunk[:, 1:], reduction="none")
        whole += losses.sum(dim=0).double()
        for i, t in enumerate(cropped_at):
            last = model(chunk[:, t + 1 - max_seq_len : t + 1])[:, -1]  # (n, V): position t
            cropped[i] += F.cross_entropy(last, chunk[:, t + 1], reduction="sum")
    n = windows.shape[0]
    return {
        "whole": whole / n,
        "cropped_at": cropped_at,
        "cropped": (cropped.double() / n).tolist(),
        "max_seq_len": max_seq_len,
    }


def plot_loss_by_position(losses: dict, unigram_entropy: float | None = None):
    """The held-out loss at each position: the whole text fed, or only the last max_seq_len tokens."""
    figure, axes = plt.subplots(figsize=(8, 3.2), layout="constrained")
    whole, max_seq_len = losses["whole"], losses["max_seq_len"]
    axes.axvspan(-0.5, max_seq_len - 0.5, color="tab:green", alpha=0.08, label=f"training window ({max_seq_len})")
    axes.plot(range(len(whole)), whole.numpy(), color="tab:blue", linewidth=1.2, label="reading everything before it")
    axes.plot(
        losses["cropped_at"],
        losses["cropped"],
        "o-",
        color="tab:orange",
        markersize=4,
        label=f"reading only the last {max_seq_len} tokens",
    )
    if unigram_entropy is not None:
        axes.axhline(unigram_entropy, linestyle="--", color="0.4", label=f"unigram entropy {unigram_entropy:.2f}")
    axes.set_xlabel("position t (predicting the character after it)")
    axes.set_ylabel("held-out loss (nats)")
    axes.set_ylim(0, max(float(whole.max()), unigram_entropy or 0) * 1.1)
    axes.legend(loc="upper left", fontsize=8)
    return figure


# ---------------------------------------------------------------- training loss


class TrainingMonitor(Explorer):
    """The training loss, drawn live while a training loop calls ``record``.

    Each step's loss is drawn thin, its moving average (window set by the
    "smooth" slider) thick, validation losses as dots, and the corpus's unigram
    entropy as a dashed line: the loss of the best model that ignores context.
    """

    css_class = "training-monitor"

    def __init__(self, unigram_entropy: float | None = None, total_steps: int = 100, redraw_seconds: float = 0.5):
        self.unigram_entropy, self.total_steps = unigram_entropy, total_steps
        self.redraw_seconds = redraw_seconds
        self.steps: list[int] = []
        self.losses: list[float] = []
        self.val_steps: list[int] = []
        self.val_losses: list[float] = []
        self._last_draw = 0.0
        if self.skip_while_graded():
            return
        self.smooth = widgets.IntSlider(10, min=1, max=50, description="smooth").add_class("smooth-slider")
        super().__init__([self.smooth], figsize=(8, 3.2))
        self.stats = widgets.HTML("").add_class("training-stats")
        # Until the browser has set the figure up, frames go to a picture instead (see draw)
        self.picture = widgets.Image(format="png").add_class("training-picture")
        self.picture.layout.display = "none"
        self.children = (*self.children[:-2], self.children[-2], self.picture, self.stats, self.children[-1])
        if hasattr(self.figure.canvas, "send_binary"):
            self.figure.canvas.observe(self._browser_ready, names="_size")
        axes = self.axes = self.figure.subplots()
        (self.raw_line,) = axes.plot([], [], color="tab:blue", alpha=0.25, linewidth=1, label="loss of each step")
        (self.smooth_line,) = axes.plot([], [], color="tab:blue", linewidth=2, label="moving average")
        (self.val_line,) = axes.plot([], [], "o-", color="tab:orange", label="validation loss")
        if unigram_entropy is not None:
            axes.axhline(unigram_entropy, linestyle="--", color="0.4", label=f"unigram entropy {unigram_entropy:.2f}")
        axes.set_xlim(0, max(total_steps, 1))
        axes.set_ylim(0, 5)
        axes.set_xlabel("step")
        axes.set_ylabel("cross-entropy (nats per character)")
        axes.legend(loc="upper right", fontsize=8)
        self.refresh()

    def smoothed(self) -> list[float]:
        """Moving average of the step losses over the last ``smooth`` steps."""
        window, out, total = self.smooth.value, [], 0.0
        for i, loss in enumerate(self.losses):
            total += loss
            if i >= window:
                total -= self.losses[i - window]
            out.append(total / min(i + 1, window))
        return out

    def record(self, step: int, loss: float, val_loss: float | None = None) -> None:
        """Called by the training loop; redraws at most every ``redraw_seconds``."""
        self.steps.append(step)
        self.losses.append(float(loss))
        if val_loss is not None:
            self.val_steps.append(step)
            self.val_losses.append(float(val_loss))
        if self.skipped:
            return
        now = time.monotonic()
        if val_loss is not None or now - self._last_draw >= self.redraw_seconds:
            self._last_draw = now
            self.refresh()

    def update(self) -> None:
        if not self.losses:
            self.stats.value = "Waiting for the training loop below to start."
            return
        self.raw_line.set_data(self.steps, self.losses)
        self.smooth_line.set_data(self.steps, self.smoothed())
        self.val_line.set_data(self.val_steps, self.val_losses)
        top = max(self.losses[: max(1, len(self.losses))])
        self.axes.set_ylim(0, max(top, self.unigram_entropy or 0) * 1.08)
        self.axes.set_xlim(0, max(self.total_steps, self.steps[-1] + 1))
        text = f"step {self.steps[-1]}: loss {self.losses[-1]:.3f}, moving average {self.smoothed()[-1]:.3f}"
        if self.val_losses:
            text += f", validation {self.val_losses[-1]:.3f}"
        if self.unigram_entropy is not None:
            text += f" (unigram entropy {self.unigram_entropy:.3f})"
        self.stats.value = text

    def draw(self) -> None:
        """Show the figure now, even while the training loop keeps the kernel busy.

        ipympl's figure appears once the browser and the kernel have exchanged a
        handshake. After it, canvas.draw() renders in the kernel and pushes the
        picture at once (draw_idle would wait for the cell to end). Before it, as
        when "Run All" has queued the training cell behind the widget, the page
        has not sized the figure yet (its answer waits for the cell to end), so
        a pushed frame would not show: the frames go to a PNG picture instead,
        which the browser shows as they come, until the handshake.
        """
        canvas = self.figure.canvas
        if not hasattr(canvas, "send_binary"):  # not ipympl: a static picture
            super().draw()
        elif not getattr(canvas, "syncing_data_url", True):  # the handshake is done
            canvas.draw()
        else:
            buffer = io.BytesIO()
            self.figure.savefig(buffer, format="png", dpi=80)
            self.picture.value = buffer.getvalue()
            self.picture.layout.display = None
            canvas.draw_idle()

    def _browser_ready(self, _change=None) -> None:
        # ipympl sets _size on the browser's resize message, which follows its
        # "initialized" message (and also when the figure is displayed: not yet ready)
        if getattr(self.figure.canvas, "syncing_data_url", True):
            return
        self.picture.layout.display = "none"
        self.figure.canvas.draw_idle()


# ---------------------------------------------------------------- attention maps


def attention_maps(model, tokens: torch.Tensor, apply_rope, attention_weights, causal_mask) -> torch.Tensor:
    """(n_layers, n_heads, T, T) attention weights of ``model`` on ``tokens`` (1, T).

    Runs the model once, records what each attention layer receives (the
    normalised residual stream), then recomputes its queries and keys with
    RoPE and the weights with the given functions: query head h reads
    key/value head h // (n_heads / n_kv_heads).
    """
    inputs = []
    hooks = [
        layer.attn.register_forward_pre_hook(lambda module, args: inputs.append(args[0])) for layer in model.layers
    ]
    try:
        with torch.no_grad():
            model(tokens)
            maps = []
            for layer, x in zip(model.layers, inputs):
                attn = layer.attn
                B, T, _ = x.shape
                positions = torch.arange(T)
                q = attn.q_proj(x).view(B, T, attn.n_heads, attn.head_dim).transpose(1, 2)
                k = attn.k_proj(x).view(B, T, attn.n_kv_heads, attn.head_dim).transpose(1, 2)
                q = apply_rope(q, positions, attn.rope_base)
                k = apply_rope(k, positions, attn.rope_base)
                k = k.repeat_interleave(attn.n_heads // attn.n_kv_heads, dim=1)
                maps.append(attention_weights(q, k, causal_mask(T))[0])
    finally:
        for hook in hooks:
            hook.remove()
    return torch.stack(maps).to(torch.float64)


class AttentionMaps(Explorer):
    """The trained model's attention on a piece of text: pick a layer, a head, a query.

    Left, the (T, T) weights of one head (row = query, column = key; the upper
    triangle is 0, the causal mask). Right, the chosen query's row as bars.
    Below, the text shaded by those weights and the model's guesses for the
    character after the query.
    """

    css_class = "attention-maps"

    def __init__(self, model, text: str, encode, decode, apply_rope, attention_weights, causal_mask):
        if self.skip_while_graded():
            return
        self.model, self.encode, self.decode = model, encode, decode
        self.apply_rope, self.attention_weights, self.causal_mask = apply_rope, attention_weights, causal_mask
        config = getattr(model, "config", None)
        n_layers = getattr(config, "n_layers", 1) if _is_model(model) else 1
        n_heads = getattr(config, "n_heads", 1) if _is_model(model) else 1
        T = max(len(text), 2)
        self.layer = widgets.IntSlider(n_layers - 1, min=0, max=max(n_layers - 1, 0), description="layer").add_class(
            "layer-slider"
        )
        self.head = widgets.IntSlider(0, min=0, max=max(n_heads - 1, 0), description="head").add_class("head-slider")
        self.query = widgets.IntSlider(T - 1, min=0, max=T - 1, description="query").add_class("query-slider")
        self.text = widgets.Text(
            text, description="text", continuous_update=False, layout=widgets.Layout(width="420px")
        ).add_class("text-box")
        super().__init__([self.text, self.layer, self.head, self.query], figsize=(9, 4.2))
        self.shaded = widgets.HTML("").add_class("attention-text")
        self.children = (
            widgets.HBox([self.text]).add_class("explorer-controls"),
            widgets.HBox([self.layer, self.head, self.query]).add_class("explorer-controls"),
            self.view,
            self.shaded,
            self.message,
        )
        self.heat_axes, self.bar_axes = self.figure.subplots(1, 2, width_ratios=[1, 1.25])
        self.maps = None
        self._built_for = None
        self.refresh()

    def _build_artists(self, chars: list[str]) -> None:
        """(Re)build the artists for a text of this length; only when the text changes."""
        T = len(chars)
        labels = [show_char(c) for c in chars]
        self.heat_axes.clear()
        self.bar_axes.clear()
        self.image, _ = heatmap(self.heat_axes, torch.zeros(T, T), labels, labels, vmin=0.0, vmax=1.0)
        self.heat_axes.tick_params(labelsize=7)
        self.heat_axes.set_xticks(range(T), labels, rotation=0, ha="center")
        self.heat_axes.set_xlabel("key")
        self.heat_axes.set_ylabel("query")
        self.row_box = Rectangle((-0.5, -0.5), T, 1, fill=False, edgecolor="crimson", linewidth=1.5)
        self.heat_axes.add_patch(self.row_box)
        self.bars = self.bar_axes.bar(range(T), [0.0] * T, color="tab:blue")
        self.bar_axes.set_xticks(range(T), labels, fontsize=7)
        self.bar_axes.set_ylim(0, 1.02)
        self.bar_axes.set_ylabel("weight")
        self._built_for = chars

    def compute(self, text: str) -> None:
        if not _is_model(self.model):
            raise LearnerFunctionProblem(NO_MODEL)
        if len(text) < 2:
            raise LearnerFunctionProblem("Type at least two characters of text.")
        try:
            tokens = torch.tensor([self.encode(text)])
        except Exception as error:
            raise LearnerFunctionProblem(
                f"The text has a character the model does not know ({error}); use the corpus's characters."
            ) from None
        maps = call_learner(
            attention_maps, self.model, tokens, self.apply_rope, self.attention_weights, self.causal_mask
        )
        with torch.no_grad():
            self.next_probs = torch.softmax(self.model(tokens)[0].double(), dim=-1)  # (T, V)
        self.maps, self.chars = maps, list(text)
        T = len(text)
        self.layer.max = maps.shape[0] - 1
        self.head.max = maps.shape[1] - 1
        self.query.max = T - 1

    def update(self) -> None:
        text = self.text.value
        if self.maps is None or list(text) != self.chars:
            self.compute(text)
        if self._built_for != self.chars:
            self._build_artists(self.chars)
        layer, head, t = self.layer.value, self.head.value, self.query.value
        weights = self.maps[layer, head]
        self.image.set_data(weights.numpy())
        self.row_box.set_y(t - 0.5)
        for bar, w in zip(self.bars, weights[t]):
            bar.set_height(float(w))
        config = self.model.config
        kv = head // (config.n_heads // config.n_kv_heads)
        self.heat_axes.set_title(f"layer {layer}, head {head} (reads kv head {kv})", fontsize=9)
        self.bar_axes.set_title(f"weights of query {t} “{show_char(self.chars[t])}”", fontsize=9)
        spans = []
        for s, c in enumerate(self.chars):
            w = float(weights[t, s]) if s <= t else 0.0
            style = f"background: rgba(214, 39, 40, {min(1.0, w * 1.5):.2f});"
            if s == t:
                style += " outline: 2px solid black;"
            spans.append(f'<span style="{style}">{html.escape(show_char(c))}</span>')
        top = torch.topk(self.next_probs[t], 3)
        guesses = ", ".join(
            f"“{html.escape(show_char(self.decode([int(i)])))}” {float(p):.2f}" for p, i in zip(top.values, top.indices)
        )
        self.shaded.value = (
            f'<span style="font-family: monospace; font-size: 15px;">{"".join(spans)}</span>'
            f"<br>after “{html.escape(''.join(self.chars[max(0, t - 11) : t + 1]))}” "
            f"the model expects: {guesses}"
        )


# ---------------------------------------------------------------- generation


class GenerationExplorer(Explorer):
    """Write with the trained model through the learner's ``generate``.

    The bars show the next character's distribution after the prompt,
    estimated from ``samples`` one-character continuations drawn with
    ``generate`` at the chosen temperature and top-k; the dots are the exact
    probabilities. "Generate" writes ``length`` characters with the same settings.
    """

    css_class = "generation-explorer"
    SHOWN = 16  # bars: the most likely characters

    def __init__(self, generate, model, encode, decode, prompt: str = "The ", samples: int = 400, length: int = 200):
        if self.skip_while_graded():
            return
        self.generate, self.model, self.encode, self.decode = generate, model, encode, decode
        self.samples = samples
        vocab = getattr(getattr(model, "config", None), "vocab_size", 64)
        self.prompt = widgets.Text(prompt, description="prompt", continuous_update=False).add_class("prompt-box")
        self.temperature = widgets.FloatSlider(
            0.8, min=0.0, max=2.0, step=0.1, description="temperature", style={"description_width": "initial"}
        ).add_class("temperature-slider")
        self.top_k = widgets.IntSlider(
            0, min=0, max=vocab, description="top-k (0: off)", style={"description_width": "initial"}
        ).add_class("top-k-slider")
        self.length = widgets.IntSlider(length, min=10, max=600, step=10, description="length").add_class(
            "length-slider"
        )
        self.seed = widgets.IntText(0, description="seed", layout=widgets.Layout(width="140px")).add_class("seed-box")
        self.button = widgets.Button(description="Generate", button_style="primary").add_class("generate-button")
        super().__init__([self.prompt, self.temperature, self.top_k], figsize=(8.5, 2.8))
        self.output = widgets.HTML("").add_class("generated-text")
        self.children = (
            self.children[0],
            widgets.HBox([self.length, self.seed, self.button]),
            *self.children[1:-1],
            self.output,
            self.children[-1],
        )
        self.button.on_click(lambda _button: self.write())
        self.axes = self.figure.subplots()
        self.bars = self.axes.bar(
            range(self.SHOWN), [0.0] * self.SHOWN, color="tab:green", label=f"share of {samples} samples"
        )
        (self.exact,) = self.axes.plot([], [], "o", color="black", markersize=4, label="exact probability")
        # The characters under the bars are texts, not tick labels: they change with most
        # inputs, and data (texts included) is blitted while new tick labels redraw everything
        self.axes.set_xticks([])
        self.axes.set_xlim(-0.6, self.SHOWN - 0.4)
        self.labels = [
            self.axes.text(i, -0.02, "", ha="center", va="top", fontsize=10, transform=self.axes.get_xaxis_transform())
            for i in range(self.SHOWN)
        ]
        self.axes.set_ylim(0, 1.02)
        self.axes.set_ylabel("probability")
        self.axes.legend(loc="upper right", fontsize=8)
        self.shares = None
        self.refresh()

    def _settings(self):
        top_k = self.top_k.value or None
        return self.temperature.value, top_k

    def _prompt_tokens(self) -> torch.Tensor:
        if not _is_model(self.model):
            raise LearnerFunctionProblem(NO_MODEL)
        text = self.prompt.value
        if not text:
            raise LearnerFunctionProblem("Type a prompt of at least one character.")
        try:
            return torch.tensor([self.encode(text)])
        except Exception as error:
            raise LearnerFunctionProblem(
                f"The prompt has a character the model does not know ({error}); use the corpus's characters."
            ) from None

    def exact_probabilities(self, prompt: torch.Tensor) -> torch.Tensor:
        """The next character's distribution after temperature and top-k (V,)."""
        temperature, top_k = self._settings()
        with torch.no_grad():
            logits = self.model(_context(self.model, prompt))[0, -1].double()
        if temperature == 0:
            return torch.nn.functional.one_hot(logits.argmax(), logits.numel()).double()
        logits = logits / temperature
        if top_k is not None:
            kth = torch.topk(logits, min(top_k, logits.numel())).values[-1]
            logits = logits.masked_fill(logits < kth, -math.inf)
        return torch.softmax(logits, dim=-1)

    def update(self) -> None:
        prompt = self._prompt_tokens()
        temperature, top_k = self._settings()
        V = self.model.config.vocab_size
        batch = prompt.expand(self.samples, -1).clone()
        with torch.random.fork_rng():
            torch.manual_seed(self.seed.value)
            out = call_learner(self.generate, self.model, batch, 1, temperature=temperature, top_k=top_k)
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != (self.samples, prompt.shape[1] + 1):
            shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            raise LearnerFunctionProblem(
                f"`generate` returned {shape} for a prompt of shape {tuple(batch.shape)} and max_new_tokens=1; "
                f"expected {(self.samples, prompt.shape[1] + 1)}: the prompt followed by the new token."
            )
        shares = torch.bincount(out[:, -1].long(), minlength=V).double() / self.samples
        exact = self.exact_probabilities(prompt)
        order = torch.argsort(exact + shares, descending=True)[: self.SHOWN]
        self.shares, self.exact_probs, self.order = shares, exact, order
        labels = [show_char(self.decode([int(i)])) for i in order]
        for bar, i in zip(self.bars, order):
            bar.set_height(float(shares[i]))
        self.exact.set_data(range(len(order)), exact[order].numpy())
        for i, text in enumerate(self.labels):
            text.set_text(labels[i] if i < len(labels) else "")
        setting = "greedy (temperature 0)" if temperature == 0 else f"temperature {temperature:.1f}"
        setting += f", top-k {top_k}" if top_k else ""
        self.axes.set_title(f"next character after “{self.prompt.value[-20:]}”: {setting}", fontsize=9)

    def write(self) -> None:
        """Generate ``length`` characters after the prompt (the button)."""
        try:
            prompt = self._prompt_tokens()
            temperature, top_k = self._settings()
            with torch.random.fork_rng():
                torch.manual_seed(self.seed.value)
                out = call_learner(
                    self.generate, self.model, prompt, self.length.value, temperature=temperature, top_k=top_k
                )
            text = self.decode(out[0].tolist())
        except LearnerFunctionProblem as problem:
            self.show_problem(str(problem))
            return
        start = len(self.prompt.value)
        self.generated = text
        self.output.value = (
            '<pre style="white-space: pre-wrap; font-size: 13px;">'
            f"<b>{html.escape(text[:start])}</b>{html.escape(text[start:])}</pre>"
        )
