"""Notebook 08: KVCache, attend_with_cache, forward_cached, generate_cached, RollingKVCache.

Each case is a short script run on a fresh cache (a generation in miniature: a
prompt, then single tokens, sometimes a chunk), and its result is everything
the script saw: the tensors each call returned, and for ``attend_with_cache``
what the cache holds at the end (that is where a cache of repeated heads, or
of unrotated keys, shows).

Tolerances:

* ``KVCache`` and ``RollingKVCache`` only store, concatenate and copy the tensors they are given: exact.
* ``attend_with_cache`` is one attention layer in float32, compared with the
  reference's: a different order of sums (einsum, sdpa, float64 inside) moves
  outputs of order 1 by about 1e-7; 1e-5 leaves room for that, and every
  catalogued mistake moves an output or a cached tensor by more than 0.01.
* ``forward_cached`` is a whole model: 1e-4, as for whole models elsewhere.
* ``generate_cached`` returns token ids. Greedy outputs are compared exactly
  (ids differ by at least 1). Sampled outputs are compared as distributions,
  as in notebook 07: 6000 continuations under a fixed seed, the share of each
  token within 0.04 of the reference's (a share's standard deviation is at
  most sqrt(0.25 / 6000) = 0.0065, the difference of two at most 0.009: more
  than four standard deviations). Whether it refuses a text longer than
  max_seq_len is a yes/no, exact.

While an exercise is checked, the ones it builds on are the reference's
(``depends_on``), so a wrong ``KVCache`` costs the ``KVCache`` points only.
The cases build their caches from the reference ``KVCache`` for the same
reason (under ``./course grade`` a substitute whose instances the grader holds outside).
The scripts the cases run are ``course_checks.scripts``' (they drive the learner's code).

Every mutant differs from the reference and from the other mutants of its
exercise on these cases (tests/test_kv_cache_reference.py checks it).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from course_checks.probes import COUNTED, EmbeddedPositions
from course_checks.scripts import AttendScript, CacheScript, ForwardScript, LimitCase, SamplingCase

from ..messages import tagged
from .catalogue import Case, Exercise, ForReview, Mistake, Property, module_case

ASSIGNMENT = "08_kv_cache"


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ---------------------------------------------------------------- KVCache


def _prompt_then_tokens(g, n_layers, B, G, Dh, prompt, new_tokens, chunk=0):
    steps = [("length",)]
    for T in [prompt] + [1] * new_tokens + ([chunk] if chunk else []):
        for layer in range(n_layers):
            steps.append(
                ("update", layer, torch.randn(B, G, T, Dh, generator=g), torch.randn(B, G, T, Dh, generator=g))
            )
        steps.append(("length",))
    return tuple(steps)


def kv_cache_cases(ref):
    g = _generator(801)
    yield CacheScript(
        "2 layers, a prompt of 5 positions then 3 single tokens (B=2, G=2, Dh=4)",
        steps=_prompt_then_tokens(g, 2, 2, 2, 4, 5, 3),
    )
    yield CacheScript(
        "3 layers, a prompt of 4, 2 single tokens, then a chunk of 3 (B=3, G=4, Dh=2)",
        steps=_prompt_then_tokens(g, 3, 3, 4, 2, 4, 2, chunk=3),
    )
    yield CacheScript(
        "1 layer (multi-query, G=1), a one-token prompt then 4 single tokens (B=1, Dh=8)",
        steps=_prompt_then_tokens(g, 1, 1, 1, 8, 1, 4),
    )
    yield CacheScript(
        "4 layers, a prompt of 2 then 1 token (B=2, G=1, Dh=4)", steps=_prompt_then_tokens(g, 4, 2, 1, 4, 2, 1)
    )


def _cache_with(concat, length_of, returns_new=False):
    """A KVCache built from two parts: how a layer's old and new tensors are joined, and what length says."""

    def mutant(ref):
        class KVCache:
            def __init__(self):
                self.keys, self.values, self.updates = {}, {}, 0

            def update(self, layer, k, v):
                self.updates += 1
                new = k, v
                if layer in self.keys:
                    k, v = concat(self.keys[layer], k), concat(self.values[layer], v)
                self.keys[layer], self.values[layer] = k, v
                return new if returns_new else (k, v)

            @property
            def length(self):
                return length_of(self)

        return KVCache

    return mutant


