"""Notebook 09 graded by real nbgrader: each catalogued mistake, correct alternatives (einsum or matmul,
float64, -inf or -1e9 masking, a loop over queries, a preallocated output or torch.cat), tampering;
and, without nbgrader, the references against independent implementations (PyTorch's softmax and
scaled_dot_product_attention) and the catalogue's power to tell its mistakes apart."""

import math
import textwrap

import pytest
import torch
import torch.nn.functional as F
from catalogue_checks import assert_mutants_differ, assert_mutants_recognised
from grading_suite import GradingSuite

from autograder import reference
from autograder.exercises import efficient_attention
from autograder.local_judge import judge_function

ASSIGNMENT = "09_efficient_attention"


def merge_answer(sums: str, outputs: str, result: str = "m, l, o") -> str:
    """A learner's merge_partials: the maxima as everyone writes them, then ``sums`` and ``outputs``."""
    return f"""
def merge_partials(m_a, l_a, o_a, m_b, l_b, o_b):
    m = torch.maximum(m_a, m_b)
    alpha = torch.exp(m_a - m)
    beta = torch.exp(m_b - m)
    l = {sums}
    o = {outputs}
    return {result}
"""


def blockwise_answer(**changes) -> str:
    """A learner's blockwise_attention written the way the hints lead (lists and torch.cat, the empty
    partial), with some of its lines changed: ``changes`` maps a line's name to its new text."""
    lines = {
        "offset": "offset = S - T",
        "keys": "for j0 in range(0, S, block_size):",
        "skip": "if causal and j0 > i1 - 1 + offset:\n                break",
        "partly": "",
        "scores": "scores = q[..., i0:i1, :] @ k[..., j0:j1, :].transpose(-2, -1) / math.sqrt(d)",
        "early max": "",
        "mask": "visible = torch.arange(j0, j1)[None, :] <= torch.arange(i0, i1)[:, None] + offset",
        "max": "tile_max = scores.amax(dim=-1, keepdim=True).clamp(min=-1e30)",
    }
    unknown = set(changes) - set(lines)
    assert not unknown, unknown
    lines.update(changes)
    source = f"""
def blockwise_attention(q, k, v, block_size, causal=False):
    T, S, d = q.shape[-2], k.shape[-2], q.shape[-1]
    {lines["offset"]}
    outputs = []
    for i0 in range(0, T, block_size):
        i1 = min(i0 + block_size, T)
        m = torch.full((*q.shape[:-2], i1 - i0, 1), float("-inf"), dtype=q.dtype)
        l = torch.zeros_like(m)
        o = torch.zeros(*q.shape[:-2], i1 - i0, v.shape[-1], dtype=q.dtype)
        {lines["keys"]}
            j1 = min(j0 + block_size, S)
            {lines["skip"]}
            {lines["partly"]}
            {lines["scores"]}
            {lines["early max"]}
            if causal and j1 - 1 > i0 + offset:
                {lines["mask"]}
                scores = scores.masked_fill(~visible, float("-inf"))
            {lines["max"]}
            p = torch.exp(scores - tile_max)
            m, l, o = merge_partials(m, l, o, tile_max, p.sum(dim=-1, keepdim=True), p @ v[..., j0:j1, :])
        outputs.append(o / l)
    return torch.cat(outputs, dim=-2)
"""
    return "\n".join(line for line in source.splitlines() if line.strip())


BLOCKS_NORMALISED_SEPARATELY = """
def blockwise_attention(q, k, v, block_size, causal=False):
    T, S = q.shape[-2], k.shape[-2]
    rows = []
    for i0 in range(0, T, block_size):
        i1 = min(i0 + block_size, T)
        outs = []
        for j0 in range(0, S, block_size):
            j1 = min(j0 + block_size, S)
            if causal and j0 > i1 - 1 + S - T:
                break
            scores = q[..., i0:i1, :] @ k[..., j0:j1, :].transpose(-2, -1) / math.sqrt(q.shape[-1])
            if causal and j1 - 1 > i0 + S - T:
                future = torch.arange(j0, j1)[None, :] > torch.arange(i0, i1)[:, None] + S - T
                scores = scores.masked_fill(future, float("-inf"))
            outs.append(softmax(scores, dim=-1) @ v[..., j0:j1, :])
        rows.append(torch.stack(outs).mean(dim=0))
    return torch.cat(rows, dim=-2)
"""

