"""Notebook 02: causal_mask (with its sliding ``window``), causal_attention.

Tolerances: ``causal_mask`` returns booleans, compared exactly (a wrong dtype
is reported as such). Its cases with a ``window`` check the band (each query
sees itself and the window - 1 keys before it), bottom-right with S > T as the
plain mask is; a mistaken plain mask is still named when the learner also wrote
the window on top of it (each mistake's mutant applies the band the way the
rest of such an answer would). ``causal_attention`` is the attention of notebook 01 with
a mask: a few float32 operations on values of order 1, where correct writings
(the given ``attention``, -1e9 instead of -inf, float64, a loop over queries,
``F.scaled_dot_product_attention``) agree to about 1e-7, so 1e-6 absolute,
as in notebook 01; every catalogued mistake moves outputs by more than 1e-2.

The property that matters, "changing a future token never changes an earlier
output", is checked by ``FutureChangeCase`` (``course_checks.scripts``): each runs the learner's function
on a random sequence and on a copy with random later tokens replaced, and
returns how far the earlier outputs moved. The reference gives exactly 0.
It is written as cases, not as ``Exercise.properties``, so that a learner who
breaks it through a known mistake (the mask applied after the softmax) is
still told which mistake it is.
"""

import torch

from course_checks.scripts import FutureChangeCase

from .catalogue import Case, Exercise, Mistake

ASSIGNMENT = "02_causal_masking"

# The worked example of the theory: queries = keys, values v0, v1, v2.
EXAMPLE_X = ((1.0, 0.0), (0.0, 1.0), (1.0, 1.0))
EXAMPLE_V = ((1.0, 0.0), (0.0, 10.0), (5.0, 5.0))


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _randint(low: int, high: int, generator) -> int:
    """A seeded integer in [low, high]."""
    return int(torch.randint(low, high + 1, (1,), generator=generator))


# ---------------------------------------------------------------- causal_mask


def causal_mask_cases(ref):
    g = _generator(2002)
    yield Case("T=3 (the worked example)", (3,))
    yield Case("T=1 (a single token)", (1,))
    yield Case("T=6", (6,))
    yield Case("T=4 with S=4 given", (4, 4))
    yield Case("T=2 queries and S=5 keys (a KV cache: the queries are positions 3 and 4)", (2, 5))
    yield Case("T=1 query and S=6 keys (one generation step: it sees every key)", (1, 6))
    yield Case("T=4 queries, S=9 keys given as S=9", (4,), {"S": 9})
    for _ in range(3):
        T = _randint(2, 12, g)
        S = T + _randint(1, 10, g)
        yield Case(f"T={T} queries and S={S} keys (random)", (T, S))
    T = _randint(7, 16, g)
    yield Case(f"T={T} (random)", (T,))
    # the sliding window: each query sees itself and the window - 1 keys before it
    yield Case("T=5, window=2 (each token sees itself and the one before)", (5,), {"window": 2})
    yield Case("T=4, window=1 (each token sees only itself)", (4,), {"window": 1})
    yield Case("T=6, window=3", (6,), {"window": 3})
    yield Case("T=4, window=4 (the window holds every earlier token: the plain mask)", (4,), {"window": 4})
    yield Case("T=3, window=10 (a window longer than the sequence)", (3,), {"window": 10})
    yield Case("T=2 queries, S=7 keys, window=3 (a KV cache: positions 5 and 6)", (2, 7), {"window": 3})
    yield Case("T=1 query, S=8 keys, window=4 (one generation step: the last 4 keys)", (1, 8), {"window": 4})
    yield Case("T=3 queries, S=3 keys given, window=2", (3, 3), {"window": 2})
    for _ in range(3):
        T = _randint(2, 10, g)
        S = T + _randint(0, 8, g)
        window = _randint(2, S - 1, g) if S > 2 else 1
        yield Case(f"T={T} queries, S={S} keys, window={window} (random)", (T, S), {"window": window})
    T = _randint(8, 14, g)
    window = _randint(2, 5, g)
    yield Case(f"T={T}, window={window} (random)", (T,), {"window": window})