def _positions(cache):
    return next(iter(cache.keys.values())).shape[2] if cache.keys else 0


def _tokens_per_update(cache):
    # what `self.length += k.shape[2]` in every update counts: positions times layers
    return sum(k.shape[2] for k in cache.keys.values()) if cache.keys else 0


KV_CACHE_MISTAKES = [
    Mistake(
        "cache-replaces",
        "update replaces the layer's keys and values instead of appending to them",
        "The new keys go after the cached ones: torch.cat([old_k, k], dim=2), store that, and return it; "
        "a step's query must see every earlier position, not only the new ones.",
        _cache_with(lambda old, new: new, _positions),
    ),
    Mistake(
        "update-returns-new-only",
        "update stores the full keys and values but returns only the new ones",
        "Return what the layer now holds, old and new positions: the caller attends to every position "
        "through the (k, v) that update returns.",
        _cache_with(lambda old, new: torch.cat([old, new], dim=2), _positions, returns_new=True),
    ),
    Mistake(
        "cache-new-first",
        "update puts the new positions before the cached ones",
        "Keep the sequence in order, oldest first: torch.cat([old_k, k], dim=2), not [k, old_k].",
        _cache_with(lambda old, new: torch.cat([new, old], dim=2), _positions),
    ),
    Mistake(
        "length-counts-every-update",
        "length grows in every layer's update, so it counts positions × layers",
        "A model calls update once per layer for the same tokens: length is the number of positions one "
        "layer holds (e.g. the keys of layer 0: .shape[2]), not the sum over updates.",
        _cache_with(lambda old, new: torch.cat([old, new], dim=2), _tokens_per_update),
    ),
    Mistake(
        "length-counts-layers",
        "length counts the layers in the cache, not the positions",
        "len(self.keys) is how many layers are stored; length must be the number of positions (axis 2 of "
        "a layer's keys), 0 when the cache is empty.",
        _cache_with(lambda old, new: torch.cat([old, new], dim=2), lambda cache: len(cache.keys)),
    ),
]


# ---------------------------------------------------------------- attend_with_cache


def _randomised(module, seed: int):
    """Reference weights drawn like ModuleCase's: matrices N(0, 1/fan_in)."""
    with torch.no_grad():
        g = _generator(seed)
        for parameter in module.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=g) * parameter.shape[-1] ** -0.5)
    return module.eval()


def _attend_steps(g, n_layers, B, D, prompt, singles, chunk=0):
    steps, start = [], 0
    for T in [prompt] + [1] * singles + ([chunk] if chunk else []):
        for layer in range(n_layers):
            steps.append((layer, torch.randn(B, T, D, generator=g), torch.arange(start, start + T)))
        start += T
    return steps


def attend_with_cache_cases(ref):
    g = _generator(802)
    gqa = [_randomised(ref.GroupedQueryAttention(32, 8, 2), 10 + i) for i in range(2)]
    yield AttendScript(
        "2 grouped-query layers (H=8, G=2, D=32): a prompt of 5, 3 single tokens, then a chunk of 3 (B=2)",
        (gqa, _attend_steps(g, 2, 2, 32, 5, 3, chunk=3)),
        cache_class=ref.KVCache,
    )
    mqa = [_randomised(ref.GroupedQueryAttention(48, 4, 1, rope_base=500.0), 20)]
    yield AttendScript(
        "1 multi-query layer (H=4, G=1, D=48, rope_base=500): a prompt of 3, then 4 single tokens (B=3)",
        (mqa, _attend_steps(g, 1, 3, 48, 3, 4)),
        cache_class=ref.KVCache,
    )
    mha = [_randomised(ref.GroupedQueryAttention(16, 2, 2), 30)]
    yield AttendScript(
        "1 multi-head layer (H=G=2, D=16): a one-token prompt, 2 single tokens, then a chunk of 4 (B=1)",
        (mha, _attend_steps(g, 1, 1, 16, 1, 2, chunk=4)),
        cache_class=ref.KVCache,
    )


