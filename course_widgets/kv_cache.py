"""Widgets for notebook 08: a KV cache filling step by step, and the memory it holds.

Both run the learner's own ``KVCache`` and ``attend_with_cache`` on a small
``GroupedQueryAttention`` (the class is passed in, like the functions: widgets
never import the reference solutions).
"""

from __future__ import annotations

import ipywidgets as widgets
import numpy as np
import torch
from matplotlib.colors import ListedColormap

from .base import Explorer, LearnerFunctionProblem, call_learner

EMPTY, READ, NEW = 0, 1, 2
CELL_COLOURS = ListedColormap(["white", "tab:blue", "tab:orange"])


def cache_tensor_bytes(cache) -> int:
    """The bytes of every tensor a cache object holds (in its attributes, dicts, lists, tuples), each storage once."""
    storages: dict[int, int] = {}
    seen: set[int] = set()

    def visit(value) -> None:
        if id(value) in seen:
            return
        seen.add(id(value))
        if isinstance(value, torch.Tensor):
            storage = value.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
        elif isinstance(value, dict):
            for item in value.values():
                visit(item)
        elif isinstance(value, (list, tuple)):
            for item in value:
                visit(item)
        elif hasattr(value, "__dict__") and not isinstance(value, type):
            for item in vars(value).values():
                visit(item)

    visit(cache)
    return sum(storages.values())


class _Recorder:
    """Wraps a cache's ``update`` to note, per call, the new and the returned (k, v) shapes."""

    def __init__(self, cache):
        self.calls: list[tuple[tuple, tuple]] = []
        original = cache.update

        def update(layer, k, v):
            result = original(layer, k, v)
            if not (
                isinstance(result, (tuple, list))
                and len(result) == 2
                and all(isinstance(t, torch.Tensor) for t in result)
            ):
                raise LearnerFunctionProblem(
                    f"`KVCache.update` returned {type(result).__name__}; it should return the layer's full (k, v)."
                )
            self.calls.append((tuple(k.shape), tuple(result[0].shape)))
            return result

        cache.update = update


def _seeded_layer(GroupedQueryAttention, d_model, n_heads, n_kv_heads, seed, dtype=torch.float32):
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        layer = GroupedQueryAttention(d_model, n_heads, n_kv_heads)
    return layer.to(dtype).eval()


def _new_cache(KVCache):
    return call_learner(KVCache)


