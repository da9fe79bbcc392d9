"""Widgets for notebook 05: which key/value head each query head reads, and what
sharing key/value heads saves in the KV cache."""

from __future__ import annotations

import math

import ipywidgets as widgets
import matplotlib
from matplotlib.collections import LineCollection
from matplotlib.ticker import FuncFormatter, NullLocator

from .base import Explorer, LearnerFunctionProblem, call_learner

# name: (n_layers, n_heads, n_kv_heads, head_dim), as published in each model's config.json
# (num_hidden_layers, num_attention_heads, num_key_value_heads, hidden_size / num_attention_heads).
PUBLISHED_MODELS = {
    "LLaMA-2-7B": (32, 32, 32, 128),
    "LLaMA-2-70B": (80, 64, 8, 128),
    "LLaMA-3-8B": (32, 32, 8, 128),
    "Mistral-7B": (32, 32, 8, 128),
    "Falcon-7B": (32, 71, 1, 64),
}

GIB = 2**30
GPU_BYTES = 80e9  # one 80 GB data-centre GPU (A100 / H100 80GB)


def divisors(n: int) -> list[int]:
    return [g for g in range(1, n + 1) if n % g == 0]


def attention_kind(n_heads: int, n_kv_heads: int) -> str:
    if n_kv_heads == n_heads:
        return "multi-head attention"
    if n_kv_heads == 1:
        return "multi-query attention"
    return "grouped-query attention"


def head_colours(n_kv_heads: int) -> list:
    """One colour per kv head: tab10 while it suffices, then evenly spaced hues."""
    if n_kv_heads <= 10:
        palette = matplotlib.colormaps["tab10"]
        return [palette(g) for g in range(n_kv_heads)]
    palette = matplotlib.colormaps["turbo"]
    return [palette(0.05 + 0.9 * g / (n_kv_heads - 1)) for g in range(n_kv_heads)]


def _as_index(value, h: int, n_heads: int, n_kv_heads: int) -> int:
    """The learner's kv_head_index(h, H, G) as an int, or a readable problem."""
    call = f"kv_head_index({h}, {n_heads}, {n_kv_heads})"
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise LearnerFunctionProblem(
            f"{call} returned {type(value).__name__}; it should return a whole number."
        ) from None
    if not number.is_integer():
        raise LearnerFunctionProblem(
            f"{call} returned {number:g}, not a whole number: a head index is an integer (round down with //)."
        )
    if not 0 <= number < n_kv_heads:
        raise LearnerFunctionProblem(
            f"{call} returned {number:g}, but the kv heads are numbered 0 to {n_kv_heads - 1}."
        )
    return int(number)


