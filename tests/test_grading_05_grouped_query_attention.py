"""Notebook 05 graded by real nbgrader: each catalogued mistake, correct alternatives,
tampering; and, without nbgrader, the properties the reference must have (G = H is
multi-head attention, G = 1 multi-query attention, agreement with torch's
scaled_dot_product_attention, cache sizes of published models) and a catalogue
whose mutants can be told apart."""

import itertools
import textwrap

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from grading_suite import GradingSuite

from autograder import reference
from autograder.compare import close
from autograder.exercises.catalogue import ModuleCase
from autograder.exercises.grouped_query_attention import EXERCISES

ASSIGNMENT = "05_grouped_query_attention"

# A learner's layer with one forward written in: the mistakes below differ only there.
LAYER = """
class GroupedQueryAttention(nn.Module):
    def __init__(self, d_model, n_heads, n_kv_heads, rope_base=10000.0):
        super().__init__()
        self.n_heads = n_heads
        self.n_kv_heads = n_kv_heads
        self.head_dim = d_model // n_heads
        self.rope_base = rope_base
        self.q_proj = nn.Linear(d_model, n_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(d_model, n_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(d_model, n_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(n_heads * self.head_dim, d_model, bias=False)

    def forward(self, x, positions=None):
"""


def layer_with(forward_body: str) -> str:
    body = "\n".join(
        "        " + line if line.strip() else "" for line in textwrap.dedent(forward_body).strip("\n").splitlines()
    )
    return LAYER + body + "\n"