class CacheFilling(Explorer):
    """One attention layer (H = 4, G = 2) generating: the prompt at step 0, then one token per step.

    The grid shows, for each key and value head (rows) and position (columns),
    what the learner's cache returned in the chosen step: computed in this step
    (orange), read back from the cache (blue), or not there yet (white). The
    right panel counts the key/value vectors computed so far, with and without
    a cache. The output of every step is compared with one full forward pass.
    """

    css_class = "cache-filling"
    D_MODEL, N_HEADS, N_KV_HEADS = 16, 4, 2
    MAX_PROMPT, MAX_STEPS = 6, 10

    def __init__(self, KVCache, attend_with_cache, GroupedQueryAttention, prompt: int = 4, step: int = 3):
        if self.skip_while_graded():
            return
        self.KVCache, self.attend_with_cache = KVCache, attend_with_cache
        self.step = widgets.IntSlider(step, min=0, max=self.MAX_STEPS, description="step").add_class("step-slider")
        self.prompt = widgets.IntSlider(prompt, min=1, max=self.MAX_PROMPT, description="prompt").add_class(
            "prompt-slider"
        )
        super().__init__([self.step, self.prompt], figsize=(9.5, 3.2))
        self.layer = _seeded_layer(GroupedQueryAttention, self.D_MODEL, self.N_HEADS, self.N_KV_HEADS, seed=8)
        self.x = torch.randn(
            1, self.MAX_PROMPT + self.MAX_STEPS, self.D_MODEL, generator=torch.Generator().manual_seed(8)
        )
        with torch.no_grad():
            self.full = self.layer(self.x)  # one causal forward pass over every position
        self.summary = widgets.HTML("").add_class("filling-summary")
        self.children = (*self.children[:-1], self.summary, self.children[-1])
        self.grid_axes, self.count_axes = self.figure.subplots(1, 2, width_ratios=[2.2, 1])
        self.max_rows = 2 * self.N_HEADS  # room for a cache that (wrongly) keeps all H heads
        self.max_columns = self.MAX_PROMPT + self.MAX_STEPS
        self.image = self.grid_axes.imshow(
            np.zeros((self.max_rows, self.max_columns)),
            cmap=CELL_COLOURS,
            vmin=0,
            vmax=2,
            aspect="auto",
            interpolation="nearest",
        )
        self.grid_axes.set_xticks(range(self.max_columns))
        self.grid_axes.set_xlabel("position")
        self.grid_axes.set_xticks(np.arange(-0.5, self.max_columns), minor=True)
        self.grid_axes.set_yticks(np.arange(-0.5, self.max_rows), minor=True)
        self.grid_axes.grid(which="minor", color="0.8", linewidth=0.5)
        self.grid_axes.tick_params(which="minor", length=0)
        for colour, label in ((NEW, "computed in this step"), (READ, "read from the cache")):
            self.grid_axes.bar(0, 0, color=CELL_COLOURS(colour), label=label)
        self.grid_axes.legend(loc="upper right", fontsize=8, framealpha=0.9)
        steps = np.arange(self.MAX_STEPS + 1)
        (self.cached_line,) = self.count_axes.plot([], [], "o-", color="tab:blue", markersize=3, label="with the cache")
        (self.uncached_line,) = self.count_axes.plot([], [], "o-", color="tab:red", markersize=3, label="without")
        self.count_axes.set_xlim(-0.5, self.MAX_STEPS + 0.5)
        self.count_axes.set_xticks(steps[::2])
        self.count_axes.set_xlabel("step")
        self.count_axes.set_ylabel("k, v vectors computed")
        self.count_axes.legend(loc="upper left", fontsize=8)
        self.calls: list = []
        self.refresh()

    def run(self, prompt: int, last_step: int):
        """The learner's cache and attention from step 0 to ``last_step``: (update calls, largest error)."""
        cache = _new_cache(self.KVCache)
        recorder = _Recorder(cache)
        outputs = []
        with torch.no_grad():
            for step in range(last_step + 1):
                start, T_new = (0, prompt) if step == 0 else (prompt + step - 1, 1)
                positions = torch.arange(start, start + T_new)
                out = call_learner(
                    self.attend_with_cache, self.layer, self.x[:, start : start + T_new], positions, cache, 0
                )
                if not isinstance(out, torch.Tensor) or tuple(out.shape) != (1, T_new, self.D_MODEL):
                    shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
                    raise LearnerFunctionProblem(
                        f"`attend_with_cache` returned {shape} for {T_new} new token(s); expected "
                        f"(B, T_new, D) = (1, {T_new}, {self.D_MODEL})."
                    )
                outputs.append(out)
        if len(recorder.calls) != last_step + 1:
            raise LearnerFunctionProblem(
                f"`attend_with_cache` called cache.update {len(recorder.calls)} times in {last_step + 1} steps; "
                "it should call it once per step."
            )
        total = prompt + last_step
        error = float((torch.cat(outputs, dim=1) - self.full[:, :total]).abs().max())
        return recorder.calls, error

    def update(self) -> None:
        prompt, step = self.prompt.value, self.step.value
        calls, error = self.run(prompt, step)
        self.calls = calls
        new_shape, full_shape = calls[-1]
        heads, S, T_new = full_shape[1], full_shape[2], new_shape[2]
        grid = np.zeros((self.max_rows, self.max_columns))
        rows = min(2 * heads, self.max_rows)
        columns = min(S, self.max_columns)
        grid[:rows, :columns] = READ
        grid[:rows, max(0, columns - T_new) : columns] = NEW
        self.image.set_data(grid)
        labels = [f"{kind} head {g}" for kind in ("key", "value") for g in range(heads)][:rows]
        self.grid_axes.set_yticks(range(rows), labels)
        if self.grid_axes.get_ylim() != (rows - 0.5, -0.5):  # only the rows the cache holds
            self.grid_axes.set_ylim(rows - 0.5, -0.5)
        self.grid_axes.set_title(f"step {step}: the cache returned {S} positions, {T_new} of them new", fontsize=10)
        computed_cached = np.cumsum([prompt] + [1] * step)
        computed_uncached = np.cumsum([prompt + s for s in range(step + 1)])
        self.cached_line.set_data(range(step + 1), computed_cached)
        self.uncached_line.set_data(range(step + 1), computed_uncached)
        top = sum(self.MAX_PROMPT + s for s in range(self.MAX_STEPS + 1))
        if self.count_axes.get_ylim() != (0, top * 1.05):
            self.count_axes.set_ylim(0, top * 1.05)
        self.summary.value = self.describe(
            prompt, step, heads, S, T_new, error, int(computed_cached[-1]), int(computed_uncached[-1])
        )

    def describe(self, prompt, step, heads, S, T_new, error, cached, uncached) -> str:
        what = (
            "the prompt: all of its positions computed at once"
            if step == 0
            else f"the new token at position {prompt + step - 1}"
        )
        verdict = (
            "matches one full forward pass"
            if error < 1e-4
            else "<b>differs from one full forward pass</b>: check positions, mask and cache"
        )
        heads_note = (
            ""
            if heads == self.N_KV_HEADS
            else f" <b>The cache holds {heads} heads, not the {self.N_KV_HEADS} kv heads</b>: cache before repeat_kv."
        )
        return (
            f"Step {step}, {what}: {T_new} key and value vector{'s' if T_new > 1 else ''} per kv head computed, "
            f"{S - T_new} read from the cache (S = {S}). Your output {verdict} (largest difference "
            f"{error:.1e}). Key/value vectors computed so far: {cached:,} with the cache, {uncached:,} "
            f"without.{heads_note}"
        )


