"""Notebook 09: merge_partials, blockwise_attention.

A *partial result* of one query over a set of keys is (m, ℓ, o): the largest score m, the sum
ℓ of exp(score - m), and o, the values weighted by exp(score - m); o / ℓ is the attention
output over those keys. For a batch of queries m and ℓ have shape (..., T, 1) and o
(..., T, d_v).

Tolerances: ``merge_partials`` is three exponentials and a few products of order-1 numbers:
1e-6 absolute and 1e-5 relative, as in notebook 01 (sums grow to about 10 on the larger cases,
where float32's spacing is 1e-6). ``blockwise_attention`` agrees with notebook 01's attention to
about 5e-7 in float32 (measured over 300 random sizes, blocks and masks: the blocks add the same
terms in another order), so it gets 01's 1e-6 too; every catalogued mistake moves outputs by more
than 1e-2, or to nan.

What comparing outputs cannot see, and the notebook explains instead: that the blocks never make a
T x S table of scores, and that a causal call skips the blocks wholly in the future (a block that is
computed and then masked away gives the same numbers). A look from inside the learner's kernel
could be fooled by the code it looks at, so no hidden check rests on one; the notebook's visible
checks show the learner the largest tensor their function makes and the work a causal call does.
"""

import math

import torch

from course_checks.scripts import MergeCase

from .catalogue import Case, Exercise, Mistake
from .causal_masking import EXAMPLE_V, EXAMPLE_X  # notebook 01's worked example: queries = keys, values

ASSIGNMENT = "09_efficient_attention"


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _partial(scores: torch.Tensor, v: torch.Tensor) -> tuple:
    """The partial result (m, ℓ, o) of the rows of ``scores`` over their keys, whose values are ``v``."""
    m = scores.amax(dim=-1, keepdim=True)
    weights = torch.exp(scores - m)
    return m, weights.sum(dim=-1, keepdim=True), weights @ v


# ---------------------------------------------------------------- merge_partials


def _example_partials(split: int):
    """The worked example's three queries, partial results over keys [0, split) and [split, 3)."""
    x, v = torch.tensor(EXAMPLE_X), torch.tensor(EXAMPLE_V)
    scores = x @ x.T / math.sqrt(2)
    return (*_partial(scores[:, :split], v[:split]), *_partial(scores[:, split:], v[split:]))


def merge_partials_cases(ref):
    g = _generator(901)
    yield MergeCase("the worked example's 3 queries: keys 0 and 1, then key 2", _example_partials(2))
    yield MergeCase("the worked example's 3 queries: key 0, then keys 1 and 2", _example_partials(1))
    a, b = _example_partials(2)[:3], _example_partials(2)[3:]
    yield MergeCase("the worked example, the same two partials in the other order", (*b, *a))
    for T, S_a, S_b, d_v in ((4, 3, 5, 3), (6, 2, 2, 1)):
        scores = torch.randn(T, S_a + S_b, generator=g) * 2
        v = torch.randn(S_a + S_b, d_v, generator=g)
        yield MergeCase(
            f"{T} queries: {S_a} keys, then {S_b} more (d_v={d_v}; each block holds some rows' largest score)",
            (*_partial(scores[:, :S_a], v[:S_a]), *_partial(scores[:, S_a:], v[S_a:])),
        )
    scores, v = torch.randn(2, 3, 5, 7, generator=g) * 2, torch.randn(2, 3, 7, 8, generator=g)
    yield MergeCase(
        "a batch of heads (2, 3) of 5 queries: keys 0-3, then 4-6 (d_v=8)",
        (*_partial(scores[..., :4], v[..., :4, :]), *_partial(scores[..., 4:], v[..., 4:, :])),
    )
    scores = torch.randn(5, 6, generator=g, dtype=torch.float64)
    v = torch.randn(6, 4, generator=g, dtype=torch.float64)
    yield MergeCase(
        "float64: 5 queries, 3 keys then 3", (*_partial(scores[:, :3], v[:3]), *_partial(scores[:, 3:], v[3:]))
    )
    scores, v = torch.randn(4, 6, generator=g) * 400, torch.randn(6, 2, generator=g)
    yield MergeCase(
        "scores up to about ±1000 (exp of a score overflows float32)",
        (*_partial(scores[:, :3], v[:3]), *_partial(scores[:, 3:], v[3:])),
    )
    scores, v = torch.randn(3, 4, generator=g), torch.randn(4, 5, generator=g)
    empty = (torch.full((3, 1), float("-inf")), torch.zeros(3, 1), torch.zeros(3, 5))
    yield MergeCase(
        "the start of a loop: the empty partial (m = -inf, ℓ = 0, o = 0), then a block of 4 keys",
        (*empty, *_partial(scores, v)),
    )
    yield MergeCase(
        "a block of 4 keys, then the empty partial (m = -inf, ℓ = 0, o = 0)", (*_partial(scores, v), *empty)
    )


