"""Notebook 04: rope_frequencies, apply_rope, neighbour_to_half_split.

Tolerances, per exercise:

* ``rope_frequencies``: one power per entry. A float32 ``base ** (-2i/d)`` (or
  ``1 / base ** (2i/d)``) is within a few float32 units (6e-8 relative) of the
  float64 reference, so rtol 1e-5 with atol 1e-6 passes every correct writing;
  the catalogued mistakes change the values by factors (base^(2i/d) or more).
* ``apply_rope``: the reference computes the angles m·θ_i in float64. A learner
  who computes them in float32 (``positions.float() * theta``, ``torch.polar``
  on float32) rounds an angle of size A by up to a few times 6e-8·A; the
  largest angle is the largest position (θ_0 = 1), and the cases go up to 4095,
  so an angle can be off by about 5e-4 rad, which moves an entry of size 4 (the
  inputs are standard normal) by about 2e-3 at worst. Measured over d = 2..128
  and bases 100 .. 500000: at most 8.4e-4. Hence atol 2e-3: loose next to the
  1e-6 of attention, but every catalogued mistake moves entries by order 1,
  and it lets a correct float32 computation pass.
* ``neighbour_to_half_split``: a reordering, exact; the default tolerance.

The cases use random, non-contiguous and offset positions: a function that
rotates by ``torch.arange(T)`` instead of ``positions`` passes on 0, 1, 2, ...
and fails on those.
"""

import math

import torch

from .catalogue import Case, Exercise, Mistake

ASSIGNMENT = "04_rope"


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ---------------------------------------------------------------- rope_frequencies


def rope_frequencies_cases(ref):
    yield Case("head_dim=8 (θ = 1, 0.1, 0.01, 0.001)", (8,))
    yield Case("head_dim=2 (a single pair)", (2,))
    yield Case("head_dim=4", (4,))
    yield Case("head_dim=64", (64,))
    yield Case("head_dim=128", (128,))
    yield Case("head_dim=16, base=500000.0 (as in LLaMA 3)", (16,), {"base": 500000.0})
    yield Case("head_dim=32, base=100.0", (32,), {"base": 100.0})
    yield Case("head_dim=12, base=10 given as an int", (12, 10))


def _frequencies_with_base(new_base):
    """θ_i = b^(-2i/d) for another b: covers the exponent mistakes.

    base^(+2i/d) is (1/base)^(-2i/d), and base^(-i/d) is (√base)^(-2i/d).
    """

    def mutant(ref):
        return lambda head_dim, base=10000.0: ref.rope_frequencies(head_dim, new_base(float(base)))

    return mutant


NO_MINUS = (
    "θ without the minus sign in the exponent",
    "θ_i = base^(-2i/d) must shrink as i grows, from θ_0 = 1 down to about 1/base: "
    "with a positive exponent the later pairs spin faster instead of slower.",
)
I_NOT_2I = (
    "the exponent uses i instead of 2i",
    "The exponent is -2i/d for i = 0 .. d/2 - 1, i.e. -(0, 2, 4, ..., d-2)/d: "
    "torch.arange(0, d, 2) / d. With i/d the last pair turns at base^(-1/2), not about 1/base.",
)

ROPE_FREQUENCIES_MISTAKES = [
    Mistake("theta-no-minus", *NO_MINUS, _frequencies_with_base(lambda b: 1.0 / b)),
    Mistake("theta-i-not-2i", *I_NOT_2I, _frequencies_with_base(math.sqrt)),
]


# ---------------------------------------------------------------- apply_rope


