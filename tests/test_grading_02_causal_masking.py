"""Notebook 02 graded by real nbgrader: each catalogued mistake, correct alternatives,
tampering; and, without nbgrader, the property the mask exists for and the
catalogue's power to tell its mistakes apart."""

import pytest
import torch
from catalogue_checks import assert_mutants_differ, assert_mutants_recognised
from grading_suite import GradingSuite

from autograder import reference
from autograder.exercises import causal_masking

ASSIGNMENT = "02_causal_masking"


class TestCausalMaskingGrading(GradingSuite):
    assignment = ASSIGNMENT

    mistakes = {
        "mask-upper-triangle": (
            "causal_mask",
            """
            def causal_mask(T, S=None, window=None):
                if S is None:
                    S = T
                mask = torch.triu(torch.ones(T, S, dtype=torch.bool), diagonal=S - T)
                if window is not None:
                    mask = mask & torch.triu(torch.ones(T, S, dtype=torch.bool), diagonal=S - T - window + 1)
                return mask
            """,
            "inverted-triangle",
        ),
        "mask-strict-lower": (
            "causal_mask",
            """
            def causal_mask(T, S=None, window=None):
                S = S or T
                queries = torch.arange(T).unsqueeze(1) + (S - T)
                keys = torch.arange(S).unsqueeze(0)
                if window is None:
                    return keys < queries
                return (keys < queries) & (keys > queries - window)
            """,
            "diagonal-excluded",
        ),
        "mask-true-where-blocked": (
            "causal_mask",
            """
            def causal_mask(T, S=None, window=None):
                S = T if S is None else S
                future = torch.ones(T, S, dtype=torch.bool).triu(S - T + 1)
                if window is not None:  # blocked: the future and the keys older than the window
                    future = future | torch.ones(T, S, dtype=torch.bool).tril(S - T - window)
                return future
            """,
            "mask-polarity",
        ),
        "mask-top-left": (
            "causal_mask",
            """
            def causal_mask(T, S=None, window=None):
                if S is None:
                    S = T
                mask = torch.tril(torch.ones(T, S, dtype=torch.bool))
                return mask if window is None else torch.triu(mask, diagonal=1 - window)
            """,
            "top-left-aligned",
        ),
        "mask-ignores-S": (
            "causal_mask",
            """
            def causal_mask(T, S=None, window=None):
                mask = torch.tril(torch.ones(T, T)).bool()
                return mask if window is None else mask.triu(1 - window)
            """,
            "s-ignored",
        ),
        "mask-of-floats": (
            "causal_mask",
            """
            def causal_mask(T, S=None, window=None):
                S = T if S is None else S
                mask = torch.tril(torch.ones(T, S), diagonal=S - T)
                return mask if window is None else torch.triu(mask, diagonal=S - T - window + 1)
            """,
            "float-mask",
        ),
        "mask-additive": (
            "causal_mask",
            """
            def causal_mask(T, S=None, window=None):
                S = T if S is None else S
                mask = torch.full((T, S), float("-inf")).triu(S - T + 1)
                if window is not None:
                    mask = mask + torch.full((T, S), float("-inf")).tril(S - T - window)
                return mask
            """,
            "additive-mask",
        ),
        "window-one-too-wide": (
            "causal_mask",
            """
            def causal_mask(T, S=None, window=None):
                S = T if S is None else S
                position = torch.arange(T)[:, None] + S - T
                key = torch.arange(S)[None, :]
                mask = key <= position
                if window is not None:
                    mask &= key >= position - window  # the window counted back from the query, itself aside
                return mask
            """,
            "window-one-too-wide",
        ),
        "window-one-too-narrow": (
            "causal_mask",
            """
            def causal_mask(T, S=None, window=None):
                S = T if S is None else S
                mask = torch.ones(T, S, dtype=torch.bool).tril(S - T)
                if window:
                    mask = mask.triu(S - T - window + 2)
                return mask
            """,
            "window-one-too-narrow",
        ),
        "window-ignored": (
            "causal_mask",
            """
            def causal_mask(T, S=None, window=None):
                S = T if S is None else S
                return torch.ones(T, S, dtype=torch.bool).tril(S - T)
            """,
            "window-ignored",
        ),
        "window-from-the-index": (
            "causal_mask",
            """
            def causal_mask(T, S=None, window=None):
                S = T if S is None else S
                t = torch.arange(T)[:, None]
                s = torch.arange(S)[None, :]
                mask = s <= t + (S - T)
                if window is not None:
                    mask = mask & (s > t - window)
                return mask
            """,
            "window-top-left",
        ),
        "attention-mask-after-softmax": (
            "causal_attention",
            """
            def causal_attention(q, k, v):
                weights = attention_weights(q, k)
                weights = weights * causal_mask(q.shape[-2], k.shape[-2])
                return weights @ v
            """,
            "mask-after-softmax",
        ),
        "attention-mask-inverted": (
            "causal_attention",
            """
            def causal_attention(q, k, v):
                blocked = ~causal_mask(q.shape[-2], k.shape[-2])
                return attention(q, k, v, mask=blocked)
            """,
            "mask-polarity",
        ),
        "attention-unmasked": (
            "causal_attention",
            """
            def causal_attention(q, k, v):
                return attention(q, k, v)
            """,
            "mask-missing",
        ),
        "attention-own-tril": (
            "causal_attention",
            """
            def causal_attention(q, k, v):
                T, S = q.shape[-2], k.shape[-2]
                mask = torch.tril(torch.ones(T, S)).bool()
                return attention(q, k, v, mask)
            """,
            "top-left-aligned",
        ),
    }

    alternatives = {
        "arange-and-masked-softmax": {
            "causal_mask": """
                def causal_mask(T, S=None, window=None):
                    S = T if S is None else S
                    query_positions = torch.arange(T)[:, None] + (S - T)
                    key_positions = torch.arange(S)[None, :]
                    allowed = key_positions <= query_positions
                    if window is not None:
                        allowed = allowed & (query_positions - key_positions < window)
                    return allowed
                """,
            "causal_attention": """
                def causal_attention(q, k, v):
                    T, S = q.shape[-2], k.shape[-2]
                    scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
                    scores = scores.masked_fill(~causal_mask(T, S), -1e9)
                    return torch.softmax(scores, dim=-1) @ v
                """,
        },
        "loops": {
            "causal_mask": """
                def causal_mask(T, S=None, window=None):
                    if S is None:
                        S = T
                    mask = torch.zeros(T, S, dtype=torch.bool)
                    for t in range(T):
                        position = t + S - T
                        first = 0 if window is None else max(0, position - window + 1)
                        for s in range(first, position + 1):
                            mask[t, s] = True
                    return mask
                """,
            "causal_attention": """
                def causal_attention(q, k, v):
                    T, S = q.shape[-2], k.shape[-2]
                    rows = []
                    for t in range(T):
                        seen = t + S - T + 1  # query t is position t + S - T
                        rows.append(attention(q[..., t:t + 1, :], k[..., :seen, :], v[..., :seen, :]))
                    return torch.cat(rows, dim=-2)
                """,
        },
        "sdpa-float64": {
            "causal_mask": """
                def causal_mask(T, S=None, window=None):
                    S = S if S is not None else T
                    distance = torch.arange(T)[:, None] + (S - T) - torch.arange(S)[None, :]  # query pos - key pos
                    upper = S if window is None else window
                    return (distance >= 0) & (distance < upper)
                """,
            "causal_attention": """
                import torch.nn.functional as F

                def causal_attention(q, k, v):
                    mask = causal_mask(q.size(-2), k.size(-2))
                    out = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=mask)
                    return out.to(q.dtype)
                """,
        },
        "renormalised-after-softmax": {
            "causal_attention": """
                def causal_attention(q, k, v):
                    # zeroing after the softmax is fine once the rows are renormalised
                    weights = attention_weights(q, k) * causal_mask(q.shape[-2], k.shape[-2])
                    weights = weights / weights.sum(dim=-1, keepdim=True)
                    return weights @ v
                """,
        },
    }

    wrong_answers = {
        "causal_mask": """
            def causal_mask(T, S=None, window=None):
                return torch.ones(T, T if S is None else S, dtype=torch.bool)
            """,
        "causal_attention": """
            def causal_attention(q, k, v):
                return v.cumsum(dim=-2)[..., -q.shape[-2]:, :]
            """,
    }