def _merge_with(sum_scales="both", output_scales="both", twice=(), normalised=False):
    """A mistaken merge: ``sum_scales`` / ``output_scales`` say which partials' ℓ / o are rescaled ("both",
    "new": only b's, "old": only a's, "none"); ``twice`` names what is rescaled twice ("l", "o");
    ``normalised`` divides the merged o by the merged ℓ."""

    def merge(m_a, l_a, o_a, m_b, l_b, o_b):
        m = torch.maximum(m_a, m_b)
        scale_a, scale_b = torch.exp(m_a - m), torch.exp(m_b - m)

        def combine(x_a, x_b, which, again):
            a = x_a * scale_a if which in ("both", "old") else x_a
            b = x_b * scale_b if which in ("both", "new") else x_b
            if again:
                a, b = a * scale_a, b * scale_b
            return a + b

        l_new = combine(l_a, l_b, sum_scales, "l" in twice)
        o_new = combine(o_a, o_b, output_scales, "o" in twice)
        return m, l_new, o_new / l_new if normalised else o_new

    return merge


def _merge_mutant(**how):
    return lambda ref: _merge_with(**how)


SUM_NOT_RESCALED = (
    "sum-not-rescaled",
    "a running sum ℓ is not rescaled by exp(m_old − m_new)",
    "Each ℓ counts exponentials measured from its own max: before adding, bring both to the new max m = "
    "max(m_a, m_b) by multiplying ℓ_a by exp(m_a − m) and ℓ_b by exp(m_b − m).",
)
OUTPUT_NOT_RESCALED = (
    "output-not-rescaled",
    "a partial output o is not rescaled by exp(m_old − m_new)",
    "o is weighted by the same exponentials as ℓ, so it needs the same factors: o = o_a·exp(m_a − m) + "
    "o_b·exp(m_b − m), with m the larger of the two maxima.",
)
RESCALED_TWICE = (
    "rescaled-twice",
    "the rescaling factor exp(m_old − m_new) is applied twice",
    "Each partial is brought to the new max once: multiply by exp(m_a − m) (or exp(m_b − m)) one time, "
    "not once when you compute the factor and again when you add.",
)

MERGE_MISTAKES = [
    *(
        Mistake(*SUM_NOT_RESCALED, _merge_mutant(sum_scales=which))
        for which in ("new", "old", "none")  # the old one, the new one, or neither rescaled
    ),
    *(Mistake(*OUTPUT_NOT_RESCALED, _merge_mutant(output_scales=which)) for which in ("new", "old", "none")),
    Mistake(*RESCALED_TWICE, _merge_mutant(twice=("l", "o"))),
    Mistake(*RESCALED_TWICE, _merge_mutant(twice=("o",))),
    Mistake(
        "output-normalised",
        "the merged output is divided by the merged sum",
        "Keep o unnormalised, the values weighted by exp(score − m), like ℓ: it is the caller who divides, "
        "o / ℓ, once every block has been merged (a normalised o would need ℓ's factors twice to merge).",
        _merge_mutant(normalised=True),
    ),
]


