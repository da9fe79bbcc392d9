"""Notebook 05: kv_head_index, repeat_kv, GroupedQueryAttention, kv_cache_bytes, mla_cache_bytes.

Tolerances:
* kv_head_index, kv_cache_bytes and mla_cache_bytes return whole numbers: they must be exact
  (``close`` compares integers exactly; a float such as 3.0 for 3 passes).
  kv_head_index's atol of 1e-9 only matters when comparing a learner's
  fractional answer (13 / 4 = 3.25) with the "not rounded down" mutant, which
  may round the last bit differently (h / (H / G) against h * G / H).
* repeat_kv only copies numbers: exact (atol 0).
* GroupedQueryAttention is a whole layer in float32 (four projections, RoPE,
  softmax): correct writings (einsum over grouped heads, scaled_dot_product_attention,
  RoPE angles in float32 instead of float64) agree to about 1e-6 on outputs of
  order 1; 1e-5 leaves room for that, while the smallest catalogued mistake
  moves outputs by more than 1e-2.
"""

import torch

from .catalogue import Case, Exercise, Mistake, module_case

ASSIGNMENT = "05_grouped_query_attention"


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ---------------------------------------------------------------- kv_head_index

# (H, G) pairs: the worked example, the two extremes, and published shapes
# (LLaMA-2-70B: 64 query heads, 8 kv heads; Falcon-7B: 71 and 1).
HEAD_SHAPES = [(32, 8), (8, 2), (12, 4), (12, 3), (32, 32), (32, 1), (64, 8), (71, 1), (6, 2), (1, 1)]


def kv_head_index_cases(ref):
    for H, G in HEAD_SHAPES:
        for h in range(H):
            yield Case(f"query head {h} of H = {H}, G = {G}", (h, H, G))


def _kv_modulo(ref):
    return lambda h, n_heads, n_kv_heads: h % n_kv_heads


def _kv_divided_by_g(ref):
    return lambda h, n_heads, n_kv_heads: h // n_kv_heads


def _kv_not_rounded(ref):
    return lambda h, n_heads, n_kv_heads: h / (n_heads / n_kv_heads)


KV_HEAD_INDEX_MISTAKES = [
    Mistake(
        "kv-index-modulo",
        "`h % G` deals the query heads out round-robin",
        "A group is a block of H/G consecutive query heads (heads 0-3 share kv head 0 when H = 32, "
        "G = 8), so divide by the group size: h // (n_heads // n_kv_heads).",
        _kv_modulo,
    ),
    Mistake(
        "kv-index-divided-by-g",
        "`h // G` divides by the number of kv heads instead of the group size",
        "The group size is H/G, the number of query heads per kv head: h // (n_heads // n_kv_heads) "
        "(query head 13 of H = 32, G = 8 reads kv head 3).",
        _kv_divided_by_g,
    ),
    Mistake(
        "kv-index-not-rounded-down",
        "the index is not rounded down",
        "h / (H/G) is a fraction for most heads (13 / 4 = 3.25); a head index is a whole number: "
        "use floor division, h // (n_heads // n_kv_heads).",
        _kv_not_rounded,
    ),
]


# ---------------------------------------------------------------- repeat_kv


def repeat_kv_cases(ref):
    g = _generator(505)
    yield Case("two kv heads holding 0 and 1, n_rep = 2", (torch.arange(2.0).view(1, 2, 1, 1), 2))
    yield Case("x (2, 2, 5, 4), n_rep = 4", (torch.randn(2, 2, 5, 4, generator=g), 4))
    yield Case("x (1, 3, 6, 8), n_rep = 2", (torch.randn(1, 3, 6, 8, generator=g), 2))
    yield Case("x (3, 4, 2, 16), n_rep = 3", (torch.randn(3, 4, 2, 16, generator=g), 3))
    yield Case("n_rep = 1 (multi-head attention): x (2, 4, 3, 8)", (torch.randn(2, 4, 3, 8, generator=g), 1))
    yield Case(
        "one kv head (multi-query attention): x (2, 1, 4, 8), n_rep = 6", (torch.randn(2, 1, 4, 8, generator=g), 6)
    )
    yield Case("float64 x (1, 2, 3, 4), n_rep = 2", (torch.randn(1, 2, 3, 4, generator=g, dtype=torch.float64), 2))
    # what the attention layer passes: v after transpose(1, 2), not contiguous in memory
    v = torch.randn(2, 5, 2, 4, generator=g).transpose(1, 2)
    yield Case("a non-contiguous x (2, 2, 5, 4) (v after transpose(1, 2)), n_rep = 3", (v, 3))


