"""Widgets for notebook 06: the SiLU gate of SwiGLU, and the residual stream through depth."""

from __future__ import annotations

import contextlib
import math

import ipywidgets as widgets
import torch
import torch.nn.functional as F
from matplotlib.ticker import NullLocator

from .base import Explorer, LearnerFunctionProblem, call_learner, expect_tensor


@contextlib.contextmanager
def _one_thread():
    """Run torch on one thread: these tensors are tiny, and on a busy or shared
    machine (Binder) extra threads only wait for each other, 10 to 40 times slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _named(name: str, function):
    """``function`` under another name, so messages say `SwiGLU.forward` and not `forward`."""

    def wrapper(*args, **kwargs):
        return function(*args, **kwargs)

    wrapper.__name__ = name
    return wrapper


def _build(cls, *args):
    """An instance of the learner's class ``cls`` (its ``__init__`` may still be unimplemented)."""
    return call_learner(_named(f"{cls.__name__}.__init__", cls), *args)


def _load(module, state: dict, what: str) -> None:
    try:
        module.load_state_dict(state)
    except Exception as error:
        raise LearnerFunctionProblem(
            f"{what} could not take the weights this widget gives it; keep the contract's names "
            f"({', '.join(state)}) as nn.Linear layers without bias. ({type(error).__name__}: {error})"
        ) from None


class SiluGateExplorer(Explorer):
    """One hidden entry of SwiGLU: SiLU(x·W1) times the other branch x·W3.

    ``SwiGLU`` is the learner's class. The widget builds ``SwiGLU(2, 2)`` with
    weights chosen so that, for an input row (z, 1), hidden entry 0 is
    SiLU(z) · 1 and hidden entry 1 is SiLU(z) · u, and the down projection is
    the identity: the learner's own forward draws the SiLU curve and the gated
    product, for every z on the axis at once. ReLU and GELU are drawn beside
    them for comparison (torch's, not the learner's).
    """

    css_class = "silu-gate-explorer"
    Z_RANGE = (-4.0, 4.0)

    def __init__(self, SwiGLU, z: float = 2.0, up: float = 0.5, points: int = 161):
        if self.skip_while_graded():
            return
        self.SwiGLU = SwiGLU
        self.z = widgets.FloatSlider(
            z, min=-4.0, max=4.0, step=0.1, description="x·W1", readout_format=".1f"
        ).add_class("z-slider")
        self.up = widgets.FloatSlider(
            up, min=-1.5, max=1.5, step=0.05, description="x·W3", readout_format=".2f"
        ).add_class("up-slider")
        super().__init__([self.z, self.up], figsize=(8.5, 3.4))
        self.readout = widgets.HTML("").add_class("gate-readout")
        self.children = (*self.children[:-1], self.readout, self.children[-1])
        self.grid = torch.linspace(*self.Z_RANGE, points, dtype=torch.float64)
        self.axes = self.figure.subplots()
        grid = self.grid.numpy()
        self.axes.plot(grid, F.relu(self.grid).numpy(), color="0.6", linewidth=1.2, label="ReLU(z)")
        self.axes.plot(
            grid,
            F.gelu(self.grid, approximate="tanh").numpy(),
            color="tab:purple",
            linewidth=1.2,
            linestyle=":",
            label="GELU(z), GPT-2",
        )
        (self.silu_line,) = self.axes.plot([], [], color="tab:blue", linewidth=2.2, label="SiLU(z), your SwiGLU")
        (self.product_line,) = self.axes.plot(
            [], [], color="tab:orange", linewidth=2.2, linestyle="--", label="SiLU(z) · x·W3, your SwiGLU"
        )
        (self.silu_marker,) = self.axes.plot([], [], "o", color="tab:blue", markersize=8)
        (self.product_marker,) = self.axes.plot([], [], "o", color="tab:orange", markersize=9)
        self.guide = self.axes.axvline(z, color="0.3", linewidth=0.8, linestyle="-")
        self.axes.axhline(0.0, color="0.8", linewidth=0.8)
        self.axes.set_xlim(*self.Z_RANGE)
        self.axes.set_ylim(-2.0, 4.2)
        self.axes.set_xlabel("z = x·W1 (one hidden entry)")
        self.axes.legend(loc="upper left", fontsize=8)
        self.product = None  # the gated value at the chosen z (float), for tests
        self.refresh()

    def gated(self, z: torch.Tensor, up: float) -> torch.Tensor:
        """(len(z), 2): SiLU(z) and SiLU(z) · up, computed by the learner's SwiGLU."""
        module = _build(self.SwiGLU, 2, 2)
        state = {
            "w1.weight": torch.tensor([[1.0, 0.0], [1.0, 0.0]]),  # both hidden entries: z
            "w3.weight": torch.tensor([[0.0, 1.0], [0.0, up]]),  # up branch: 1 and u
            "w2.weight": torch.eye(2),  # down: hidden entries as they are
        }
        _load(module, state, "Your SwiGLU")
        rows = torch.stack([z.float(), torch.ones(len(z))], dim=-1)  # inputs (z, 1)
        with torch.no_grad():
            output = call_learner(_named("SwiGLU.forward", module), rows)
        return expect_tensor("SwiGLU.forward", output, (len(z), 2))

    def update(self) -> None:
        z, up = self.z.value, self.up.value
        values = self.gated(torch.cat([self.grid, torch.tensor([z], dtype=torch.float64)]), up)
        curve, (silu_z, product) = values[:-1], values[-1].tolist()
        grid = self.grid.numpy()
        self.silu_line.set_data(grid, curve[:, 0].numpy())
        self.product_line.set_data(grid, curve[:, 1].numpy())
        self.silu_marker.set_data([z], [silu_z])
        self.product_marker.set_data([z], [product])
        self.guide.set_xdata([z, z])
        low, high = float(curve.min()), float(curve.max())
        self.axes.set_ylim(min(-1.0, low - 0.3), max(4.2, high + 0.3))
        self.product = product
        sigmoid = 1.0 / (1.0 + math.exp(-z))
        note = " (the gate is 0: this entry is switched off)" if up == 0 else ""
        self.readout.value = (
            f"SiLU({z:.2f}) = {z:.2f} · σ({z:.2f}) = {z:.2f} · {sigmoid:.3f} = <b>{silu_z:.2f}</b>; "
            f"times x·W3 = {up:.2f} gives <b>{product:.2f}</b>{note}"
        )


