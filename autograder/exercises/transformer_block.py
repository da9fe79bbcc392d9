"""Notebook 06: RMSNorm, SwiGLU, TransformerBlock.

All three are nn.Module exercises, checked with ``ModuleCase``: learner and
reference are built with the same randomised weights, and the contract's
parameter names (``weight``; ``w1``, ``w3``, ``w2``; ``attn_norm``, ``attn``,
``mlp_norm``, ``mlp``) are enforced by ``load_state_dict``.

Tolerances, per exercise:

* RMSNorm, atol 1e-6 and rtol 1e-5: a mean of squares, a square root and two
  products on float32 values of order 1 (outputs up to about 5). Correct
  writings (rsqrt or 1/sqrt, float32 or float64 throughout, F.rms_norm) agree
  to about 1e-7 relative; the smallest catalogued mistake, eps outside the
  root, moves outputs by 30 % on the small-value case.
* SwiGLU, atol and rtol 1e-5: two matrix products of up to 40 terms before the
  SiLU, one after; a fused w1/w3 product or float64 arithmetic reorders the
  sums, which moves float32 results by a few 1e-7 (CS336 uses 1e-5 here too).
* TransformerBlock, atol and rtol 1e-5: attention and the MLP in sequence,
  about thirty float32 operations with sums over up to 64 terms; rounding
  differences between correct writings stay below 2e-6. Every catalogued
  mistake moves outputs by more than 1e-2.
"""

import torch
import torch.nn.functional as F

from .catalogue import Exercise, Mistake, module_case

ASSIGNMENT = "06_transformer_block"


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ---------------------------------------------------------------- RMSNorm


def rmsnorm_cases(ref):
    g = _generator(601)

    def case(label, x, dim, seed, **init_kwargs):
        return module_case(label, (x,), reference=ref.RMSNorm, init_args=(dim,), init_kwargs=init_kwargs, seed=seed)

    yield case("a (2, 5, 16) batch of token vectors", torch.randn(2, 5, 16, generator=g), 16, 1)
    # RMS about 1e-3: the mean of squares is as large as eps = 1e-6, so where
    # eps goes (inside or outside the root) changes the output by about 30 %.
    yield case(
        "(3, 8) vectors of tiny values (RMS about 0.001), where eps matters",
        torch.randn(3, 8, generator=g) * 1e-3,
        8,
        2,
    )
    yield case("one vector of 6, mean far from 0", torch.randn(6, generator=g) + 2.0, 6, 3)
    yield case(
        "RMSNorm(8, eps=0.01) on (4, 8) values of order 0.1", torch.randn(4, 8, generator=g) * 0.1, 8, 4, eps=0.01
    )
    yield case("(3, 4, 12) values of order 1000", torch.randn(3, 4, 12, generator=g) * 1000, 12, 5)
    yield case("(2, 3, 4, 10): four dimensions", torch.randn(2, 3, 4, 10, generator=g) - 0.5, 10, 6)
    for label, x, seed in (
        ("a float64 RMSNorm(32) on (5, 32)", torch.randn(5, 32, generator=g, dtype=torch.float64), 7),
        (
            "a float64 RMSNorm(16) on tiny (4, 16) values",
            torch.randn(4, 16, generator=g, dtype=torch.float64) * 1e-3,
            8,
        ),
    ):
        yield module_case(label, (x,), reference=ref.RMSNorm, init_args=(x.shape[-1],), seed=seed, dtype="float64")


def _rmsnorm_with(normalise):
    """A mutant RMSNorm whose forward is weight * normalise(x, eps)."""

    def mutant(ref):
        class RMSNorm(ref.RMSNorm):
            def forward(self, x):
                return self.weight * normalise(x, self.eps)

        return RMSNorm

    return mutant


def _rmsnorm_without_weight(ref):
    class RMSNorm(ref.RMSNorm):
        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps)

    return RMSNorm