def _repeat_tiled(ref):
    return lambda x, n_rep: x.repeat(1, n_rep, 1, 1)


def _repeat_time_axis(ref):
    return lambda x, n_rep: x.repeat_interleave(n_rep, dim=2)


TILED_HINT = (
    "Query head h must read kv head h // n_rep, so each kv head is repeated in place: "
    "[k0, k0, k1, k1], as x.repeat_interleave(n_rep, dim=1) gives. x.repeat(1, n_rep, 1, 1) "
    "tiles the whole axis, [k0, k1, k0, k1], which is the h % G grouping."
)

REPEAT_KV_MISTAKES = [
    Mistake(
        "kv-repeat-tiled",
        "the kv heads are tiled ([k0, k1, k0, k1]) instead of repeated in place",
        TILED_HINT,
        _repeat_tiled,
    ),
    Mistake(
        "repeat-kv-wrong-axis",
        "the repetition runs along the time axis, not the head axis",
        "x has shape (B, G, T, Dh): the heads are axis 1. Repeat along dim=1 to get (B, G*n_rep, T, Dh).",
        _repeat_time_axis,
    ),
]


# ---------------------------------------------------------------- GroupedQueryAttention


def gqa_cases(ref):
    g = _generator(707)

    def case(label, d_model, n_heads, n_kv_heads, B, T, seed, positions=None, **init_kwargs):
        kwargs = {} if positions is None else {"positions": positions}
        return module_case(
            label,
            (torch.randn(B, T, d_model, generator=g),),
            kwargs,
            reference=ref.GroupedQueryAttention,
            init_args=(d_model, n_heads, n_kv_heads),
            init_kwargs=init_kwargs,
            seed=seed,
        )

    yield case("d_model 32, H = 8, G = 2, x (2, 6, 32)", 32, 8, 2, 2, 6, seed=1)
    yield case("G = H (multi-head attention): d_model 32, H = G = 4, x (2, 5, 32)", 32, 4, 4, 2, 5, seed=2)
    yield case("G = 1 (multi-query attention): d_model 24, H = 6, G = 1, x (1, 7, 24)", 24, 6, 1, 1, 7, seed=3)
    yield case("d_model 48, H = 12, G = 3, x (2, 8, 48)", 48, 12, 3, 2, 8, seed=4)
    # positions that are not 0, 1, 2, ... with constant steps: RoPE depends on
    # differences of positions only, so a shifted arange would not notice them ignored
    yield case(
        "d_model 64, H = 8, G = 4, x (1, 9, 64), positions (0, 1, 2, 5, 6, 9, 10, 11, 20)",
        64,
        8,
        4,
        1,
        9,
        seed=5,
        positions=torch.tensor([0, 1, 2, 5, 6, 9, 10, 11, 20]),
    )
    yield case("d_model 32, H = 4, G = 2, rope_base = 100, x (2, 6, 32)", 32, 4, 2, 2, 6, seed=6, rope_base=100.0)
    yield case("one token: d_model 16, H = 4, G = 2, x (3, 1, 16)", 16, 4, 2, 3, 1, seed=7)


def _tile(x, n_rep):
    return x.repeat(1, n_rep, 1, 1)


def _interleave(x, n_rep):
    return x.repeat_interleave(n_rep, dim=1)


