"""Widgets for notebook 03: multi-head attention.

* ``ShapeWalk``: where each feature of each token goes on the way
  (B, T, D) -> (B, T, H, D/H) -> (B, H, T, D/H) and back, as the learner's
  ``split_heads`` and ``merge_heads`` move it.
* ``HeadPatterns``: the attention weights of every head of the learner's
  ``MultiHeadAttention`` on a short sentence, side by side, and one query's
  head outputs before and after the output projection.

Drawing convention of ``ShapeWalk``: a tensor of shape (A, R, C) (batch axis
dropped) is drawn as A blocks side by side, each R rows by C columns.
"""

from __future__ import annotations

import math

import ipywidgets as widgets
import matplotlib
import matplotlib.layout_engine
import numpy as np
import torch
from matplotlib.patches import Rectangle

from .base import Explorer, LearnerFunctionProblem, call_learner, expect_tensor
from .plots import nice_ceiling

TOKEN_COLOURS = [matplotlib.colors.to_rgb(c) for c in matplotlib.colormaps["tab10"].colors]
HEAD_COLOURS = TOKEN_COLOURS


def _named_call(name: str, function):
    """``function`` under the name the learner knows (for call_learner's messages)."""
    function.__name__ = name
    return function


def _fix_layout(figure, engine=None):
    """Lay the figure out once now, then keep the positions: later draws skip the layout.

    Constrained layout measures every label on every draw, about half the time
    of a redraw here; the positions only need recomputing when the labels change.
    Returns the engine, to run again after such a change.
    """
    engine = engine or figure.get_layout_engine()
    if isinstance(engine, matplotlib.layout_engine.ConstrainedLayoutEngine):
        engine.execute(figure)
        figure.set_layout_engine("none")
    return engine


def _ranges(numbers: list[int]) -> str:
    """[0, 1, 2, 3, 6] -> '0–3, 6'."""
    parts, start = [], None
    for i, n in enumerate(numbers):
        if start is None:
            start = n
        if i + 1 == len(numbers) or numbers[i + 1] != n + 1:
            parts.append(f"{start}" if start == n else f"{start}–{n}")
            start = None
    return ", ".join(parts)


# ---------------------------------------------------------------- the shape walk