BLOCKWISE_EINSUM_MINUS_1E9 = """
def blockwise_attention(q, k, v, block_size, causal=False):
    T, S = q.shape[-2], k.shape[-2]
    scale = 1 / math.sqrt(q.shape[-1])
    outputs = []
    for start in range(0, T, block_size):
        stop = min(start + block_size, T)
        positions = torch.arange(start, stop)[:, None] + (S - T)
        state = None
        for key_start in range(0, S, block_size):
            key_stop = min(key_start + block_size, S)
            if causal and key_start > stop - 1 + S - T:
                continue
            s = torch.einsum("...td,...sd->...ts", q[..., start:stop, :], k[..., key_start:key_stop, :]) * scale
            if causal:
                s = s.masked_fill(torch.arange(key_start, key_stop)[None, :] > positions, -1e9)
            biggest = s.amax(-1, keepdim=True)
            p = torch.exp(s - biggest)
            part = (biggest, p.sum(-1, keepdim=True), torch.einsum("...ts,...sd->...td", p, v[..., key_start:key_stop, :]))
            state = part if state is None else merge_partials(*state, *part)
        outputs.append(state[2] / state[1])
    return torch.cat(outputs, dim=-2)
"""

MERGE_WHERE = """
def merge_partials(m_a, l_a, o_a, m_b, l_b, o_b):
    m = torch.where(m_a > m_b, m_a, m_b)
    alpha, beta = (m_a - m).exp(), (m_b - m).exp()
    return m, alpha * l_a + beta * l_b, alpha * o_a + beta * o_b
"""

MERGE_FLOAT64 = """
def merge_partials(m_a, l_a, o_a, m_b, l_b, o_b):
    dtype = o_a.dtype
    m_a, l_a, o_a, m_b, l_b, o_b = (x.double() for x in (m_a, l_a, o_a, m_b, l_b, o_b))
    m = torch.stack([m_a, m_b]).max(dim=0).values
    l = l_a * torch.exp(m_a - m) + l_b * torch.exp(m_b - m)
    o = o_a * torch.exp(m_a - m) + o_b * torch.exp(m_b - m)
    return m.to(dtype), l.to(dtype), o.to(dtype)
"""

BLOCKWISE_QUERY_BY_QUERY_FLOAT64 = """
def blockwise_attention(q, k, v, block_size, causal=False):
    # one query at a time (tiles of 1 x block_size), in float64
    T, S, d = q.shape[-2], k.shape[-2], q.shape[-1]
    q64, k64, v64 = q.double(), k.double(), v.double()
    rows = []
    for t in range(T):
        position = t + S - T
        m = torch.full((*q.shape[:-2], 1, 1), -math.inf, dtype=torch.float64)
        l = torch.zeros_like(m)
        o = torch.zeros(*q.shape[:-2], 1, v.shape[-1], dtype=torch.float64)
        for j0 in range(0, S, block_size):
            if causal and j0 > position:
                break
            j1 = min(j0 + block_size, S, position + 1) if causal else min(j0 + block_size, S)
            scores = torch.matmul(q64[..., t:t + 1, :], k64[..., j0:j1, :].transpose(-1, -2)) / d ** 0.5
            top = scores.max(dim=-1, keepdim=True).values
            w = (scores - top).exp()
            m, l, o = merge_partials(m, l, o, top, w.sum(dim=-1, keepdim=True), torch.matmul(w, v64[..., j0:j1, :]))
        rows.append(o / l)
    return torch.cat(rows, dim=-2).to(q.dtype)
"""

BLOCKWISE_PREALLOCATED_WHERE = """
def blockwise_attention(q, k, v, block_size, causal=False):
    T, S = q.shape[-2], k.shape[-2]
    out = torch.zeros(*torch.broadcast_shapes(q.shape[:-2], k.shape[:-2]), T, v.shape[-1], dtype=v.dtype)
    for a in range(0, T, block_size):
        b = min(a + block_size, T)
        run = None
        for c in range(0, S, block_size):
            e = min(c + block_size, S)
            if causal and c > (b - 1) + (S - T):
                break
            s = (q[..., a:b, :] / math.sqrt(q.shape[-1])) @ k[..., c:e, :].mT
            if causal:
                s = torch.where(torch.arange(c, e) <= torch.arange(a, b).unsqueeze(-1) + S - T, s, -math.inf)
            top = s.amax(-1, keepdim=True)
            top = torch.where(torch.isinf(top), torch.zeros_like(top), top)
            w = torch.exp(s - top)
            piece = (top, w.sum(-1, keepdim=True), w @ v[..., c:e, :])
            run = piece if run is None else merge_partials(*run, *piece)
        out[..., a:b, :] = run[2] / run[1]
    return out
"""