def _gqa_variant(
    *,
    repeat_k=_interleave,
    repeat_v=_interleave,
    rope_k=True,
    rope_v=False,
    causal=True,
    use_positions=True,
    rope_before_split=False,
    split_with_transpose=True,
):
    """A mutant: the reference layer's forward with one step done the mistaken way."""

    def mutant(ref):
        class Mistaken(ref.GroupedQueryAttention):
            def forward(self, x, positions=None):
                B, T, _ = x.shape
                if positions is None or not use_positions:
                    positions = torch.arange(T)
                H, G, Dh, base = self.n_heads, self.n_kv_heads, self.head_dim, self.rope_base
                q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
                if rope_before_split:
                    q, k = ref.apply_rope(q, positions, base), ref.apply_rope(k, positions, base)

                def split(t, heads):
                    if split_with_transpose:
                        return t.view(B, T, heads, Dh).transpose(1, 2)
                    return t.reshape(B, heads, T, Dh)

                q, k, v = split(q, H), split(k, G), split(v, G)
                if not rope_before_split:
                    q = ref.apply_rope(q, positions, base)
                    k = ref.apply_rope(k, positions, base) if rope_k else k
                    v = ref.apply_rope(v, positions, base) if rope_v else v
                n_rep = H // G
                mask = ref.causal_mask(T) if causal else None
                out = ref.attention(q, repeat_k(k, n_rep), repeat_v(v, n_rep), mask)
                return self.o_proj(out.transpose(1, 2).reshape(B, T, -1))

        return Mistaken

    return mutant


DIFFERENT_REPEATS_HINT = (
    "Keys and values must be grouped the same way: query head h reads key head AND value "
    "head h // n_rep. Use repeat_kv (repeat_interleave on dim 1) for both k and v."
)

GQA_MISTAKES = [
    Mistake(
        "kv-repeat-tiled",
        "the kv heads are tiled ([k0, k1, k0, k1]) instead of repeated in place",
        TILED_HINT,
        _gqa_variant(repeat_k=_tile, repeat_v=_tile),
    ),
    Mistake(
        "gqa-k-v-repeated-differently",
        "keys and values are repeated differently",
        DIFFERENT_REPEATS_HINT,
        _gqa_variant(repeat_v=_tile),
    ),
    Mistake(
        "gqa-k-v-repeated-differently",
        "keys and values are repeated differently",
        DIFFERENT_REPEATS_HINT,
        _gqa_variant(repeat_k=_tile),
    ),
    Mistake(
        "gqa-no-causal-mask",
        "the causal mask is missing: tokens see the future",
        "Pass causal_mask(T) to attention, so token t attends to tokens 0..t only.",
        _gqa_variant(causal=False),
    ),
    Mistake(
        "gqa-rope-not-on-k",
        "RoPE is applied to the queries but not to the keys",
        "Rotate both q and k with apply_rope: the score q·k depends on the distance of two tokens only "
        "when both are rotated.",
        _gqa_variant(rope_k=False),
    ),
    Mistake(
        "gqa-rope-on-v",
        "RoPE is applied to the values too",
        "Rotate q and k only; the values carry content, not position, and stay as v_proj made them.",
        _gqa_variant(rope_v=True),
    ),
    Mistake(
        "gqa-positions-ignored",
        "the `positions` argument is ignored",
        "Use torch.arange(T) only when positions is None; otherwise rotate by the positions given.",
        _gqa_variant(use_positions=False),
    ),
    Mistake(
        "gqa-rope-before-head-split",
        "RoPE is applied before the split into heads",
        "apply_rope's frequencies depend on the vector size: rotate each head's vectors of size head_dim, "
        "after view(B, T, heads, head_dim).transpose(1, 2), not the whole projection.",
        _gqa_variant(rope_before_split=True),
    ),
    Mistake(
        "gqa-heads-split-without-transpose",
        "the heads are split with a reshape to (B, heads, T, head_dim)",
        "Each token's projection holds its heads side by side: view(B, T, heads, head_dim), then "
        "transpose(1, 2). Reshaping straight to (B, heads, T, head_dim) mixes tokens and heads.",
        _gqa_variant(split_with_transpose=False),
    ),
]


# ---------------------------------------------------------------- kv_cache_bytes

# Published configurations: (n_layers, n_kv_heads, head_dim).
LLAMA_2_7B = (32, 32, 128)  # multi-head attention: 32 kv heads
LLAMA_3_8B = (32, 8, 128)  # grouped-query attention: 8 kv heads for 32 query heads
LLAMA_2_70B = (80, 8, 128)  # 64 query heads, 8 kv heads
FALCON_7B = (32, 1, 64)  # multi-query attention: 71 query heads, 1 kv head