def _attend_with(
    rope_positions=None,
    mask=None,
    store="rotated",
    read_again=None,
    repeat_first=False,
    updates=1,
    rotate_values=False,
    bypass=False,
):
    """An attend_with_cache built from its parts, as the mistaken code would do it."""

    def mutant(ref):
        def attend_with_cache(attn, x, positions, cache, layer):
            B, T_new, _ = x.shape
            q = attn.q_proj(x).view(B, T_new, attn.n_heads, attn.head_dim).transpose(1, 2)
            k = attn.k_proj(x).view(B, T_new, attn.n_kv_heads, attn.head_dim).transpose(1, 2)
            v = attn.v_proj(x).view(B, T_new, attn.n_kv_heads, attn.head_dim).transpose(1, 2)
            at = rope_positions(positions, T_new) if rope_positions else positions
            q = ref.apply_rope(q, at, attn.rope_base)
            if store == "rotated":
                k = ref.apply_rope(k, at, attn.rope_base)
            if rotate_values:
                v = ref.apply_rope(v, at, attn.rope_base)
            n_rep = attn.n_heads // attn.n_kv_heads
            if repeat_first:
                k, v = ref.repeat_kv(k, n_rep), ref.repeat_kv(v, n_rep)
                n_rep = 1
            if bypass:
                S = T_new
            else:
                for _ in range(updates):
                    k_all, v_all = cache.update(layer, k, v)
                k, v = k_all, v_all
                S = k.shape[2]
            if read_again is not None:
                k = ref.apply_rope(k, torch.arange(S), attn.rope_base)
            allowed = mask(T_new, S) if mask else ref.causal_mask(T_new, S)
            out = ref.attention(q, ref.repeat_kv(k, n_rep), ref.repeat_kv(v, n_rep), allowed)
            return attn.o_proj(out.transpose(1, 2).reshape(B, T_new, -1))

        return attend_with_cache

    return mutant


ATTEND_MISTAKES = [
    Mistake(
        "positions-ignored",
        "the new tokens are rotated at positions 0, 1, ... instead of their true positions",
        "In a decode step the new token sits at position cache.length, not 0: rotate q and k with the "
        "`positions` argument, apply_rope(q, positions, attn.rope_base).",
        _attend_with(rope_positions=lambda positions, T: torch.arange(T)),
    ),
    Mistake(
        "mask-top-left",
        "the causal mask is aligned top-left instead of bottom-right",
        "With T_new queries and S keys the queries are the LAST T_new positions: causal_mask(T_new, S) "
        "(tril with diagonal S - T_new). A top-left triangle (torch.ones(T, S).tril(), or sdpa's "
        "is_causal=True) lets a decoded token see only the first key.",
        _attend_with(mask=lambda T, S: torch.ones(T, S, dtype=torch.bool).tril()),
    ),
    Mistake(
        "cache-holds-repeated-heads",
        "the cache stores the keys and values after repeat_kv (H heads, not G)",
        "Call cache.update with the G key/value heads and repeat them only for the attention: caching the "
        "repeated heads makes a grouped-query model's cache H/G times larger, which is what GQA saves.",
        _attend_with(repeat_first=True),
    ),
    Mistake(
        "rope-after-cache",
        "the keys are cached unrotated and rotated again at every step",
        "Rotate k at its positions before cache.update: a key's rotation never changes, so it is done once; "
        "the cache holds rotated keys (and re-rotating all S keys at every step redoes the work the cache "
        "is there to save).",
        _attend_with(store="raw", read_again=True),
    ),
    Mistake(
        "rope-twice",
        "the cached keys are rotated a second time after cache.update",
        "Keys are rotated once, before they are cached; the (k, v) that update returns are ready to use.",
        _attend_with(read_again=True),
    ),
    Mistake(
        "cache-bypassed",
        "the new tokens attend only to themselves: the cache is neither filled nor read",
        "Pass the new k and v through k, v = cache.update(layer, k, v) and attend to what it returns: "
        "every position so far.",
        _attend_with(bypass=True),
    ),
    Mistake(
        "cache-updated-twice",
        "cache.update is called twice, so every new key and value is stored twice",
        "Call update once per layer and step, and use the (k, v) it returns.",
        _attend_with(updates=2),
    ),
    Mistake(
        "values-rotated",
        "RoPE is applied to the values too",
        "Rotary embeddings rotate queries and keys only (their dot product is what depends on the distance); "
        "the values are cached and mixed unrotated.",
        _attend_with(rotate_values=True),
    ),
]