def _centred(x, eps):
    centred = x - x.mean(dim=-1, keepdim=True)
    return centred * torch.rsqrt(centred.pow(2).mean(dim=-1, keepdim=True) + eps)


RMSNORM_MISTAKES = [
    Mistake(
        "rmsnorm-eps-outside-sqrt",
        "eps is added outside the square root",
        "LLaMA's RMSNorm divides by sqrt(mean(x²) + eps): eps goes inside the root. It only shows "
        "on tiny vectors, where mean(x²) is as small as eps.",
        _rmsnorm_with(lambda x, eps: x / (x.pow(2).mean(dim=-1, keepdim=True).sqrt() + eps)),
    ),
    *[
        Mistake(
            "rmsnorm-mean-not-mean-of-squares",
            "the mean of x is used instead of the mean of x²",
            "Square first, then average: x.pow(2).mean(dim=-1, keepdim=True). The root of that mean "
            "square is the vector's size (its RMS); the plain mean can be 0 or negative.",
            _rmsnorm_with(statistic),
        )
        for statistic in (
            lambda x, eps: x * torch.rsqrt(x.mean(dim=-1, keepdim=True) + eps),
            lambda x, eps: x * torch.rsqrt(x.mean(dim=-1, keepdim=True).pow(2) + eps),
            lambda x, eps: x * torch.rsqrt(x.abs().mean(dim=-1, keepdim=True) + eps),
        )
    ],
    *[
        Mistake(
            "rmsnorm-wrong-axis",
            "the mean of squares is taken over the wrong axis",
            "Each token is normalised on its own: average x² over its features, the last axis "
            "(dim=-1, keepdim=True), not over the batch, the tokens or the whole tensor.",
            _rmsnorm_with(statistic),
        )
        for statistic in (
            lambda x, eps: x * torch.rsqrt(x.pow(2).mean(dim=0, keepdim=True) + eps),
            lambda x, eps: x * torch.rsqrt(x.pow(2).mean() + eps),
        )
    ],
    Mistake(
        "rmsnorm-no-sqrt",
        "x is divided by the mean square, not by its square root",
        "Divide by sqrt(mean(x²) + eps) (or multiply by torch.rsqrt of it): the RMS is a root.",
        _rmsnorm_with(lambda x, eps: x / (x.pow(2).mean(dim=-1, keepdim=True) + eps)),
    ),
    Mistake(
        "rmsnorm-centred",
        "the mean is subtracted first, as in LayerNorm",
        "RMSNorm does not centre: divide x itself by its root mean square, without subtracting the mean.",
        _rmsnorm_with(_centred),
    ),
    Mistake(
        "rmsnorm-no-weight",
        "the learned `weight` is not applied",
        "Multiply the normalised vector by self.weight, feature by feature.",
        _rmsnorm_without_weight,
    ),
]


# ---------------------------------------------------------------- SwiGLU


def swiglu_cases(ref):
    g = _generator(602)

    def case(label, x, d_model, d_hidden, seed, dtype=None):
        return module_case(label, (x,), reference=ref.SwiGLU, init_args=(d_model, d_hidden), seed=seed, dtype=dtype)

    yield case("a (2, 5, 16) batch, d_hidden 40", torch.randn(2, 5, 16, generator=g), 16, 40, 1)
    yield case("(3, 8) vectors, d_hidden 24", torch.randn(3, 8, generator=g), 8, 24, 2)
    yield case("one vector of 12, d_hidden 32", torch.randn(12, generator=g), 12, 32, 3)
    yield case("(4, 6) inputs times 3, d_hidden 5 (large pre-activations)", torch.randn(4, 6, generator=g) * 3, 6, 5, 4)
    yield case(
        "a float64 SwiGLU(8, 16) on (2, 3, 8)",
        torch.randn(2, 3, 8, generator=g, dtype=torch.float64),
        8,
        16,
        5,
        dtype="float64",
    )


