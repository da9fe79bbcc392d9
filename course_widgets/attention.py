"""Widgets for notebook 01: attention as a soft lookup, and why divide by sqrt(d)."""

from __future__ import annotations

import math

import ipywidgets as widgets
import torch
from matplotlib.patches import Rectangle

from .base import Explorer, call_learner, expect_tensor
from .plots import heatmap


def _vector(values) -> str:
    return "(" + ", ".join(f"{float(x):.2f}" for x in values) + ")"


class AttentionHeatmap(Explorer):
    """Pick a query: see its attention weights over the keys, and its output.

    ``attention_weights`` and ``attention`` are the learner's functions;
    ``q`` (T, d), ``k`` (S, d) and ``v`` (S, d_v) the example's vectors. The
    "sharpen" slider multiplies the queries, making every dot product larger:
    the weights concentrate on the best-matching key.
    """

    css_class = "attention-heatmap"

    def __init__(self, attention_weights, attention, q, k, v, tokens=None, key_tokens=None):
        if self.skip_while_graded():
            return
        self.attention_weights, self.attention = attention_weights, attention
        self.q, self.k, self.v = (torch.as_tensor(x, dtype=torch.float32) for x in (q, k, v))
        T, S = self.q.shape[0], self.k.shape[0]
        self.tokens = list(tokens) if tokens is not None else [f"token {t}" for t in range(T)]
        self.key_tokens = list(key_tokens) if key_tokens is not None else self.tokens[:S]
        self.query = widgets.IntSlider(0, min=0, max=T - 1, description="query").add_class("query-slider")
        self.sharpen = widgets.FloatSlider(1.0, min=0.25, max=4.0, step=0.25, description="sharpen ×").add_class(
            "sharpen-slider"
        )
        super().__init__([self.query, self.sharpen], figsize=(8.5, 3.4))
        self.output_line = widgets.HTML("").add_class("attention-output")
        self.children = (*self.children[:-1], self.output_line, self.children[-1])
        heat_axes, self.bar_axes = self.figure.subplots(1, 2, width_ratios=[1, 1.2])
        self.image, self.cell_texts = heatmap(
            heat_axes, torch.zeros(T, S), self.key_tokens, self.tokens, vmin=0.0, vmax=1.0, fmt="{:.2f}"
        )
        heat_axes.set_title("weights: softmax(q·k / √d), one row per query")
        heat_axes.set_xlabel("key")
        self.row_box = Rectangle((-0.5, -0.5), S, 1, fill=False, edgecolor="crimson", linewidth=2.5)
        heat_axes.add_patch(self.row_box)
        self.bars = self.bar_axes.bar(range(S), [0.0] * S, color="tab:blue")
        self.bar_axes.set_xticks(range(S), self.key_tokens, rotation=30, ha="right")
        self.bar_axes.set_ylim(0, 1.05)
        self.bar_axes.set_ylabel("weight")
        self.weights = None
        self.output = None
        self.refresh()

    def update(self) -> None:
        T, S = self.q.shape[0], self.k.shape[0]
        q = self.q * self.sharpen.value
        weights = expect_tensor("attention_weights", call_learner(self.attention_weights, q, self.k), (T, S))
        output = expect_tensor("attention", call_learner(self.attention, q, self.k, self.v), (T, self.v.shape[1]))
        self.weights, self.output = weights, output
        t = self.query.value
        self.image.set_data(weights.numpy())
        for (row, col), text in self.cell_texts.items():
            text.set_text(f"{float(weights[row, col]):.2f}")
        self.row_box.set_y(t - 0.5)
        for bar, w in zip(self.bars, weights[t]):
            bar.set_height(float(w))
        self.bar_axes.set_title(f"weights of query “{self.tokens[t]}”")
        mix = " + ".join(f"{float(w):.2f}·v{s}" for s, w in enumerate(weights[t]))
        self.output_line.value = f"output of “{self.tokens[t]}” = {mix} = <b>{_vector(output[t])}</b>"