class ShapeWalk(Explorer):
    """(B, T, D) -> view (B, T, H, D/H) -> transpose (B, H, T, D/H) -> merge (B, T, D).

    Entry (t, d) of the input holds the number t·D + d, so wherever the
    learner's ``split_heads`` puts it, the widget can tell which token (colour)
    and which feature (the digit in the cell) it is. The followed token is
    drawn in full colour, the others faded.
    """

    css_class = "shape-walk"
    GAP = 3  # blank columns between the four panels

    def __init__(self, split_heads, merge_heads, tokens=("the", "cat", "sat"), d_model: int = 8):
        if self.skip_while_graded():
            return
        self.split_heads, self.merge_heads = split_heads, merge_heads
        self.tokens, self.D = list(tokens), d_model
        self.T = len(self.tokens)
        options = [h for h in (1, 2, 4, 8, 16) if d_model % h == 0 and h <= d_model]
        self.heads = widgets.SelectionSlider(
            options=options, value=2 if 2 in options else options[0], description="heads H"
        ).add_class("heads-slider")
        self.token = widgets.SelectionSlider(
            options=[(f"{t}: {w}", t) for t, w in enumerate(self.tokens)],
            value=min(1, self.T - 1),
            description="follow",
        ).add_class("token-slider")
        super().__init__([self.heads, self.token], figsize=(9.2, 2.8))
        self.walk = widgets.HTML("").add_class("shape-walk-text")
        self.children = (*self.children[:-1], self.walk, self.children[-1])
        self.x = torch.arange(self.T * self.D, dtype=torch.float64).view(1, self.T, self.D)
        self.axes = self.figure.subplots()
        self.axes.set_axis_off()
        self.image = self.axes.imshow(np.ones((1, 1, 3)), interpolation="nearest")
        n_cells = 4 * self.T * self.D
        self.cell_texts = [self.axes.text(0, 0, "", ha="center", va="center", fontsize=8) for _ in range(n_cells)]
        self.titles = [self.axes.text(0, 0, "", ha="center", va="bottom", fontsize=9) for _ in range(4)]
        self.arrows = [self.axes.text(0, 0, "→", ha="center", va="center", fontsize=16, color="0.3") for _ in range(3)]
        max_blocks = max(self.T, max(options))
        self.block_labels = [
            self.axes.text(0, 0, "", ha="center", va="top", fontsize=8, color="0.3") for _ in range(self.T + max_blocks)
        ]
        self.split = self.merged = None
        self._layout_fixed = False
        self.refresh()

    # -- layout: every panel is (blocks, rows, cols) of (token, feature) pairs
    def _panels(self, split: torch.Tensor, merged: torch.Tensor):
        H = self.heads.value
        return [
            (f"x\n{(1, self.T, self.D)}", self.x[0][None], None),
            (f"view\n{(1, self.T, H, self.D // H)}", split[0].transpose(0, 1), "token"),
            (f"split_heads(x, {H})\n{tuple(split.shape)}", split[0], "head"),
            (f"merge_heads(...)\n{tuple(merged.shape)}", merged[0][None], None),
        ]

    def _decode(self, value: float):
        """(token, feature) that the number ``value`` came from, or None."""
        if not math.isfinite(value) or abs(value - round(value)) > 1e-6:
            return None
        n = int(round(value))
        return divmod(n, self.D) if 0 <= n < self.T * self.D else None

    def update(self) -> None:
        H, followed = self.heads.value, self.token.value
        Dh = self.D // H
        split = expect_tensor("split_heads", call_learner(self.split_heads, self.x.clone(), H), (1, H, self.T, Dh))
        merged = expect_tensor("merge_heads", call_learner(self.merge_heads, split.clone()), (1, self.T, self.D))
        self.split, self.merged = split, merged
        panels = self._panels(split, merged)
        rows = max(blocks.shape[1] for _, blocks, _ in panels)
        widths = [blocks.shape[0] * blocks.shape[2] + blocks.shape[0] - 1 for _, blocks, _ in panels]
        total = sum(widths) + self.GAP * (len(panels) - 1)
        rgb = np.ones((rows, total, 3))
        texts = iter(self.cell_texts)
        labels = iter(self.block_labels)
        left = 0
        for index, ((title, blocks, kind), width) in enumerate(zip(panels, widths)):
            n_blocks, n_rows, n_cols = blocks.shape
            for b in range(n_blocks):
                for r in range(n_rows):
                    for c in range(n_cols):
                        col = left + b * (n_cols + 1) + c
                        where = self._decode(float(blocks[b, r, c]))
                        text = next(texts)
                        text.set_position((col, r))
                        if where is None:
                            rgb[r, col] = (0.6, 0.6, 0.6)
                            text.set_text("?")
                            continue
                        token, feature = where
                        colour = np.array(TOKEN_COLOURS[token % len(TOKEN_COLOURS)])
                        rgb[r, col] = colour if token == followed else 0.25 * colour + 0.75
                        text.set_text(str(feature))
                if kind is not None:
                    label = next(labels)
                    label.set_text(f"{'t' if kind == 'token' else 'h'}{b}")
                    label.set_position((left + b * (n_cols + 1) + (n_cols - 1) / 2, n_rows - 0.5 + 0.15))
            self.titles[index].set_text(title)
            self.titles[index].set_position((left + (width - 1) / 2, -0.7))
            if index < len(self.arrows):
                self.arrows[index].set_position((left + width - 1 + (self.GAP + 1) / 2, (rows - 1) / 2))
            left += width + self.GAP
        for text in texts:
            text.set_text("")
        for label in labels:
            label.set_text("")
        self.image.set_data(rgb)
        self.image.set_extent((-0.5, total - 0.5, rows - 0.5, -0.5))
        self.axes.set_xlim(-0.5, total - 0.5)
        self.axes.set_ylim(rows + 0.4, -1.9)
        self.walk.value = self._describe(H, followed, split, merged)
        if not self._layout_fixed:  # once everything is shown (not while a message hides the axes)
            _fix_layout(self.figure)
            self._layout_fixed = True

    def _describe(self, H, followed, split, merged) -> str:
        Dh = self.D // H
        landing = {}  # head -> [(feature, row)]
        for h in range(H):
            for t in range(self.T):
                for j in range(Dh):
                    where = self._decode(float(split[0, h, t, j]))
                    if where is not None and where[0] == followed:
                        landing.setdefault(h, []).append((where[1], t))
        parts = []
        for h in sorted(landing):
            features = sorted(f for f, _ in landing[h])
            rows = sorted({t for _, t in landing[h]})
            parts.append(f"head {h} ← features {_ranges(features)} (row {', '.join(map(str, rows))})")
        exact = bool(torch.equal(merged, self.x))
        word = self.tokens[followed]
        return (
            f"({1}, {self.T}, {self.D}) → view → (1, {self.T}, {H}, {Dh}) → transpose(1, 2) → "
            f"(1, {H}, {self.T}, {Dh}) → merge_heads → {tuple(merged.shape)}: "
            f"{'<b>round trip exact</b>' if exact else '<b>the round trip does not give x back</b>'}.<br>"
            f"“{word}” (token {followed}): " + ("; ".join(parts) if parts else "its features are nowhere to be found")
        )