# ---------------------------------------------------------------- forward_cached


def _model(ref, seed, **sizes):
    config = ref.ModelConfig(**sizes)
    return module_case("", reference=ref.Llama, init_args=(config,), seed=seed).build(ref.Llama)


def _chunks(tokens, sizes):
    out, start = [], 0
    for size in sizes:
        out.append(tokens[:, start : start + size])
        start += size
    return out


def forward_cached_cases(ref):
    g = _generator(803)
    small = _model(ref, 1, vocab_size=40, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_hidden=64)
    tokens = torch.randint(0, 40, (2, 10), generator=g)
    yield ForwardScript(
        "a 2-layer model (V=40, D=32, 4 heads, 2 kv heads): a prompt of 5, 3 single tokens, then a chunk of 2 (B=2)",
        (small, _chunks(tokens, [5, 1, 1, 1, 2])),
        cache_class=ref.KVCache,
    )
    mqa = _model(
        ref,
        2,
        vocab_size=29,
        d_model=48,
        n_layers=3,
        n_heads=4,
        n_kv_heads=1,
        d_hidden=80,
        norm_eps=1e-5,
        rope_base=500.0,
    )
    tokens = torch.randint(0, 29, (1, 7), generator=g)
    yield ForwardScript(
        "a 3-layer multi-query model (V=29, D=48, rope_base=500): a one-token prompt, then 6 single tokens (B=1)",
        (mqa, _chunks(tokens, [1] * 7)),
        cache_class=ref.KVCache,
    )
    tokens = torch.randint(0, 40, (3, 6), generator=g)
    yield ForwardScript(
        "the 2-layer model: a prompt of 6 on an empty cache (B=3)", (small, [tokens]), cache_class=ref.KVCache
    )


def _forward_with(positions_at=None, per_layer=False, layer_index=None, mlp=True, norms=True):
    def mutant(ref):
        @torch.no_grad()
        def forward_cached(model, tokens, cache):
            T_new = tokens.shape[1]
            start = 0 if positions_at == "zero" else cache.length
            positions = torch.arange(start, start + T_new)
            x = model.embed(tokens)
            for i, block in enumerate(model.layers):
                if per_layer:
                    positions = torch.arange(cache.length, cache.length + T_new)
                h = block.attn_norm(x) if norms else x
                x = x + ref.attend_with_cache(
                    block.attn, h, positions, cache, i if layer_index is None else layer_index
                )
                if mlp:
                    x = x + block.mlp(block.mlp_norm(x) if norms else x)
            return model.lm_head(model.norm(x))

        return forward_cached

    return mutant


FORWARD_MISTAKES = [
    Mistake(
        "positions-from-zero",
        "the new tokens' positions start at 0 in every call",
        "A decoded token continues the sequence: positions = torch.arange(cache.length, cache.length + T_new), "
        "read before the first layer.",
        _forward_with(positions_at="zero"),
    ),
    Mistake(
        "positions-read-per-layer",
        "the positions are read from cache.length inside the layer loop",
        "The first layer's update already makes the cache longer, so later layers get positions shifted by "
        "T_new: compute positions once, before the loop.",
        _forward_with(per_layer=True),
    ),
    Mistake(
        "same-layer-index",
        "every block uses layer 0 of the cache",
        "Each block has its own keys and values: pass the block's index (enumerate(model.layers)) to "
        "attend_with_cache.",
        _forward_with(layer_index=0),
    ),
    Mistake(
        "mlp-missing",
        "the blocks' MLP half is left out",
        "A TransformerBlock is attention then MLP, each with its residual: after the attention add "
        "x = x + block.mlp(block.mlp_norm(x)).",
        _forward_with(mlp=False),
    ),
    Mistake(
        "block-norms-missing",
        "the blocks' RMSNorms are not applied before attention and the MLP",
        "Pre-norm: attend_with_cache(block.attn, block.attn_norm(x), ...) and block.mlp(block.mlp_norm(x)); "
        "the residual adds to the unnormalised x.",
        _forward_with(norms=False),
    ),
]