class TestGroupedQueryAttentionGrading(GradingSuite):
    assignment = ASSIGNMENT

    mistakes = {
        "index-modulo": (
            "kv_head_index",
            """
            def kv_head_index(h, n_heads, n_kv_heads):
                return h % n_kv_heads
            """,
            "kv-index-modulo",
        ),
        "index-divided-by-g": (
            "kv_head_index",
            """
            def kv_head_index(h, n_heads, n_kv_heads):
                return h // n_kv_heads
            """,
            "kv-index-divided-by-g",
        ),
        "index-fraction": (
            "kv_head_index",
            """
            def kv_head_index(h, n_heads, n_kv_heads):
                group = n_heads / n_kv_heads
                return h / group
            """,
            "kv-index-not-rounded-down",
        ),
        "repeat-tiled": (
            "repeat_kv",
            """
            def repeat_kv(x, n_rep):
                B, G, T, D = x.shape
                return x.unsqueeze(1).expand(B, n_rep, G, T, D).reshape(B, n_rep * G, T, D)
            """,
            "kv-repeat-tiled",
        ),
        "repeat-time-axis": (
            "repeat_kv",
            """
            def repeat_kv(x, n_rep):
                return torch.repeat_interleave(x, n_rep, dim=-2)
            """,
            "repeat-kv-wrong-axis",
        ),
        "layer-tiled": (
            "GroupedQueryAttention",
            layer_with("""
            B, T, _ = x.shape
            if positions is None:
                positions = torch.arange(T)
            q = self.q_proj(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
            k = self.k_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
            v = self.v_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
            q, k = apply_rope(q, positions, self.rope_base), apply_rope(k, positions, self.rope_base)
            n_rep = self.n_heads // self.n_kv_heads
            k = k.repeat(1, n_rep, 1, 1)
            v = v.repeat(1, n_rep, 1, 1)
            out = attention(q, k, v, causal_mask(T))
            return self.o_proj(out.transpose(1, 2).reshape(B, T, -1))
            """),
            "kv-repeat-tiled",
        ),
        "layer-k-v-differ": (
            "GroupedQueryAttention",
            layer_with("""
            B, T, _ = x.shape
            if positions is None:
                positions = torch.arange(T)
            q = apply_rope(self.q_proj(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2), positions, self.rope_base)
            k = apply_rope(self.k_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2), positions, self.rope_base)
            v = self.v_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
            k = repeat_kv(k, self.n_heads // self.n_kv_heads)
            v = v.repeat(1, self.n_heads // self.n_kv_heads, 1, 1)
            out = attention(q, k, v, causal_mask(T))
            return self.o_proj(out.transpose(1, 2).reshape(B, T, -1))
            """),
            "gqa-k-v-repeated-differently",
        ),
        "layer-not-causal": (
            "GroupedQueryAttention",
            layer_with("""
            B, T, _ = x.shape
            positions = torch.arange(T) if positions is None else positions
            q = apply_rope(self.q_proj(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2), positions, self.rope_base)
            k = apply_rope(self.k_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2), positions, self.rope_base)
            v = self.v_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
            out = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
            return self.o_proj(out.transpose(1, 2).reshape(B, T, -1))
            """),
            "gqa-no-causal-mask",
        ),
        "layer-rope-q-only": (
            "GroupedQueryAttention",
            layer_with("""
            B, T, _ = x.shape
            if positions is None:
                positions = torch.arange(T)
            q = self.q_proj(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
            k = self.k_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
            v = self.v_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
            q = apply_rope(q, positions, self.rope_base)
            n_rep = self.n_heads // self.n_kv_heads
            out = attention(q, repeat_kv(k, n_rep), repeat_kv(v, n_rep), causal_mask(T))
            return self.o_proj(out.transpose(1, 2).reshape(B, T, -1))
            """),
            "gqa-rope-not-on-k",
        ),
        "layer-rope-on-v": (
            "GroupedQueryAttention",
            layer_with("""
            B, T, _ = x.shape
            if positions is None:
                positions = torch.arange(T)
            q = self.q_proj(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
            k = self.k_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
            v = self.v_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
            q, k, v = (apply_rope(t, positions, self.rope_base) for t in (q, k, v))
            n_rep = self.n_heads // self.n_kv_heads
            out = attention(q, repeat_kv(k, n_rep), repeat_kv(v, n_rep), causal_mask(T))
            return self.o_proj(out.transpose(1, 2).reshape(B, T, -1))
            """),
            "gqa-rope-on-v",
        ),
        "layer-positions-ignored": (
            "GroupedQueryAttention",
            layer_with("""
            B, T, _ = x.shape
            positions = torch.arange(T)
            q = apply_rope(self.q_proj(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2), positions, self.rope_base)
            k = apply_rope(self.k_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2), positions, self.rope_base)
            v = self.v_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
            n_rep = self.n_heads // self.n_kv_heads
            out = attention(q, repeat_kv(k, n_rep), repeat_kv(v, n_rep), causal_mask(T))
            return self.o_proj(out.transpose(1, 2).reshape(B, T, -1))
            """),
            "gqa-positions-ignored",
        ),
        "layer-rope-whole-projection": (
            "GroupedQueryAttention",
            layer_with("""
            B, T, _ = x.shape
            if positions is None:
                positions = torch.arange(T)
            q = apply_rope(self.q_proj(x), positions, self.rope_base)
            k = apply_rope(self.k_proj(x), positions, self.rope_base)
            q = q.view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
            k = k.view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
            v = self.v_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
            n_rep = self.n_heads // self.n_kv_heads
            out = attention(q, repeat_kv(k, n_rep), repeat_kv(v, n_rep), causal_mask(T))
            return self.o_proj(out.transpose(1, 2).reshape(B, T, -1))
            """),
            "gqa-rope-before-head-split",
        ),
        "layer-split-without-transpose": (
            "GroupedQueryAttention",
            layer_with("""
            B, T, _ = x.shape
            if positions is None:
                positions = torch.arange(T)
            q = self.q_proj(x).reshape(B, self.n_heads, T, self.head_dim)
            k = self.k_proj(x).reshape(B, self.n_kv_heads, T, self.head_dim)
            v = self.v_proj(x).reshape(B, self.n_kv_heads, T, self.head_dim)
            q, k = apply_rope(q, positions, self.rope_base), apply_rope(k, positions, self.rope_base)
            n_rep = self.n_heads // self.n_kv_heads
            out = attention(q, repeat_kv(k, n_rep), repeat_kv(v, n_rep), causal_mask(T))
            return self.o_proj(out.transpose(1, 2).reshape(B, T, -1))
            """),
            "gqa-heads-split-without-transpose",
        ),
        "cache-k-only": (
            "kv_cache_bytes",
            """
            def kv_cache_bytes(n_layers, n_kv_heads, head_dim, seq_len, batch_size=1, bytes_per_value=2):
                return n_layers * n_kv_heads * head_dim * seq_len * batch_size * bytes_per_value
            """,
            "kv-cache-missing-factor-2",
        ),
        "cache-counts-values": (
            "kv_cache_bytes",
            """
            def kv_cache_bytes(n_layers, n_kv_heads, head_dim, seq_len, batch_size=1, bytes_per_value=2):
                values = 2 * n_layers * n_kv_heads * head_dim * seq_len * batch_size
                return values
            """,
            "kv-cache-counts-values",
        ),
        "cache-one-sequence": (
            "kv_cache_bytes",
            """
            def kv_cache_bytes(n_layers, n_kv_heads, head_dim, seq_len, batch_size=1, bytes_per_value=2):
                per_layer = 2 * n_kv_heads * head_dim * seq_len * bytes_per_value
                return n_layers * per_layer
            """,
            "kv-cache-batch-ignored",
        ),
        "mla-keys-and-values": (
            "mla_cache_bytes",
            """
            def mla_cache_bytes(n_layers, latent_dim, rope_dim, seq_len, batch_size=1, bytes_per_value=2):
                per_token = 2 * (latent_dim + rope_dim)  # a key and a value, as in kv_cache_bytes
                return n_layers * per_token * seq_len * batch_size * bytes_per_value
            """,
            "mla-cache-factor-2",
        ),
        "mla-latent-only": (
            "mla_cache_bytes",
            """
            def mla_cache_bytes(n_layers, latent_dim, rope_dim, seq_len, batch_size=1, bytes_per_value=2):
                return n_layers * latent_dim * seq_len * batch_size * bytes_per_value
            """,
            "mla-cache-rope-key-missing",
        ),
        "mla-numbers": (
            "mla_cache_bytes",
            """
            def mla_cache_bytes(n_layers, latent_dim, rope_dim, seq_len, batch_size=1, bytes_per_value=2):
                numbers = n_layers * (latent_dim + rope_dim) * seq_len * batch_size
                return numbers
            """,
            "mla-cache-counts-values",
        ),
    }

    alternatives = {
        "expand-einsum-groups": {
            "kv_head_index": """
                def kv_head_index(h, n_heads, n_kv_heads):
                    return h * n_kv_heads // n_heads
                """,
            "repeat_kv": """
                def repeat_kv(x, n_rep):
                    B, G, T, D = x.shape
                    return x[:, :, None, :, :].expand(B, G, n_rep, T, D).reshape(B, G * n_rep, T, D)
                """,
            "GroupedQueryAttention": """
                class GroupedQueryAttention(nn.Module):
                    def __init__(self, d_model, n_heads, n_kv_heads, rope_base=10000.0):
                        super().__init__()
                        self.n_heads, self.n_kv_heads, self.rope_base = n_heads, n_kv_heads, rope_base
                        self.head_dim = d_model // n_heads
                        # created in another order than the reference: weights are matched by name
                        self.o_proj = nn.Linear(n_heads * self.head_dim, d_model, bias=False)
                        self.v_proj = nn.Linear(d_model, n_kv_heads * self.head_dim, bias=False)
                        self.k_proj = nn.Linear(d_model, n_kv_heads * self.head_dim, bias=False)
                        self.q_proj = nn.Linear(d_model, n_heads * self.head_dim, bias=False)

                    def forward(self, x, positions=None):
                        B, T, _ = x.shape
                        H, G, Dh = self.n_heads, self.n_kv_heads, self.head_dim
                        pos = torch.arange(T) if positions is None else positions
                        q = apply_rope(self.q_proj(x).view(B, T, H, Dh).permute(0, 2, 1, 3), pos, self.rope_base)
                        k = apply_rope(self.k_proj(x).view(B, T, G, Dh).permute(0, 2, 1, 3), pos, self.rope_base)
                        v = self.v_proj(x).view(B, T, G, Dh).permute(0, 2, 1, 3)
                        q = q.reshape(B, G, H // G, T, Dh)  # query heads grouped by the kv head they read
                        scores = torch.einsum("bgrtd,bgsd->bgrts", q, k) / math.sqrt(Dh)
                        scores = scores.masked_fill(~causal_mask(T), -1e9)
                        weights = scores.softmax(dim=-1)
                        out = torch.einsum("bgrts,bgsd->bgrtd", weights, v).reshape(B, H, T, Dh)
                        return self.o_proj(out.permute(0, 2, 1, 3).reshape(B, T, H * Dh))
                """,
            "kv_cache_bytes": """
                def kv_cache_bytes(n_layers, n_kv_heads, head_dim, seq_len, batch_size=1, bytes_per_value=2):
                    per_token = 2 * n_layers * n_kv_heads * head_dim * bytes_per_value  # a key and a value
                    return per_token * seq_len * batch_size
                """,
            "mla_cache_bytes": """
                def mla_cache_bytes(n_layers, latent_dim, rope_dim, seq_len, batch_size=1, bytes_per_value=2):
                    latent = n_layers * latent_dim * seq_len * batch_size * bytes_per_value
                    rope_key = n_layers * rope_dim * seq_len * batch_size * bytes_per_value
                    return latent + rope_key
                """,
        },
        "index-select-sdpa-complex-rope": {
            "kv_head_index": """
                def kv_head_index(h, n_heads, n_kv_heads):
                    return int(h // (n_heads / n_kv_heads))
                """,
            "repeat_kv": """
                def repeat_kv(x, n_rep):
                    G = x.shape[1]
                    index = torch.tensor([kv_head_index(h, G * n_rep, G) for h in range(G * n_rep)])
                    return x.index_select(1, index)
                """,
            "GroupedQueryAttention": """
                def rotate(t, positions, base):
                    # t (B, T, heads, Dh): neighbour pairs as complex numbers, angles in float32
                    d = t.shape[-1]
                    freqs = 1.0 / (base ** (torch.arange(0, d, 2).float() / d))
                    angles = torch.outer(positions.float(), freqs)
                    turn = torch.polar(torch.ones_like(angles), angles)[:, None, :]
                    pairs = torch.view_as_complex(t.float().reshape(*t.shape[:-1], -1, 2))
                    return torch.view_as_real(pairs * turn).flatten(-2).type_as(t)


                class GroupedQueryAttention(torch.nn.Module):
                    def __init__(self, d_model, n_heads, n_kv_heads, rope_base=10000.0):
                        super().__init__()
                        self.n_heads = n_heads
                        self.n_kv_heads = n_kv_heads
                        self.head_dim = d_model // n_heads
                        self.rope_base = rope_base
                        self.q_proj = torch.nn.Linear(d_model, d_model, bias=False)
                        self.k_proj = torch.nn.Linear(d_model, n_kv_heads * self.head_dim, bias=False)
                        self.v_proj = torch.nn.Linear(d_model, n_kv_heads * self.head_dim, bias=False)
                        self.o_proj = torch.nn.Linear(d_model, d_model, bias=False)

                    def forward(self, x, positions=None):
                        B, T, D = x.shape
                        if positions is None:
                            positions = torch.arange(T)
                        q = rotate(self.q_proj(x).view(B, T, self.n_heads, -1), positions, self.rope_base)
                        k = rotate(self.k_proj(x).view(B, T, self.n_kv_heads, -1), positions, self.rope_base)
                        v = self.v_proj(x).view(B, T, self.n_kv_heads, -1)
                        out = F.scaled_dot_product_attention(
                            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True, enable_gqa=True)
                        return self.o_proj(out.transpose(1, 2).reshape(B, T, D))
                """,
            "kv_cache_bytes": """
                def kv_cache_bytes(n_layers, n_kv_heads, head_dim, seq_len, batch_size=1, bytes_per_value=2):
                    return math.prod([2, n_layers, n_kv_heads, head_dim, seq_len, batch_size, bytes_per_value])
                """,
            "mla_cache_bytes": """
                def mla_cache_bytes(n_layers, latent_dim, rope_dim, seq_len, batch_size=1, bytes_per_value=2):
                    return math.prod([n_layers, latent_dim + rope_dim, seq_len, batch_size, bytes_per_value])
                """,
        },
        "loops-float64": {
            "kv_head_index": """
                def kv_head_index(h, n_heads, n_kv_heads):
                    group_size = n_heads // n_kv_heads
                    return int(h / group_size)
                """,
            "repeat_kv": """
                def repeat_kv(x, n_rep):
                    heads = []
                    for g in range(x.shape[1]):
                        heads += [x[:, g]] * n_rep
                    return torch.stack(heads, dim=1)
                """,
            "GroupedQueryAttention": layer_with("""
                B, T, _ = x.shape
                H, G = self.n_heads, self.n_kv_heads
                positions = torch.arange(T) if positions is None else positions
                q = apply_rope(self.q_proj(x).double().view(B, T, H, -1).transpose(1, 2), positions, self.rope_base)
                k = apply_rope(self.k_proj(x).double().view(B, T, G, -1).transpose(1, 2), positions, self.rope_base)
                v = self.v_proj(x).double().view(B, T, G, -1).transpose(1, 2)
                heads = []
                for h in range(H):  # one head at a time, reading its kv head
                    g = kv_head_index(h, H, G)
                    heads.append(attention(q[:, h], k[:, g], v[:, g], causal_mask(T)))
                out = torch.stack(heads, dim=1).float()
                return self.o_proj(out.transpose(1, 2).reshape(B, T, -1))
                """),
            "kv_cache_bytes": """
                def kv_cache_bytes(n_layers, n_kv_heads, head_dim, seq_len, batch_size=1, bytes_per_value=2):
                    total = 0.0
                    for _ in range(n_layers):
                        total += 2.0 * n_kv_heads * head_dim * seq_len * batch_size * bytes_per_value
                    return total
                """,
            "mla_cache_bytes": """
                def mla_cache_bytes(n_layers, latent_dim, rope_dim, seq_len, batch_size=1, bytes_per_value=2):
                    total = 0.0
                    for _ in range(n_layers):  # per layer: one latent and one RoPE key per token and sequence
                        total += float(latent_dim + rope_dim) * seq_len * batch_size * bytes_per_value
                    return total
                """,
        },
    }

    wrong_answers = {
        "kv_head_index": """
            def kv_head_index(h, n_heads, n_kv_heads):
                return 0
            """,
        "repeat_kv": """
            def repeat_kv(x, n_rep):
                return x
            """,
        "GroupedQueryAttention": layer_with("""
            return self.o_proj(self.q_proj(x))
            """),
        "kv_cache_bytes": """
            def kv_cache_bytes(n_layers, n_kv_heads, head_dim, seq_len, batch_size=1, bytes_per_value=2):
                return n_layers * seq_len
            """,
        "mla_cache_bytes": """
            def mla_cache_bytes(n_layers, latent_dim, rope_dim, seq_len, batch_size=1, bytes_per_value=2):
                return latent_dim * seq_len
            """,
    }