def kv_cache_bytes_cases(ref):
    yield Case("LLaMA-2-7B (32 layers, 32 kv heads of 128), 4096 tokens, float16", (*LLAMA_2_7B, 4096))
    yield Case("LLaMA-2-7B, 4096 tokens, float32", (*LLAMA_2_7B, 4096), {"bytes_per_value": 4})
    yield Case("LLaMA-2-7B, 1024 tokens, batch 8, float16", (*LLAMA_2_7B, 1024), {"batch_size": 8})
    yield Case("LLaMA-3-8B (32 layers, 8 kv heads of 128), 8192 tokens, float16", (*LLAMA_3_8B, 8192))
    yield Case("LLaMA-3-8B, 8192 tokens, float32", (*LLAMA_3_8B, 8192), {"bytes_per_value": 4})
    yield Case("LLaMA-3-8B, 2048 tokens, batch 4, float32", (*LLAMA_3_8B, 2048, 4, 4))
    yield Case(
        "LLaMA-3-8B, 128 tokens, batch 16, float16", (*LLAMA_3_8B, 128), {"batch_size": 16, "bytes_per_value": 2}
    )
    yield Case("LLaMA-2-70B (80 layers, 8 kv heads of 128), 4096 tokens, batch 2, float16", (*LLAMA_2_70B, 4096, 2))
    yield Case(
        "Falcon-7B (32 layers, 1 kv head of 64), 2048 tokens, float32", (*FALCON_7B, 2048), {"bytes_per_value": 4}
    )
    yield Case("one layer, one kv head of 1, one token, 8-bit", (1, 1, 1, 1), {"bytes_per_value": 1})


def _cache_one_of_k_v(ref):
    def kv_cache_bytes(n_layers, n_kv_heads, head_dim, seq_len, batch_size=1, bytes_per_value=2):
        return n_layers * n_kv_heads * head_dim * seq_len * batch_size * bytes_per_value

    return kv_cache_bytes


def _cache_counts_values(ref):
    def kv_cache_bytes(n_layers, n_kv_heads, head_dim, seq_len, batch_size=1, bytes_per_value=2):
        return 2 * n_layers * n_kv_heads * head_dim * seq_len * batch_size

    return kv_cache_bytes


def _cache_batch_ignored(ref):
    def kv_cache_bytes(n_layers, n_kv_heads, head_dim, seq_len, batch_size=1, bytes_per_value=2):
        return ref.kv_cache_bytes(n_layers, n_kv_heads, head_dim, seq_len, 1, bytes_per_value)

    return kv_cache_bytes


KV_CACHE_BYTES_MISTAKES = [
    Mistake(
        "kv-cache-missing-factor-2",
        "the cache is counted half: keys OR values, not both",
        "Each layer keeps a key vector AND a value vector per kv head and token: multiply by 2.",
        _cache_one_of_k_v,
    ),
    Mistake(
        "kv-cache-counts-values",
        "the result counts numbers, not bytes",
        "Multiply the number of stored values by bytes_per_value (2 for float16, 4 for float32).",
        _cache_counts_values,
    ),
    Mistake(
        "kv-cache-batch-ignored",
        "the batch size is ignored",
        "Every sequence in the batch has its own cache: multiply by batch_size.",
        _cache_batch_ignored,
    ),
]


# ---------------------------------------------------------------- mla_cache_bytes

# DeepSeek-V2 (DeepSeek-AI, 2024): 60 layers; per layer and token a latent of d_c = 512 and a
# decoupled RoPE key of d_h^R = 64. The other shapes vary the two widths apart, so that a cache
# that drops the RoPE key, or doubles it, differs on every case.
DEEPSEEK_V2_MLA = (60, 512, 64)