def _swiglu_with(combine):
    """A mutant SwiGLU: w2(combine(w1 x, w3 x))."""

    def mutant(ref):
        class SwiGLU(ref.SwiGLU):
            def forward(self, x):
                return self.w2(combine(self.w1(x), self.w3(x)))

        return SwiGLU

    return mutant


SWIGLU_MISTAKES = [
    Mistake(
        "swiglu-w1-w3-swapped",
        "SiLU is applied to x·W3 instead of x·W1 (w1 and w3 swapped)",
        "SiLU goes on w1 (the gate, Hugging Face's gate_proj); w3 (up_proj) stays linear: w2(silu(w1(x)) * w3(x)).",
        _swiglu_with(lambda gate, up: F.silu(up) * gate),
    ),
    *[
        Mistake(
            "swiglu-gelu",
            "GELU is used where SiLU belongs",
            "GELU is GPT-2's activation; SwiGLU uses SiLU(z) = z·sigmoid(z) (F.silu).",
            _swiglu_with(lambda gate, up, a=approximate: F.gelu(gate, approximate=a) * up),
        )
        for approximate in ("none", "tanh")
    ],
    Mistake(
        "swiglu-relu",
        "ReLU is used where SiLU belongs",
        "SwiGLU uses SiLU(z) = z·sigmoid(z) (F.silu), which is smooth and slightly negative below 0.",
        _swiglu_with(lambda gate, up: F.relu(gate) * up),
    ),
    Mistake(
        "swiglu-sigmoid",
        "the gate is sigmoid(x·W1), not SiLU(x·W1) = x·W1·sigmoid(x·W1)",
        "SiLU multiplies z by its sigmoid: z * torch.sigmoid(z), or F.silu(z).",
        _swiglu_with(lambda gate, up: torch.sigmoid(gate) * up),
    ),
    Mistake(
        "swiglu-no-gate",
        "the x·W3 branch is missing (an ungated MLP)",
        "Multiply SiLU(x·W1) entry by entry with x·W3 before w2: w2(silu(w1(x)) * w3(x)).",
        _swiglu_with(lambda gate, up: F.silu(gate)),
    ),
]


# ---------------------------------------------------------------- TransformerBlock


def block_cases(ref):
    g = _generator(603)

    def case(label, x, init_args, seed, dtype=None, init_kwargs=None, positions=None):
        kwargs = {} if positions is None else {"positions": positions}
        return module_case(
            label,
            (x,),
            kwargs,
            reference=ref.TransformerBlock,
            init_args=init_args,
            init_kwargs=init_kwargs or {},
            seed=seed,
            dtype=dtype,
        )

    yield case("(2, 6, 32), 4 heads, 2 kv heads, d_hidden 64", torch.randn(2, 6, 32, generator=g), (32, 4, 2, 64), 1)
    # Positions that are not evenly spaced: a shift of all positions would not
    # change RoPE's scores, so only these show whether positions reach attention.
    yield case(
        "(1, 5, 16), 2 heads, 1 kv head, positions (0, 2, 3, 7, 8)",
        torch.randn(1, 5, 16, generator=g),
        (16, 2, 1, 40),
        2,
        positions=torch.tensor([0, 2, 3, 7, 8]),
    )
    yield case(
        "(3, 4, 24), 6 heads = 6 kv heads, norm_eps 0.01, inputs of order 0.1",
        torch.randn(3, 4, 24, generator=g) * 0.1,
        (24, 6, 6, 48),
        3,
        init_kwargs={"norm_eps": 0.01},
    )
    yield case(
        "(2, 7, 16), rope_base 100, positions 0, 3, 6, ...",
        torch.randn(2, 7, 16, generator=g),
        (16, 4, 2, 32),
        4,
        init_kwargs={"rope_base": 100.0},
        positions=torch.arange(7) * 3,
    )
    yield case("one token (1, 1, 32)", torch.randn(1, 1, 32, generator=g) * 3, (32, 4, 1, 48), 5)
    yield case(
        "a float64 block on (2, 4, 16)",
        torch.randn(2, 4, 16, generator=g, dtype=torch.float64),
        (16, 2, 2, 24),
        6,
        dtype="float64",
    )


