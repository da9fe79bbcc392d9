"""Notebook 01: softmax, attention_weights, attention.

Tolerances: these are a few float32 operations on values of order 1, where
different but correct orderings (einsum or matmul, float64) agree to about
1e-7; 1e-6 absolute leaves room for that and still catches any real mistake
(the smallest one catalogued moves weights by more than 1e-3). softmax also
gets a relative 1e-4: on scores near 1000, float32 spacing is 6e-5, so the
correct exp(x - logsumexp(x)) differs from exp(x - max) / sum by up to that.
"""

import math

import torch

from .catalogue import Case, Exercise, Mistake

ASSIGNMENT = "01_attention"


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _random_mask(shape, generator) -> torch.Tensor:
    """A boolean mask (True = may attend) with a True and a False in every row.

    No row is entirely True or entirely False, so an inverted mask never hides
    a whole row: every mistake then gives finite numbers that can be compared
    whether the learner masks with -inf or with -1e9.
    """
    mask = torch.rand(shape, generator=generator) < 0.6
    mask[..., 0] = True
    mask[..., 1] = False
    permutation = torch.randperm(shape[-1], generator=generator)
    return mask[..., permutation]


# ---------------------------------------------------------------- softmax


def softmax_cases(ref):
    g = _generator(101)
    yield Case("a vector of 5 scores", (torch.randn(5, generator=g),))
    yield Case("a (3, 5) table, dim=-1", (torch.randn(3, 5, generator=g) * 3,), {"dim": -1})
    yield Case("a (4, 6) table, dim=0", (torch.randn(4, 6, generator=g),), {"dim": 0})
    yield Case("a (2, 3, 4) tensor, dim=1", (torch.randn(2, 3, 4, generator=g),), {"dim": 1})
    yield Case("a (2, 3, 4, 5) tensor, default dim", (torch.randn(2, 3, 4, 5, generator=g) * 2,))
    yield Case("a (3, 4) table with scores up to ±1000", (torch.randn(3, 4, generator=g) * 1000,))
    yield Case("scores (1000, 0, 1000)", (torch.tensor([1000.0, 0.0, 1000.0]),))
    yield Case("a (3, 4) table in float64", (torch.randn(3, 4, generator=g, dtype=torch.float64),))
    scores = torch.randn(3, 5, generator=g)
    scores[0, 1] = scores[2, 3] = scores[2, 4] = float("-inf")
    yield Case("a (3, 5) table with some -inf (masked) scores", (scores,))


def _softmax_without_max(ref):
    def softmax(x, dim=-1):
        exponentials = torch.exp(x)
        return exponentials / exponentials.sum(dim=dim, keepdim=True)

    return softmax


def _softmax_over_axis(axis):
    def mutant(ref):
        return lambda x, dim=-1: ref.softmax(x, dim=axis if x.dim() > 1 else -1)

    return mutant


def _softmax_ignoring_dim(ref):
    return lambda x, dim=-1: ref.softmax(x, dim=-1)


WRONG_AXIS_HINT = (
    "Each slice along `dim` must sum to 1; take the maximum and the sum along `dim` "
    "(with keepdim=True), not along another axis."
)

SOFTMAX_MISTAKES = [
    Mistake(
        "softmax-no-max-subtraction",
        "no max subtraction: large scores overflow to nan",
        "exp(1000) is inf in float32 and inf/inf is nan. Subtract each slice's maximum "
        "before exp; the result is mathematically unchanged.",
        _softmax_without_max,
    ),
    Mistake("softmax-wrong-axis", "softmax over the wrong axis (axis 0)", WRONG_AXIS_HINT, _softmax_over_axis(0)),
    Mistake(
        "softmax-ignores-dim",
        "softmax over the wrong axis (`dim` ignored, always the last axis)",
        WRONG_AXIS_HINT,
        _softmax_ignoring_dim,
    ),
]


# ---------------------------------------------------------------- attention_weights


def attention_weights_cases(ref):
    g = _generator(202)
    yield Case(
        "3 queries and 3 keys of size 2 (the worked example)", (torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]),) * 2
    )
    yield Case("4 queries, 6 keys, d=8", (torch.randn(4, 8, generator=g), torch.randn(6, 8, generator=g)))
    yield Case(
        "a batch (2, 5, 16) of queries and (2, 7, 16) of keys",
        (torch.randn(2, 5, 16, generator=g), torch.randn(2, 7, 16, generator=g)),
    )
    yield Case(
        "heads: (2, 3, 4, 64) queries and keys",
        (torch.randn(2, 3, 4, 64, generator=g), torch.randn(2, 3, 4, 64, generator=g)),
    )
    yield Case("d=1", (torch.randn(3, 1, generator=g), torch.randn(5, 1, generator=g)))
    yield Case(
        "float64 queries and keys, d=32",
        (torch.randn(5, 32, generator=g, dtype=torch.float64), torch.randn(5, 32, generator=g, dtype=torch.float64)),
    )
    yield Case(
        "5 queries, 5 keys, d=16, with a (5, 5) mask",
        (torch.randn(5, 16, generator=g), torch.randn(5, 16, generator=g)),
        {"mask": _random_mask((5, 5), g)},
    )
    yield Case(
        "a batch (2, 4, 8) with a (4, 6) mask broadcast over the batch",
        (torch.randn(2, 4, 8, generator=g), torch.randn(2, 6, 8, generator=g)),
        {"mask": _random_mask((4, 6), g)},
    )