# ---------------------------------------------------------------- the reference's properties


@pytest.fixture(scope="module")
def ref():
    return reference.load(ASSIGNMENT)


def heads_of(layer, x, positions, rope):
    """q (B, H, T, Dh), k and v (B, G, T, Dh) of ``layer``, RoPE applied to q and k."""
    B, T, _ = x.shape
    H, G, Dh = layer.n_heads, layer.n_kv_heads, layer.head_dim
    q = rope(layer.q_proj(x).view(B, T, H, Dh).transpose(1, 2), positions)
    k = rope(layer.k_proj(x).view(B, T, G, Dh).transpose(1, 2), positions)
    v = layer.v_proj(x).view(B, T, G, Dh).transpose(1, 2)
    return q, k, v


def test_seed_numbers(ref):
    """H = 32, G = 8: groups of 4, query head 13 reads kv head 3, the cache is 4 times smaller."""
    assert [ref.kv_head_index(h, 32, 8) for h in range(32)] == [g for g in range(8) for _ in range(4)]
    assert ref.kv_head_index(13, 32, 8) == 3
    assert ref.kv_cache_bytes(32, 32, 128, 4096) == 4 * ref.kv_cache_bytes(32, 8, 128, 4096)


@pytest.mark.parametrize(
    "n_layers, n_kv_heads, head_dim, seq_len, batch, width, expected",
    [
        (32, 32, 128, 4096, 1, 2, 2 * 2**30),  # LLaMA-2-7B, float16: 2 GiB
        (32, 32, 128, 4096, 1, 4, 4 * 2**30),  # LLaMA-2-7B, float32
        (32, 32, 128, 1, 1, 2, 512 * 2**10),  # LLaMA-2-7B: 512 KiB per token
        (32, 8, 128, 8192, 1, 2, 2**30),  # LLaMA-3-8B, full 8k context: 1 GiB
        (32, 8, 128, 8192, 8, 4, 16 * 2**30),  # LLaMA-3-8B, batch 8, float32
        (80, 8, 128, 1, 1, 2, 320 * 2**10),  # LLaMA-2-70B: 320 KiB per token
        (32, 1, 64, 1, 1, 2, 8 * 2**10),  # Falcon-7B (one kv head): 8 KiB per token
    ],
)
def test_kv_cache_bytes_of_published_models(ref, n_layers, n_kv_heads, head_dim, seq_len, batch, width, expected):
    assert ref.kv_cache_bytes(n_layers, n_kv_heads, head_dim, seq_len, batch, width) == expected