class HeadGrouping(Explorer):
    """The H query heads (top), the G key/value heads (bottom) and which one each query head reads.

    ``kv_head_index`` is the learner's. Each kv head sits under the middle of
    the block of query heads that should share it, so consecutive groups give
    straight fans of lines and a round-robin mapping (``h % G``) crossing ones.
    """

    css_class = "head-grouping"
    HEAD_COUNTS = (4, 8, 12, 16, 32, 64)
    MAX_HEADS = max(HEAD_COUNTS)

    def __init__(self, kv_head_index, n_heads: int = 32, n_kv_heads: int = 8, query_head: int = 13):
        if self.skip_while_graded():
            return
        self.kv_head_index = kv_head_index
        self.n_heads = widgets.SelectionSlider(
            options=self.HEAD_COUNTS, value=n_heads, description="H (query)"
        ).add_class("heads-slider")
        self.n_kv_heads = widgets.SelectionSlider(
            options=divisors(n_heads), value=n_kv_heads, description="G (kv)"
        ).add_class("kv-heads-slider")
        self.query_head = widgets.IntSlider(query_head, min=0, max=n_heads - 1, description="query head").add_class(
            "query-head-slider"
        )
        self._syncing = False
        super().__init__([self.n_heads, self.n_kv_heads, self.query_head], figsize=(9, 3.0))
        self.summary = widgets.HTML("").add_class("grouping-summary")
        self.children = (*self.children[:-1], self.summary, self.children[-1])
        self.axes = self.figure.subplots()
        self.axes.set_ylim(-0.45, 1.45)
        self.axes.set_yticks([0, 1], ["kv heads (G)", "query heads (H)"])
        self.axes.tick_params(axis="y", length=0)
        self.axes.set_xticks([])
        for side in ("top", "right", "bottom", "left"):
            self.axes.spines[side].set_visible(False)
        self.links = LineCollection([], linewidths=1.2, zorder=1)
        self.axes.add_collection(self.links)
        (self.highlight,) = self.axes.plot([], [], color="black", linewidth=3.5, zorder=2)
        self.query_boxes = self.axes.scatter([], [], marker="s", edgecolors="black", linewidths=0.6, zorder=3)
        self.kv_boxes = self.axes.scatter([], [], marker="s", edgecolors="black", linewidths=0.6, zorder=3)
        self.rings = self.axes.scatter(
            [], [], marker="s", facecolors="none", edgecolors="black", linewidths=2.5, zorder=4
        )
        self.query_labels = [
            self.axes.text(0, 1, "", ha="center", va="center", zorder=5) for _ in range(self.MAX_HEADS)
        ]
        self.kv_labels = [self.axes.text(0, 0, "", ha="center", va="center", zorder=5) for _ in range(self.MAX_HEADS)]
        self.groups = None
        self.refresh()

    # -- keeping G and the query head valid when H changes
    def _on_change(self, change=None) -> None:
        if self._syncing:
            return
        if change is not None and change.get("owner") is self.n_heads:
            self._sync_to_heads()
        self.refresh()

    def _sync_to_heads(self) -> None:
        H = self.n_heads.value
        G = max(g for g in divisors(H) if g <= self.n_kv_heads.value)
        self._syncing = True
        try:
            self.n_kv_heads.options = divisors(H)
            self.n_kv_heads.value = G
            self.query_head.max = H - 1  # clamps the value when it no longer exists
        finally:
            self._syncing = False

    # -- drawing
    def update(self) -> None:
        H, G, chosen = self.n_heads.value, self.n_kv_heads.value, self.query_head.value
        groups = [_as_index(call_learner(self.kv_head_index, h, H, G), h, H, G) for h in range(H)]
        self.groups = groups
        colours = head_colours(G)
        group_size = H // G
        kv_x = [(g + 0.5) * group_size - 0.5 for g in range(G)]  # under the middle of its block
        box = min(260.0, (520.0 / H) ** 2)
        self.axes.set_xlim(-0.8, H - 0.2)
        self.query_boxes.set_offsets([(h, 1) for h in range(H)])
        self.query_boxes.set_facecolors([colours[g] for g in groups])
        self.query_boxes.set_sizes([box])
        self.kv_boxes.set_offsets([(x, 0) for x in kv_x])
        self.kv_boxes.set_facecolors(colours)
        self.kv_boxes.set_sizes([min(400.0, box * 1.4)])
        self.links.set_segments([[(h, 0.9), (kv_x[g], 0.1)] for h, g in enumerate(groups)])
        self.links.set_colors([colours[g] for g in groups])
        target = groups[chosen]
        self.highlight.set_data([chosen, kv_x[target]], [0.9, 0.1])
        self.rings.set_offsets([(chosen, 1), (kv_x[target], 0)])
        self.rings.set_sizes([box * 1.6, min(400.0, box * 1.4) * 1.5])
        size = 9 if H <= 16 else 7 if H <= 32 else 5
        for h, text in enumerate(self.query_labels):
            text.set_visible(h < H)
            if h < H:
                text.set_position((h, 1))
                text.set_text(str(h))
                text.set_fontsize(size)
        for g, text in enumerate(self.kv_labels):
            text.set_visible(g < G)
            if g < G:
                text.set_position((kv_x[g], 0))
                text.set_text(str(g))
                text.set_fontsize(size if G <= 32 else 5)
        self.axes.set_title(f"H = {H}, G = {G}: {attention_kind(H, G)}", fontsize=10)
        self.summary.value = self.describe(H, G, chosen, groups)

    @staticmethod
    def describe(H: int, G: int, chosen: int, groups: list[int]) -> str:
        readers = [groups.count(g) for g in range(G)]
        blocks = all(groups[h] <= groups[h + 1] for h in range(H - 1))
        if len(set(readers)) == 1:
            sharing = f"each kv head is read by {readers[0]} query head{'s' if readers[0] > 1 else ''}"
        else:
            sharing = f"kv heads are read by {min(readers)} to {max(readers)} query heads (uneven groups)"
        layout = (
            "the groups are blocks of consecutive query heads"
            if blocks
            else "<b>the groups are not blocks of consecutive heads</b>: check your kv_head_index"
        )
        saving = (
            "the KV cache is as large as with multi-head attention"
            if G == H
            else f"the KV cache holds {G} head{'s' if G > 1 else ''} instead of {H}: "
            f"{H // G}× smaller than multi-head attention"
        )
        return (
            f"H = {H} query heads, G = {G} kv heads ({attention_kind(H, G)}): {sharing}; {layout}. "
            f"Query head {chosen} reads <b>kv head {groups[chosen]}</b> "
            f"(kv_head_index({chosen}, {H}, {G}) = {groups[chosen]}); {saving}."
        )