def _band(mask, offset: int, window):
    """``mask`` with the cells more than window - 1 before the diagonal ``offset`` turned off (None: as is)."""
    return mask if window is None else mask.triu(diagonal=offset - window + 1)


def _mask_mutant(build, offset=lambda T, S: S - T):
    """A mistaken causal_mask: ``build(T, S)`` with S defaulting to T, and a window, when given, cut
    along the diagonal the answer puts its triangle on (``offset(T, S)``)."""

    def mutant(ref):
        def causal_mask(T, S=None, window=None):
            S = T if S is None else S
            return _band(build(T, S), offset(T, S), window)

        return causal_mask

    return mutant


def _window_mutant(wrong_window=None, *, top_left=False):
    """A causal_mask whose window is ``wrong_window(window)`` keys wide (None: the window ignored),
    or, with ``top_left``, whose band is measured from the query's index instead of its position."""

    def mutant(ref):
        def causal_mask(T, S=None, window=None):
            S = T if S is None else S
            causal = ref.causal_mask(T, S)
            if window is None:
                return causal
            if top_left:
                return _band(causal, 0, window)
            return causal if wrong_window is None else _band(causal, S - T, wrong_window(window))

        return causal_mask

    return mutant


def _ones(T, S):
    return torch.ones(T, S, dtype=torch.bool)


def _float_mask(ref):
    return lambda T, S=None, window=None: ref.causal_mask(T, S, window=window).float()


def _additive_mask(ref):
    def causal_mask(T, S=None, window=None):
        allowed = ref.causal_mask(T, S, window=window)
        return torch.zeros(allowed.shape).masked_fill(~allowed, float("-inf"))

    return causal_mask


def _inverted_polarity(ref):
    return lambda T, S=None, window=None: ~ref.causal_mask(T, S, window=window)


INVERTED_HINT = (
    "Row t is query t, column s is key s, and query t may attend to keys s ≤ t: the allowed "
    "cells are on and below the diagonal, the lower triangle (`tril`, not `triu`)."
)
DIAGONAL_HINT = (
    "Every token may attend to itself, so mask[t, t] is True: keep the diagonal "
    "(`tril(diagonal=0)` when S == T, not `diagonal=-1`)."
)
POLARITY_HINT = (
    'True means "may attend" (as in F.scaled_dot_product_attention): True on and below '
    "the diagonal, False above it, where the future is."
)
WINDOW_HINT = (
    "With a window W, query t (at position p = t + S - T) sees itself and the W - 1 keys before it: "
    "keys p - W + 1 .. p, W keys in all. Cut the band with `triu(diagonal=S - T - W + 1)` on the "
    "causal mask, or compare positions: `key > position - W`."
)
TOP_LEFT_HINT = (
    "With S > T keys the T queries are the LAST T positions (the first S - T keys are cached "
    "earlier tokens), so query t sits at position t + S - T and sees keys 0 .. t + S - T: "
    "shift the triangle, `tril(diagonal=S - T)`. The last query sees every key."
)