# ---------------------------------------------------------------- generate_cached


def _greedy_model(ref):
    return _model(ref, 5, vocab_size=31, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_hidden=64, max_seq_len=16)


def _sampling_model(ref):
    model = _model(ref, 6, vocab_size=6, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, d_hidden=32, max_seq_len=8)
    with torch.no_grad():
        model.lm_head.weight.mul_(4.0)  # clear gaps between the likeliest tokens, so top-k and temperature show
    return model


def generate_cached_cases(ref):
    g = _generator(804)
    model = _greedy_model(ref)
    yield Case(
        "greedy (temperature=0) on a 2-layer model: prompt (2, 5), 6 new tokens",
        (model, torch.randint(0, 31, (2, 5), generator=g), 6),
        {"temperature": 0},
    )
    yield Case(
        "greedy: a one-token prompt (1, 1), 9 new tokens",
        (model, torch.randint(0, 31, (1, 1), generator=g), 9),
        {"temperature": 0.0},
    )
    yield Case(
        "greedy with top_k=3 (top-k changes nothing at temperature 0): prompt (3, 4), 5 new tokens",
        (model, torch.randint(0, 31, (3, 4), generator=g), 5),
        {"temperature": 0, "top_k": 3},
    )
    yield Case(
        "greedy up to exactly max_seq_len=16 tokens: prompt (2, 6), 10 new tokens",
        (model, torch.randint(0, 31, (2, 6), generator=g), 10),
        {"temperature": 0},
    )
    yield Case("max_new_tokens=0 returns the prompt", (model, torch.randint(0, 31, (2, 3), generator=g), 0))
    yield LimitCase(
        "a prompt of 6 and 11 new tokens: 17 > max_seq_len=16 (must raise ValueError)",
        (model, torch.randint(0, 31, (1, 6), generator=g), 11),
        {"temperature": 0},
    )
    yield LimitCase(
        "a prompt of 20 tokens, longer than max_seq_len=16 by itself (must raise ValueError)",
        (model, torch.randint(0, 31, (1, 20), generator=g), 1),
    )
    sampler = _sampling_model(ref)
    prompt = torch.randint(0, 6, (1, 3), generator=g).repeat(6000, 1)
    yield SamplingCase("6000 samples of 3 tokens at temperature 1 (shares of each token)", (sampler, prompt, 3), seed=1)
    yield SamplingCase(
        "6000 samples of 2 tokens at temperature 0.6 with top_k=3",
        (sampler, prompt, 2),
        {"temperature": 0.6, "top_k": 3},
        seed=2,
    )


def _pick(logits, temperature, top_k):
    if temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)
    logits = logits / temperature
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.shape[-1]), dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.multinomial(F.softmax(logits, dim=-1), num_samples=1)


def _check_limit(model, tokens, max_new_tokens):
    if tokens.shape[1] + max_new_tokens > model.config.max_seq_len:
        raise ValueError(f"longer than max_seq_len={model.config.max_seq_len}")


