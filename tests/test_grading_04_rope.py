"""Notebook 04 graded by real nbgrader: each catalogued mistake, correct alternatives, tampering.

Also, outside nbgrader: the reference agrees with Hugging Face's own RoPE
(``apply_rotary_pos_emb``, half-split) through ``neighbour_to_half_split``, and
with the permutation of q/k weight rows that Hugging Face's converter applies.
"""

import pytest
import torch
from grading_suite import GradingSuite

from autograder import reference


class TestRopeGrading(GradingSuite):
    assignment = "04_rope"

    mistakes = {
        "theta-positive-exponent": (
            "rope_frequencies",
            """
            def rope_frequencies(head_dim, base=10000.0):
                return base ** (torch.arange(0, head_dim, 2).float() / head_dim)
            """,
            "theta-no-minus",
        ),
        "theta-i-over-d": (
            "rope_frequencies",
            """
            def rope_frequencies(head_dim, base=10000.0):
                i = torch.arange(head_dim // 2)
                return 1.0 / base ** (i / head_dim)
            """,
            "theta-i-not-2i",
        ),
        "rope-halves": (
            "apply_rope",
            """
            def apply_rope(x, positions, base=10000.0):
                d = x.shape[-1]
                angles = positions[:, None] * rope_frequencies(d, base)
                cos, sin = torch.cos(angles).float(), torch.sin(angles).float()
                x1, x2 = x[..., : d // 2], x[..., d // 2:]
                return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)
            """,
            "rope-half-split",
        ),
        "rope-arange": (
            "apply_rope",
            """
            def apply_rope(x, positions, base=10000.0):
                T, d = x.shape[-2], x.shape[-1]
                angles = torch.outer(torch.arange(T, dtype=torch.float32), rope_frequencies(d, base).float())
                out = torch.empty_like(x)
                out[..., 0::2] = x[..., 0::2] * angles.cos() - x[..., 1::2] * angles.sin()
                out[..., 1::2] = x[..., 0::2] * angles.sin() + x[..., 1::2] * angles.cos()
                return out
            """,
            "rope-positions-ignored",
        ),
        "rope-clockwise": (
            "apply_rope",
            """
            def apply_rope(x, positions, base=10000.0):
                angles = positions.float().unsqueeze(-1) * rope_frequencies(x.shape[-1], base).float()
                cos, sin = angles.cos(), angles.sin()
                even, odd = x[..., ::2], x[..., 1::2]
                return torch.stack([even * cos + odd * sin, -even * sin + odd * cos], -1).flatten(-2)
            """,
            "rope-wrong-direction",
        ),
        "rope-concatenated": (
            "apply_rope",
            """
            def apply_rope(x, positions, base=10000.0):
                theta = rope_frequencies(x.shape[-1], base)
                angles = positions[..., None] * theta
                even, odd = x[..., 0::2], x[..., 1::2]
                new_even = even * torch.cos(angles) - odd * torch.sin(angles)
                new_odd = even * torch.sin(angles) + odd * torch.cos(angles)
                return torch.cat([new_even, new_odd], dim=-1).to(x.dtype)
            """,
            "rope-pairs-not-interleaved",
        ),
        "reorder-backwards": (
            "neighbour_to_half_split",
            """
            def neighbour_to_half_split(x):
                return x.reshape(*x.shape[:-1], 2, -1).transpose(-1, -2).reshape(x.shape)
            """,
            "permutation-inverted",
        ),
        "reorder-flattened": (
            "neighbour_to_half_split",
            """
            def neighbour_to_half_split(x):
                flat = x.flatten()
                return torch.cat([flat[0::2], flat[1::2]]).view_as(x)
            """,
            "permutation-mixes-batch",
        ),
    }

    alternatives = {
        "complex-float32": {
            "rope_frequencies": """
                def rope_frequencies(head_dim, base=10000.0):
                    return 1.0 / (base ** (torch.arange(0, head_dim, 2).float() / head_dim))
                """,
            "apply_rope": """
                def apply_rope(x, positions, base=10000.0):
                    d = x.shape[-1]
                    angles = torch.outer(positions.float(), rope_frequencies(d, base).float())
                    turns = torch.polar(torch.ones_like(angles), angles)          # e^(i m θ)
                    pairs = torch.view_as_complex(x.float().reshape(*x.shape[:-1], d // 2, 2).contiguous())
                    return torch.view_as_real(pairs * turns).flatten(-2).to(x.dtype)
                """,
            "neighbour_to_half_split": """
                def neighbour_to_half_split(x):
                    d = x.shape[-1]
                    order = torch.cat((torch.arange(0, d, 2), torch.arange(1, d, 2)))
                    return x[..., order]
                """,
        },
        "loops-float64": {
            "rope_frequencies": """
                def rope_frequencies(head_dim, base=10000.0):
                    return torch.tensor([base ** (-2 * i / head_dim) for i in range(head_dim // 2)],
                                        dtype=torch.float64)
                """,
            "apply_rope": """
                def apply_rope(x, positions, base=10000.0):
                    theta = rope_frequencies(x.shape[-1], base).double()
                    m = positions.double()
                    out = x.double().clone()
                    for i in range(x.shape[-1] // 2):
                        c, s = torch.cos(m * theta[i]), torch.sin(m * theta[i])
                        a, b = x[..., 2 * i].double(), x[..., 2 * i + 1].double()
                        out[..., 2 * i] = a * c - b * s
                        out[..., 2 * i + 1] = a * s + b * c
                    return out
                """,
            "neighbour_to_half_split": """
                def neighbour_to_half_split(x):
                    return x.unflatten(-1, (-1, 2)).transpose(-1, -2).flatten(-2)
                """,
        },
        "rotation-matrices": {
            "rope_frequencies": """
                def rope_frequencies(head_dim, base=10000.0):
                    return torch.exp(-math.log(base) * torch.arange(0, head_dim, 2) / head_dim)
                """,
            "apply_rope": """
                def apply_rope(x, positions, base=10000.0):
                    angles = positions[:, None] * rope_frequencies(x.shape[-1], base)     # (T, d/2)
                    cos, sin = angles.cos(), angles.sin()
                    R = torch.stack([torch.stack([cos, -sin], -1), torch.stack([sin, cos], -1)], -2)
                    pairs = x.unflatten(-1, (-1, 2)).to(R.dtype)                        # (..., T, d/2, 2)
                    return torch.einsum("tpij,...tpj->...tpi", R, pairs).flatten(-2).to(x.dtype)
                """,
            "neighbour_to_half_split": """
                def neighbour_to_half_split(x):
                    d = x.shape[-1]
                    order = sorted(range(d), key=lambda j: (j % 2, j))
                    return x[..., order]
                """,
        },
    }

    wrong_answers = {
        "rope_frequencies": """
            def rope_frequencies(head_dim, base=10000.0):
                return torch.ones(head_dim // 2)
            """,
        "apply_rope": """
            def apply_rope(x, positions, base=10000.0):
                return x.clone()
            """,
        "neighbour_to_half_split": """
            def neighbour_to_half_split(x):
                return x.clone()
            """,
    }