def test_mla_cache_of_deepseek_v2_is_gqa_with_two_and_a_quarter_groups(ref):
    """DeepSeek-V2's paper counts MLA's cache as (d_c + d_h^R) l = 9/2 d_h l elements per token (d_c = 4 d_h,
    d_h^R = d_h / 2), what GQA caches with 2.25 groups: with d_h = 128, l = 60 layers and 2 bytes a number,
    60 x 576 x 2 = 69,120 bytes per token, 57 times less than its 128 heads of 128 as multi-head attention."""
    per_token = ref.mla_cache_bytes(60, 512, 64, 1)
    assert per_token == 9 * 128 * 60 * 2 // 2 == 69_120
    assert per_token == 2.25 * ref.kv_cache_bytes(60, 1, 128, 1)  # GQA's 2 G d_h l with G = 2.25
    assert ref.kv_cache_bytes(60, 128, 128, 1) / per_token == pytest.approx(56.9, abs=0.05)
    assert ref.mla_cache_bytes(60, 512, 64, 8192, 4, 4) == 8192 * 4 * 2 * per_token


def test_with_as_many_kv_heads_as_query_heads_it_is_torch_multi_head_attention(ref):
    torch.manual_seed(0)
    layer = ref.GroupedQueryAttention(48, 6, 6)
    torch_mha = nn.MultiheadAttention(48, 6, bias=False, batch_first=True)
    x = torch.randn(3, 7, 48)
    with torch.no_grad():
        torch_mha.in_proj_weight.copy_(torch.cat([layer.q_proj.weight, layer.k_proj.weight, layer.v_proj.weight]))
        torch_mha.out_proj.weight.copy_(layer.o_proj.weight)
        expected, _ = torch_mha(x, x, x, attn_mask=~ref.causal_mask(7), need_weights=False)
        # every position 0: RoPE rotates nothing, so only the attention itself is compared
        actual = layer(x, positions=torch.zeros(7, dtype=torch.long))
    assert torch.allclose(actual, expected, atol=1e-6)