def _generate_with(feed="new", checks_limit=True):
    """A generate_cached that differs from the reference in what it feeds each step, or in the limit check."""

    def mutant(ref):
        @torch.no_grad()
        def generate_cached(model, tokens, max_new_tokens, temperature=1.0, top_k=None):
            if checks_limit:
                _check_limit(model, tokens, max_new_tokens)
            cache = ref.KVCache()
            logits = ref.forward_cached(model, tokens, cache)[:, -1, :]
            for _ in range(max_new_tokens):
                if feed == "last-again":  # the prefill's logits thrown away, the last token fed once more
                    logits = ref.forward_cached(model, tokens[:, -1:], cache)[:, -1, :]
                next_token = _pick(logits, temperature, top_k)
                tokens = torch.cat([tokens, next_token], dim=1)
                if feed == "new":
                    logits = ref.forward_cached(model, next_token, cache)[:, -1, :]
                elif feed == "whole":
                    logits = ref.forward_cached(model, tokens, cache)[:, -1, :]
                elif feed == "fresh-cache":
                    logits = ref.forward_cached(model, next_token, ref.KVCache())[:, -1, :]
            return tokens

        return generate_cached

    return mutant


def _one_token_per_pass(ref) -> EmbeddedPositions:
    """Right tokens, but recomputed: more than prompt + max_new_tokens positions embedded in all.

    Only a learner whose greedy tokens are right is judged here (a wrong one is
    diagnosed on the cases, where its mistake can be named): e.g. one who calls
    07's generate, or forward_cached on the whole sequence with a new cache at
    every step. Both give generate's tokens at generate's cost.
    """
    model = _greedy_model(ref)
    setattr(model, COUNTED, True)  # the referee counts its passes outside the kernel
    return EmbeddedPositions(model=model, prompt=torch.randint(0, 31, (2, 4), generator=_generator(77)), new_tokens=8)


def _recomputes_reading(seen, probe, ref) -> str | None:
    """What ``EmbeddedPositions`` saw: the learner's tokens against 07's generate, and the positions.

    Under ``./course grade`` the referee also counts the positions embedded in the forward passes it
    computed for the check's substitutes (``forward_cached``): ``seen`` is then ``{"kernel": what the
    probe saw, "outside": that count}``. When every pass went through them (at least prompt + new - 1
    positions outside), the larger count decides, so a kernel that reports fewer gains nothing. When
    passes were made inside the kernel (07's generate, the model called directly), only the kernel
    counted them: a count that says it recomputes is believed (it costs the notebook its points), one
    that says it does not is what a forging kernel would say, so it decides nothing and is flagged for
    review.
    """
    outside = None
    if isinstance(seen, dict):
        seen, outside = seen.get("kernel"), seen.get("outside")
    try:
        out, positions = seen
        positions = int(positions)
        outside = None if outside is None else int(outside)
    except (TypeError, ValueError):
        return "`generate_cached`: the check of its forward passes did not report what it saw."
    prompt, new = probe.prompt, probe.new_tokens
    right = (
        isinstance(out, torch.Tensor)
        and tuple(out.shape) == (prompt.shape[0], prompt.shape[1] + new)
        and not out.is_floating_point()
        and torch.equal(out.long(), ref.generate(probe.model, prompt, new, temperature=0))
    )
    most = prompt.shape[1] + new
    if outside is not None and outside >= most - 1:
        positions = max(positions, outside)
    elif outside is not None and right and positions <= most:
        return ForReview(
            f"`generate_cached` gives the right tokens, but of its forward passes the grader saw {outside} token "
            f"positions embedded (through forward_cached), not the {most - 1} or more a cached generation of {new} "
            f"tokens after a prompt of {prompt.shape[1]} makes: the others ran inside the kernel, which reported "
            f"{positions} in all. Whether it recomputes the sequence is for you to read in its code."
        )
    if right and positions > most:
        return tagged(
            f"`generate_cached` gives the right tokens but embedded {positions} token positions to "
            f"write {new} tokens after a prompt of {prompt.shape[1]}; with a cache the prompt is read once and "
            f"then one new token per step, at most {most}. It recomputes the sequence (model(tokens), generate, "
            "or forward_cached on the whole sequence with a new cache): feed forward_cached the prompt once, "
            "then only each new token, with the same cache.",
            "recomputes-sequence",
        )
    return None


