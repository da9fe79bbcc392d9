"""Widgets for notebook 02: causal masking.

``MaskExplorer``: edit one token and see which outputs change (with the causal
mask, only that token's and the later ones). ``CacheMaskViewer``: the mask for
T new queries against S keys, the queries being the last T positions.
Both run the learner's own ``causal_mask``.
"""

from __future__ import annotations

import math

import ipywidgets as widgets
import matplotlib
import numpy as np
import torch
from matplotlib.colors import ListedColormap
from matplotlib.patches import Rectangle

from .base import Explorer, call_learner, expect_tensor
from .plots import heatmap, nice_ceiling

CHANGED, UNCHANGED = "crimson", "0.7"


def _text_color(blocked: bool, brightness: float) -> str:
    """Readable text on a heatmap cell: grey on blocked cells, dark on bright viridis."""
    if blocked:
        return "0.35"
    return "black" if brightness > 0.6 else "white"


def _listing(indices) -> str:
    return ", ".join(str(i) for i in indices) if indices else "none"


class MaskExplorer(Explorer):
    """Change one token's vectors: which outputs change?

    ``x`` (T, d) are the tokens' queries and keys (equal, as in the worked
    example), ``v`` (T, d_v) their values. The picked token's query, key and
    value all move by ``change`` in every component (a different token at that
    place). Left: the masked scores, -inf in grey; middle: the weights from
    the learner's ``causal_mask`` and the given ``attention_weights``; right:
    how far each token's output (from ``attention``) moved. With the causal
    mask only the edited token and the later ones move; without it, all do.
    """

    css_class = "mask-explorer"

    def __init__(self, causal_mask, attention_weights, attention, x, v, tokens=None, token=None):
        if self.skip_while_graded():
            return
        self.causal_mask, self.attention_weights, self.attention = causal_mask, attention_weights, attention
        self.x, self.v = (torch.as_tensor(a, dtype=torch.float32) for a in (x, v))
        T = self.x.shape[0]
        self.tokens = list(tokens) if tokens is not None else [f"token {t}" for t in range(T)]
        self.token = widgets.Dropdown(
            options=[(f"{t}: {name}", t) for t, name in enumerate(self.tokens)],
            value=T // 2 if token is None else token,
            description="edit token",
        ).add_class("token-picker")
        self.change = widgets.FloatSlider(
            0.0, min=-3.0, max=3.0, step=0.5, description="change by", readout_format="+.1f"
        ).add_class("change-slider")
        self.causal = widgets.Checkbox(True, description="causal mask").add_class("causal-toggle")
        super().__init__([self.token, self.change, self.causal], figsize=(9, 3.3))
        self.summary = widgets.HTML("").add_class("mask-summary")
        self.children = (*self.children[:-1], self.summary, self.children[-1])
        score_axes, weight_axes, self.change_axes = self.figure.subplots(1, 3, width_ratios=[1, 1, 1.1])
        cmap = matplotlib.colormaps["viridis"].with_extremes(bad="0.88")
        labels = [str(t) for t in range(T)]
        self.score_image, self.score_texts = heatmap(
            score_axes, torch.zeros(T, T), labels, labels, cmap=cmap, fmt="{:.2f}"
        )
        score_axes.set_title("scores q·k/√d, masked")
        self.weight_image, self.weight_texts = heatmap(
            weight_axes, torch.zeros(T, T), labels, labels, vmin=0.0, vmax=1.0, cmap=cmap, fmt="{:.2f}"
        )
        weight_axes.set_title("weights (rows sum to 1)")
        for axes in (score_axes, weight_axes):
            axes.set_xlabel("key")
            axes.set_ylabel("query")
        # the edited token's key column, in both tables
        self.frames = [Rectangle((-0.5, -0.5), 1, T, fill=False, edgecolor=CHANGED, linewidth=2.5) for _ in range(2)]
        score_axes.add_patch(self.frames[0])
        weight_axes.add_patch(self.frames[1])
        self.bars = self.change_axes.bar(range(T), [0.0] * T, color=UNCHANGED)
        self.bar_texts = [self.change_axes.text(t, 0, "", ha="center", va="bottom", fontsize=9) for t in range(T)]
        self.change_axes.set_xticks(range(T), labels)
        self.change_axes.set_xlabel("token")
        self.change_axes.set_title("how far each output moved")
        self.weights = self.moved = None
        self.refresh()

    def edited(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The tokens' (x, v) after the edit."""
        x, v = self.x.clone(), self.v.clone()
        x[self.token.value] += self.change.value
        v[self.token.value] += self.change.value
        return x, v

    def update(self) -> None:
        T = self.x.shape[0]
        mask = None
        if self.causal.value:
            mask = expect_tensor(
                "causal_mask", call_learner(self.causal_mask, T), (T, T), dtype=torch.bool, detach=False
            )
        x, v = self.edited()
        weights = expect_tensor("attention_weights", call_learner(self.attention_weights, x, x, mask), (T, T))
        output = expect_tensor("attention", call_learner(self.attention, x, x, v, mask), tuple(v.shape))
        original = expect_tensor(
            "attention", call_learner(self.attention, self.x, self.x, self.v, mask), tuple(v.shape)
        )
        scores = (x @ x.T / math.sqrt(x.shape[1])).double()
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        self.weights = weights
        self.moved = (output - original).norm(dim=-1)

        finite = scores[torch.isfinite(scores)]
        self.score_image.set_data(np.ma.masked_invalid(scores.numpy()))
        low, high = float(finite.min()), float(finite.max()) + 1e-9
        self.score_image.set_clim(low, high)
        for (row, col), text in self.score_texts.items():
            value = float(scores[row, col])
            text.set_text("-inf" if value == float("-inf") else f"{value:.2f}")
            text.set_color(_text_color(value == float("-inf"), (value - low) / (high - low)))
        self.weight_image.set_data(
            np.ma.masked_where(~mask.numpy(), weights.numpy()) if mask is not None else weights.numpy()
        )
        for (row, col), text in self.weight_texts.items():
            blocked = mask is not None and not bool(mask[row, col])
            text.set_text(f"{float(weights[row, col]):.2f}")
            text.set_color(_text_color(blocked, float(weights[row, col])))
        for frame in self.frames:
            frame.set_x(self.token.value - 0.5)
        changed = [t for t in range(T) if float(self.moved[t]) > 1e-9]
        for t, (bar, label) in enumerate(zip(self.bars, self.bar_texts)):
            bar.set_height(float(self.moved[t]))
            bar.set_color(CHANGED if t in changed else UNCHANGED)
            label.set_position((t, float(self.moved[t])))
            label.set_text(f"{float(self.moved[t]):.2f}" if t in changed else "0")
        self.change_axes.set_ylim(0, nice_ceiling(max(1.0, 1.15 * float(self.moved.max()))))

        j = self.token.value
        name = f"token {j} “{self.tokens[j]}”"
        if self.change.value == 0:
            text = f"Move the slider to change {name}; its key column is framed in red."
        else:
            unchanged = [t for t in range(T) if t not in changed]
            text = (
                f"{name} changed by {self.change.value:+.1f}: the outputs of tokens "
                f"<b>{_listing(changed)}</b> moved; tokens <b>{_listing(unchanged)}</b> did not move at all."
            )
            if mask is None and any(t < j for t in changed):
                text += " Without the mask, earlier tokens see the future."
        self.summary.value = text
        self.changed = changed


class CacheMaskViewer(Explorer):
    """The learner's ``causal_mask(T, S)``: T new queries against S keys.

    With a KV cache the first S - T keys belong to tokens processed earlier;
    the T queries are the last T positions, so the triangle sits bottom-right
    and the last query sees every key.
    """

    css_class = "cache-mask-viewer"
    MAX_T, MAX_S = 8, 12

    def __init__(self, causal_mask, T: int = 3, S: int = 7):
        if self.skip_while_graded():
            return
        self.causal_mask = causal_mask
        self.query_slider = widgets.IntSlider(T, min=1, max=self.MAX_T, description="queries T").add_class(
            "queries-slider"
        )
        self.key_slider = widgets.IntSlider(S, min=1, max=self.MAX_S, description="keys S").add_class("keys-slider")
        super().__init__([self.query_slider, self.key_slider], figsize=(7.5, 3.6))
        self.summary = widgets.HTML("").add_class("cache-summary")
        self.children = (*self.children[:-1], self.summary, self.children[-1])
        self.axes = self.figure.subplots()
        self.image = self.axes.imshow(
            np.zeros((T, S)), cmap=ListedColormap(["0.88", "tab:blue"]), vmin=0, vmax=1, aspect="auto"
        )
        self.axes.set_xlabel("key position s (grey: blocked, blue: may attend)")
        self.axes.tick_params(which="minor", length=0)
        self.axes.grid(which="minor", color="white", linewidth=1.5)
        (self.cache_line,) = self.axes.plot([], [], color=CHANGED, linewidth=3)
        self.mask = None
        self.refresh()

    def update(self) -> None:
        T, S = self.query_slider.value, self.key_slider.value
        if S < T:
            self.key_slider.value = T  # fires update() again with S = T
            return
        mask = expect_tensor(
            "causal_mask", call_learner(self.causal_mask, T, S), (T, S), dtype=torch.bool, detach=False
        )
        self.mask = mask
        self.image.set_data(mask.numpy().astype(float))
        self.image.set_extent((-0.5, S - 0.5, T - 0.5, -0.5))
        self.axes.set_xlim(-0.5, S - 0.5)
        self.axes.set_ylim(T - 0.5, -0.5)
        self.axes.set_xticks(range(S))
        self.axes.set_xticks(np.arange(-0.5, S), minor=True)
        self.axes.set_yticks(np.arange(-0.5, T), minor=True)
        self.axes.set_yticks(range(T), [f"query {t} (position {t + S - T})" for t in range(T)])
        cached = S - T
        self.cache_line.set_data([cached - 0.5, cached - 0.5], [-0.5, T - 0.5])
        self.cache_line.set_visible(cached > 0)
        self.axes.set_title(f"causal_mask({T}, {S}): {cached} cached keys (left of the red line), {T} new")
        seen = [int(row.sum()) for row in mask]
        self.summary.value = (
            f"{cached} keys come from the cache and {T} from the new tokens. Query 0 sits at position "
            f"{cached} and may attend to <b>{seen[0]}</b> keys; the last query, at position {S - 1}, "
            f"to <b>{seen[-1]}</b> of {S}."
        )