class TestEfficientAttentionGrading(GradingSuite):
    assignment = ASSIGNMENT

    mistakes = {
        "merge-old-sum-unscaled": (
            "merge_partials",
            merge_answer("l_a + beta * l_b", "alpha * o_a + beta * o_b"),
            "sum-not-rescaled",
        ),
        "merge-outputs-added": (
            "merge_partials",
            merge_answer("alpha * l_a + beta * l_b", "o_a + o_b"),
            "output-not-rescaled",
        ),
        "merge-rescaled-twice": (
            "merge_partials",
            """
            def merge_partials(m_a, l_a, o_a, m_b, l_b, o_b):
                m = torch.maximum(m_a, m_b)
                alpha, beta = torch.exp(m_a - m), torch.exp(m_b - m)
                l_a, o_a = l_a * alpha, o_a * alpha     # brought to the new max ...
                l_b, o_b = l_b * beta, o_b * beta
                return m, l_a * alpha + l_b * beta, o_a * alpha + o_b * beta   # ... and again
            """,
            "rescaled-twice",
        ),
        "merge-divides": (
            "merge_partials",
            merge_answer("alpha * l_a + beta * l_b", "alpha * o_a + beta * o_b", "m, l, o / l"),
            "output-normalised",
        ),
        "blockwise-strict-diagonal": (
            "blockwise_attention",
            blockwise_answer(mask="visible = torch.arange(j0, j1)[None, :] < torch.arange(i0, i1)[:, None] + offset"),
            "diagonal-off-by-one",
        ),
        "blockwise-skips-diagonal": (
            "blockwise_attention",
            blockwise_answer(partly="if causal and j1 - 1 > i0 + offset:\n                continue"),
            "skips-partly-visible-block",
        ),
        "blockwise-max-first": (
            "blockwise_attention",
            blockwise_answer(**{"early max": "tile_max = scores.amax(dim=-1, keepdim=True)", "max": ""}),
            "max-before-masking",
        ),
        "blockwise-no-clamp": (
            "blockwise_attention",
            blockwise_answer(max="tile_max = scores.amax(dim=-1, keepdim=True)"),
            "masked-row-nan",
        ),
        "blockwise-top-left": ("blockwise_attention", blockwise_answer(offset="offset = 0"), "top-left-aligned"),
        "blockwise-whole-blocks-only": (
            "blockwise_attention",
            blockwise_answer(keys="for j0 in range(0, S - block_size + 1, block_size):"),
            "last-block-dropped",
        ),
        "blockwise-no-sqrt-d": (
            "blockwise_attention",
            blockwise_answer(scores="scores = q[..., i0:i1, :] @ k[..., j0:j1, :].transpose(-2, -1)"),
            "no-sqrt-d",
        ),
        "blockwise-averages-blocks": (
            "blockwise_attention",
            BLOCKS_NORMALISED_SEPARATELY,
            "blocks-normalised-separately",
        ),
    }

    alternatives = {
        "where-einsum-minus-1e9": {"merge_partials": MERGE_WHERE, "blockwise_attention": BLOCKWISE_EINSUM_MINUS_1E9},
        "float64-query-by-query": {
            "merge_partials": MERGE_FLOAT64,
            "blockwise_attention": BLOCKWISE_QUERY_BY_QUERY_FLOAT64,
        },
        "hinted-cat": {"blockwise_attention": blockwise_answer()},
        "preallocated-where": {"blockwise_attention": BLOCKWISE_PREALLOCATED_WHERE},
    }

    wrong_answers = {
        "merge_partials": """
            def merge_partials(m_a, l_a, o_a, m_b, l_b, o_b):
                return torch.maximum(m_a, m_b), l_a + l_b, o_a + o_b
            """,
        "blockwise_attention": """
            def blockwise_attention(q, k, v, block_size, causal=False):
                return v[..., : q.shape[-2], :].mean(dim=-2, keepdim=True).expand(*v.shape[:-2], q.shape[-2], v.shape[-1])
            """,
    }


# ---------------------------------------------------------------- without nbgrader


@pytest.fixture(scope="module")
def solved():
    return reference.load(ASSIGNMENT)


def bottom_right(T: int, S: int) -> torch.Tensor:
    """The causal mask of T queries that are the last T of S positions, built here on its own."""
    return torch.ones(S, S, dtype=torch.bool).tril()[S - T :]


def test_blockwise_attention_equals_pytorchs_scaled_dot_product_attention(solved):
    """The reference against an independent implementation: 200 random sizes, batches, block sizes,
    dtypes, causal or not (T <= S then), against F.scaled_dot_product_attention, within the hidden
    checks' tolerance (1e-6 + 1e-5·|expected|) in float32 and to 1e-12 in float64."""
    generator = torch.Generator().manual_seed(90)
    for trial in range(200):
        dtype = torch.float64 if trial % 3 == 0 else torch.float32
        T = int(torch.randint(1, 33, (1,), generator=generator))
        causal = bool(torch.rand((), generator=generator) < 0.5)
        S = (
            T + int(torch.randint(0, 17, (1,), generator=generator))
            if causal
            else int(torch.randint(1, 40, (1,), generator=generator))
        )
        block = int(torch.randint(1, 41, (1,), generator=generator))
        batch = [(), (2,), (2, 3)][trial % 3]
        d, d_v = (
            int(torch.randint(1, 65, (1,), generator=generator)),
            int(torch.randint(1, 9, (1,), generator=generator)),
        )
        q = torch.randn(*batch, T, d, generator=generator, dtype=dtype)
        k = torch.randn(*batch, S, d, generator=generator, dtype=dtype)
        v = torch.randn(*batch, S, d_v, generator=generator, dtype=dtype)
        mine = solved.blockwise_attention(q, k, v, block, causal=causal)
        theirs = F.scaled_dot_product_attention(q, k, v, attn_mask=bottom_right(T, S) if causal else None)
        assert mine.dtype == dtype and mine.shape == theirs.shape
        if dtype == torch.float32:
            assert torch.allclose(mine, theirs, atol=1e-6, rtol=1e-5), (T, S, block, causal)
        else:
            assert torch.allclose(mine, theirs, atol=1e-12, rtol=0), (T, S, block, causal)


