"""Notebook 03: split_heads, merge_heads, MultiHeadAttention, and no loop over heads.

Tolerances: ``split_heads`` and ``merge_heads`` only move numbers around, so
every correct writing (view or reshape, permute, einsum-free or not, float64)
returns exactly the reference's values: they are compared exactly (0, 0).
``MultiHeadAttention`` is four matrix products and a softmax in float32;
correct orderings (einsum, ``F.scaled_dot_product_attention``, float64 inside)
agree to about 1e-6, so 1e-5 absolute and relative leaves room for them, while
the smallest catalogued mistake (√D instead of √(D/H) with 2 heads) moves the
outputs by more than 1e-2.

The no-loop check (``no_head_loop``, its own check cell and points) runs one
forward pass with 2 heads and one with 8 and counts the Python steps taken
(``sys.settrace`` with opcode events): code without a loop over heads takes
exactly as many steps with 8 heads as with 2, whatever it loops over otherwise
(the three projections, say); a loop over heads, in ``forward``, in a helper
method or in the learner's own ``split_heads``, takes more. The message quotes
the line of the learner's code that ran more often. When the learner's
helpers make the forward pass fail, the reference ones stand in; when it
still fails (and is not simply unimplemented), the class's methods are
judged by their syntax tree instead: no loop statement or comprehension
outside ``__init__``. Either way a mistake elsewhere costs only its own check.
The counting is ``course_checks.probes.HeadLoop`` (it runs where the learner's code runs);
what it saw is read here.

Under ``./course grade`` the learner's forward pass also gets, while the check runs, a substitute
`attention` that the referee answers outside the kernel (``counted_calls``), and the judge counts
its calls by the shape of their queries: without a loop over heads, as many calls with 8 heads as
with 2, each carrying all the heads; with one, a call per head. What the referee counted decides
when it shows a loop, whatever the kernel reported (a forged step count, a loop run in a thread the
counter does not trace, a loop compiled under a library's file name). A loop it cannot see (in the
learner's own `split_heads`, or in a forward pass that never calls `attention`: einsum, torch's
scaled_dot_product_attention) is the kernel's count's to find, as in self-study.
"""

from __future__ import annotations

import math

import torch

from course_checks.probes import HeadLoop, ViewError

from ..messages import tagged
from .catalogue import Case, Exercise, ForReview, Mistake, Property, module_case

ASSIGNMENT = "03_multi_head_attention"


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _random_mask(T: int, generator) -> torch.Tensor:
    """A (T, T) boolean mask (True = may attend) with a True and a False in every row.

    No row is all False, and none all True, so an inverted mask never hides a
    whole row: the mask mistakes then give finite numbers that can be compared.
    """
    mask = torch.rand(T, T, generator=generator) < 0.6
    mask[:, 0] = True
    mask[:, 1] = False
    return mask[:, torch.randperm(T, generator=generator)]


def _named(exercise: str, mistake: Mistake) -> str:
    return tagged(f"`{exercise}`: {mistake.name}. {mistake.hint}", mistake.id)


# ---------------------------------------------------------------- split_heads


def split_heads_cases(ref):
    g = _generator(301)
    yield Case("the worked example's shape: (1, 3, 8) into 2 heads of 4", (torch.arange(24.0).view(1, 3, 8), 2))
    yield Case("a (2, 5, 12) batch into 3 heads", (torch.randn(2, 5, 12, generator=g), 3))
    yield Case(
        "a (2, 4, 16) batch in float64 into 4 heads", (torch.randn(2, 4, 16, generator=g, dtype=torch.float64), 4)
    )
    yield Case("one token: (3, 1, 8) into 2 heads", (torch.randn(3, 1, 8, generator=g), 2))
    yield Case("(2, 3, 8) into 8 heads of size 1", (torch.randn(2, 3, 8, generator=g), 8))
    yield Case("(2, 6, 8) into a single head", (torch.randn(2, 6, 8, generator=g), 1))
    yield Case("(1, 7, 24) into 6 heads", (torch.randn(1, 7, 24, generator=g), 6))