# ---------------------------------------------------------------- against Hugging Face


@pytest.fixture(scope="module")
def solved():
    return reference.load("04_rope")


def test_reference_matches_hugging_face_rope_through_the_reordering(solved):
    """HF's half-split RoPE on reordered q, k equals the reordered neighbour-pair RoPE."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    n_heads, head_dim = 4, 32
    config = LlamaConfig(
        hidden_size=n_heads * head_dim,
        num_attention_heads=n_heads,
        num_key_value_heads=n_heads,
        num_hidden_layers=1,
        vocab_size=100,
        rope_theta=10000.0,
    )
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(2, n_heads, 7, head_dim, generator=generator)
    k = torch.randn(2, n_heads, 7, head_dim, generator=generator)
    positions = torch.tensor([0, 3, 4, 17, 120, 121, 450])
    cos, sin = LlamaRotaryEmbedding(config)(q, positions[None].expand(2, -1))
    q_hf, k_hf = apply_rotary_pos_emb(solved.neighbour_to_half_split(q), solved.neighbour_to_half_split(k), cos, sin)
    # HF computes its angles in float32: at position 450 they are off by up to
    # about 450 · 1.2e-7 = 5e-5 rad, which moves entries of size 4 by 2e-4.
    assert torch.allclose(q_hf, solved.neighbour_to_half_split(solved.apply_rope(q, positions)), atol=5e-4)
    assert torch.allclose(k_hf, solved.neighbour_to_half_split(solved.apply_rope(k, positions)), atol=5e-4)


def test_reordering_the_rows_is_hugging_faces_weight_permutation(solved):
    """Per head, neighbour_to_half_split on the rows of W_q is the converter's reshape."""
    n_heads, head_dim, d_model = 3, 8, 12
    W = torch.randn(n_heads * head_dim, d_model)
    per_head = W.reshape(n_heads, head_dim, d_model).transpose(1, 2)
    mine = solved.neighbour_to_half_split(per_head).transpose(1, 2).reshape(n_heads * head_dim, d_model)
    converter = W.view(n_heads, head_dim // 2, 2, d_model).transpose(1, 2).reshape(n_heads * head_dim, d_model)
    assert torch.equal(mine, converter)


def test_every_mutant_differs_from_the_reference_and_from_each_other(solved):
    """Each catalogued mistake shows on some case, and no two mistakes look alike."""
    from autograder.compare import close
    from autograder.exercises import rope

    for exercise in rope.EXERCISES.values():
        cases = list(exercise.cases(solved))
        reference_outputs = [case.run(getattr(solved, exercise.name)) for case in cases]
        outputs = {}
        for mistake in exercise.mistakes:
            mutant = mistake.mutant(solved)
            outputs[mistake.id] = [case.run(mutant) for case in cases]
            assert any(
                close(o, r, exercise.atol, exercise.rtol) for o, r in zip(outputs[mistake.id], reference_outputs)
            ), f"{mistake.id} never differs from the reference"
        for a in outputs:
            for b in outputs:
                if a < b:
                    assert any(close(x, y, exercise.atol, exercise.rtol) for x, y in zip(outputs[a], outputs[b])), (
                        f"{a} and {b} give the same outputs on every case"
                    )


def test_a_solution_that_ignores_positions_passes_only_on_arange(solved):
    """Why the cases use random and offset positions: with 0, 1, 2, ... alone it would pass."""
    from autograder.compare import close
    from autograder.exercises import rope

    exercise = rope.EXERCISES["apply_rope"]
    ignores = next(m for m in exercise.mistakes if m.id == "rope-positions-ignored").mutant(solved)
    verdicts = []
    for case in exercise.cases(solved):
        positions = case.args[1]
        arange = torch.equal(positions, torch.arange(len(positions)))
        same = close(case.run(ignores), case.run(solved.apply_rope), exercise.atol, exercise.rtol) is None
        verdicts.append((arange, same))
        assert same == arange, case.label
    assert (True, True) in verdicts and (False, False) in verdicts
