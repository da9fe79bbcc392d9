"""Widgets for notebook 04: rotary position embeddings.

* ``PairRotation``: one pair of dimensions turning with the position m, for a
  chosen pair index i; beside it every pair of the vector at that position.
* ``RelativeScores``: the score q·k with q rotated to position m and k to
  position n, over a grid of (m, n): constant along every diagonal, because it
  depends on m - n only.
* ``PairingExplorer``: which dimensions form a pair in the neighbour layout
  (2i, 2i+1) and in the half-split layout (i, i + d/2), and how the learner's
  ``neighbour_to_half_split`` moves each dimension from one to the other.

All three call the learner's own functions (``apply_rope``, ``rope_frequencies``,
``neighbour_to_half_split``) through ``call_learner``.
"""

from __future__ import annotations

import math

import ipywidgets as widgets
import matplotlib
import numpy as np
import torch
from matplotlib.collections import LineCollection
from matplotlib.patches import Rectangle

from .base import Explorer, LearnerFunctionProblem, call_learner, expect_tensor

PAIR_COLOURS = matplotlib.colormaps["tab10"]  # neighbouring pairs get unrelated colours


def _unit_pairs(n_positions: int, head_dim: int) -> torch.Tensor:
    """(n_positions, head_dim): every pair (x_2i, x_2i+1) is (1, 0)."""
    x = torch.zeros(n_positions, head_dim)
    x[:, 0::2] = 1.0
    return x


# ---------------------------------------------------------------- one pair turning