class ScalingExplorer(Explorer):
    """Why divide by √d: softmax of q·k scores for random q, k of dimension d.

    With entries of variance 1, q·k has variance d. Unscaled, large d makes the
    scores spread widely and the softmax puts nearly all weight on one key;
    dividing by √d brings the spread back to 1. ``softmax`` is the learner's.
    """

    css_class = "scaling-explorer"
    DIMENSIONS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)

    def __init__(self, softmax, n_keys: int = 8, draws: int = 200, seed: int = 0):
        if self.skip_while_graded():
            return
        self.softmax, self.n_keys, self.draws, self.seed = softmax, n_keys, draws, seed
        self.d = widgets.SelectionSlider(options=self.DIMENSIONS, value=128, description="d").add_class("d-slider")
        self.scaled = widgets.Checkbox(True, description="divide by √d").add_class("scale-toggle")
        super().__init__([self.d, self.scaled], figsize=(8.5, 3.2))
        self.stats = widgets.HTML("").add_class("scaling-stats")
        self.children = (*self.children[:-1], self.stats, self.children[-1])
        self.bar_axes, self.curve_axes = self.figure.subplots(1, 2)
        self.bars = self.bar_axes.bar(range(n_keys), [0.0] * n_keys, color="tab:orange")
        self.bar_axes.set_ylim(0, 1.05)
        self.bar_axes.set_xlabel("key")
        self.bar_axes.set_ylabel("weight")
        self.curve_axes.set_xscale("log", base=2)
        self.curve_axes.set_ylim(0, 1.05)
        self.curve_axes.set_xlabel("d")
        self.curve_axes.set_title(f"largest weight, mean of {draws} draws")
        (self.curve_unscaled,) = self.curve_axes.plot([], [], "o-", color="tab:red", label="q·k")
        (self.curve_scaled,) = self.curve_axes.plot([], [], "o-", color="tab:green", label="q·k / √d")
        (self.marker,) = self.curve_axes.plot([], [], "o", markersize=14, markerfacecolor="none", color="black")
        self.curve_axes.legend(loc="center right")
        self._scores = {}
        self.curves = None
        self.refresh()

    def scores(self, d: int) -> torch.Tensor:
        """(draws, n_keys) dot products of random q and k with N(0, 1) entries."""
        if d not in self._scores:
            generator = torch.Generator().manual_seed(self.seed * 10_007 + d)
            q = torch.randn(self.draws, d, generator=generator)
            k = torch.randn(self.draws, self.n_keys, d, generator=generator)
            self._scores[d] = torch.einsum("nd,nkd->nk", q, k)
        return self._scores[d]

    def weights(self, d: int, scaled: bool) -> torch.Tensor:
        scores = self.scores(d) / (math.sqrt(d) if scaled else 1.0)
        return expect_tensor("softmax", call_learner(self.softmax, scores), scores.shape)

    def update(self) -> None:
        if self.curves is None:
            self.curves = {
                scaled: [float(self.weights(d, scaled).max(dim=-1).values.mean()) for d in self.DIMENSIONS]
                for scaled in (False, True)
            }
            self.curve_unscaled.set_data(self.DIMENSIONS, self.curves[False])
            self.curve_scaled.set_data(self.DIMENSIONS, self.curves[True])
            self.curve_axes.set_xlim(0.7, 1500)
        d, scaled = self.d.value, self.scaled.value
        weights = self.weights(d, scaled)
        first = weights[0]
        for bar, w in zip(self.bars, first):
            bar.set_height(float(w))
        self.marker.set_data([d], [self.curves[scaled][self.DIMENSIONS.index(d)]])
        scores = self.scores(d)[0] / (math.sqrt(d) if scaled else 1.0)
        self.bar_axes.set_title(f"one draw: scores' spread {float(scores.std()):.1f}")
        self.stats.value = (
            f"d = {d}, {'divided by √d' if scaled else 'not scaled'}: scores of one draw spread "
            f"(std) {float(scores.std()):.2f}; its largest weight is <b>{float(first.max()):.5f}</b>; "
            f"over {self.draws} draws the largest weight averages {self.curves[scaled][self.DIMENSIONS.index(d)]:.3f}."
        )