def apply_rope_cases(ref):
    g = _generator(404)
    # the worked example: one pair with θ = 0.5 (d = 4 and base = 4 give θ = (1, 0.5));
    # pair 0 is zero, pair 1 holds q = (1, 2), then k = (3, 1)
    yield Case(
        "the worked example's query (0, 0, 1, 2), base=4, positions (3, 7, 5)",
        (torch.tensor([[0.0, 0.0, 1.0, 2.0]] * 3), torch.tensor([3, 7, 5])),
        {"base": 4.0},
    )
    yield Case(
        "the worked example's key (0, 0, 3, 1), base=4, positions (1, 5, 7)",
        (torch.tensor([[0.0, 0.0, 3.0, 1.0]] * 3), torch.tensor([1, 5, 7])),
        {"base": 4.0},
    )
    yield Case("(5, 8) vectors at positions 0, 1, ..., 4", (torch.randn(5, 8, generator=g), torch.arange(5)))
    yield Case(
        "(6, 16) vectors at random, unsorted positions below 50",
        (torch.randn(6, 16, generator=g), torch.randperm(50, generator=g)[:6]),
    )
    yield Case(
        "(2, 3, 7, 32) heads at positions 100, 101, ..., 106 (after 100 cached tokens)",
        (torch.randn(2, 3, 7, 32, generator=g), torch.arange(100, 107)),
    )
    yield Case(
        "one new token (1, 1, 64) at position 57, as when generating with a KV cache",
        (torch.randn(1, 1, 64, generator=g), torch.tensor([57])),
    )
    yield Case(
        "(4, 2) vectors: d=2, a single pair, positions (3, 0, 11, 11)",
        (torch.randn(4, 2, generator=g), torch.tensor([3, 0, 11, 11])),
    )
    yield Case(
        "(3, 8, 128) vectors at random positions below 4096",
        (torch.randn(3, 8, 128, generator=g), torch.randint(0, 4096, (8,), generator=g)),
    )
    yield Case(
        "(5, 64) vectors at positions 2900, 2901, ...", (torch.randn(5, 64, generator=g), torch.arange(2900, 2905))
    )
    yield Case(
        "float64 (2, 6, 16) vectors at positions (0, 2, 4, 8, 16, 32)",
        (torch.randn(2, 6, 16, generator=g, dtype=torch.float64), torch.tensor([0, 2, 4, 8, 16, 32])),
    )
    yield Case(
        "(6, 16) vectors, base=500000.0, positions (40, 41, 60, 61, 300, 2000)",
        (torch.randn(6, 16, generator=g), torch.tensor([40, 41, 60, 61, 300, 2000])),
        {"base": 500000.0},
    )
    yield Case(
        "(5, 8) vectors, base=100.0 (third argument), positions (9, 1, 4, 16, 25)",
        (torch.randn(5, 8, generator=g), torch.tensor([9, 1, 4, 16, 25]), 100.0),
    )
    # q and k of attention heads come from a transpose: not contiguous in memory
    heads = torch.randn(2, 5, 4, 8, generator=g).transpose(1, 2)  # (B, H, T, Dh) as a view
    yield Case(
        "(2, 4, 5, 8) heads made by a transpose (not contiguous) at positions 10 .. 14", (heads, torch.arange(10, 15))
    )


def _half_split_rope(ref):
    """Pairs (i, i + d/2) instead of (2i, 2i+1): Hugging Face's rotate_half layout."""

    def apply_rope(x, positions, base=10000.0):
        half = x.shape[-1] // 2
        angles = positions.to(torch.float64)[..., None] * ref.rope_frequencies(x.shape[-1], base)
        cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
        first, second = x[..., :half], x[..., half:]
        return torch.cat((first * cos - second * sin, first * sin + second * cos), dim=-1)

    return apply_rope


def _positions_ignored(ref):
    return lambda x, positions, base=10000.0: ref.apply_rope(x, torch.arange(x.shape[-2]), base)


def _wrong_direction(ref):
    return lambda x, positions, base=10000.0: ref.apply_rope(x, -positions, base)


def _pairs_not_interleaved(ref):
    """Rotated correctly, but returned as (all x'_2i, then all x'_2i+1)."""

    def apply_rope(x, positions, base=10000.0):
        rotated = ref.apply_rope(x, positions, base)
        return torch.cat((rotated[..., 0::2], rotated[..., 1::2]), dim=-1)

    return apply_rope