GENERATE_MISTAKES = [
    Mistake(
        "whole-sequence-every-step",
        "the whole sequence is fed to forward_cached at every step",
        "The cache already holds every earlier position: after the prefill feed only the new token, "
        "forward_cached(model, next_token, cache); feeding the sequence again appends it to the cache a "
        "second time, at later positions.",
        _generate_with(feed="whole"),
    ),
    Mistake(
        "fresh-cache-every-step",
        "a new KVCache is made at every step, so the model sees only the newest token",
        "Make the cache once, before the prefill, and pass the same cache to every forward_cached call.",
        _generate_with(feed="fresh-cache"),
    ),
    Mistake(
        "last-prompt-token-twice",
        "the prefill's logits are thrown away and the last token is fed again",
        "The prefill's last position already predicts the first new token: pick from those logits, then feed "
        "each new token once. Feeding the prompt's last token again caches it twice, at two positions.",
        _generate_with(feed="last-again"),
    ),
    Mistake(
        "context-limit-not-checked",
        "a text longer than max_seq_len is generated instead of refused",
        "Before any forward pass: if tokens.shape[1] + max_new_tokens > model.config.max_seq_len, raise a "
        "ValueError that names the limit.",
        _generate_with(checks_limit=False),
    ),
]


# ---------------------------------------------------------------- RollingKVCache


def _rolling_steps(g, window, n_layers, B, G, Dh, chunks, buffers_every=True):
    """Updates of every layer chunk by chunk; after each chunk the length and, once every slot is written (a slot
    not written yet holds whatever the buffer was made with), every layer's buffers."""
    steps, written = [("length",)], 0
    for T in chunks:
        for layer in range(n_layers):
            steps.append(
                ("update", layer, torch.randn(B, G, T, Dh, generator=g), torch.randn(B, G, T, Dh, generator=g))
            )
        written += T
        steps.append(("length",))
        if buffers_every and written >= window:
            steps += [("buffers", layer) for layer in range(n_layers)]
    return tuple(steps)


def rolling_cache_cases(ref):
    g = _generator(805)
    yield CacheScript(
        "window 4, 1 layer: 7 single positions (B=1, G=1, Dh=2)",
        steps=_rolling_steps(g, 4, 1, 1, 1, 2, [1] * 7),
        init_args=(4,),
    )
    yield CacheScript(
        "window 5, 2 layers: a prompt of 3, 4 single positions, then a chunk of 2 (B=2, G=2, Dh=4)",
        steps=_rolling_steps(g, 5, 2, 2, 2, 4, [3, 1, 1, 1, 1, 2]),
        init_args=(5,),
    )
    yield CacheScript(
        "window 3, 2 layers: a prompt of 7 (longer than the window), then 2 single positions (B=2, G=1, Dh=3)",
        steps=_rolling_steps(g, 3, 2, 2, 1, 3, [7, 1, 1]),
        init_args=(3,),
    )
    yield CacheScript(
        "window 1, 1 layer: a prompt of 2, then 2 single positions (B=1, G=2, Dh=2)",
        steps=_rolling_steps(g, 1, 1, 1, 2, 2, [2, 1, 1]),
        init_args=(1,),
    )
    yield CacheScript(
        "window 4, 3 layers: 2 single positions, a chunk of 3, then 4 single positions (B=1, G=2, Dh=2)",
        steps=_rolling_steps(g, 4, 3, 1, 2, 2, [1, 1, 3, 1, 1, 1, 1], buffers_every=False) + (("buffers", 2),),
        init_args=(4,),
    )


