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
"""

from __future__ import annotations

import ast
import inspect
import linecache
import math
import os
import sys
import sysconfig
import textwrap
from collections import Counter

import torch

from course_checks.checks import substitute

from ..messages import tagged
from .catalogue import Case, Exercise, Mistake, module_case

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


def _is_view_error(error: BaseException) -> bool:
    """True for torch's error when .view cannot merge the axes of a non-contiguous tensor."""
    return isinstance(error, RuntimeError) and "view size is not compatible" in str(error)


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


def _merge_view_property(merge_heads, ref):
    """Name the .view-after-transpose error in the learner's terms."""
    try:
        merge_heads(torch.randn(2, 3, 5, 4, generator=_generator(7)))
    except Exception as error:  # other errors are described by the comparison
        if _is_view_error(error):
            return _named("merge_heads", MERGE_VIEW)
    return None


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


def _mha_view_property(cls, ref):
    try:
        cls(8, 2)(torch.randn(2, 3, 8, generator=_generator(8)))
    except Exception as error:  # other errors are described by the comparison
        if _is_view_error(error):
            return _named("MultiHeadAttention", MHA_VIEW)
    return None


# ---------------------------------------------------------------- no loop over heads

PROBE_WIDTH, PROBE_TOKENS, PROBE_HEADS = 16, 3, (2, 8)
_GIVEN = ("softmax", "attention_weights", "attention", "split_heads", "merge_heads")


def _library_folders() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    folders = {os.path.dirname(torch.__file__), paths["stdlib"], paths["purelib"], paths["platlib"]}
    return tuple(os.path.realpath(folder) + os.sep for folder in folders)


class _TracerRemoved(Exception):
    pass


def python_steps(cls, n_heads: int) -> Counter:
    """{(file, line, function's qualified name): Python events} of one forward pass of ``cls(16, n_heads)``.

    Every call, line and bytecode step of every Python frame counts, so a loop
    of any kind adds steps each time round.
    """
    module = cls(PROBE_WIDTH, n_heads)
    x = torch.randn(1, PROBE_TOKENS, PROBE_WIDTH, generator=_generator(9))
    with torch.no_grad():
        module(x)  # warm-up: first-call work (caches, lazy imports) is not counted
    counts = Counter()

    def trace(frame, event, arg):
        code = frame.f_code
        counts[code.co_filename, frame.f_lineno, code.co_qualname.replace(".<locals>", "")] += 1
        if event == "call":
            frame.f_trace_opcodes = True
        return trace

    previous = sys.gettrace()
    sys.settrace(trace)
    try:
        with torch.no_grad():
            module(x)
    finally:
        current = sys.gettrace()
        sys.settrace(previous)
    if current is not trace:
        raise _TracerRemoved()
    return counts


def _steps_with_fallback(cls, ref):
    """Counts for each probe head count; with the reference helpers (``ref``) if the learner's fail."""

    try:
        return [python_steps(cls, h) for h in PROBE_HEADS]
    except _TracerRemoved:
        raise
    except Exception as failure:
        namespace = getattr(getattr(cls, "forward", None), "__globals__", None)
        if not isinstance(namespace, dict):
            raise
        try:
            given = {name: getattr(ref, name) for name in _GIVEN}
        except AttributeError:  # no reference here: the learner's own failure stands
            raise failure from None
        restore = substitute(namespace, given)
        try:
            return [python_steps(cls, h) for h in PROBE_HEADS]
        finally:
            restore()


def _loop_line(few: Counter, many: Counter, classes: set) -> str | None:
    """The learner's line that ran more often with more heads, quoted.

    Lines of the class's own methods come first, then other notebook code; the
    earliest such line of a function is the loop's header (a body comes after it).
    """
    library = _library_folders()
    found = []
    for (filename, line, function), count in many.items():
        if count <= few.get((filename, line, function), 0):
            continue
        if (
            os.path.realpath(filename).startswith(library)
            or "/autograder/" in filename
            or "/course_checks/" in filename
        ):
            continue
        found.append((function.split(".")[0] not in classes, filename, line, function))
    if not found:
        return None
    _, filename, line, function = min(found)
    text = linecache.getline(filename, line).strip()
    return f"`{text}` (in `{function}`)" if text else f"line {line} of `{function}`"


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