CAUSAL_MASK_MISTAKES = [
    Mistake(
        "inverted-triangle",
        "the allowed cells form the upper triangle instead of the lower one",
        INVERTED_HINT,
        _mask_mutant(lambda T, S: _ones(T, S).triu(diagonal=S - T)),
    ),
    Mistake(
        "inverted-triangle",
        "the allowed cells form the upper triangle instead of the lower one",
        INVERTED_HINT,
        _mask_mutant(lambda T, S: _ones(T, S).triu(), offset=lambda T, S: 0),
    ),
    Mistake(
        "diagonal-excluded",
        "the diagonal is excluded: no token may attend to itself",
        DIAGONAL_HINT,
        _mask_mutant(lambda T, S: _ones(T, S).tril(diagonal=S - T - 1)),
    ),
    Mistake(
        "diagonal-excluded",
        "the diagonal is excluded: no token may attend to itself",
        DIAGONAL_HINT,
        _mask_mutant(lambda T, S: _ones(T, S).tril(diagonal=-1), offset=lambda T, S: 0),
    ),
    Mistake(
        "mask-polarity",
        "the mask's polarity is inverted (True where attention is blocked)",
        POLARITY_HINT,
        _inverted_polarity,
    ),
    Mistake(
        "mask-polarity",
        "the mask's polarity is inverted (True where attention is blocked)",
        POLARITY_HINT,
        _mask_mutant(lambda T, S: _ones(T, S).triu(diagonal=1), offset=lambda T, S: 0),
    ),
    Mistake(
        "top-left-aligned",
        "with S > T the mask is aligned top-left instead of bottom-right",
        TOP_LEFT_HINT,
        _mask_mutant(lambda T, S: _ones(T, S).tril(), offset=lambda T, S: 0),
    ),
    Mistake(
        "s-ignored",
        "`S` is ignored: the mask is always (T, T)",
        "With S keys the mask has S columns: use S, and only when it is None use T.",
        _mask_mutant(lambda T, S: _ones(T, T).tril(), offset=lambda T, S: 0),
    ),
    Mistake(
        "float-mask",
        "the mask holds the numbers 0 and 1, not booleans",
        "Return dtype torch.bool: attention_weights computes `~mask` and `masked_fill(~mask, ...)`, "
        "which need booleans. `torch.ones(T, S, dtype=torch.bool)` or a comparison such as `<=` gives them.",
        _float_mask,
    ),
    Mistake(
        "additive-mask",
        "an additive mask (0 and -inf) instead of a boolean one",
        "Return booleans, True where attention is allowed: attention_weights turns them into -inf scores itself.",
        _additive_mask,
    ),
    Mistake(
        "window-one-too-wide",
        "the window is one too wide: each query sees itself and `window` keys before it, window + 1 in all",
        WINDOW_HINT,
        _window_mutant(lambda window: window + 1),
    ),
    Mistake(
        "window-one-too-narrow",
        "the window is one too narrow: each query sees window - 1 keys in all, itself included",
        WINDOW_HINT,
        _window_mutant(lambda window: window - 1),
    ),
    Mistake(
        "window-ignored",
        "`window` is ignored: every query still sees all the keys before it",
        "With `window` given, turn off the keys more than window - 1 before the query's position: "
        "`window=2` leaves each query itself and the key just before it.",
        _window_mutant(None),
    ),
    Mistake(
        "window-top-left",
        "with S > T the window is measured from the query's index t, not from its position t + S - T",
        "The T queries are the last T of S positions (as for the triangle): query t sits at position "
        "t + S - T, and its window is the keys t + S - T - window + 1 .. t + S - T.",
        _window_mutant(top_left=True),
    ),
]


# ---------------------------------------------------------------- causal_attention


def _future_change_case(generator, batch: tuple, T: int, d: int, d_v: int, dtype=torch.float32) -> FutureChangeCase:
    q, k = (torch.randn(*batch, T, d, generator=generator, dtype=dtype) for _ in range(2))
    v = torch.randn(*batch, T, d_v, generator=generator, dtype=dtype)
    first = _randint(1, T - 1, generator)
    later = [p for p in range(first + 1, T) if bool(torch.rand((), generator=generator) < 0.5)]
    positions = [first, *later]
    changed = []
    for x in (q, k, v):
        x = x.clone()
        x[..., positions, :] = torch.randn(*batch, len(positions), x.shape[-1], generator=generator, dtype=dtype) * 3
        changed.append(x)
    shape = "×".join(str(n) for n in (*batch, T))
    label = (
        f"a random sequence ({shape} tokens) with token{'s' if len(positions) > 1 else ''} "
        f"{', '.join(map(str, positions))} changed: the outputs of tokens 0 to {first - 1} must not move"
    )
    return FutureChangeCase(label, (q, k, v, *changed), first=first)