class PairRotation(Explorer):
    """Pair i of a vector whose pairs all start at (1, 0), rotated to position m.

    Left: the pair on the unit circle, with the path it took over positions
    0 .. m. Right: all head_dim / 2 pairs at position m, one small dial each:
    the first pairs turn fast, the last ones barely move.
    """

    css_class = "rope-rotation"

    def __init__(
        self, apply_rope, rope_frequencies, head_dim: int = 16, base: float = 10000.0, max_position: int = 100
    ):
        if self.skip_while_graded():
            return
        self.apply_rope, self.rope_frequencies = apply_rope, rope_frequencies
        self.head_dim, self.base = head_dim, base
        self.position = widgets.IntSlider(3, min=0, max=max_position, description="position m").add_class(
            "position-slider"
        )
        self.pair = widgets.IntSlider(0, min=0, max=head_dim // 2 - 1, description="pair i").add_class("pair-slider")
        super().__init__([self.position, self.pair], figsize=(9, 3.4))
        self.readout = widgets.HTML("").add_class("rope-rotation-readout")
        self.children = (*self.children[:-1], self.readout, self.children[-1])
        self.circle_axes, self.dial_axes = self.figure.subplots(1, 2, width_ratios=[1, 2.4])

        circle = self.circle_axes
        angles = np.linspace(0, 2 * math.pi, 200)
        circle.plot(np.cos(angles), np.sin(angles), color="0.8", linewidth=1)
        circle.axhline(0, color="0.9", linewidth=0.8, zorder=0)
        circle.axvline(0, color="0.9", linewidth=0.8, zorder=0)
        circle.plot([1], [0], "o", color="0.6", markersize=5)  # where every pair starts, position 0
        (self.trail,) = circle.plot([], [], ".", color="tab:blue", markersize=4, alpha=0.6)
        (self.arrow,) = circle.plot([], [], "-", color="crimson", linewidth=2.5)
        (self.tip,) = circle.plot([], [], "o", color="crimson", markersize=7)
        circle.set_xlim(-1.25, 1.25)
        circle.set_ylim(-1.25, 1.25)
        circle.set_aspect("equal")
        circle.set_xlabel("$x_{2i}$")
        circle.set_ylabel("$x_{2i+1}$")

        dials = self.dial_axes
        n_pairs = head_dim // 2
        self.dial_centres = np.arange(n_pairs) * 2.6
        for centre in self.dial_centres:
            dials.plot(centre + np.cos(angles), np.sin(angles), color="0.8", linewidth=1)
        (self.hands,) = dials.plot([], [], "-", color="tab:blue", linewidth=2)
        (self.chosen_hand,) = dials.plot([], [], "-", color="crimson", linewidth=3)
        self.dial_labels = [dials.text(c, -1.45, "", ha="center", va="top", fontsize=8) for c in self.dial_centres]
        dials.set_xlim(-1.3, self.dial_centres[-1] + 1.3)
        dials.set_ylim(-2.0, 1.3)
        dials.set_aspect("equal")
        dials.axis("off")
        self.rotated = None
        self.theta = None
        self.refresh()

    def update(self) -> None:
        d, m, i = self.head_dim, self.position.value, self.pair.value
        theta = expect_tensor("rope_frequencies", call_learner(self.rope_frequencies, d, self.base), (d // 2,))
        rotated = expect_tensor(
            "apply_rope",
            call_learner(self.apply_rope, _unit_pairs(m + 1, d), torch.arange(m + 1), self.base),
            (m + 1, d),
        )
        self.theta, self.rotated = theta, rotated
        pair_path = rotated[:, 2 * i : 2 * i + 2].numpy()  # (m + 1, 2): the pair at positions 0 .. m
        x, y = pair_path[-1]
        self.trail.set_data(pair_path[:, 0], pair_path[:, 1])
        self.arrow.set_data([0, x], [0, y])
        self.tip.set_data([x], [y])
        angle = m * float(theta[i])
        self.circle_axes.set_title(f"pair {i} (dims {2 * i}, {2 * i + 1}) at m = {m}", fontsize=10)

        now = rotated[-1].numpy()
        xs, ys = [], []
        for centre, (cx, cy) in zip(self.dial_centres, now.reshape(-1, 2)):
            xs += [centre, centre + cx, np.nan]
            ys += [0.0, cy, np.nan]
        self.hands.set_data(xs, ys)
        self.chosen_hand.set_data([self.dial_centres[i], self.dial_centres[i] + now[2 * i]], [0, now[2 * i + 1]])
        for j, label in enumerate(self.dial_labels):
            label.set_text(f"i={j}\nθ={float(theta[j]):.2g}")
            label.set_color("crimson" if j == i else "0.3")
        self.dial_axes.set_title(f"all {d // 2} pairs at position m = {m}", fontsize=10)
        self.readout.value = (
            f"θ<sub>{i}</sub> = {self.base:g}<sup>-{2 * i}/{d}</sup> = {float(theta[i]):.4g}; "
            f"angle m·θ<sub>{i}</sub> = {m} × {float(theta[i]):.4g} = <b>{angle:.3f} rad</b> "
            f"({math.degrees(angle):.1f}°, {angle / (2 * math.pi):.2f} turns). "
            f"Your <code>apply_rope</code> turned (1, 0) into <b>({x:.3f}, {y:.3f})</b>; "
            f"(cos, sin) of the angle is ({math.cos(angle):.3f}, {math.sin(angle):.3f})."
        )


# ---------------------------------------------------------------- score vs (m, n)


def _worked_example():
    """One pair with θ = 0.5: d = 4 and base = 4 give θ = (1, 0.5); pair 0 stays zero."""
    return torch.tensor([0.0, 0.0, 1.0, 2.0]), torch.tensor([0.0, 0.0, 3.0, 1.0]), 4.0


def _random_example(head_dim: int = 64, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(head_dim, generator=generator), torch.randn(head_dim, generator=generator), 10000.0


class RelativeScores(Explorer):
    """The score of q at position m against k at position n, for every (m, n).

    Every diagonal (cells with the same m - n) holds one value: RoPE makes the
    score depend on the distance only. The right panel plots all the cells
    against m - n, where they fall onto one curve. "shift both by" moves every
    position by the same amount: nothing changes.
    """

    css_class = "rope-scores"
    EXAMPLES = {
        "worked example: one pair, θ = 0.5": _worked_example,
        "random q, k with d = 64": _random_example,
    }

    def __init__(self, apply_rope, n_positions: int = 16):
        if self.skip_while_graded():
            return
        self.apply_rope, self.n_positions = apply_rope, n_positions
        N = n_positions
        compact = dict(style={"description_width": "initial"}, layout=widgets.Layout(width="210px"))
        self.example = widgets.Dropdown(
            options=list(self.EXAMPLES),
            description="q and k",
            style={"description_width": "initial"},
            layout=widgets.Layout(width="290px"),
        ).add_class("example-choice")
        self.query_position = widgets.IntSlider(3, min=0, max=N - 1, description="m", **compact).add_class("m-slider")
        self.key_position = widgets.IntSlider(1, min=0, max=N - 1, description="n", **compact).add_class("n-slider")
        self.offset = widgets.IntSlider(0, min=0, max=3000, step=100, description="shift both by", **compact).add_class(
            "offset-slider"
        )
        super().__init__([self.example, self.query_position, self.key_position, self.offset], figsize=(9, 3.8))
        self.readout = widgets.HTML("").add_class("rope-scores-readout")
        self.children = (*self.children[:-1], self.readout, self.children[-1])
        self.heat_axes, self.curve_axes = self.figure.subplots(1, 2, width_ratios=[1, 1.25])
        self.image = self.heat_axes.imshow(np.zeros((N, N)), cmap="RdBu_r", vmin=-1, vmax=1)
        self.figure.colorbar(self.image, ax=self.heat_axes, shrink=0.85)
        self.cell_box = Rectangle((0.5, 2.5), 1, 1, fill=False, edgecolor="black", linewidth=2)
        self.heat_axes.add_patch(self.cell_box)
        self.heat_axes.set_xlabel("key position n")
        self.heat_axes.set_ylabel("query position m")
        self.ticks = list(range(0, N, 3))
        (self.cloud,) = self.curve_axes.plot([], [], "o", color="tab:blue", markersize=4, alpha=0.5)
        (self.chosen,) = self.curve_axes.plot(
            [], [], "o", markersize=11, markerfacecolor="none", markeredgecolor="black", markeredgewidth=2
        )
        self.curve_axes.axvline(0, color="0.85", linewidth=0.8, zorder=0)
        self.curve_axes.set_xlabel("distance m − n")
        self.curve_axes.set_ylabel("score q·k")
        self.curve_axes.set_xlim(-N, N)
        self.curve_axes.set_title(f"all {N}×{N} cells against m − n", fontsize=10)
        self.scores = None
        self.refresh()

    def rotated(self, vector: torch.Tensor, positions: torch.Tensor, base: float) -> torch.Tensor:
        N, d = len(positions), vector.shape[-1]
        out = call_learner(self.apply_rope, vector.expand(N, d).clone(), positions, base)
        return expect_tensor("apply_rope", out, (N, d))

    def update(self) -> None:
        N = self.n_positions
        q, k, base = self.EXAMPLES[self.example.value]()
        first = self.offset.value
        positions = torch.arange(first, first + N)
        scores = self.rotated(q, positions, base) @ self.rotated(k, positions, base).T  # (N, N): [m, n]
        self.scores = scores
        m, n = self.query_position.value, self.key_position.value
        # 3 digits: shifting both positions changes the scores only by rounding noise
        limit = float(f"{float(scores.abs().max()):.3g}") or 1.0
        self.image.set_data(scores.numpy())
        self.image.set_clim(-limit, limit)
        self.cell_box.set_xy((n - 0.5, m - 0.5))
        labels = [str(first + t) for t in self.ticks]
        self.heat_axes.set_xticks(self.ticks, labels, rotation=45 if first else 0, fontsize=8)
        self.heat_axes.set_yticks(self.ticks, labels, fontsize=8)
        self.heat_axes.set_title("score of q at m against k at n", fontsize=10)

        distance = (torch.arange(N)[:, None] - torch.arange(N)[None, :]).flatten()
        self.cloud.set_data(distance.numpy(), scores.flatten().numpy())
        self.chosen.set_data([m - n], [float(scores[m, n])])
        self.curve_axes.set_ylim(-1.1 * limit, 1.1 * limit)

        diagonal = torch.diagonal(scores, offset=n - m)  # every cell with the same m - n
        self.diagonal_spread = float(diagonal.max() - diagonal.min())
        self.readout.value = (
            f"q at position {first + m}, k at position {first + n} (distance m − n = {m - n}): "
            f"score <b>{float(scores[m, n]):.3f}</b>. The {len(diagonal)} cells with m − n = {m - n} "
            f"range over {self.diagonal_spread:.1e}: the score depends on the distance only."
        )


# ---------------------------------------------------------------- neighbour vs half-split


class PairingExplorer(Explorer):
    """Which dimensions are paired: neighbours (2i, 2i+1) and half-split (i, i + d/2).

    Top row: the dimensions of a head in the neighbour layout, coloured by
    pair. Bottom row: where the learner's ``neighbour_to_half_split`` puts each
    of them; in the half-split layout pair i sits at slots i and i + d/2. The
    chosen pair is framed in both rows.
    """

    css_class = "rope-pairing"
    HEAD_DIMS = (4, 8, 16)

    def __init__(self, neighbour_to_half_split, head_dim: int = 8):
        if self.skip_while_graded():
            return
        self.neighbour_to_half_split = neighbour_to_half_split
        self.head_dim = widgets.ToggleButtons(options=self.HEAD_DIMS, value=head_dim, description="head_dim").add_class(
            "head-dim-choice"
        )
        self.head_dim.style.button_width = "3em"
        self.pair = widgets.IntSlider(1, min=0, max=head_dim // 2 - 1, description="pair i").add_class("pair-slider")
        self._adjusting = False
        super().__init__([self.head_dim, self.pair], figsize=(9, 2.9))
        self.readout = widgets.HTML("").add_class("rope-pairing-readout")
        self.children = (*self.children[:-1], self.readout, self.children[-1])
        axes = self.axes = self.figure.subplots()
        colours = dict(cmap=PAIR_COLOURS, vmin=-0.5, vmax=PAIR_COLOURS.N - 0.5, aspect="auto", interpolation="nearest")
        self.top = axes.imshow(np.zeros((1, 8)), extent=(0, 8, 2, 3), **colours)
        self.bottom = axes.imshow(np.zeros((1, 8)), extent=(0, 8, 0, 1), **colours)
        biggest = max(self.HEAD_DIMS)
        self.top_texts = [axes.text(0, 2.5, "", ha="center", va="center", fontsize=9) for _ in range(biggest)]
        self.bottom_texts = [axes.text(0, 0.5, "", ha="center", va="center", fontsize=9) for _ in range(biggest)]
        self.links = LineCollection([], linewidths=1.5)
        axes.add_collection(self.links)
        self.frames = [Rectangle((0, 0), 1, 1, fill=False, edgecolor="black", linewidth=2.5) for _ in range(4)]
        for frame in self.frames:
            axes.add_patch(frame)
        axes.set_ylim(-0.1, 3.1)
        axes.set_yticks([0.5, 2.5], ["half-split\n(i, i + d/2)", "neighbour\n(2i, 2i+1)"])
        axes.tick_params(length=0)
        for side in axes.spines.values():
            side.set_visible(False)
        axes.set_xticks([])
        self.permutation = None
        self.refresh()

    def _on_change(self, change=None) -> None:
        if not self._adjusting:
            super()._on_change(change)

    def update(self) -> None:
        d = self.head_dim.value
        if self.pair.max != d // 2 - 1:
            self._adjusting = True  # clamping the slider must not start a second update
            try:
                self.pair.max = d // 2 - 1
            finally:
                self._adjusting = False
        i = self.pair.value
        moved = expect_tensor(
            "neighbour_to_half_split",
            call_learner(self.neighbour_to_half_split, torch.arange(d, dtype=torch.float64)),
            (d,),
        )
        permutation = moved.round().long()  # slot k of the result holds dimension permutation[k]
        if sorted(permutation.tolist()) != list(range(d)) or not torch.equal(moved, permutation.double()):
            raise LearnerFunctionProblem(
                f"`neighbour_to_half_split(torch.arange({d}.0))` returned {moved.tolist()}: it should "
                f"reorder the numbers 0 .. {d - 1}, each appearing once."
            )
        self.permutation = permutation
        top = np.arange(d) // 2
        bottom = (permutation // 2).numpy()
        self.top.set_data(top[None, :])
        self.top.set_extent((0, d, 2, 3))
        self.bottom.set_data(bottom[None, :])
        self.bottom.set_extent((0, d, 0, 1))
        for j, (upper, lower) in enumerate(zip(self.top_texts, self.bottom_texts)):
            upper.set_visible(j < d)
            lower.set_visible(j < d)
            if j < d:
                upper.set_position((j + 0.5, 2.5))
                upper.set_text(str(j))
                lower.set_position((j + 0.5, 0.5))
                lower.set_text(str(int(permutation[j])))
        self.links.set_segments([[(int(source) + 0.5, 2), (slot + 0.5, 1)] for slot, source in enumerate(permutation)])
        self.links.set_colors(
            [("black" if int(source) // 2 == i else PAIR_COLOURS(int(source) // 2)) for source in permutation]
        )
        self.links.set_linewidths([3.0 if int(source) // 2 == i else 1.2 for source in permutation])
        slots = [int((permutation == 2 * i + c).nonzero()[0]) for c in (0, 1)]
        for frame, (x, y) in zip(self.frames, [(2 * i, 2), (2 * i + 1, 2), (slots[0], 0), (slots[1], 0)]):
            frame.set_xy((x, y))
        self.axes.set_xlim(-0.05, d + 0.05)
        expected = [i, i + d // 2]
        verdict = (
            "✓ as in the half-split layout"
            if slots == expected
            else f"✗ the half-split layout puts it at slots ({expected[0]}, {expected[1]})"
        )
        self.readout.value = (
            f"pair {i}: dimensions ({2 * i}, {2 * i + 1}) in the neighbour layout go to slots "
            f"<b>({slots[0]}, {slots[1]})</b> through your <code>neighbour_to_half_split</code>, {verdict}. "
            f"Your reordering: {permutation.tolist()}."
        )