class CacheMemory(Explorer):
    """Cache bytes against tokens for a 4-layer stack (H = 8 heads of 16) as MHA, GQA (G = 2) and MQA.

    Lines: the learner's ``kv_cache_bytes``. Dots: the bytes the learner's
    ``KVCache`` really holds after ``attend_with_cache`` ran the chosen number of
    tokens through every layer.
    """

    css_class = "cache-memory"
    N_LAYERS, N_HEADS, HEAD_DIM = 4, 8, 16
    VARIANTS = {"MHA": 8, "GQA": 2, "MQA": 1}
    COLOURS = {"MHA": "tab:red", "GQA": "tab:blue", "MQA": "tab:green"}
    TOKENS = (32, 64, 128, 256, 512)
    DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}

    def __init__(self, KVCache, attend_with_cache, GroupedQueryAttention, kv_cache_bytes, tokens: int = 128):
        if self.skip_while_graded():
            return
        self.KVCache, self.attend_with_cache, self.kv_cache_bytes = KVCache, attend_with_cache, kv_cache_bytes
        self.GroupedQueryAttention = GroupedQueryAttention
        self.tokens = widgets.SelectionSlider(options=self.TOKENS, value=tokens, description="tokens").add_class(
            "tokens-slider"
        )
        self.dtype = widgets.ToggleButtons(options=list(self.DTYPES), value="float32").add_class("dtype-toggle")
        self.dtype.style.button_width = "80px"
        super().__init__([self.tokens, self.dtype], figsize=(8, 3.4))
        self._layers: dict = {}
        self.summary = widgets.HTML("").add_class("memory-summary")
        self.children = (*self.children[:-1], self.summary, self.children[-1])
        self.axes = self.figure.subplots()
        self.lines, self.dots = {}, {}
        for variant, colour in self.COLOURS.items():
            (self.lines[variant],) = self.axes.plot(
                [], [], "-", color=colour, label=f"{variant} (G = {self.VARIANTS[variant]})"
            )
            (self.dots[variant],) = self.axes.plot([], [], "o", color=colour, markersize=8, markeredgecolor="black")
        self.axes.plot([], [], "o", color="0.5", markeredgecolor="black", label="your KVCache, measured")
        self.axes.legend(loc="upper left", fontsize=8)
        self.axes.set_xlim(0, self.TOKENS[-1] * 1.04)
        self.axes.set_ylim(0, 2 * self.N_LAYERS * self.N_HEADS * self.HEAD_DIM * self.TOKENS[-1] * 4 / 2**20 * 1.08)
        self.axes.set_xlabel("tokens in the cache")
        self.axes.set_ylabel("KV cache (MiB)")
        self.axes.grid(True, alpha=0.3)
        self.measured: dict = {}
        self.predicted: dict = {}
        self.refresh()

    def layers(self, n_kv_heads: int, dtype):
        key = (n_kv_heads, dtype)
        if key not in self._layers:
            self._layers[key] = [
                _seeded_layer(
                    self.GroupedQueryAttention,
                    self.N_HEADS * self.HEAD_DIM,
                    self.N_HEADS,
                    n_kv_heads,
                    seed=i,
                    dtype=dtype,
                )
                for i in range(self.N_LAYERS)
            ]
        return self._layers[key]

    def measure(self, n_kv_heads: int, n_tokens: int, dtype) -> int:
        """Bytes the learner's cache holds after a prompt of ``n_tokens`` went through every layer."""
        cache = _new_cache(self.KVCache)
        x = torch.randn(1, n_tokens, self.N_HEADS * self.HEAD_DIM, generator=torch.Generator().manual_seed(0))
        x = x.to(dtype)
        with torch.no_grad():
            for index, layer in enumerate(self.layers(n_kv_heads, dtype)):
                x = call_learner(self.attend_with_cache, layer, x, torch.arange(n_tokens), cache, index)
                if not isinstance(x, torch.Tensor) or x.shape != (1, n_tokens, self.N_HEADS * self.HEAD_DIM):
                    raise LearnerFunctionProblem("`attend_with_cache` should return (B, T_new, D) for the new tokens.")
        return cache_tensor_bytes(cache)

    def predict(self, n_kv_heads: int, n_tokens: int, bytes_per_value: int) -> float:
        value = call_learner(
            self.kv_cache_bytes,
            self.N_LAYERS,
            n_kv_heads,
            self.HEAD_DIM,
            n_tokens,
            batch_size=1,
            bytes_per_value=bytes_per_value,
        )
        try:
            return float(value)
        except (TypeError, ValueError):
            raise LearnerFunctionProblem(
                f"`kv_cache_bytes` returned {type(value).__name__}; it should return a number of bytes."
            ) from None

    def update(self) -> None:
        n_tokens, dtype = self.tokens.value, self.DTYPES[self.dtype.value]
        size = torch.tensor([], dtype=dtype).element_size()
        xs = np.linspace(0, self.TOKENS[-1], 9)
        for variant, g in self.VARIANTS.items():
            curve = [self.predict(g, int(n), size) for n in xs]
            self.predicted[variant] = self.predict(g, n_tokens, size)
            self.measured[variant] = self.measure(g, n_tokens, dtype)
            self.lines[variant].set_data(xs, np.array(curve) / 2**20)
            self.dots[variant].set_data([n_tokens], [self.measured[variant] / 2**20])
        self.axes.set_title(
            f"{self.N_LAYERS} layers, H = {self.N_HEADS} query heads of {self.HEAD_DIM}, "
            f"{self.dtype.value} ({size} bytes a value)",
            fontsize=10,
        )
        self.summary.value = self.describe(n_tokens, size)

    def describe(self, n_tokens: int, size: int) -> str:
        parts = []
        for variant, g in self.VARIANTS.items():
            measured, predicted = self.measured[variant], self.predicted[variant]
            mark = "=" if measured == predicted else "<b>≠</b>"
            parts.append(
                f"{variant} (G = {g}): your cache holds <b>{measured:,}</b> bytes {mark} "
                f"kv_cache_bytes {int(predicted):,}"
            )
        return f"{n_tokens} tokens, {size} bytes a value. " + " · ".join(parts) + "."