# ---------------------------------------------------------------- per-head patterns


class HeadPatterns(Explorer):
    """Every head's attention weights on a short sentence, side by side.

    The words get fixed random embeddings (the same word, the same vector);
    the learner's ``MultiHeadAttention`` is built with random weights from the
    seed. Its projections, ``split_heads``, ``attention_weights``,
    ``attention``, ``merge_heads`` and the module itself all run on every
    change. Below: the chosen query's outputs of all heads side by side (bars,
    one colour per head) and the module's output after W_O (dots).
    """

    css_class = "head-patterns"
    HEAD_OPTIONS = (1, 2, 4, 8)
    GAIN = 1.5  # projection weights ~ N(0, (GAIN / √D)²): patterns sharp enough to tell heads apart

    def __init__(
        self,
        MultiHeadAttention,
        split_heads,
        merge_heads,
        attention_weights,
        attention,
        sentence: str = "the cat sat on the mat",
        d_model: int = 16,
    ):
        if self.skip_while_graded():
            return
        self.MultiHeadAttention = MultiHeadAttention
        self.split_heads, self.merge_heads = split_heads, merge_heads
        self.attention_weights, self.attention = attention_weights, attention
        self.tokens, self.D = sentence.split(), d_model
        self.T = len(self.tokens)
        self.heads = widgets.SelectionSlider(
            options=[h for h in self.HEAD_OPTIONS if d_model % h == 0], value=2, description="heads H"
        ).add_class("heads-slider")
        self.query = widgets.SelectionSlider(
            options=[(f"{t}: {w}", t) for t, w in enumerate(self.tokens)], value=2, description="query"
        ).add_class("query-slider")
        self.seed = widgets.IntSlider(0, min=0, max=9, description="seed").add_class("seed-slider")
        self.causal = widgets.Checkbox(False, description="causal mask").add_class("causal-toggle")
        super().__init__([self.heads, self.query, self.seed, self.causal], figsize=(9.2, 4.8))
        self.summary = widgets.HTML("").add_class("head-summary")
        self.children = (*self.children[:-1], self.summary, self.children[-1])
        generator = torch.Generator().manual_seed(2024)
        vocabulary = {word: torch.randn(d_model, generator=generator) for word in dict.fromkeys(self.tokens)}
        self.x = torch.stack([vocabulary[w] for w in self.tokens])[None]  # (1, T, D)

        self.heat_axes, self.bar_axes = self.figure.subplots(2, 1, height_ratios=[1.5, 1])
        cmap = matplotlib.colormaps["viridis"].with_extremes(bad="white")
        self.image = self.heat_axes.imshow(
            np.zeros((self.T, self.T)), cmap=cmap, vmin=0.0, vmax=1.0, interpolation="nearest", aspect="auto"
        )
        self.figure.colorbar(self.image, ax=self.heat_axes, shrink=0.8, label="weight")
        self.heat_axes.set_yticks(range(self.T), self.tokens)
        self.heat_axes.set_ylabel("query")
        self.head_titles = [
            self.heat_axes.text(0, -0.7, "", ha="center", va="bottom", fontsize=9)
            for _ in range(max(self.HEAD_OPTIONS))
        ]
        self.row_box = Rectangle((-0.5, -0.5), self.T, 1, fill=False, edgecolor="crimson", linewidth=2.0)
        self.heat_axes.add_patch(self.row_box)
        self.bars = self.bar_axes.bar(range(d_model), [0.0] * d_model)
        (self.after,) = self.bar_axes.plot(
            range(d_model), [0.0] * d_model, "o", color="black", markersize=4, label="after W_O"
        )
        self.bar_axes.axhline(0.0, color="0.5", linewidth=0.8)
        self.bar_axes.set_xticks(range(d_model))
        self.bar_axes.set_xlabel("feature")
        self.bar_axes.legend(loc="upper right", fontsize=8)
        self._layout_heads = None
        self._layout = self.figure.get_layout_engine()
        self.weights = self.head_outputs = self.output = None
        self.refresh()

    def build_module(self, n_heads: int, seed: int):
        """The learner's MultiHeadAttention with random weights drawn from ``seed``."""
        module = call_learner(self.MultiHeadAttention, self.D, n_heads)
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
                layer = getattr(module, name, None)
                if not isinstance(layer, torch.nn.Module) or not hasattr(layer, "weight"):
                    raise LearnerFunctionProblem(
                        f"`MultiHeadAttention` has no linear layer `{name}`: "
                        "create it in __init__ with nn.Linear(d_model, d_model, bias=False)."
                    )
                layer.weight.copy_(torch.randn(layer.weight.shape, generator=generator) * self.GAIN / math.sqrt(self.D))
        return module.eval()

    def _relayout(self, H: int) -> None:
        """Ticks and head titles for H blocks of T columns (only when H changes)."""
        T = self.T
        positions, labels = [], []
        for h in range(H):
            positions += [h * (T + 1) + s for s in range(T)]
            labels += self.tokens
        self.heat_axes.set_xticks(positions, labels, rotation=90, fontsize=max(5, 9 - H))
        for h, title in enumerate(self.head_titles):
            title.set_visible(h < H)
            title.set_text(f"head {h}")
            title.set_position((h * (T + 1) + (T - 1) / 2, -0.7))
        self.heat_axes.set_xlim(-0.5, H * (T + 1) - 1.5)
        self.heat_axes.set_ylim(T - 0.5, -0.5)
        self.row_box.set_width(H * (T + 1) - 1)
        self._layout_heads = H
        self._layout = _fix_layout(self.figure, self._layout)

    def update(self) -> None:
        H, t, T, D = self.heads.value, self.query.value, self.T, self.D
        Dh = D // H
        module = self.build_module(H, self.seed.value)
        mask = torch.ones(T, T, dtype=torch.bool).tril() if self.causal.value else None
        with torch.no_grad():
            q, k, v = (
                expect_tensor(
                    "split_heads", call_learner(self.split_heads, getattr(module, name)(self.x), H), (1, H, T, Dh)
                )
                for name in ("q_proj", "k_proj", "v_proj")
            )
            weights = expect_tensor("attention_weights", call_learner(self.attention_weights, q, k, mask), (1, H, T, T))
            head_outputs = expect_tensor("attention", call_learner(self.attention, q, k, v, mask), (1, H, T, Dh))
            merged = expect_tensor("merge_heads", call_learner(self.merge_heads, head_outputs), (1, T, D))
            forward = _named_call("MultiHeadAttention", lambda: module(self.x, mask))
            output = expect_tensor("MultiHeadAttention", call_learner(forward), (1, T, D))
        self.weights, self.head_outputs, self.merged, self.output = weights[0], head_outputs[0], merged[0], output[0]

        picture = np.full((T, H * (T + 1) - 1), np.nan)
        for h in range(H):
            picture[:, h * (T + 1) : h * (T + 1) + T] = self.weights[h].numpy()
        self.image.set_data(picture)
        self.image.set_extent((-0.5, picture.shape[1] - 0.5, T - 0.5, -0.5))
        self.row_box.set_y(t - 0.5)

        for d, bar in enumerate(self.bars):
            bar.set_height(float(self.merged[t, d]))
            bar.set_color(HEAD_COLOURS[(d // Dh) % len(HEAD_COLOURS)])
        self.after.set_ydata(self.output[t].numpy())
        # rounded up to 1, 2, 5, ...: most inputs keep the axis, and only the data is redrawn
        limit = nice_ceiling(1.15 * max(float(self.merged[t].abs().max()), float(self.output[t].abs().max()), 0.1))
        self.bar_axes.set_ylim(-limit, limit)
        self.bar_axes.set_title(
            f"“{self.tokens[t]}”: the {H} heads' outputs side by side ({Dh} numbers each, bars) and after W_O (dots)",
            fontsize=9,
        )

        favourites = []
        for h in range(H):
            s = int(self.weights[h, t].argmax())
            favourites.append(f"head {h} → “{self.tokens[s]}” ({float(self.weights[h, t, s]):.2f})")
        self.summary.value = f"query “{self.tokens[t]}” looks most at: " + ", ".join(favourites)
        if self._layout_heads != H:  # last: the layout measures the labels and titles just set
            self._relayout(H)