# ---------------------------------------------------------------- blockwise_attention


def _qkv(generator, batch: tuple, T: int, S: int, d: int, d_v: int, dtype=torch.float32) -> tuple:
    q = torch.randn(*batch, T, d, generator=generator, dtype=dtype)
    k = torch.randn(*batch, S, d, generator=generator, dtype=dtype)
    v = torch.randn(*batch, S, d_v, generator=generator, dtype=dtype)
    return q, k, v


def _a_future_key_that_scores_high(generator) -> tuple:
    """8 tokens, d=4: every query has positive entries and key 7 is 120 in each, so queries 0-6 give the
    key they must not see a score above 100. Taking a block's max before masking (m over 100) makes the
    visible exponentials exp(score − m) underflow to 0 in float32."""
    q = torch.rand(8, 4, generator=generator) + 0.5
    k = torch.randn(8, 4, generator=generator)
    k[7] = 120.0
    return q, k, torch.randn(8, 3, generator=generator)


def blockwise_attention_cases(ref):
    g = _generator(902)
    X, V = torch.tensor(EXAMPLE_X), torch.tensor(EXAMPLE_V)
    for block in (1, 2):
        yield Case(f"the worked example (3 tokens), block_size={block}", (X, X, V, block))
    yield Case("the worked example, causal, block_size=2", (X, X, V, 2), {"causal": True})
    qkv = _qkv(g, (), 10, 10, 8, 5)
    for block in (3, 4, 10, 16):
        yield Case(f"10 queries and keys (d=8, d_v=5), block_size={block}", (*qkv, block))
    for block in (1, 3, 4):
        yield Case(f"the same 10 tokens, causal, block_size={block}", (*qkv, block), {"causal": True})
    qkv = _qkv(g, (), 12, 12, 8, 4)
    yield Case("12 tokens, causal, block_size=4 (it divides T)", (*qkv, 4), {"causal": True})
    yield Case("12 tokens, causal, block_size=5", (*qkv, 5), {"causal": True})
    yield Case("a batch of heads (2, 3), 9 tokens, d=16, block_size=4", (*_qkv(g, (2, 3), 9, 9, 16, 16), 4))
    yield Case(
        "a batch of heads (2, 3), 9 tokens, d=16, causal, block_size=4",
        (*_qkv(g, (2, 3), 9, 9, 16, 16), 4),
        {"causal": True},
    )
    yield Case(
        "float64, 11 tokens, causal, block_size=4",
        (*_qkv(g, (), 11, 11, 8, 3, dtype=torch.float64), 4),
        {"causal": True},
    )
    qkv = _qkv(g, (), 3, 10, 8, 4)
    yield Case("3 queries against 10 keys, block_size=4", (*qkv, 4))
    yield Case(
        "3 new queries against 10 keys (a KV cache: the queries are positions 7 to 9), causal, block_size=4",
        (*qkv, 4),
        {"causal": True},
    )
    yield Case(
        "1 new query against 9 keys (one generation step), causal, block_size=4",
        (*_qkv(g, (2,), 1, 9, 8, 8), 4),
        {"causal": True},
    )
    yield Case(
        "heads (2,): 5 new queries against 11 keys, causal, block_size=3",
        (*_qkv(g, (2,), 5, 11, 8, 4), 3),
        {"causal": True},
    )
    yield Case("9 queries against 4 keys, block_size=3", (*_qkv(g, (), 9, 4, 8, 2), 3))
    yield Case(
        "8 tokens where key 7 scores over 100 for every earlier query, causal, block_size=4",
        (*_a_future_key_that_scores_high(g), 4),
        {"causal": True},
    )
    q, k, v = _qkv(g, (), 7, 7, 4, 3)
    yield Case("7 tokens with scores up to about ±1000, block_size=3", (q * 30, k * 30, v, 3))
    T, block = (int(torch.randint(low, high + 1, (1,), generator=g)) for low, high in ((13, 24), (2, 7)))
    yield Case(f"{T} tokens (random), causal, block_size={block}", (*_qkv(g, (), T, T, 8, 8), block), {"causal": True})