def _as_bytes(value, call: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise LearnerFunctionProblem(
            f"{call} returned {type(value).__name__}; it should return a number of bytes."
        ) from None
    if not math.isfinite(number) or number <= 0:
        raise LearnerFunctionProblem(f"{call} returned {number:g}; a cache size is a positive number of bytes.")
    return number


def _gib(n_bytes: float) -> str:
    gib = n_bytes / GIB
    if gib >= 100:
        return f"{gib:,.0f} GiB"
    if gib >= 1:
        return f"{gib:.2f} GiB"
    return f"{n_bytes / 2**20:,.0f} MiB" if n_bytes >= 2**20 else f"{n_bytes / 2**10:,.0f} KiB"


class KVCacheExplorer(Explorer):
    """KV-cache size against sequence length for a model as published and as MHA, GQA (G = 8) or MQA.

    ``kv_cache_bytes`` is the learner's; ``models`` maps a name to
    (n_layers, n_heads, n_kv_heads, head_dim).
    """

    css_class = "kv-cache-explorer"
    SEQ_LENS = tuple(2**k for k in range(7, 18))  # 128 .. 131 072 tokens
    BATCHES = (1, 2, 4, 8, 16, 32, 64)
    VARIANT_COLOURS = {"MHA": "tab:red", "GQA": "tab:blue", "MQA": "tab:green"}

    def __init__(self, kv_cache_bytes, models: dict | None = None, model: str = "LLaMA-3-8B"):
        if self.skip_while_graded():
            return
        self.kv_cache_bytes = kv_cache_bytes
        self.models = dict(models or PUBLISHED_MODELS)
        self.model = widgets.Dropdown(
            options=list(self.models),
            value=model if model in self.models else next(iter(self.models)),
            description="model",
            layout=widgets.Layout(width="220px"),
        ).add_class("model-preset")
        self.seq_len = widgets.SelectionSlider(
            options=self.SEQ_LENS,
            value=4096,
            description="tokens",
            layout=widgets.Layout(width="290px"),
        ).add_class("seq-len-slider")
        self.batch = widgets.SelectionSlider(
            options=self.BATCHES,
            value=1,
            description="batch",
            layout=widgets.Layout(width="230px"),
        ).add_class("batch-slider")
        self.precision = widgets.ToggleButtons(
            options=[("16-bit", 2), ("32-bit", 4)],
            value=2,
            tooltips=["2 bytes a value", "4 bytes a value"],
        ).add_class("precision-toggle")
        self.precision.style.button_width = "60px"
        super().__init__([self.model, self.seq_len, self.batch, self.precision], figsize=(9, 3.6))
        self.summary = widgets.HTML("").add_class("cache-summary")
        self.children = (*self.children[:-1], self.summary, self.children[-1])
        self.axes = self.figure.subplots()
        self.axes.set_xscale("log", base=2)
        self.axes.set_yscale("log")
        # plain decade labels (0.01, 0.1, 1, ...) and no minor ticks: readable, and cheaper to draw than mathtext
        self.axes.yaxis.set_minor_locator(NullLocator())
        self.axes.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:g}"))
        self.axes.set_xlim(self.SEQ_LENS[0] / 1.3, self.SEQ_LENS[-1] * 1.3)
        self.axes.set_xticks(self.SEQ_LENS, [f"{n // 1024}k" if n >= 1024 else str(n) for n in self.SEQ_LENS])
        self.axes.set_xlabel("sequence length (tokens)")
        self.axes.set_ylabel("KV cache (GiB)")
        self.axes.grid(True, which="major", alpha=0.3)
        self.axes.axhline(GPU_BYTES / GIB, color="0.3", linestyle="--", linewidth=1)
        self.axes.text(self.SEQ_LENS[0], GPU_BYTES / GIB * 1.15, "80 GB GPU", color="0.3", fontsize=8)
        self.lines, self.markers = {}, {}
        for variant, colour in self.VARIANT_COLOURS.items():
            (self.lines[variant],) = self.axes.plot([], [], "-", color=colour, label=variant)
            (self.markers[variant],) = self.axes.plot([], [], "o", color=colour, markersize=7)
        self.legend = self.axes.legend(loc="lower right", fontsize=8)
        self.curves = None
        self.refresh()

    def variants(self) -> dict:
        """{variant: n_kv_heads} for the chosen model; GQA only when G = 8 fits between 1 and H."""
        _, n_heads, _, _ = self.models[self.model.value]
        found = {"MHA": n_heads}
        if n_heads > 8 and n_heads % 8 == 0:
            found["GQA"] = 8
        found["MQA"] = 1
        return found

    def bytes_for(self, n_kv_heads: int, seq_len: int) -> float:
        n_layers, _, _, head_dim = self.models[self.model.value]
        batch, precision = self.batch.value, self.precision.value
        call = f"kv_cache_bytes({n_layers}, {n_kv_heads}, {head_dim}, {seq_len}, {batch}, {precision})"
        value = call_learner(
            self.kv_cache_bytes, n_layers, n_kv_heads, head_dim, seq_len, batch_size=batch, bytes_per_value=precision
        )
        return _as_bytes(value, call)

    def update(self) -> None:
        name = self.model.value
        _, n_heads, published_g, _ = self.models[name]
        seq_len = self.seq_len.value
        variants = self.variants()
        curves = {variant: [self.bytes_for(g, n) for n in self.SEQ_LENS] for variant, g in variants.items()}
        self.curves = curves
        chosen = {variant: curve[self.SEQ_LENS.index(seq_len)] for variant, curve in curves.items()}
        for (variant, line), legend_text in zip(self.lines.items(), self.legend.get_texts()):
            marker = self.markers[variant]
            if variant not in curves:
                line.set_data([], [])
                marker.set_data([], [])
                legend_text.set_text(f"{variant}: G = 8 does not divide H = {n_heads}")
                continue
            g = variants[variant]
            line.set_data(self.SEQ_LENS, [b / GIB for b in curves[variant]])
            marker.set_data([seq_len], [chosen[variant] / GIB])
            published = g == published_g
            line.set_linewidth(3.0 if published else 1.4)
            legend_text.set_text(f"{variant} (G = {g}){', as published' if published else ''}")
        values = [b for curve in curves.values() for b in curve] + [GPU_BYTES]
        limits = (min(values) / GIB / 2, max(values) / GIB * 3)
        if self.axes.get_ylim() != limits:  # moving along a curve keeps the axis as it is
            self.axes.set_ylim(*limits)
        self.axes.set_title(
            f"{name}: {self.models[name][0]} layers, H = {n_heads}, head size {self.models[name][3]}", fontsize=10
        )
        self.summary.value = self.describe(name, seq_len, variants, chosen, published_g)

    def describe(self, name, seq_len, variants, chosen, published_g) -> str:
        parts = []
        for variant, g in variants.items():
            mark = " (as published)" if g == published_g else ""
            parts.append(f"{variant} (G = {g}){mark} <b>{_gib(chosen[variant])}</b>")
        published = [v for v, g in variants.items() if g == published_g]
        exact = f"; as published: {int(chosen[published[0]]):,} bytes" if published else ""
        ratio = chosen["MHA"] / chosen["MQA"]
        return (
            f"{name}, {seq_len:,} tokens, batch {self.batch.value}, {self.precision.value} bytes a value: "
            + " · ".join(parts)
            + exact
            + f". MQA is {ratio:g}× smaller than MHA."
        )
