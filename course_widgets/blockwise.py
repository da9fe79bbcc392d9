"""Widget and measurements for notebook 09: attention one block of keys at a time.

``BlockStepper``: one query's keys, block by block. Each block's partial result (its own max, its
sum of exponentials, its weighted values) is merged into the running one with the learner's own
``merge_partials``; the figure shows the running max, the weights exp(s - m) / ℓ so far and the
partial output o / ℓ after each block, and after the last block the weights are the softmax's.

``working_memory``: the most bytes of tensors a call holds at once besides its inputs and what it
returns, counted from PyTorch's own allocations. ``peak_resident_mb``: the process's peak resident
memory during a call, as the operating system counts it (Linux), to check that count against.
"""

from __future__ import annotations

import math
import weakref
from pathlib import Path

import ipywidgets as widgets
import numpy as np
import torch

from .base import Explorer, LearnerFunctionProblem, call_learner, expect_tensor
from .compat import TensorDispatchMode
from .plots import nice_ceiling

BLOCK_COLOURS = ("tab:blue", "tab:orange")
WAITING = "0.85"  # a key whose block is not merged yet


# ---------------------------------------------------------------- measuring memory


class _Allocations(TensorDispatchMode):
    """Every storage an operation creates while the mode is on, and when it is freed again."""

    def __init__(self):
        super().__init__()
        self.events: list[tuple[int, int]] = []  # (allocation number, +bytes or -bytes), in order
        self.pointers: dict[int, int] = {}  # data pointer -> allocation number, while alive
        self.sizes: dict[int, int] = {}  # allocation number -> bytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        given = {s.data_ptr() for s in _storages([*args, *(kwargs or {}).values()])}
        for storage in _storages(result):
            if storage.data_ptr() not in given:  # not a view of an argument, nor the argument written in place
                self._note(storage)
        return result

    def _note(self, storage) -> None:
        pointer = storage.data_ptr()
        if pointer in self.pointers or storage.nbytes() == 0:
            return  # counted already (a view of an earlier result), or empty
        number = len(self.sizes)
        self.pointers[pointer] = number
        self.sizes[number] = storage.nbytes()
        self.events.append((number, storage.nbytes()))
        weakref.finalize(storage, self._freed, pointer, number)

    def _freed(self, pointer: int, number: int) -> None:
        if self.pointers.get(pointer) == number:
            del self.pointers[pointer]
            self.events.append((number, -self.sizes[number]))

    def peak_without(self, kept: set[int]) -> int:
        """The most bytes alive at once, leaving out the allocations ``kept`` (the result's)."""
        alive = peak = 0
        for number, change in self.events:
            if number not in kept:
                alive += change
                peak = max(peak, alive)
        return peak


def _storages(value) -> list:
    if isinstance(value, torch.Tensor):
        return [value.untyped_storage()]
    if isinstance(value, (tuple, list)):
        return [storage for item in value for storage in _storages(item)]
    return []


def working_memory(function, *args, **kwargs) -> tuple:
    """(result, bytes): what ``function(*args, **kwargs)`` returns, and the most bytes of tensors it held
    at once besides its inputs and what it returned (its scores, weights, blocks: its working memory)."""
    counter = _Allocations()
    with counter:
        result = function(*args, **kwargs)
    kept = {counter.pointers[s.data_ptr()] for s in _storages(result) if s.data_ptr() in counter.pointers}
    return result, counter.peak_without(kept)


def peak_resident_mb(function, *args, **kwargs) -> float | None:
    """How far the process's resident memory rose above where it stood during ``function(*args, **kwargs)``,
    in MB, as Linux counts it (the peak is reset first through /proc/self/clear_refs); None elsewhere."""
    status, clear = Path("/proc/self/status"), Path("/proc/self/clear_refs")

    def read(field: str) -> float:
        line = next(line for line in status.read_text().splitlines() if line.startswith(field + ":"))
        return int(line.split()[1]) / 1024

    try:
        clear.write_text("5")  # 5: reset the peak resident set size to the current one
        before = read("VmRSS")
    except (OSError, StopIteration):
        return None
    function(*args, **kwargs)
    return read("VmHWM") - before


# ---------------------------------------------------------------- the widget


def _block_partial(scores: torch.Tensor, values: torch.Tensor) -> tuple:
    """One block's own partial result for one query: (its max, its sum of exp(s - max), its weighted values),
    shaped (1, 1), (1, 1), (1, d_v) as merge_partials takes them."""
    block_max = scores.max()
    exponentials = torch.exp(scores - block_max)
    return block_max.reshape(1, 1), exponentials.sum().reshape(1, 1), (exponentials @ values).reshape(1, -1)