# ---------------------------------------------------------------- without nbgrader


@pytest.fixture(scope="module")
def solved():
    return reference.load(ASSIGNMENT)


def _replace_tokens(q, k, v, positions, generator):
    changed = []
    for x in (q, k, v):
        x = x.clone()
        x[..., positions, :] = torch.randn(*x.shape[:-2], len(positions), x.shape[-1], generator=generator) * 3
        changed.append(x)
    return changed


def test_changing_a_future_token_never_changes_an_earlier_output(solved):
    """The property the mask exists for, on 200 random sequences: random length,
    batch, and a random set of changed positions. Earlier outputs stay bit for bit
    the same; the changed token's own output moves."""
    generator = torch.Generator().manual_seed(20)
    for _ in range(200):
        T = int(torch.randint(2, 17, (1,), generator=generator))
        batch = tuple(
            int(n)
            for n in torch.randint(1, 4, (int(torch.randint(0, 3, (1,), generator=generator)),), generator=generator)
        )
        q, k, v = (torch.randn(*batch, T, 8, generator=generator) for _ in range(3))
        changed = torch.rand(T, generator=generator) < 0.3
        changed[int(torch.randint(1, T, (1,), generator=generator))] = True
        changed[0] = False
        positions = changed.nonzero().flatten().tolist()
        first = positions[0]
        before = solved.causal_attention(q, k, v)
        after = solved.causal_attention(*_replace_tokens(q, k, v, positions, generator))
        assert torch.equal(before[..., :first, :], after[..., :first, :]), (T, positions)
        assert not torch.allclose(before[..., first, :], after[..., first, :]), (T, positions)