_LOOPS = (ast.For, ast.AsyncFor, ast.While, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


def _static_loop_check(cls, error: Exception) -> str | None:
    """When the forward pass cannot run: look for loops in the class's methods (``__init__`` aside).

    A forward that fails (a .view error, say) loses the points of the exercise
    it belongs to; here it passes unless its code holds a loop.
    """
    name = "MultiHeadAttention"
    raised = f"{type(error).__name__}: {error}"
    loops = []  # (not about heads, line number, where, line)
    for klass in cls.__mro__:
        if klass.__module__.split(".")[0] == "torch" or klass is object:
            continue
        for method, function in vars(klass).items():
            if method == "__init__" or not inspect.isfunction(function):
                continue
            try:
                source = textwrap.dedent(inspect.getsource(function))
                tree = ast.parse(source)
            except (OSError, TypeError, SyntaxError):
                return f"`{name}` raised {raised}; this check needs a forward pass that runs."
            for node in ast.walk(tree):
                if isinstance(node, _LOOPS):
                    iterables = (
                        [node.iter] if hasattr(node, "iter") else [g.iter for g in getattr(node, "generators", [])]
                    )
                    text = " ".join(ast.unparse(i) for i in iterables).lower()
                    about_heads = "head" in text or text.startswith("range(")
                    line = source.splitlines()[node.lineno - 1].strip()
                    loops.append((not about_heads, node.lineno, f"{klass.__name__}.{method}", line))
    if not loops:
        return None
    _, _, where, line = min(loops)
    return tagged(
        f"`{name}`: {HEAD_LOOP.name}? Your forward pass raised {raised}, so its steps could not be "
        f"counted, and `{where}` holds a loop: `{line}`. {HEAD_LOOP.hint}",
        HEAD_LOOP.id,
    )


def no_head_loop_property(cls, ref):
    """None when one forward pass takes as many Python steps with 8 heads as with 2."""
    name = "MultiHeadAttention"
    try:
        few, many = _steps_with_fallback(cls, ref)
    except NotImplementedError:
        raise  # the stub: the check helper says "not implemented yet" (and self-study "not tried")
    except _TracerRemoved:
        return f"`{name}`: the forward pass switched off the step counter (sys.settrace), so it cannot be checked."
    except Exception as error:  # judged by the syntax tree instead
        return _static_loop_check(cls, error)
    steps_few, steps_many = sum(few.values()), sum(many.values())
    if steps_many <= steps_few:
        return None
    classes = {klass.__name__ for klass in cls.__mro__ if klass.__module__.split(".")[0] != "torch"}
    where = _loop_line(few, many, classes)
    located = f"; this line ran more often: {where}" if where else ""
    return tagged(
        f"`{name}`: {HEAD_LOOP.name}. One forward pass takes {steps_few} Python steps with "
        f"{PROBE_HEADS[0]} heads and {steps_many} with {PROBE_HEADS[1]}{located}. {HEAD_LOOP.hint}",
        HEAD_LOOP.id,
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
        properties=(_merge_view_property,),
    ),
    "MultiHeadAttention": Exercise(
        "MultiHeadAttention",
        multi_head_attention_cases,
        atol=1e-5,
        rtol=1e-5,
        depends_on=("softmax", "attention_weights", "attention", "split_heads", "merge_heads"),
        mistakes=MULTI_HEAD_ATTENTION_MISTAKES,
        properties=(_mha_view_property,),
    ),
    # Its own check cell and points: judges the forward pass as the learner wrote
    # it (with their split_heads and merge_heads), not its numbers.
    "no_head_loop": Exercise(
        "no_head_loop",
        _no_cases,
        target="MultiHeadAttention",
        mistakes=(HEAD_LOOP,),
        properties=(no_head_loop_property,),
        reference_uses=_GIVEN,
    ),
}