class BlockStepper(Explorer):
    """One query's keys in blocks of ``block size``, merged one block at a time with the learner's
    ``merge_partials``; ``softmax`` (notebook 01's) gives the weights the merged result must reach.

    ``x`` (S, d) are the tokens' queries and keys (equal, as in the worked example), ``v`` (S, 2)
    their values, drawn as points in the plane. Step 0 is the empty partial (m = -inf, ℓ = 0,
    o = 0); step j has merged the first j blocks.
    """

    css_class = "block-stepper"

    def __init__(self, merge_partials, softmax, x, v, query: int = 5, block_size: int = 3, step: int = 1, tokens=None):
        if self.skip_while_graded():
            return
        self.merge_partials, self.softmax = merge_partials, softmax
        self.x = torch.as_tensor(x, dtype=torch.float64)
        self.v = torch.as_tensor(v, dtype=torch.float64)
        S = self.x.shape[0]
        self.tokens = list(tokens) if tokens is not None else [f"token {s}" for s in range(S)]
        self.query = widgets.Dropdown(
            options=[(f"{t}: {name}", t) for t, name in enumerate(self.tokens)],
            value=query,
            description="query",
            layout={"width": "200px"},
        ).add_class("query-picker")
        wide_label = {"description_width": "initial"}
        self.block_size = widgets.IntSlider(
            block_size, min=1, max=S, description="block size", style=wide_label
        ).add_class("block-size-slider")
        self.step = widgets.IntSlider(
            step, min=0, max=math.ceil(S / block_size), description="blocks merged", style=wide_label
        ).add_class("step-slider")
        super().__init__([self.query, self.block_size, self.step], figsize=(9, 3.4))
        self.summary = widgets.HTML("").add_class("stepper-summary")
        self.children = (*self.children[:-1], self.summary, self.children[-1])
        self.score_axes, self.weight_axes, self.output_axes = self.figure.subplots(1, 3, width_ratios=[1.1, 1.1, 1])
        keys = range(S)
        self.score_bars = self.score_axes.bar(keys, [0.0] * S, color=WAITING)
        (self.max_line,) = self.score_axes.plot([-0.5, S - 0.5], [0, 0], color="crimson", linewidth=2)
        self.max_text = self.score_axes.text(S - 0.5, 0, "", ha="right", va="bottom", color="crimson", fontsize=9)
        self.score_axes.axhline(0, color="0.5", linewidth=0.8)
        self.score_axes.set_title("scores q·k/√d")
        self.weight_bars = self.weight_axes.bar(keys, [0.0] * S, color=WAITING)
        (self.softmax_marks,) = self.weight_axes.plot(
            keys, [0.0] * S, linestyle="none", marker="_", markersize=14, markeredgewidth=2, color="black"
        )
        self.weight_axes.set_ylim(0, 1.05)
        self.weight_axes.set_title("weights so far, exp(s − m)/ℓ")
        for axes in (self.score_axes, self.weight_axes):
            axes.set_xticks(list(keys), [str(s) for s in keys])
            axes.set_xlabel("key")
            axes.set_xlim(-0.6, S - 0.4)
        self.boundaries = [self.score_axes.axvline(-10, color="0.3", linewidth=1, linestyle=":") for _ in keys]
        values = self.v.numpy()
        self.value_dots = self.output_axes.scatter(values[:, 0], values[:, 1], s=36, color=WAITING, zorder=2)
        for s, (a, b) in enumerate(values):
            self.output_axes.annotate(f"v{s}", (a, b), textcoords="offset points", xytext=(4, 3), fontsize=8)
        (self.path,) = self.output_axes.plot([], [], "o-", color="crimson", markersize=4, zorder=3)
        (self.target,) = self.output_axes.plot(
            [], [], marker="*", markersize=15, color="gold", markeredgecolor="black", linestyle="none", zorder=4
        )
        low, high = values.min(axis=0), values.max(axis=0)
        pad = 0.12 * (high - low) + 0.5
        self.output_axes.set_xlim(low[0] - pad[0], high[0] + pad[0])
        self.output_axes.set_ylim(low[1] - pad[1], high[1] + pad[1])
        self.output_axes.set_title("output so far, o/ℓ (★ final)")
        self.trail = []  # the running state (m, ℓ, o) after each merged block, for a test or a reader
        self.refresh()

    # -- what the learner's functions give
    def blocks(self) -> list[tuple[int, int]]:
        S, size = self.x.shape[0], self.block_size.value
        return [(start, min(start + size, S)) for start in range(0, S, size)]

    def scores(self) -> torch.Tensor:
        q = self.x[self.query.value]
        return self.x @ q / math.sqrt(self.x.shape[1])

    def merged(self, scores: torch.Tensor) -> list[tuple]:
        """The running (m, ℓ, o) after each block, merged with the learner's ``merge_partials``."""
        state = (torch.full((1, 1), -math.inf, dtype=torch.float64), torch.zeros(1, 1, dtype=torch.float64))
        state = (*state, torch.zeros(1, self.v.shape[1], dtype=torch.float64))
        trail = []
        for start, stop in self.blocks():
            result = call_learner(self.merge_partials, *state, *_block_partial(scores[start:stop], self.v[start:stop]))
            if not (isinstance(result, (tuple, list)) and len(result) == 3):
                raise LearnerFunctionProblem(
                    f"`merge_partials` returned {type(result).__name__}; it should return the three tensors (m, l, o)."
                )
            m, total, out = (
                expect_tensor("merge_partials", part, shape)
                for part, shape in zip(result, ((1, 1), (1, 1), (1, self.v.shape[1])))
            )
            state = (m, total, out)
            trail.append(state)
        return trail

    def update(self) -> None:
        blocks = self.blocks()
        if self.step.max != len(blocks):
            self.step.max = len(blocks)  # clamps the value too, which fires update() again
        step = min(self.step.value, len(blocks))
        scores = self.scores()
        trail = self.merged(scores)
        weights = expect_tensor("softmax", call_learner(self.softmax, scores), tuple(scores.shape))
        self.trail = trail
        done = blocks[step - 1][1] if step else 0  # keys 0 .. done - 1 are merged
        m, total, out = trail[step - 1] if step else (None, None, None)

        for s, bar in enumerate(self.score_bars):
            bar.set_height(float(scores[s]))
            block = next(i for i, (start, stop) in enumerate(blocks) if start <= s < stop)
            bar.set_color(BLOCK_COLOURS[block % 2] if s < done else WAITING)
        top = nice_ceiling(float(scores.abs().max()) * 1.15)
        self.score_axes.set_ylim(-top, top)
        starts = [start for start, _ in blocks[1:]]  # a dotted line before each block but the first
        for i, line in enumerate(self.boundaries):
            line.set_xdata([starts[i] - 0.5] * 2 if i < len(starts) else [-10.0] * 2)
        self.max_line.set_visible(step > 0)
        self.max_text.set_visible(step > 0)
        shown_weights = torch.zeros_like(scores)
        if step:
            self.max_line.set_ydata([float(m)] * 2)
            self.max_text.set_position((len(scores) - 0.5, float(m)))
            self.max_text.set_text(f"m = {float(m):.2f}")
            shown_weights[:done] = torch.exp(scores[:done] - m.reshape(())) / total.reshape(())
        for s, bar in enumerate(self.weight_bars):
            bar.set_height(float(shown_weights[s]) if math.isfinite(float(shown_weights[s])) else 0.0)
            bar.set_color(self.score_bars[s].get_facecolor())
        self.softmax_marks.set_ydata(weights.numpy())
        colours = [self.score_bars[s].get_facecolor() for s in range(len(scores))]
        self.value_dots.set_facecolor(colours)
        path = np.array([(o / t).reshape(-1).numpy() for _, t, o in trail[:step]]).reshape(-1, 2)
        self.path.set_data(path[:, 0], path[:, 1])
        final = (weights @ self.v).numpy()
        self.target.set_data([final[0]], [final[1]])
        self.summary.value = self._summary(blocks, step, scores, weights, trail)

    def _summary(self, blocks, step, scores, weights, trail) -> str:
        query = f"query {self.query.value} “{self.tokens[self.query.value]}”"
        if step == 0:
            return (
                f"{query}: nothing merged yet, the empty partial m = −∞, ℓ = 0, o = 0. "
                f"Move <b>blocks merged</b> to add its {len(blocks)} blocks of keys one at a time."
            )
        start, stop = blocks[step - 1]
        m, total, out = trail[step - 1]
        keys = f"key {start}" if stop - start == 1 else f"keys {start}–{stop - 1}"
        own_max = float(scores[start:stop].max())
        text = f"{query}, block {step} of {len(blocks)} ({keys}): its own max {own_max:.2f}. "
        if step > 1:
            before = float(trail[step - 2][0])
            if float(m) > before:
                text += (
                    f"The max rose from {before:.2f} to {float(m):.2f}, so the earlier sum and output were "
                    f"multiplied by exp({before:.2f} − {float(m):.2f}) = {math.exp(before - float(m)):.3f}. "
                )
            else:
                text += f"The max stays {float(m):.2f}: this block's sum and output were scaled by " + (
                    f"exp({own_max:.2f} − {float(m):.2f}) = {math.exp(own_max - float(m)):.3f}. "
                )
        output = (out / total).reshape(-1)
        text += (
            f"Now m = <b>{float(m):.2f}</b>, ℓ = <b>{float(total):.3f}</b>, o/ℓ = "
            f"<b>({float(output[0]):.2f}, {float(output[1]):.2f})</b>."
        )
        if step == len(blocks):
            final = torch.exp(scores - m.reshape(())) / total.reshape(())
            gap = float((final - weights).abs().max())
            if math.isfinite(gap) and gap < 1e-6:
                text += (
                    f" Every block merged: the weights exp(s − m)/ℓ equal the softmax's "
                    f"(largest difference {gap:.0e}), and o/ℓ is the attention output."
                )
            else:
                text += (
                    f" Every block merged, but the weights exp(s − m)/ℓ differ from the softmax's by {gap:.3g}: "
                    "check how your merge_partials rescales ℓ and o."
                )
        return text