class ResidualStreamExplorer(Explorer):
    """The residual stream through a stack of the learner's blocks: pre-norm, post-norm, no residual.

    ``TransformerBlock`` is the learner's class; the widget stacks ``max_layers``
    of them with random weights (matrices N(0, 1/fan_in), norm gains 1) and
    pushes one random sequence through the same parts in three arrangements:

    * pre-norm: each block's own ``forward`` (x + attn(norm(x)), then x + mlp(norm(x)));
    * post-norm: the original transformer's order, x = attn_norm(x + attn(x)),
      then x = mlp_norm(x + mlp(x));
    * no residual: x = attn(attn_norm(x)), then x = mlp(mlp_norm(x)).

    Top: the size of the stream (RMS of x, averaged over tokens) and how much
    of the input x0 is still in it (cosine of x and x0) after each layer, for
    pre- and post-norm. Bottom: the gradient. A loss reads the stream after
    the chosen number of layers (its dot product with a fixed random tensor,
    so the gradient there has the size of that tensor), and the panel shows
    the size of the gradient that reaches the stream after each earlier layer,
    relative to the top: 1 means it arrives whole. "sub-layer ×" scales the
    output projections (attn.o_proj, mlp.w2), i.e. how much each sub-layer adds.
    """

    css_class = "residual-stream-explorer"
    STYLES = ("pre-norm", "post-norm", "no residual")
    COLORS = {"pre-norm": "tab:green", "post-norm": "tab:red", "no residual": "tab:gray"}

    def __init__(
        self,
        TransformerBlock,
        max_layers: int = 24,
        d_model: int = 64,
        n_heads: int = 4,
        n_kv_heads: int = 2,
        d_hidden: int = 172,
        tokens: int = 16,
        seed: int = 0,
    ):
        if self.skip_while_graded():
            return
        self.TransformerBlock = TransformerBlock
        self.max_layers, self.seed = max_layers, seed
        self.shape = dict(d_model=d_model, n_heads=n_heads, n_kv_heads=n_kv_heads, d_hidden=d_hidden)
        self.layers = widgets.IntSlider(12, min=1, max=max_layers, description="layers").add_class("layers-slider")
        self.gain = widgets.FloatSlider(
            1.0, min=0.25, max=2.0, step=0.25, description="sub-layer ×", readout_format=".2f"
        ).add_class("gain-slider")
        super().__init__([self.layers, self.gain], figsize=(9.2, 5.2))
        self.stats = widgets.HTML("").add_class("stream-stats")
        self.gradient_stats = widgets.HTML("").add_class("gradient-stats")
        self.children = (*self.children[:-1], self.stats, self.gradient_stats, self.children[-1])
        generator = torch.Generator().manual_seed(seed)
        self.x0 = torch.randn(1, tokens, d_model, generator=generator)
        self.probe = torch.randn(1, tokens, d_model, generator=generator)  # what the loss reads from the top
        panels = self.figure.subplot_mosaic([["size", "input"], ["gradient", "gradient"]])
        self.size_axes, self.input_axes, self.gradient_axes = panels["size"], panels["input"], panels["gradient"]
        self.lines, self.markers = {}, {}
        for axes, styles in (
            (self.size_axes, self.STYLES[:2]),
            (self.input_axes, self.STYLES[:2]),
            (self.gradient_axes, self.STYLES),
        ):
            for style in styles:
                (line,) = axes.plot([], [], "-", color=self.COLORS[style], linewidth=2, label=style)
                (marker,) = axes.plot([], [], "o", color=self.COLORS[style], markersize=7)
                self.lines[axes, style], self.markers[axes, style] = line, marker
            axes.set_xlim(0, max_layers)
        self.size_axes.set_title("size of the stream: RMS of x")
        self.size_axes.set_ylim(0, 8)
        self.input_axes.set_title("input still in the stream: cos(x, x₀)")
        self.input_axes.set_ylim(-0.2, 1.05)
        self.input_axes.axhline(0.0, color="0.8", linewidth=0.8)
        self.gradient_axes.set_title("gradient reaching the stream after each layer, relative to the top (log scale)")
        self.gradient_axes.set_yscale("log")
        self.gradient_axes.yaxis.set_minor_locator(NullLocator())  # decades only: fewer artists, faster draws
        self.gradient_axes.axhline(1.0, color="0.8", linewidth=0.8)
        self.loss_line = self.gradient_axes.axvline(12, color="0.3", linewidth=0.8, linestyle=":")
        self.loss_label = self.gradient_axes.text(
            12,
            0.03,
            " the loss reads here",
            fontsize=8,
            color="0.3",
            va="bottom",
            transform=self.gradient_axes.get_xaxis_transform(),
        )
        self.loss_label.set_in_layout(False)  # near the right edge it may overhang: no reason to shrink the axes
        self.gradient_axes.set_xlabel("layer")
        # The legends carry the numbers at the markers (at the chosen depth, or at the input for the
        # gradient): text artists, redrawn with the data, so a new number costs no full draw.
        self.legend_texts = {
            (axes, style): self._legend_entry(axes, row, style, corner)
            for axes, styles, corner in (
                (self.size_axes, self.STYLES[:2], "left"),
                (self.input_axes, self.STYLES[:2], "right"),
                (self.gradient_axes, self.STYLES, "right"),
            )
            for row, style in enumerate(styles)
        }
        self._blocks = None  # (the learner's class, its blocks, their base output weights)
        self._trajectories = {}  # gain -> {style: (rms list, cos list)}
        self._gradients = {}  # (gain, layers) -> {style: gradient sizes after 0 .. layers layers}
        self._streams = None  # (gain, {style: the stream after each layer, in autograd's graph})
        self.refresh()

    def _legend_entry(self, axes, row: int, style: str, corner: str):
        """One line of a panel's legend, in its style's colour: the label and, after an update, the value."""
        text = axes.text(
            0.02 if corner == "left" else 0.98,
            0.97 - 0.1 * row,
            f"━ {style}",
            transform=axes.transAxes,
            ha=corner,
            va="top",
            fontsize=8.5,
            color=self.COLORS[style],
            bbox=dict(boxstyle="square,pad=0.15", facecolor="white", edgecolor="none", alpha=0.85),
        )
        text.set_in_layout(False)
        return text

    # -- the computation, with the learner's blocks
    def blocks(self):
        if self._blocks is None or self._blocks[0] is not self.TransformerBlock:
            with _one_thread():
                self._blocks = self._build_blocks()
            self._trajectories, self._gradients, self._streams = {}, {}, None
        return self._blocks[1], self._blocks[2]

    def _build_blocks(self):
        """(the learner's class, max_layers of its blocks with random weights, their output weights)."""
        generator = torch.Generator().manual_seed(self.seed + 1)
        blocks, base = [], []
        for _ in range(self.max_layers):
            block = _build(self.TransformerBlock, *self.shape.values())
            for parameter in block.parameters():
                if parameter.dim() >= 2:  # N(0, 1/fan_in): order-1 activations at every depth
                    parameter.data.normal_(0.0, parameter.shape[-1] ** -0.5, generator=generator)
                parameter.requires_grad_(False)  # gradients are taken for the stream only
            missing = [name for name in ("attn_norm", "attn", "mlp_norm", "mlp") if not hasattr(block, name)]
            if missing or not hasattr(block.attn, "o_proj") or not hasattr(block.mlp, "w2"):
                raise LearnerFunctionProblem(
                    "This widget needs the contract's names: attn_norm, attn (with o_proj), "
                    f"mlp_norm, mlp (with w2); your TransformerBlock lacks {missing or 'o_proj or w2'}."
                )
            blocks.append(block.eval())
            base.append((block.attn.o_proj.weight.detach().clone(), block.mlp.w2.weight.detach().clone()))
        return self.TransformerBlock, blocks, base

    def _scaled_blocks(self, gain: float) -> list:
        """The blocks, their output projections scaled by ``gain``."""
        blocks, base = self.blocks()
        for block, (o_proj, w2) in zip(blocks, base):
            block.attn.o_proj.weight.data.copy_(o_proj * gain)
            block.mlp.w2.weight.data.copy_(w2 * gain)
        return blocks

    @staticmethod
    def _steps() -> dict:
        """{style: step(block, x)}: the learner's forward, and its parts in two other orders."""

        def post_norm(block, x):
            x = block.attn_norm(x + block.attn(x))
            return block.mlp_norm(x + block.mlp(x))

        def no_residual(block, x):
            x = block.attn(block.attn_norm(x))
            return block.mlp(block.mlp_norm(x))

        return {
            "pre-norm": _named("TransformerBlock.forward", lambda block, x: block(x)),
            "post-norm": _named("your block's parts (post-norm order)", post_norm),
            "no residual": _named("your block's parts (without the residual sums)", no_residual),
        }

    def streams(self, gain: float) -> dict:
        """{style: [x0, x1, ..., x_max_layers]}, kept in autograd's graph for ``gradients``.

        Only the current gain's streams are kept: the graphs are small (16 tokens,
        24 layers), but one per gain would add up.
        """
        if self._streams is not None and self._streams[0] == gain:
            return self._streams[1]
        blocks = self._scaled_blocks(gain)
        found = {}
        with torch.enable_grad(), _one_thread():
            for style, step in self._steps().items():
                xs = [self.x0.clone().requires_grad_(True) * 1.0]  # not a leaf: a forward may write into x
                for block in blocks:
                    output = call_learner(step, block, xs[-1])
                    xs.append(expect_tensor("TransformerBlock.forward", output, self.x0.shape, detach=False))
                if not xs[-1].requires_grad:
                    raise LearnerFunctionProblem(
                        f"No gradient flows through {step.__name__}: does it detach x or run under "
                        "torch.no_grad()? The gradient panel needs the forward pass as autograd sees it."
                    )
                found[style] = xs
        self._streams = (gain, found)
        return found

    def trajectories(self, gain: float) -> dict:
        """{"pre-norm" | "post-norm": (RMS of x, cos(x, x0)) after 0 .. max_layers layers}."""
        if gain in self._trajectories:
            return self._trajectories[gain]
        streams = self.streams(gain)
        found = {}
        with torch.no_grad():
            for style in self.STYLES[:2]:
                xs = [x.detach().float() for x in streams[style]]
                rms = [float(x.pow(2).mean(-1).sqrt().mean()) for x in xs]
                cos = [float(F.cosine_similarity(x, self.x0, dim=-1).mean()) for x in xs]
                found[style] = (rms, cos)
        self._trajectories[gain] = found
        return found

    def gradients(self, gain: float, layers: int) -> dict:
        """{style: |dL/dx_l| / |dL/dx_top| for l = 0 .. layers}, L reading the stream after ``layers`` layers.

        The loss is the stream's dot product with a fixed random tensor (``probe``),
        so the gradient at the top is that tensor: 1 after dividing by its size.
        """
        key = (gain, layers)
        if key in self._gradients:
            return self._gradients[key]
        streams = self.streams(gain)
        top = float(self.probe.norm())
        found = {}
        with _one_thread():
            for style, xs in streams.items():
                loss = (xs[layers].float() * self.probe).sum()
                try:
                    grads = torch.autograd.grad(loss, xs[: layers + 1], retain_graph=True, allow_unused=True)
                except RuntimeError as error:
                    raise LearnerFunctionProblem(
                        f"The gradient through your block could not be computed ({error}). Does its forward "
                        "change a tensor in place (x += ...)? Write x = x + ... instead."
                    ) from None
                found[style] = [0.0 if g is None else float(g.double().norm()) / top for g in grads]
        self._gradients[key] = found
        return found

    def update(self) -> None:
        depth, gain = self.layers.value, self.gain.value
        found = self.trajectories(gain)
        steps = list(range(depth + 1))
        for style, (rms, cos) in found.items():
            for axes, values in ((self.size_axes, rms), (self.input_axes, cos)):
                self.lines[axes, style].set_data(steps, values[: depth + 1])
                self.markers[axes, style].set_data([depth], [values[depth]])
        top = max(max(rms) for rms, _ in found.values())
        self.size_axes.set_ylim(0, max(2.0, 1.1 * top))
        gradients = self.gradients(gain, depth)
        for style, sizes in gradients.items():
            shown = [max(size, 1e-12) for size in sizes]  # a log axis has no 0
            self.lines[self.gradient_axes, style].set_data(steps, shown)
            self.markers[self.gradient_axes, style].set_data([0], [shown[0]])
        self.loss_line.set_xdata([depth, depth])
        self.loss_label.set_x(depth)
        every = [max(size, 1e-12) for sizes in gradients.values() for size in sizes]
        low, high = min(every), max(every)
        # limits on whole powers of 10, so that small changes do not move the axis
        self.gradient_axes.set_ylim(
            10.0 ** math.floor(math.log10(low) - 0.3), 10.0 ** math.ceil(math.log10(high) + 0.3)
        )
        for style, (rms, cos) in found.items():
            self.legend_texts[self.size_axes, style].set_text(f"━ {style}: RMS {rms[depth]:.2f}")
            self.legend_texts[self.input_axes, style].set_text(f"━ {style}: cos {cos[depth]:.2f}")
        for style, sizes in gradients.items():
            self.legend_texts[self.gradient_axes, style].set_text(f"━ {style}: {_times(sizes[0])} at the input")
        (pre_rms, pre_cos), (post_rms, post_cos) = found["pre-norm"], found["post-norm"]
        self.stats.value = (
            f"after {depth} layer{'s' if depth > 1 else ''} (sub-layer × {gain:.2f}): "
            f"<b>pre-norm</b> RMS {pre_rms[depth]:.2f}, cos(x, x₀) {pre_cos[depth]:.2f}; "
            f"<b>post-norm</b> RMS {post_rms[depth]:.2f}, cos(x, x₀) {post_cos[depth]:.2f}"
        )
        self.gradient_stats.value = "gradient reaching the input x₀, relative to the top: " + "; ".join(
            f"<b>{style}</b> {_times(gradients[style][0])}" for style in self.STYLES
        )


def _times(ratio: float) -> str:
    """A gradient ratio for people: 1.3×, 13×, 1600×, 0.0042×."""
    if ratio == 0.0:
        return "0 (no gradient arrives)"
    if ratio >= 100:
        return f"{ratio:,.0f}×"
    return f"{ratio:.2g}×"