def test_with_one_kv_head_every_query_head_reads_it(ref):
    torch.manual_seed(1)
    layer = ref.GroupedQueryAttention(32, 4, 1)
    assert tuple(layer.k_proj.weight.shape) == (8, 32) and tuple(layer.v_proj.weight.shape) == (8, 32)
    x = torch.randn(2, 5, 32)
    with torch.no_grad():
        q, k, v = heads_of(layer, x, torch.arange(5), ref.apply_rope)
        shared = ref.attention(q, k, v, ref.causal_mask(5))  # (B, 1, T, Dh) broadcast over the 4 heads
        expected = layer.o_proj(shared.transpose(1, 2).reshape(2, 5, 32))
        assert torch.allclose(layer(x), expected, atol=1e-6)


@pytest.mark.parametrize("n_kv_heads", [8, 4, 2, 1])
def test_agrees_with_scaled_dot_product_attention_enable_gqa(ref, n_kv_heads):
    torch.manual_seed(n_kv_heads)
    layer = ref.GroupedQueryAttention(64, 8, n_kv_heads, rope_base=500.0)
    x = torch.randn(2, 9, 64)
    positions = torch.tensor([0, 1, 2, 5, 6, 9, 10, 11, 20])
    with torch.no_grad():
        q, k, v = heads_of(layer, x, positions, lambda t, p: ref.apply_rope(t, p, 500.0))
        heads = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        expected = layer.o_proj(heads.transpose(1, 2).reshape(2, 9, 64))
        assert torch.allclose(layer(x, positions), expected, atol=1e-6)