APPLY_ROPE_MISTAKES = [
    Mistake(
        "rope-half-split",
        "pairs (i, i + d/2) instead of neighbour pairs (2i, 2i+1)",
        "That is the half-split layout of Hugging Face's rotate_half. Here pair i is the neighbours "
        "x_2i and x_2i+1: turn each even dimension together with the odd one right after it, and put "
        "each turned pair back into those two dimensions.",
        _half_split_rope,
    ),
    Mistake(
        "rope-positions-ignored",
        "the rotation ignores `positions` (it uses 0, 1, 2, ...)",
        "Rotate token t by positions[t] · θ_i: after 100 cached tokens the next token is at "
        "position 100, not 0. Build the angles from `positions`, not from torch.arange(T).",
        _positions_ignored,
    ),
    Mistake(
        "rope-wrong-direction",
        "the rotation goes the wrong way (the sin terms have flipped signs)",
        "x'_2i = x_2i cos - x_2i+1 sin and x'_2i+1 = x_2i sin + x_2i+1 cos: (1, 0) at angle 90° "
        "becomes (0, 1), a counter-clockwise turn.",
        _wrong_direction,
    ),
    Mistake(
        "rope-pairs-not-interleaved",
        "the rotated pairs are concatenated, not put back in place",
        "Concatenating the turned halves puts all the x'_2i first. Each pair goes back where it came "
        "from: x'_2i into dimension 2i and x'_2i+1 into dimension 2i+1, interleaved as in the input.",
        _pairs_not_interleaved,
    ),
]


# ---------------------------------------------------------------- neighbour_to_half_split


def neighbour_to_half_split_cases(ref):
    g = _generator(505)
    yield Case("the dimensions 0 .. 7 of one vector, as floats", (torch.arange(8.0),))
    yield Case("a (3, 16) batch of vectors", (torch.randn(3, 16, generator=g),))
    yield Case("float64 heads (2, 4, 5, 64)", (torch.randn(2, 4, 5, 64, generator=g, dtype=torch.float64),))
    yield Case("integer entries, shape (2, 12)", (torch.arange(24).reshape(2, 12),))
    yield Case("d=2 (one pair: nothing moves)", (torch.randn(3, 2, generator=g),))
    yield Case(
        "(2, 6, 4, 8) transposed to (2, 4, 6, 8) (not contiguous)",
        (torch.randn(2, 6, 4, 8, generator=g).transpose(1, 2),),
    )


def _half_split_to_neighbour(ref):
    def inverse(x):
        half = x.shape[-1] // 2
        return torch.stack((x[..., :half], x[..., half:]), dim=-1).flatten(-2)

    return inverse


def _mixes_batch(ref):
    def reorder(x):
        pairs = x.reshape(-1, 2)
        return torch.cat((pairs[:, 0], pairs[:, 1])).reshape(x.shape)

    return reorder


NEIGHBOUR_TO_HALF_SPLIT_MISTAKES = [
    Mistake(
        "permutation-inverted",
        "this is the inverse reordering (half-split to neighbour)",
        "Slot i of the result must hold x[2i] and slot i + d/2 must hold x[2i+1]: the even "
        "dimensions first, then the odd ones. Interleaving the two halves goes the other way.",
        _half_split_to_neighbour,
    ),
    Mistake(
        "permutation-mixes-batch",
        "the reordering mixes entries of different vectors",
        "Reorder the last axis of each vector on its own: x[..., 0::2] and x[..., 1::2] keep the "
        "leading (batch, head, token) dimensions apart; reshape(-1, 2) over the whole tensor does not.",
        _mixes_batch,
    ),
]


EXERCISES = {
    "rope_frequencies": Exercise("rope_frequencies", rope_frequencies_cases, mistakes=ROPE_FREQUENCIES_MISTAKES),
    "apply_rope": Exercise(
        "apply_rope", apply_rope_cases, atol=2e-3, depends_on=("rope_frequencies",), mistakes=APPLY_ROPE_MISTAKES
    ),
    "neighbour_to_half_split": Exercise(
        "neighbour_to_half_split", neighbour_to_half_split_cases, mistakes=NEIGHBOUR_TO_HALF_SPLIT_MISTAKES
    ),
}