def _split_without_transpose(ref):
    def split_heads(x, n_heads):
        B, T, D = x.shape
        return x.reshape(B, n_heads, T, D // n_heads)

    return split_heads


def _split_strided(ref):
    def split_heads(x, n_heads):
        B, T, D = x.shape
        return x.reshape(B, T, D // n_heads, n_heads).permute(0, 3, 1, 2)

    return split_heads


def _split_transpose_missing(ref):
    def split_heads(x, n_heads):
        B, T, D = x.shape
        return x.reshape(B, T, n_heads, D // n_heads)

    return split_heads


SPLIT_HEADS_MISTAKES = [
    Mistake(
        "split-no-transpose",
        "reshaped straight to (B, H, T, D/H), without the transpose",
        "Reshaping (B, T, D) directly to (B, H, T, D/H) cuts the flat row of numbers in the wrong "
        "places: head 0 then holds all of token 0's features and half of token 1's. View as "
        "(B, T, H, D/H) first, so each token's D features are cut into H pieces, then swap the "
        "token and head axes with .transpose(1, 2).",
        _split_without_transpose,
    ),
    Mistake(
        "split-heads-strided",
        "each head gets every H-th feature instead of D/H neighbouring ones",
        "Head h takes features h·D/H to (h+1)·D/H − 1 (with D = 8 and 2 heads: 0–3 for head 0, "
        "4–7 for head 1). View as (B, T, H, D/H), not (B, T, D/H, H).",
        _split_strided,
    ),
    Mistake(
        "split-transpose-missing",
        "returns (B, T, H, D/H): the transpose is missing",
        "After the view to (B, T, H, D/H), swap the token and head axes with .transpose(1, 2), "
        "so that attention sees one (T, D/H) matrix per head.",
        _split_transpose_missing,
    ),
]


# ---------------------------------------------------------------- merge_heads


def merge_heads_cases(ref):
    g = _generator(302)
    yield Case("the worked example's shape: 2 heads, 3 tokens, head size 4", (torch.arange(24.0).view(1, 2, 3, 4),))
    yield Case("a (2, 3, 5, 4) batch", (torch.randn(2, 3, 5, 4, generator=g),))
    yield Case("a (2, 4, 3, 2) batch in float64", (torch.randn(2, 4, 3, 2, generator=g, dtype=torch.float64),))
    yield Case("a single head (2, 1, 5, 8)", (torch.randn(2, 1, 5, 8, generator=g),))
    yield Case("8 heads of size 1: (3, 8, 2, 1)", (torch.randn(3, 8, 2, 1, generator=g),))
    yield Case("one token: (2, 2, 1, 4)", (torch.randn(2, 2, 1, 4, generator=g),))


def _merge_without_transpose(ref):
    def merge_heads(x):
        B, H, T, Dh = x.shape
        return x.reshape(B, T, H * Dh)

    return merge_heads


def _merge_interleaved(ref):
    def merge_heads(x):
        B, H, T, Dh = x.shape
        return x.permute(0, 2, 3, 1).reshape(B, T, H * Dh)

    return merge_heads


def _merge_with_view(ref):
    def merge_heads(x):  # raises for most shapes, as the mistaken code does
        B, H, T, Dh = x.shape
        return x.transpose(1, 2).view(B, T, H * Dh)

    return merge_heads


MERGE_NO_TRANSPOSE = Mistake(
    "merge-no-transpose",
    "reshaped (B, H, T, Dh) straight to (B, T, H·Dh), without the transpose",
    "In (B, H, T, Dh) one token's numbers are spread over the H heads. Swap the axes back with "
    ".transpose(1, 2) to (B, T, H, Dh) first, then reshape to (B, T, H·Dh).",
    _merge_without_transpose,
)
MERGE_VIEW = Mistake(
    "merge-view-not-contiguous",
    "`.view` after `.transpose` fails (the tensor is not contiguous)",
    "A transposed tensor's numbers are no longer in row order in memory, so .view cannot merge its "
    "axes. Use .reshape(B, T, H * Dh), which copies when it must, or call .contiguous() before .view.",
    _merge_with_view,
)

MERGE_HEADS_MISTAKES = [
    MERGE_NO_TRANSPOSE,
    Mistake(
        "merge-wrong-order",
        "the heads' outputs are interleaved instead of side by side",
        "Token t's output must read [head 0's Dh numbers, head 1's Dh numbers, ...]: transpose to "
        "(B, T, H, Dh), with the head axis before Dh, then reshape.",
        _merge_interleaved,
    ),
    MERGE_VIEW,
]


def _view_reading(exercise: str, mistake: Mistake):
    """Name the .view-after-transpose error in the learner's terms (what ``ViewError`` saw)."""

    def reading(seen, probe, ref):
        return _named(exercise, mistake) if seen == "view-error" else None

    return reading


MERGE_VIEW_PROPERTY = Property(
    ViewError(args=(torch.randn(2, 3, 5, 4, generator=_generator(7)),)), _view_reading("merge_heads", MERGE_VIEW)
)


# ---------------------------------------------------------------- MultiHeadAttention


def multi_head_attention_cases(ref):
    g = _generator(303)
    MHA = ref.MultiHeadAttention

    def case(label, D, H, B, T, mask=None, seed=0, dtype=None):
        x = torch.randn(B, T, D, generator=g, dtype=torch.float64 if dtype == "float64" else torch.float32)
        kwargs = {} if mask is None else {"mask": mask}
        return module_case(label, (x,), kwargs, reference=MHA, init_args=(D, H), seed=seed, dtype=dtype)

    causal = torch.ones(5, 5, dtype=torch.bool).tril()
    yield case("the worked example's size: D = 8, 2 heads, 3 tokens", 8, 2, 1, 3, seed=1)
    yield case("D = 16, 4 heads, a batch of 2 × 5 tokens, a (5, 5) mask", 16, 4, 2, 5, _random_mask(5, g), seed=2)
    yield case("D = 16, 4 heads, 2 × 5 tokens, a causal mask", 16, 4, 2, 5, causal, seed=3)
    yield case("D = 32, 8 heads, 3 × 7 tokens", 32, 8, 3, 7, seed=4)
    yield case("D = 12, 3 heads, 2 × 4 tokens, a (4, 4) mask", 12, 3, 2, 4, _random_mask(4, g), seed=5)
    yield case("a single head: D = 8, 1 head, 2 × 4 tokens", 8, 1, 2, 4, seed=6)
    yield case("D = 8, 8 heads of size 1, 6 tokens", 8, 8, 1, 6, seed=7)
    yield case("one token: D = 16, 2 heads", 16, 2, 2, 1, seed=8)
    yield case(
        "float64: D = 16, 2 heads, 2 × 6 tokens, a (6, 6) mask",
        16,
        2,
        2,
        6,
        _random_mask(6, g),
        seed=9,
        dtype="float64",
    )


def _module_mutant(forward):
    """A reference MultiHeadAttention whose forward is the mistaken ``forward(self, x, mask, ref)``."""

    def mutant(ref):
        class Mistaken(ref.MultiHeadAttention):
            def forward(self, x, mask=None):
                return forward(self, x, mask, ref)

        return Mistaken

    return mutant


def _heads(self, x, ref):
    return (ref.split_heads(proj(x), self.n_heads) for proj in (self.q_proj, self.k_proj, self.v_proj))


def _forward_scaled_by_model_width(self, x, mask, ref):
    q, k, v = _heads(self, x, ref)
    return self.o_proj(ref.merge_heads(ref.attention(q / math.sqrt(self.n_heads), k, v, mask)))


def _forward_without_output_projection(self, x, mask, ref):
    q, k, v = _heads(self, x, ref)
    return ref.merge_heads(ref.attention(q, k, v, mask))


def _forward_split_without_transpose(self, x, mask, ref):
    B, T, D = x.shape
    H = self.n_heads
    q, k, v = (proj(x).reshape(B, H, T, D // H) for proj in (self.q_proj, self.k_proj, self.v_proj))
    return self.o_proj(ref.merge_heads(ref.attention(q, k, v, mask)))


def _forward_merge_without_transpose(self, x, mask, ref):
    B, T, D = x.shape
    q, k, v = _heads(self, x, ref)
    return self.o_proj(ref.attention(q, k, v, mask).reshape(B, T, D))


def _forward_mask_inverted(self, x, mask, ref):
    q, k, v = _heads(self, x, ref)
    return self.o_proj(ref.merge_heads(ref.attention(q, k, v, None if mask is None else ~mask)))


def _forward_mask_dropped(self, x, mask, ref):
    q, k, v = _heads(self, x, ref)
    return self.o_proj(ref.merge_heads(ref.attention(q, k, v)))


def _forward_merge_with_view(self, x, mask, ref):
    B, T, D = x.shape
    q, k, v = _heads(self, x, ref)
    return self.o_proj(ref.attention(q, k, v, mask).transpose(1, 2).view(B, T, D))


MHA_VIEW = Mistake(
    "merge-view-not-contiguous",
    "`.view` after `.transpose` fails (the tensor is not contiguous)",
    MERGE_VIEW.hint + " Or call your merge_heads.",
    _module_mutant(_forward_merge_with_view),
)

MULTI_HEAD_ATTENTION_MISTAKES = [
    Mistake(
        "scaled-by-sqrt-d-model",
        "the scores are divided by √D (the model width) instead of √(D/H) (the head size)",
        "Each head is an attention of size D/H: attention(q, k, v, mask) on the split (B, H, T, D/H) "
        "tensors already divides by √(D/H) = √(q.shape[-1]). Add no extra factor, and if you compute "
        "the scores yourself, take d from the split tensors.",
        _module_mutant(_forward_scaled_by_model_width),
    ),
    Mistake(
        "no-output-projection",
        "the output projection W_O is missing",
        "After merging the heads, mix them with the output projection: return self.o_proj(merge_heads(...)).",
        _module_mutant(_forward_without_output_projection),
    ),
    Mistake(
        "split-no-transpose",
        "the projections are reshaped to (B, H, T, D/H) without the transpose",
        "Reshaping straight to (B, H, T, D/H) hands each head the wrong numbers; use your split_heads "
        "(a view to (B, T, H, D/H), then .transpose(1, 2)).",
        _module_mutant(_forward_split_without_transpose),
    ),
    Mistake(
        "merge-no-transpose",
        "the heads are merged without the transpose",
        "attention returns (B, H, T, D/H): transpose to (B, T, H, D/H) before reshaping to (B, T, D), "
        "or use your merge_heads.",
        _module_mutant(_forward_merge_without_transpose),
    ),
    Mistake(
        "mask-polarity",
        "the mask's polarity is inverted",
        'Here True means "may attend" (as in F.scaled_dot_product_attention); '
        "torch.nn.MultiheadAttention's attn_mask uses the opposite, True = blocked. "
        "Pass the mask on to attention unchanged.",
        _module_mutant(_forward_mask_inverted),
    ),
    Mistake(
        "mask-not-passed",
        "the mask is not passed on to attention",
        "Call attention(q, k, v, mask): the (T, T) mask broadcasts over the batch and head axes.",
        _module_mutant(_forward_mask_dropped),
    ),
    MHA_VIEW,
]


MHA_VIEW_PROPERTY = Property(
    ViewError(args=(torch.randn(2, 3, 8, generator=_generator(8)),), init_args=(8, 2)),
    _view_reading("MultiHeadAttention", MHA_VIEW),
)


# ---------------------------------------------------------------- no loop over heads

PROBE_WIDTH, PROBE_TOKENS, PROBE_HEADS = 16, 3, (2, 8)
_GIVEN = ("softmax", "attention_weights", "attention", "split_heads", "merge_heads")


def _looping_forward(self, x, mask, ref):
    q, k, v = _heads(self, x, ref)
    heads = [ref.attention(q[:, h], k[:, h], v[:, h], mask) for h in range(self.n_heads)]
    return self.o_proj(ref.merge_heads(torch.stack(heads, dim=1)))


HEAD_LOOP = Mistake(
    "head-loop",
    "a Python loop over the heads",
    "Work on all heads at once: split_heads gives (B, H, T, D/H), and attention runs on every head "
    "in one call because it treats the leading axes (B, H) as batch axes. Loops elsewhere are fine.",
    _module_mutant(_looping_forward),
)


def _shape(key: str) -> tuple[int, ...] | None:
    """The shape the referee wrote as ``"1x8x3x2"`` (None for an argument that was no tensor)."""
    try:
        return tuple(int(size) for size in key.split("x"))
    except ValueError:
        return None


def _calls_seen_outside(outside: dict, probe) -> dict[int, list]:
    """{heads: [(shape, calls)]}: the calls of `attention` the referee answered during the passes
    with each head count of ``probe``, by the shape of their queries (those of a pass end in
    (tokens, width / heads))."""
    found = {heads: [] for heads in probe.heads}
    for key, calls in outside.items():
        shape = _shape(str(key))
        if not shape or len(shape) < 2 or not isinstance(calls, int) or calls <= 0:
            continue
        for heads in probe.heads:
            if shape[-2:] == (probe.tokens, probe.width // heads):
                found[heads].append((shape, calls))
    return found


def _loop_seen_outside(outside: dict, probe) -> str | None:
    """What the calls of `attention` the referee answered say of a loop over heads, or None.

    Without a loop, a forward pass hands `attention` all its heads at once, whatever H: as many
    calls with 8 heads as with 2, each carrying (B, H, ...) = H heads (as (B, H, T, d), (B·H, T, d)
    or any other arrangement of the leading axes). A loop over heads makes more calls with more
    heads, each carrying fewer than all of them (one head: (B, T, d))."""
    few, many = probe.heads[0], probe.heads[-1]
    found = _calls_seen_outside(outside, probe)
    calls = {heads: sum(n for _, n in found[heads]) for heads in found}
    partial = [(shape, n) for shape, n in found[many] if math.prod(shape[:-2]) < many]
    if calls[many] <= calls[few] and not partial:
        return None
    shown = ", ".join(f"{n} on {tuple(shape)}" for shape, n in sorted(found[many], key=lambda item: -item[1])[:3])
    return tagged(
        f"`MultiHeadAttention`: {HEAD_LOOP.name}. In the check's forward passes with {many} heads your code "
        f"called `attention` {calls[many]} times ({shown}: the last two axes are the tokens and the head "
        f"size, the others the sequences and heads each call carries), with {few} heads {calls[few]} times. "
        f"{HEAD_LOOP.hint}",
        HEAD_LOOP.id,
    )


def _head_loop_reading(seen, probe, ref) -> str | None:
    """The message for what ``HeadLoop`` saw: None when one forward pass takes as many Python
    steps with 8 heads as with 2.

    Under ``./course grade`` ``seen`` is ``{"kernel": what the probe saw, "outside": the calls of
    `attention` the referee answered, by shape}`` (the check hands the learner's forward pass a
    substitute `attention`, ``Exercise.counted_calls``). Calls that show a loop over heads decide,
    whatever the kernel reported: a kernel that forges its step count (or loops where the counter
    cannot see, in a thread) gains nothing. Otherwise the kernel's count decides: it is believed when
    it finds a loop (a loop in the learner's own `split_heads`, say), and when it finds none it is
    the only observation of a forward pass that never calls `attention` (einsum, torch's
    scaled_dot_product_attention): forging it takes what the tamper scan flags (the tracer switched,
    frames read, code compiled under another file name, the probe edited).
    """
    if isinstance(seen, dict) and "outside" in seen:
        outside = seen.get("outside")
        seen = seen.get("kernel")
        outside = outside if isinstance(outside, dict) else {}
        found = _loop_seen_outside(outside, probe)
        if found:
            return found
        if outside.get("overflow"):  # calls of so many shapes that the grader could not tell them apart
            kernel = _head_loop_reading(seen, probe, ref)
            return kernel or ForReview(
                "`MultiHeadAttention` called `attention` with more different shapes than the grader counts "
                "apart, so its calls could not show whether it loops over the heads; its kernel reported no "
                "loop. Whether it loops over the heads is for you to read in its code."
            )
    name = "MultiHeadAttention"
    if not isinstance(seen, dict):
        return f"`{name}`: the check of its forward pass did not report what it saw."
    if seen.get("tracer_removed"):
        return f"`{name}`: the forward pass switched off the step counter (sys.settrace), so it cannot be checked."
    if "raised" in seen:  # no forward pass could run: judged by the syntax tree
        raised = str(seen["raised"])[:2000]
        if seen.get("unreadable"):
            return f"`{name}` raised {raised}; this check needs a forward pass that runs."
        loop = seen.get("loop")
        if not loop:
            return None
        where, line = (str(part)[:500] for part in loop)
        return tagged(
            f"`{name}`: {HEAD_LOOP.name}? Your forward pass raised {raised}, so its steps could not be "
            f"counted, and `{where}` holds a loop: `{line}`. {HEAD_LOOP.hint}",
            HEAD_LOOP.id,
        )
    steps = seen.get("steps")
    if not (isinstance(steps, list) and len(steps) == 2 and all(isinstance(n, int) for n in steps)):
        return f"`{name}`: the check of its forward pass did not report what it saw."
    steps_few, steps_many = steps
    if steps_many <= steps_few:
        return None
    where = seen.get("where")
    located = f"; this line ran more often: {str(where)[:500]}" if where else ""
    return tagged(
        f"`{name}`: {HEAD_LOOP.name}. One forward pass takes {steps_few} Python steps with "
        f"{PROBE_HEADS[0]} heads and {steps_many} with {PROBE_HEADS[1]}{located}. {HEAD_LOOP.hint}",
        HEAD_LOOP.id,
    )


NO_HEAD_LOOP_PROPERTY = Property(
    HeadLoop(width=PROBE_WIDTH, tokens=PROBE_TOKENS, heads=PROBE_HEADS, fallback=_GIVEN),
    _head_loop_reading,
    counted="calls/attention",
)


def _no_cases(ref):
    return ()


EXERCISES = {
    "split_heads": Exercise("split_heads", split_heads_cases, atol=0.0, rtol=0.0, mistakes=SPLIT_HEADS_MISTAKES),
    # merge_heads calls nothing, but its visible checks take a round trip through
    # split_heads: the reference one, so that they judge merge_heads alone.
    "merge_heads": Exercise(
        "merge_heads",
        merge_heads_cases,
        atol=0.0,
        rtol=0.0,
        depends_on=("split_heads",),
        mistakes=MERGE_HEADS_MISTAKES,
        properties=(MERGE_VIEW_PROPERTY,),
    ),
    "MultiHeadAttention": Exercise(
        "MultiHeadAttention",
        multi_head_attention_cases,
        atol=1e-5,
        rtol=1e-5,
        depends_on=("softmax", "attention_weights", "attention", "split_heads", "merge_heads"),
        mistakes=MULTI_HEAD_ATTENTION_MISTAKES,
        properties=(MHA_VIEW_PROPERTY,),
    ),
    # Its own check cell and points: judges the forward pass as the learner wrote
    # it (with their split_heads and merge_heads), not its numbers.
    "no_head_loop": Exercise(
        "no_head_loop",
        _no_cases,
        target="MultiHeadAttention",
        mistakes=(HEAD_LOOP,),
        properties=(NO_HEAD_LOOP_PROPERTY,),
        reference_uses=_GIVEN,
        counted_calls=("attention",),
    ),
}