def _blockwise(
    scale=True,
    merge=None,
    reach=0,
    skip_partly_visible=False,
    max_before_mask=False,
    fill=float("-inf"),
    guard=True,
    bottom_right=True,
    drop_last=(),
    separately=False,
):
    """A mistaken blockwise_attention. On a diagonal tile query t sees key s when s <= t + (S - T) + ``reach``
    (the reference: ``reach`` 0; the tiles skipped or left unmasked are the reference's, so an off-by-one
    in the mask's comparison alone); ``bottom_right`` False forgets S - T everywhere; ``skip_partly_visible``
    computes only the key blocks every query of the block sees; ``max_before_mask`` takes a block's max
    from its unmasked scores; ``fill`` is what masked scores become; without ``guard`` a row that sees no
    key of a block gives exp(-inf - (-inf)) = nan; ``drop_last`` lists the axes ("keys", "queries") whose
    last, shorter block is left out; ``separately`` averages the blocks' own softmax outputs; ``merge``
    replaces the reference's merge_partials."""

    def mutant(ref):
        combine = merge or ref.merge_partials

        def starts(length, block_size, axis):
            stop = (length // block_size) * block_size if axis in drop_last else length
            return range(0, stop, block_size)

        def blockwise_attention(q, k, v, block_size, causal=False):
            T, S, d = q.shape[-2], k.shape[-2], q.shape[-1]
            offset = S - T if bottom_right else 0
            rows = []
            for i0 in starts(T, block_size, "queries"):
                i1 = min(i0 + block_size, T)
                empty = torch.full((*q.shape[:-2], i1 - i0, 1), float("-inf"), dtype=q.dtype)
                m, total, out = (
                    empty,
                    torch.zeros_like(empty),
                    torch.zeros(*empty.shape[:-1], v.shape[-1], dtype=q.dtype),
                )
                outputs = []
                for j0 in starts(S, block_size, "keys"):
                    j1 = min(j0 + block_size, S)
                    if causal and j0 > i1 - 1 + offset:  # wholly in the future
                        continue
                    partly = causal and j1 - 1 > i0 + offset
                    if partly and skip_partly_visible:
                        continue
                    scores = q[..., i0:i1, :] @ k[..., j0:j1, :].transpose(-2, -1)
                    if scale:
                        scores = scores / math.sqrt(d)
                    block_max = scores.amax(dim=-1, keepdim=True)
                    if partly:
                        visible = torch.arange(j0, j1) <= torch.arange(i0, i1)[:, None] + offset + reach
                        scores = scores.masked_fill(~visible, fill)
                    if not max_before_mask:
                        block_max = scores.amax(dim=-1, keepdim=True)
                    if guard:
                        block_max = block_max.clamp(min=-1e30)
                    weights = torch.exp(scores - block_max)
                    part = (block_max, weights.sum(dim=-1, keepdim=True), weights @ v[..., j0:j1, :])
                    outputs.append(part[2] / part[1])
                    m, total, out = combine(m, total, out, *part)
                rows.append(torch.stack(outputs).mean(dim=0) if separately else out / total)
            if not rows:  # every block of queries left out
                return torch.zeros(*q.shape[:-2], 0, v.shape[-1], dtype=q.dtype)
            return torch.cat(rows, dim=-2)

        return blockwise_attention

    return mutant


BLOCKWISE_MISTAKES = [
    Mistake(
        "diagonal-off-by-one",
        "the diagonal block's mask is off by one position",
        "On the block that straddles the diagonal, query t (at position t + S − T) sees key s when "
        "s <= t + S − T: itself included, the next key not. Compare absolute positions, "
        "torch.arange(j0, j1) against torch.arange(i0, i1)[:, None] + S − T, with <=.",
        _blockwise(reach=-1),
    ),
    Mistake(
        "diagonal-off-by-one",
        "the diagonal block's mask is off by one position",
        "On the block that straddles the diagonal, query t (at position t + S − T) sees key s when "
        "s <= t + S − T: itself included, the next key not. Compare absolute positions with <=.",
        _blockwise(reach=-1, fill=-1e9),
    ),
    Mistake(
        "diagonal-off-by-one",
        "the diagonal block's mask is off by one position",
        "On the block that straddles the diagonal, query t (at position t + S − T) sees key s when "
        "s <= t + S − T: the next key is already the future.",
        _blockwise(reach=1),
    ),
    Mistake(
        "skips-partly-visible-block",
        "a key block that is only partly visible (the diagonal block) is skipped",
        "Skip a block only when every key in it is in the future of every query of the query block; a block "
        "that straddles the diagonal is computed, with its future keys masked to -inf.",
        _blockwise(skip_partly_visible=True),
    ),
    Mistake(
        "max-before-masking",
        "a block's max is taken before the mask is applied",
        "Mask the scores first, then take the max: a future key's score can be far above the visible ones, "
        "and exp(score − m) of every visible key then underflows to 0 (here a future key scores over 100).",
        _blockwise(max_before_mask=True),
    ),
    Mistake(
        "masked-row-nan",
        "a query that sees no key of a block gets nan",
        "With more keys than queries a block can hold no key some query may see: its max is -inf, and "
        "exp(-inf − (-inf)) is nan. Clamp the block's max before subtracting it (block_max.clamp(min=-1e30)): "
        "its ℓ and o are then 0, and merging adds nothing.",
        _blockwise(guard=False),
    ),
    Mistake(
        "top-left-aligned",
        "with more keys than queries the causal mask is aligned top-left",
        "The T queries are the last T of the S positions (notebook 02's causal_mask(T, S)): query t sits at "
        "position t + S − T, so both the skip and the diagonal mask compare with t + S − T.",
        _blockwise(bottom_right=False),
    ),
    Mistake(
        "last-block-dropped",
        "the last, shorter block is left out when block_size does not divide the length",
        "range(0, S, block_size) starts a block at every multiple of block_size below S; the last block "
        "ends at S, min(j0 + block_size, S), and may be shorter than block_size.",
        _blockwise(drop_last=("keys",)),
    ),
    Mistake(
        "last-block-dropped",
        "the last, shorter block is left out when block_size does not divide the length",
        "range(0, T, block_size) starts a block at every multiple of block_size below T; the last block "
        "ends at T, min(i0 + block_size, T), and may be shorter than block_size (keys likewise).",
        _blockwise(drop_last=("keys", "queries")),
    ),
    Mistake(
        "no-sqrt-d",
        "the scores are not divided by √d",
        "Each block's scores are q·k / √d as in notebook 01, with d = q.shape[-1].",
        _blockwise(scale=False),
    ),
    Mistake(
        "blocks-normalised-separately",
        "each block's softmax is normalised on its own and the blocks' outputs averaged",
        "A block's weights must be divided by the sum over every key, not over the block's: keep the partial "
        "results (m, ℓ, o), merge them with merge_partials, and divide o by ℓ once, after the last block.",
        _blockwise(separately=True),
    ),
    *(Mistake(*SUM_NOT_RESCALED, _blockwise(merge=_merge_with(sum_scales=which))) for which in ("new", "old", "none")),
    *(
        Mistake(*OUTPUT_NOT_RESCALED, _blockwise(merge=_merge_with(output_scales=which)))
        for which in ("new", "old", "none")
    ),
]


EXERCISES = {
    "merge_partials": Exercise("merge_partials", merge_partials_cases, mistakes=MERGE_MISTAKES),
    "blockwise_attention": Exercise(
        "blockwise_attention",
        blockwise_attention_cases,
        depends_on=("merge_partials", "causal_mask", "softmax", "attention_weights", "attention"),
        mistakes=BLOCKWISE_MISTAKES,
    ),
}