def test_with_a_kv_cache_each_step_matches_the_full_pass(solved):
    """T new queries against S keys are the last T positions: for every split of a
    random sequence, the result is the last T rows of the full causal attention."""
    generator = torch.Generator().manual_seed(21)
    for S in range(1, 11):
        q, k, v = (torch.randn(2, S, 4, generator=generator) for _ in range(3))
        full = solved.causal_attention(q, k, v)
        for T in range(1, S + 1):
            assert torch.allclose(solved.causal_attention(q[..., -T:, :], k, v), full[..., -T:, :], atol=1e-6)


def test_mask_agrees_with_torch(solved):
    """Square masks are torch's own causal mask; with S > T the mask is the bottom-right
    one that makes scaled_dot_product_attention agree with the full pass."""
    for T in range(1, 9):
        square = torch.ones(T, T, dtype=torch.bool).tril()
        assert torch.equal(solved.causal_mask(T), square)
        for S in range(T, T + 6):
            mask = solved.causal_mask(T, S)
            assert mask.dtype == torch.bool and tuple(mask.shape) == (T, S)
            assert torch.equal(mask, torch.ones(S, S, dtype=torch.bool).tril()[-T:])


def band_mask(T, S, window):
    """The sliding-window mask written from its definition, cell by cell: query t sits at position
    p = t + S - T and may attend to key s when p - window < s <= p."""
    mask = torch.zeros(T, S, dtype=torch.bool)
    for t in range(T):
        p = t + S - T
        for s in range(S):
            mask[t, s] = p - window < s <= p
    return mask


def test_window_is_the_band_written_out(solved):
    """Every size up to 9 queries and 14 keys, every window from 1 key to longer than the keys: the
    reference's band is the definition's, and the windowed attention is the full attention restricted
    to it (F.scaled_dot_product_attention with the band written out)."""
    for T in range(1, 10):
        for S in range(T, T + 6):
            for window in range(1, S + 2):
                assert torch.equal(solved.causal_mask(T, S, window=window), band_mask(T, S, window)), (T, S, window)
            assert torch.equal(solved.causal_mask(T, S, window=None), band_mask(T, S, S + 1))
        assert torch.equal(solved.causal_mask(T, window=2), band_mask(T, T, 2))
    generator = torch.Generator().manual_seed(22)
    q, k, v = (torch.randn(2, 3, 11, 8, generator=generator) for _ in range(3))
    windowed = solved.attention(q, k, v, solved.causal_mask(11, window=4))
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=band_mask(11, 11, 4))
    assert torch.allclose(windowed, expected, atol=1e-6)


def test_mistakes_break_the_property(solved):
    """The catalogued causal_attention mistakes all let an earlier output depend on
    a later token (or hide the past): the FutureChangeCases catch each of them."""
    cases = [c for c in causal_masking.causal_attention_cases(solved) if isinstance(c, causal_masking.FutureChangeCase)]
    assert len(cases) >= 3
    for case in cases:
        moved = case.run(solved.causal_attention)
        assert torch.count_nonzero(moved) == 0, case.label
    for mistake in causal_masking.EXERCISES["causal_attention"].mistakes:
        if mistake.id in ("mask-after-softmax", "mask-missing"):
            mutant = mistake.mutant(solved)
            assert any(torch.count_nonzero(case.run(mutant)) for case in cases), mistake.id


@pytest.mark.parametrize("name", list(causal_masking.EXERCISES))
def test_each_mutant_differs_from_the_reference_and_from_every_other(solved, name):
    """Recognition needs a case where each mutant differs from the reference, and mutants with
    different ids must disagree on those cases."""
    assert_mutants_differ(causal_masking.EXERCISES[name], solved)


@pytest.mark.parametrize("name", list(causal_masking.EXERCISES))
def test_each_mutant_is_recognised_as_itself(solved, name):
    """The judge names each mutant's own mistake (not an earlier entry's)."""
    assert_mutants_recognised(causal_masking.EXERCISES[name], solved)