def test_repeat_kv_puts_kv_head_h_div_n_rep_under_query_head_h(ref):
    x = torch.randn(2, 3, 4, 5)
    out = ref.repeat_kv(x, 4)
    for h in range(12):
        assert torch.equal(out[:, h], x[:, ref.kv_head_index(h, 12, 3)])


# ---------------------------------------------------------------- the catalogue


def outputs(function, cases):
    results = []
    for case in cases:
        try:
            results.append(case.run(function))
        except Exception as error:  # a mutant may fail on a case; that counts as different
            results.append(error)
    return results


def same(a, b, exercise) -> bool:
    if isinstance(a, Exception) or isinstance(b, Exception):
        return False
    return close(a, b, exercise.atol, exercise.rtol) is None


@pytest.mark.parametrize("name", list(EXERCISES))
def test_every_mutant_differs_from_the_reference_and_from_the_others(ref, name):
    """A case where each catalogued mistake shows, and where any two of them can be told apart."""
    exercise = EXERCISES[name]
    cases = list(exercise.cases(ref))
    expected = outputs(getattr(ref, name), cases)
    mutants = [(m.id, outputs(m.mutant(ref), cases)) for m in exercise.mistakes]
    for mistake_id, got in mutants:
        assert not all(same(g, e, exercise) for g, e in zip(got, expected)), f"{mistake_id} never shows"
    for (id_a, a), (id_b, b) in itertools.combinations(mutants, 2):
        if id_a != id_b:
            assert not all(same(x, y, exercise) for x, y in zip(a, b)), f"{id_a} and {id_b} look the same"


def test_module_cases_give_learner_and_reference_the_same_weights(ref):
    case = next(c for c in EXERCISES["GroupedQueryAttention"].cases(ref) if isinstance(c, ModuleCase))
    first, second = case.build(ref.GroupedQueryAttention), case.build(ref.GroupedQueryAttention)
    for (name, a), (_, b) in zip(first.state_dict().items(), second.state_dict().items()):
        assert torch.equal(a, b), name