def _rolling_with(slot_of="position", returned="oldest-first", length="written", shifts=False):
    """A RollingKVCache built from its parts, as the mistaken code would do it."""

    def mutant(ref):
        class RollingKVCache:
            def __init__(self, window):
                self.window, self.keys, self.values, self.written = window, {}, {}, {}

            def update(self, layer, k, v):
                W = self.window
                start = self.written.get(layer, 0)
                end = start + k.shape[2]
                self.written[layer] = end
                if shifts:  # the window kept oldest first by concatenating and cropping
                    if layer in self.keys:
                        k, v = torch.cat([self.keys[layer], k], dim=2), torch.cat([self.values[layer], v], dim=2)
                    self.keys[layer], self.values[layer] = k[:, :, -W:], v[:, :, -W:]
                    return self.keys[layer], self.values[layer]
                if layer not in self.keys:
                    B, G, _, Dh = k.shape
                    self.keys[layer], self.values[layer] = k.new_zeros(B, G, W, Dh), v.new_zeros(B, G, W, Dh)
                first = max(start, end - W)
                positions = (
                    torch.arange(first, end) if slot_of == "position" else torch.arange(first - start, end - start)
                )
                self.keys[layer][:, :, positions % W] = k[:, :, first - start :]
                self.values[layer][:, :, positions % W] = v[:, :, first - start :]
                if returned == "slots":  # the buffer as it is stored
                    order = torch.arange(min(end, W))
                elif returned == "every-slot":  # unwritten slots too, before the window fills
                    order = torch.arange(end - W, end) % W
                else:
                    order = torch.arange(max(0, end - W), end) % W
                return self.keys[layer][:, :, order], self.values[layer][:, :, order]

            @property
            def length(self):
                written = next(iter(self.written.values()), 0)
                return min(written, self.window) if length == "window" else written

        return RollingKVCache

    return mutant


ROLLING_CACHE_MISTAKES = [
    Mistake(
        "rolling-buffer-shifted",
        "the window is kept oldest first by shifting it, not written into slot i % window",
        "A rolling buffer never moves what it holds: write position i into slot i % window (over the position "
        "window places before it) and leave the other slots alone. Concatenating and cropping copies the whole "
        "window at every step; read the slots oldest first only when update returns them.",
        _rolling_with(shifts=True),
    ),
    Mistake(
        "rolling-returns-slot-order",
        "update returns the buffer in slot order, not the positions oldest first",
        "Once the buffer has wrapped, slot order is not position order. Return the slots of positions "
        "length - S .. length - 1, in that order (torch.arange(max(0, end - window), end) % window): the newest "
        "positions last, as the bottom-right causal_mask(T_new, S) expects.",
        _rolling_with(returned="slots"),
    ),
    Mistake(
        "rolling-length-stops-at-window",
        "length stops at the window instead of counting every position",
        "length is where the next token's true position starts (RoPE turns it by that position), so it counts "
        "every position written, past the window too; only the storage stops at window.",
        _rolling_with(length="window"),
    ),
    Mistake(
        "rolling-returns-unwritten-slots",
        "before the window fills, update returns every slot, unwritten ones too",
        "Return only the positions written so far, min(length, window) of them: an unwritten slot holds zeros, "
        "a key every query would attend to and a value it would mix in.",
        _rolling_with(returned="every-slot"),
    ),
    Mistake(
        "rolling-slot-from-chunk-index",
        "the slot comes from the position's index in the chunk, not from its position in the text",
        "Position i goes into slot i % window, i counted from the start of the text: the positions already "
        "written plus the index in the chunk. A single new token is not always slot 0.",
        _rolling_with(slot_of="chunk"),
    ),
]


EXERCISES = {
    "KVCache": Exercise("KVCache", kv_cache_cases, atol=0.0, rtol=0.0, mistakes=KV_CACHE_MISTAKES),
    "attend_with_cache": Exercise(
        "attend_with_cache",
        attend_with_cache_cases,
        atol=1e-5,
        rtol=1e-5,
        depends_on=("KVCache",),
        mistakes=ATTEND_MISTAKES,
    ),
    "forward_cached": Exercise(
        "forward_cached",
        forward_cached_cases,
        atol=1e-4,
        rtol=1e-4,
        depends_on=("KVCache", "attend_with_cache"),
        mistakes=FORWARD_MISTAKES,
    ),
    "generate_cached": Exercise(
        "generate_cached",
        generate_cached_cases,
        atol=0.04,
        rtol=0.0,
        depends_on=("KVCache", "attend_with_cache", "forward_cached"),
        mistakes=GENERATE_MISTAKES,
        properties=(Property(_one_token_per_pass, _recomputes_reading, counted="embedded"),),
    ),
    "RollingKVCache": Exercise(
        "RollingKVCache", rolling_cache_cases, atol=0.0, rtol=0.0, mistakes=ROLLING_CACHE_MISTAKES
    ),
}