def test_merging_partials_gives_the_softmax_over_all_the_keys(solved):
    """Any cut of the keys into blocks, merged in any order from the empty partial, gives o / ℓ equal to
    torch.softmax over every key times the values, and the same max as every score's."""
    generator = torch.Generator().manual_seed(91)
    for _ in range(100):
        T, S = int(torch.randint(1, 6, (1,), generator=generator)), int(torch.randint(2, 12, (1,), generator=generator))
        scores = torch.randn(T, S, generator=generator, dtype=torch.float64) * 5
        values = torch.randn(S, 3, generator=generator, dtype=torch.float64)
        cuts = sorted(set(torch.randint(1, S, (3,), generator=generator).tolist()))
        blocks = list(zip([0, *cuts], [*cuts, S]))
        order = torch.randperm(len(blocks), generator=generator).tolist()
        state = (torch.full((T, 1), -math.inf, dtype=torch.float64), torch.zeros(T, 1, dtype=torch.float64))
        state = (*state, torch.zeros(T, 3, dtype=torch.float64))
        for index in order:
            start, stop = blocks[index]
            part = efficient_attention._partial(scores[:, start:stop], values[start:stop])
            state = solved.merge_partials(*state, *part)
        m, total, out = state
        assert torch.allclose(m, scores.amax(dim=-1, keepdim=True))
        assert torch.allclose(out / total, torch.softmax(scores, dim=-1) @ values, atol=1e-12)


def test_a_future_key_that_scores_high_breaks_only_the_max_taken_before_masking(solved):
    """The case built for "max-before-masking": the reference stays exact, the mutant gets nan."""
    q, k, v = efficient_attention._a_future_key_that_scores_high(torch.Generator().manual_seed(1))
    expected = solved.attention(q, k, v, solved.causal_mask(8))
    assert torch.allclose(solved.blockwise_attention(q, k, v, 4, causal=True), expected, atol=1e-6)
    mistake = next(m for m in efficient_attention.BLOCKWISE_MISTAKES if m.id == "max-before-masking")
    assert torch.isnan(mistake.mutant(solved)(q, k, v, 4, causal=True)).any()


@pytest.mark.parametrize("name", list(efficient_attention.EXERCISES))
def test_each_mutant_differs_from_the_reference_and_from_every_other(solved, name):
    """Recognition needs a case where each mutant differs from the reference, and mutants with
    different ids must disagree on those cases."""
    assert_mutants_differ(efficient_attention.EXERCISES[name], solved)


@pytest.mark.parametrize("name", list(efficient_attention.EXERCISES))
def test_each_mutant_is_recognised_as_itself(solved, name):
    """The judge names each mutant's own mistake (not an earlier entry's)."""
    assert_mutants_recognised(efficient_attention.EXERCISES[name], solved)


def learner(solved, source: str, name: str):
    """The learner's ``name`` from ``source``, defined over the reference's set-up and answers."""
    namespace = dict(vars(solved))
    exec(textwrap.dedent(source), namespace)
    return namespace[name]


@pytest.mark.parametrize("student", list(TestEfficientAttentionGrading.mistakes))
def test_each_written_mistake_is_named_by_the_judge(solved, student):
    """Quicker than the nbgrader class, and says which: every learner-written mistake gets its name."""
    exercise, source, mistake_id = TestEfficientAttentionGrading.mistakes[student]
    message = judge_function(efficient_attention.EXERCISES[exercise], learner(solved, source, exercise), solved)
    assert message is not None and f"[mistake:{mistake_id}]" in message, message


@pytest.mark.parametrize("student", list(TestEfficientAttentionGrading.alternatives))
def test_each_written_alternative_passes_the_judge(solved, student):
    for exercise, source in TestEfficientAttentionGrading.alternatives[student].items():
        function = learner(solved, source, exercise)
        assert judge_function(efficient_attention.EXERCISES[exercise], function, solved) is None, exercise