def _block_with(forward):
    """A mutant TransformerBlock whose forward is forward(block, x, positions)."""

    def mutant(ref):
        class TransformerBlock(ref.TransformerBlock):
            def forward(self, x, positions=None):
                return forward(self, x, positions)

        return TransformerBlock

    return mutant


def _post_norm(b, x, positions):
    x = b.attn_norm(x + b.attn(x, positions))
    return b.mlp_norm(x + b.mlp(x))


def _residual_from_normed(b, x, positions):
    h = b.attn_norm(x)
    x = h + b.attn(h, positions)
    h = b.mlp_norm(x)
    return h + b.mlp(h)


BLOCK_MISTAKES = [
    Mistake(
        "block-post-norm",
        "post-norm: the stream is normalised after each residual sum",
        "Pre-norm normalises each sub-layer's input and leaves the stream alone: "
        "x = x + attn(attn_norm(x)), then x = x + mlp(mlp_norm(x)).",
        _block_with(_post_norm),
    ),
    *[
        Mistake(
            "block-missing-residual",
            "a residual connection is missing",
            "Both sub-layers add to the stream: x = x + attn(attn_norm(x)), then x = x + mlp(mlp_norm(x)).",
            _block_with(forward),
        )
        for forward in (
            lambda b, x, p: (lambda h: h + b.mlp(b.mlp_norm(h)))(b.attn(b.attn_norm(x), p)),
            lambda b, x, p: (lambda h: b.mlp(b.mlp_norm(h)))(x + b.attn(b.attn_norm(x), p)),
            lambda b, x, p: b.mlp(b.mlp_norm(b.attn(b.attn_norm(x), p))),
        )
    ],
    Mistake(
        "block-residual-from-normed",
        "the residual adds the normalised x instead of x",
        "Keep the un-normalised x for the sum: x = x + attn(attn_norm(x)); only the sub-layer's input is normalised.",
        _block_with(_residual_from_normed),
    ),
    Mistake(
        "block-norm-reused",
        "one RMSNorm is used for both sub-layers",
        "attn_norm feeds the attention and mlp_norm the MLP; each has its own learned weight.",
        _block_with(lambda b, x, p: (lambda h: h + b.mlp(b.attn_norm(h)))(x + b.attn(b.attn_norm(x), p))),
    ),
    Mistake(
        "block-parallel",
        "the MLP reads the block's input instead of the stream after attention",
        "The sub-layers run one after the other: the MLP normalises x after the attention's "
        "residual sum, x = x + attn(attn_norm(x)), then x = x + mlp(mlp_norm(x)).",
        _block_with(lambda b, x, p: x + b.attn(b.attn_norm(x), p) + b.mlp(b.mlp_norm(x))),
    ),
    Mistake(
        "block-positions-dropped",
        "`positions` is not passed on to the attention",
        "Call self.attn(self.attn_norm(x), positions): RoPE needs each token's position.",
        _block_with(lambda b, x, p: (lambda h: h + b.mlp(b.mlp_norm(h)))(x + b.attn(b.attn_norm(x)))),
    ),
]


EXERCISES = {
    "RMSNorm": Exercise("RMSNorm", rmsnorm_cases, atol=1e-6, rtol=1e-5, mistakes=RMSNORM_MISTAKES),
    "SwiGLU": Exercise("SwiGLU", swiglu_cases, atol=1e-5, rtol=1e-5, mistakes=SWIGLU_MISTAKES),
    "TransformerBlock": Exercise(
        "TransformerBlock",
        block_cases,
        atol=1e-5,
        rtol=1e-5,
        depends_on=("RMSNorm", "SwiGLU", "GroupedQueryAttention"),
        mistakes=BLOCK_MISTAKES,
    ),
}