def causal_attention_cases(ref):
    g = _generator(2003)
    X, V = torch.tensor(EXAMPLE_X), torch.tensor(EXAMPLE_V)
    yield Case("the worked example (3 tokens)", (X, X, V))
    yield Case(
        "6 tokens, d=8, d_v=3",
        (torch.randn(6, 8, generator=g), torch.randn(6, 8, generator=g), torch.randn(6, 3, generator=g)),
    )
    yield Case("a batch of heads (2, 3, 5, 16)", tuple(torch.randn(2, 3, 5, 16, generator=g) for _ in range(3)))
    yield Case(
        "float64, 7 tokens, d=4, d_v=5",
        (
            torch.randn(7, 4, generator=g, dtype=torch.float64),
            torch.randn(7, 4, generator=g, dtype=torch.float64),
            torch.randn(7, 5, generator=g, dtype=torch.float64),
        ),
    )
    yield Case(
        "2 new queries against 6 keys (a KV cache), d=8, d_v=4",
        (torch.randn(2, 8, generator=g), torch.randn(6, 8, generator=g), torch.randn(6, 4, generator=g)),
    )
    yield Case(
        "1 new query against 5 keys, batch of 2 (one generation step)",
        (torch.randn(2, 1, 8, generator=g), torch.randn(2, 5, 8, generator=g), torch.randn(2, 5, 8, generator=g)),
    )
    yield Case(
        "heads (2, 2): 3 new queries against 7 keys",
        (
            torch.randn(2, 2, 3, 8, generator=g),
            torch.randn(2, 2, 7, 8, generator=g),
            torch.randn(2, 2, 7, 8, generator=g),
        ),
    )
    yield _future_change_case(g, (), _randint(3, 10, g), 4, 3)
    yield _future_change_case(g, (2,), _randint(3, 10, g), 8, 8)
    yield _future_change_case(g, (2, 2), _randint(3, 10, g), 8, 4, dtype=torch.float64)


def _attention_mutant(build_mask, after_softmax=None):
    """A mistaken causal_attention: attention with ``build_mask(ref, T, S)``, or,
    with ``after_softmax``, the unmasked weights with the mask applied afterwards."""

    def mutant(ref):
        def causal_attention(q, k, v):
            T, S = q.shape[-2], k.shape[-2]
            if after_softmax is None:
                return ref.attention(q, k, v, build_mask(ref, T, S))
            return after_softmax(ref.attention_weights(q, k), ref.causal_mask(T, S)) @ v

        return causal_attention

    return mutant


MASK_AFTER_HINT = (
    "The mask must act on the scores, before the softmax (attention(q, k, v, mask) does it): "
    "zeroing weights afterwards leaves rows that do not sum to 1 and that still depend on the "
    "future through the softmax's denominator."
)

CAUSAL_ATTENTION_MISTAKES = [
    Mistake(
        "mask-after-softmax",
        "the mask is applied to the weights after the softmax",
        MASK_AFTER_HINT,
        _attention_mutant(None, lambda weights, mask: weights.masked_fill(~mask, 0.0)),
    ),
    Mistake(
        "mask-after-softmax",
        "the mask is applied to the weights after the softmax",
        MASK_AFTER_HINT,
        _attention_mutant(None, lambda weights, mask: weights.masked_fill(~mask, float("-inf"))),
    ),
    Mistake(
        "mask-polarity",
        "the mask's polarity is inverted (the future is visible, the past hidden)",
        "causal_mask is True where attention is allowed: pass it to attention as it is, not `~mask`.",
        _attention_mutant(lambda ref, T, S: ~ref.causal_mask(T, S)),
    ),
    Mistake(
        "mask-missing",
        "no mask: every token sees the future",
        "Pass causal_mask(T, S) as the mask, with T = q.shape[-2] queries and S = k.shape[-2] keys.",
        _attention_mutant(lambda ref, T, S: None),
    ),
    Mistake(
        "top-left-aligned",
        "with more keys than queries the mask is aligned top-left instead of bottom-right",
        "The T queries are the last T of the S positions: use causal_mask(T, S), which shifts the "
        "triangle by S - T, rather than a plain lower triangle of shape (T, S).",
        _attention_mutant(lambda ref, T, S: torch.ones(T, S, dtype=torch.bool).tril()),
    ),
]


EXERCISES = {
    "causal_mask": Exercise("causal_mask", causal_mask_cases, mistakes=CAUSAL_MASK_MISTAKES),
    "causal_attention": Exercise(
        "causal_attention",
        causal_attention_cases,
        depends_on=("causal_mask", "softmax", "attention_weights", "attention"),
        mistakes=CAUSAL_ATTENTION_MISTAKES,
    ),
}