def _scaled_by(factor):
    """Reference weights with the queries multiplied by factor(d): a different scale."""

    def mutant(ref):
        def attention_weights(q, k, mask=None):
            return ref.attention_weights(q * factor(q.shape[-1]), k, mask)

        return attention_weights

    return mutant


def _mask_after_softmax_zeroed(ref):
    def attention_weights(q, k, mask=None):
        weights = ref.attention_weights(q, k)
        return weights if mask is None else weights.masked_fill(~mask, 0.0)

    return attention_weights


def _mask_after_softmax_filled(ref):
    def attention_weights(q, k, mask=None):
        weights = ref.attention_weights(q, k)
        return weights if mask is None else weights.masked_fill(~mask, float("-inf"))

    return attention_weights


def _mask_inverted(ref):
    def attention_weights(q, k, mask=None):
        return ref.attention_weights(q, k, None if mask is None else ~mask)

    return attention_weights


def _mask_ignored(ref):
    return lambda q, k, mask=None: ref.attention_weights(q, k)


def _weights_over_queries(ref):
    def attention_weights(q, k, mask=None):
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        return ref.softmax(scores, dim=-2)

    return attention_weights


MASK_HINT = (
    "The mask must act on the scores, before the softmax: "
    "`scores.masked_fill(~mask, float('-inf'))`, so the remaining weights still sum to 1."
)

ATTENTION_WEIGHTS_MISTAKES = [
    Mistake(
        "no-sqrt-d",
        "the scores are not divided by √d",
        "Divide q·k by math.sqrt(d), where d = q.shape[-1], before the softmax.",
        _scaled_by(lambda d: math.sqrt(d)),
    ),
    Mistake(
        "scaled-by-d",
        "the scores are divided by d instead of √d",
        "The variance of q·k is d, so its spread is √d: divide by math.sqrt(d), not by d.",
        _scaled_by(lambda d: 1 / math.sqrt(d)),
    ),
    Mistake(
        "mask-after-softmax",
        "the mask is applied to the weights after the softmax",
        MASK_HINT,
        _mask_after_softmax_zeroed,
    ),
    Mistake(
        "mask-after-softmax",
        "the mask is applied to the weights after the softmax",
        MASK_HINT,
        _mask_after_softmax_filled,
    ),
    Mistake(
        "mask-polarity",
        "the mask's polarity is inverted",
        'True means "may attend" (as in F.scaled_dot_product_attention): hide the positions '
        "where the mask is False, i.e. fill where `~mask`.",
        _mask_inverted,
    ),
    Mistake(
        "mask-ignored",
        "the mask is ignored",
        "When `mask` is given, set the scores where it is False to -inf before the softmax.",
        _mask_ignored,
    ),
    Mistake(
        "softmax-over-queries",
        "the softmax runs over the queries (axis -2) instead of the keys",
        "Each query's weights must sum to 1 over the keys: softmax along the last axis.",
        _weights_over_queries,
    ),
]


# ---------------------------------------------------------------- attention


def attention_cases(ref):
    g = _generator(303)
    X = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    yield Case("the worked example", (X, X, torch.tensor([[1.0, 0.0], [0.0, 10.0], [5.0, 5.0]])))
    yield Case(
        "4 queries, 6 keys, d=8, d_v=3",
        (torch.randn(4, 8, generator=g), torch.randn(6, 8, generator=g), torch.randn(6, 3, generator=g)),
    )
    yield Case("a batch of heads (2, 3, 5, 16), d_v=16", tuple(torch.randn(2, 3, 5, 16, generator=g) for _ in range(3)))
    yield Case(
        "float64, d=8, d_v=5",
        (
            torch.randn(4, 8, generator=g, dtype=torch.float64),
            torch.randn(6, 8, generator=g, dtype=torch.float64),
            torch.randn(6, 5, generator=g, dtype=torch.float64),
        ),
    )
    yield Case(
        "5 queries and keys with a (5, 5) mask",
        tuple(torch.randn(5, 8, generator=g) for _ in range(3)),
        {"mask": _random_mask((5, 5), g)},
    )


def _attention_mask_ignored(ref):
    return lambda q, k, v, mask=None: ref.attention(q, k, v)


def _attention_mask_inverted(ref):
    return lambda q, k, v, mask=None: ref.attention(q, k, v, None if mask is None else ~mask)


def _attention_unnormalised(ref):
    def attention(q, k, v, mask=None):
        return (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])) @ v

    return attention


ATTENTION_MISTAKES = [
    Mistake(
        "attention-mask-not-passed",
        "the mask is not passed on",
        "Call attention_weights(q, k, mask), so masked keys get weight 0.",
        _attention_mask_ignored,
    ),
    Mistake(
        "mask-polarity",
        "the mask's polarity is inverted",
        'True means "may attend": pass the mask through unchanged.',
        _attention_mask_inverted,
    ),
    Mistake(
        "scores-times-values",
        "the values are weighted by the raw scores, not the softmax weights",
        "Use the weights from attention_weights (they sum to 1), then multiply by v.",
        _attention_unnormalised,
    ),
]


EXERCISES = {
    "softmax": Exercise("softmax", softmax_cases, rtol=1e-4, mistakes=SOFTMAX_MISTAKES),
    "attention_weights": Exercise(
        "attention_weights", attention_weights_cases, depends_on=("softmax",), mistakes=ATTENTION_WEIGHTS_MISTAKES
    ),
    "attention": Exercise(
        "attention", attention_cases, depends_on=("softmax", "attention_weights"), mistakes=ATTENTION_MISTAKES
    ),
}