def mla_cache_bytes_cases(ref):
    yield Case("DeepSeek-V2 (60 layers, latent 512, RoPE key 64), one token, float16", (*DEEPSEEK_V2_MLA, 1))
    yield Case("DeepSeek-V2, 8192 tokens, float16", (*DEEPSEEK_V2_MLA, 8192))
    yield Case("DeepSeek-V2, 4096 tokens, batch 4, float32", (*DEEPSEEK_V2_MLA, 4096, 4, 4))
    yield Case(
        "DeepSeek-V2, 1024 tokens, batch 8, 8-bit", (*DEEPSEEK_V2_MLA, 1024), {"batch_size": 8, "bytes_per_value": 1}
    )
    yield Case("12 layers, latent 256, RoPE key 32, 2048 tokens, float32", (12, 256, 32, 2048), {"bytes_per_value": 4})
    yield Case("one layer, latent 4, RoPE key 2, 3 tokens, batch 2", (1, 4, 2, 3), {"batch_size": 2})
    yield Case("one layer, latent 7, RoPE key 5, one token, 8-bit", (1, 7, 5, 1), {"bytes_per_value": 1})


def _mla_factor_2(ref):
    def mla_cache_bytes(n_layers, latent_dim, rope_dim, seq_len, batch_size=1, bytes_per_value=2):
        return 2 * n_layers * (latent_dim + rope_dim) * seq_len * batch_size * bytes_per_value

    return mla_cache_bytes


def _mla_rope_key_missing(ref):
    def mla_cache_bytes(n_layers, latent_dim, rope_dim, seq_len, batch_size=1, bytes_per_value=2):
        return n_layers * latent_dim * seq_len * batch_size * bytes_per_value

    return mla_cache_bytes


def _mla_counts_values(ref):
    def mla_cache_bytes(n_layers, latent_dim, rope_dim, seq_len, batch_size=1, bytes_per_value=2):
        return n_layers * (latent_dim + rope_dim) * seq_len * batch_size

    return mla_cache_bytes


MLA_CACHE_BYTES_MISTAKES = [
    Mistake(
        "mla-cache-factor-2",
        "the latent and the RoPE key are counted twice, as if keys and values were cached apart",
        "MLA caches one latent per layer and token, from which both the keys and the values are made, and one "
        "RoPE key shared by the heads: (latent_dim + rope_dim) numbers, with no factor 2.",
        _mla_factor_2,
    ),
    Mistake(
        "mla-cache-rope-key-missing",
        "the decoupled RoPE key is left out: only the latent is counted",
        "RoPE cannot be applied to keys made from the latent (a rotation between query and key cannot be folded "
        "into the query), so each layer caches a small RoPE key beside the latent: latent_dim + rope_dim numbers.",
        _mla_rope_key_missing,
    ),
    Mistake(
        "mla-cache-counts-values",
        "the result counts numbers, not bytes",
        "Multiply the number of stored values by bytes_per_value (2 for float16, 4 for float32).",
        _mla_counts_values,
    ),
]


EXERCISES = {
    "kv_head_index": Exercise(
        "kv_head_index", kv_head_index_cases, atol=1e-9, rtol=0.0, mistakes=KV_HEAD_INDEX_MISTAKES
    ),
    "repeat_kv": Exercise(
        "repeat_kv", repeat_kv_cases, atol=0.0, rtol=0.0, depends_on=("kv_head_index",), mistakes=REPEAT_KV_MISTAKES
    ),
    "GroupedQueryAttention": Exercise(
        "GroupedQueryAttention",
        gqa_cases,
        atol=1e-5,
        rtol=1e-5,
        depends_on=(
            "kv_head_index",
            "repeat_kv",
            "softmax",
            "attention_weights",
            "attention",
            "causal_mask",
            "rope_frequencies",
            "apply_rope",
        ),
        mistakes=GQA_MISTAKES,
    ),
    "kv_cache_bytes": Exercise(
        "kv_cache_bytes", kv_cache_bytes_cases, atol=0.0, rtol=0.0, mistakes=KV_CACHE_BYTES_MISTAKES
    ),
    "mla_cache_bytes": Exercise(
        "mla_cache_bytes", mla_cache_bytes_cases, atol=0.0, rtol=0.0, mistakes=MLA_CACHE_BYTES_MISTAKES
    ),
}
