"""Notebook 08 graded by real nbgrader: each catalogued mistake, correct alternatives, tampering.

The catalogue's mutants against the reference and each other are checked without
nbgrader in test_kv_cache_reference.py.
"""

from grading_suite import GradingSuite

# ---------------------------------------------------------------- KVCache answers

CACHE_REPLACES = """
class KVCache:
    def __init__(self):
        self.keys = {}
        self.values = {}

    def update(self, layer, k, v):
        self.keys[layer] = k
        self.values[layer] = v
        return k, v

    @property
    def length(self):
        return self.keys[0].shape[2] if self.keys else 0
"""

CACHE_RETURNS_NEW = """
class KVCache:
    def __init__(self):
        self.k = {}
        self.v = {}

    def update(self, layer, k, v):
        if layer not in self.k:
            self.k[layer], self.v[layer] = k, v
        else:
            self.k[layer] = torch.cat([self.k[layer], k], dim=2)
            self.v[layer] = torch.cat([self.v[layer], v], dim=2)
        return k, v

    @property
    def length(self):
        return 0 if not self.k else self.k[0].shape[2]
"""

CACHE_NEW_FIRST = """
class KVCache:
    def __init__(self):
        self.store = {}

    def update(self, layer, k, v):
        if layer in self.store:
            old_k, old_v = self.store[layer]
            k, v = torch.cat([k, old_k], dim=2), torch.cat([v, old_v], dim=2)
        self.store[layer] = (k, v)
        return k, v

    @property
    def length(self):
        return self.store[0][0].shape[2] if 0 in self.store else 0
"""

CACHE_LENGTH_EVERY_UPDATE = """
class KVCache:
    def __init__(self):
        self.keys, self.values = {}, {}
        self.length = 0

    def update(self, layer, k, v):
        self.length += k.shape[2]          # count the new positions
        if layer in self.keys:
            k = torch.cat([self.keys[layer], k], dim=2)
            v = torch.cat([self.values[layer], v], dim=2)
        self.keys[layer], self.values[layer] = k, v
        return k, v
"""

CACHE_LENGTH_LAYERS = """
class KVCache:
    def __init__(self):
        self.layers = {}

    def update(self, layer, k, v):
        if layer in self.layers:
            k = torch.cat([self.layers[layer][0], k], dim=2)
            v = torch.cat([self.layers[layer][1], v], dim=2)
        self.layers[layer] = (k, v)
        return k, v

    @property
    def length(self):
        return len(self.layers)
"""

# ---------------------------------------------------------------- RollingKVCache answers

ROLLING_HEAD = """
class RollingKVCache:
    def __init__(self, window):
        self.window = window
        self.keys, self.values, self.count = {}, {}, {}

    def update(self, layer, k, v):
        W = self.window
        if layer not in self.keys:
            B, G, _, Dh = k.shape
            self.keys[layer], self.values[layer] = k.new_zeros(B, G, W, Dh), v.new_zeros(B, G, W, Dh)
            self.count[layer] = 0
"""

ROLLING_WRITE = """
        start = self.count[layer]
        end = start + k.shape[2]
        first = max(start, end - W)
        slots = torch.arange(first, end) % W
        self.keys[layer][:, :, slots] = k[:, :, first - start:]
        self.values[layer][:, :, slots] = v[:, :, first - start:]
        self.count[layer] = end
"""

ROLLING_LENGTH = """
    @property
    def length(self):
        return self.count.get(0, 0)
"""

ROLLING_RETURNS_OLDEST_FIRST = """
        order = torch.arange(max(0, end - W), end) % W
        return self.keys[layer][:, :, order], self.values[layer][:, :, order]
"""


def rolling_with(write=ROLLING_WRITE, returns=ROLLING_RETURNS_OLDEST_FIRST, length=ROLLING_LENGTH) -> str:
    return ROLLING_HEAD + write + returns + length


ROLLING_SHIFTED = """
class RollingKVCache:
    def __init__(self, window):
        self.window = window
        self.keys, self.values = {}, {}
        self.seen = 0

    def update(self, layer, k, v):
        if layer == 0:
            self.seen += k.shape[2]
        if layer in self.keys:
            k = torch.cat([self.keys[layer], k], dim=2)
            v = torch.cat([self.values[layer], v], dim=2)
        self.keys[layer], self.values[layer] = k[:, :, -self.window:], v[:, :, -self.window:]
        return self.keys[layer], self.values[layer]

    @property
    def length(self):
        return self.seen
"""

# ---------------------------------------------------------------- attend_with_cache answers

ATTEND_HEAD = """
def attend_with_cache(attn, x, positions, cache, layer):
    B, T, _ = x.shape
    H, G, Dh = attn.n_heads, attn.n_kv_heads, attn.head_dim
    q = attn.q_proj(x).view(B, T, H, Dh).transpose(1, 2)
    k = attn.k_proj(x).view(B, T, G, Dh).transpose(1, 2)
    v = attn.v_proj(x).view(B, T, G, Dh).transpose(1, 2)
"""


def attend_with(body: str) -> str:
    return ATTEND_HEAD + body


ATTEND_TAIL = """
    out = attention(q, repeat_kv(k, H // G), repeat_kv(v, H // G), causal_mask(T, S))
    return attn.o_proj(out.transpose(1, 2).reshape(B, T, H * Dh))
"""

# ---------------------------------------------------------------- forward_cached answers

FORWARD_HEAD = """
@torch.no_grad()
def forward_cached(model, tokens, cache):
"""

# ---------------------------------------------------------------- generate_cached answers

PICK = """
        if temperature == 0:
            next_token = logits.argmax(dim=-1, keepdim=True)
        else:
            logits = logits / temperature
            if top_k is not None:
                kth = torch.topk(logits, min(top_k, logits.shape[-1]), dim=-1).values[:, -1:]
                logits = logits.masked_fill(logits < kth, float("-inf"))
            next_token = torch.multinomial(F.softmax(logits, dim=-1), num_samples=1)
"""

LIMIT = """
    if tokens.shape[1] + max_new_tokens > model.config.max_seq_len:
        raise ValueError(f"too long for max_seq_len={model.config.max_seq_len}")
"""


def generate_with(before_loop: str, in_loop_before_pick: str, in_loop_after_pick: str, limit: str = LIMIT) -> str:
    return (
        """
@torch.no_grad()
def generate_cached(model, tokens, max_new_tokens, temperature=1.0, top_k=None):
"""
        + limit
        + before_loop
        + """
    for _ in range(max_new_tokens):
"""
        + in_loop_before_pick
        + PICK
        + """
        tokens = torch.cat([tokens, next_token], dim=1)
"""
        + in_loop_after_pick
        + """
    return tokens
"""
    )


PREFILL = """
    cache = KVCache()
    logits = forward_cached(model, tokens, cache)[:, -1, :]
"""


class TestKVCacheGrading(GradingSuite):
    assignment = "08_kv_cache"

    mistakes = {
        "cache-replaces": ("KVCache", CACHE_REPLACES, "cache-replaces"),
        "cache-returns-new": ("KVCache", CACHE_RETURNS_NEW, "update-returns-new-only"),
        "cache-new-first": ("KVCache", CACHE_NEW_FIRST, "cache-new-first"),
        "cache-length-every-update": ("KVCache", CACHE_LENGTH_EVERY_UPDATE, "length-counts-every-update"),
        "cache-length-layers": ("KVCache", CACHE_LENGTH_LAYERS, "length-counts-layers"),
        "rolling-shifted": ("RollingKVCache", ROLLING_SHIFTED, "rolling-buffer-shifted"),
        "rolling-slot-order": (
            "RollingKVCache",
            rolling_with(
                returns="""
        n = min(end, W)
        return self.keys[layer][:, :, :n], self.values[layer][:, :, :n]
"""
            ),
            "rolling-returns-slot-order",
        ),
        "rolling-length-capped": (
            "RollingKVCache",
            rolling_with(
                length="""
    @property
    def length(self):
        return min(self.count.get(0, 0), self.window)
"""
            ),
            "rolling-length-stops-at-window",
        ),
        "rolling-unwritten-slots": (
            "RollingKVCache",
            rolling_with(
                returns="""
        order = torch.arange(end - W, end) % W
        return self.keys[layer][:, :, order], self.values[layer][:, :, order]
"""
            ),
            "rolling-returns-unwritten-slots",
        ),
        "rolling-chunk-index": (
            "RollingKVCache",
            rolling_with(
                write="""
        start = self.count[layer]
        end = start + k.shape[2]
        for j in range(k.shape[2]):
            self.keys[layer][:, :, j % W] = k[:, :, j]
            self.values[layer][:, :, j % W] = v[:, :, j]
        self.count[layer] = end
"""
            ),
            "rolling-slot-from-chunk-index",
        ),
        "attend-positions-from-zero": (
            "attend_with_cache",
            attend_with(
                """
    steps = torch.arange(T)                 # the positions of the new tokens
    q, k = apply_rope(q, steps, attn.rope_base), apply_rope(k, steps, attn.rope_base)
    k, v = cache.update(layer, k, v)
    S = k.shape[2]
"""
                + ATTEND_TAIL
            ),
            "positions-ignored",
        ),
        "attend-top-left": (
            "attend_with_cache",
            attend_with("""
    q, k = apply_rope(q, positions, attn.rope_base), apply_rope(k, positions, attn.rope_base)
    k, v = cache.update(layer, k, v)
    S = k.shape[2]
    mask = torch.tril(torch.ones(T, S, dtype=torch.bool))
    out = attention(q, repeat_kv(k, H // G), repeat_kv(v, H // G), mask)
    return attn.o_proj(out.transpose(1, 2).reshape(B, T, H * Dh))
"""),
            "mask-top-left",
        ),
        "attend-caches-repeated": (
            "attend_with_cache",
            attend_with("""
    q, k = apply_rope(q, positions, attn.rope_base), apply_rope(k, positions, attn.rope_base)
    k, v = repeat_kv(k, H // G), repeat_kv(v, H // G)
    k, v = cache.update(layer, k, v)
    S = k.shape[2]
    out = attention(q, k, v, causal_mask(T, S))
    return attn.o_proj(out.transpose(1, 2).reshape(B, T, H * Dh))
"""),
            "cache-holds-repeated-heads",
        ),
        "attend-rope-after-cache": (
            "attend_with_cache",
            attend_with(
                """
    k, v = cache.update(layer, k, v)
    S = k.shape[2]
    q = apply_rope(q, positions, attn.rope_base)
    k = apply_rope(k, torch.arange(S), attn.rope_base)
"""
                + ATTEND_TAIL
            ),
            "rope-after-cache",
        ),
        "attend-rope-twice": (
            "attend_with_cache",
            attend_with(
                """
    q, k = apply_rope(q, positions, attn.rope_base), apply_rope(k, positions, attn.rope_base)
    k, v = cache.update(layer, k, v)
    S = k.shape[2]
    k = apply_rope(k, torch.arange(S), attn.rope_base)
"""
                + ATTEND_TAIL
            ),
            "rope-twice",
        ),
        "attend-cache-bypassed": (
            "attend_with_cache",
            attend_with(
                """
    q, k = apply_rope(q, positions, attn.rope_base), apply_rope(k, positions, attn.rope_base)
    S = T
"""
                + ATTEND_TAIL
            ),
            "cache-bypassed",
        ),
        "attend-updated-twice": (
            "attend_with_cache",
            attend_with(
                """
    q, k = apply_rope(q, positions, attn.rope_base), apply_rope(k, positions, attn.rope_base)
    cache.update(layer, k, v)
    k, v = cache.update(layer, k, v)
    S = k.shape[2]
"""
                + ATTEND_TAIL
            ),
            "cache-updated-twice",
        ),
        "attend-values-rotated": (
            "attend_with_cache",
            attend_with(
                """
    q, k, v = (apply_rope(t, positions, attn.rope_base) for t in (q, k, v))
    k, v = cache.update(layer, k, v)
    S = k.shape[2]
"""
                + ATTEND_TAIL
            ),
            "values-rotated",
        ),
        "forward-positions-from-zero": (
            "forward_cached",
            FORWARD_HEAD
            + """
    positions = torch.arange(tokens.shape[1])
    x = model.embed(tokens)
    for i, block in enumerate(model.layers):
        x = x + attend_with_cache(block.attn, block.attn_norm(x), positions, cache, i)
        x = x + block.mlp(block.mlp_norm(x))
    return model.lm_head(model.norm(x))
""",
            "positions-from-zero",
        ),
        "forward-positions-per-layer": (
            "forward_cached",
            FORWARD_HEAD
            + """
    T = tokens.shape[1]
    x = model.embed(tokens)
    for i, block in enumerate(model.layers):
        positions = torch.arange(cache.length, cache.length + T)
        x = x + attend_with_cache(block.attn, block.attn_norm(x), positions, cache, i)
        x = x + block.mlp(block.mlp_norm(x))
    return model.lm_head(model.norm(x))
""",
            "positions-read-per-layer",
        ),
        "forward-layer-zero": (
            "forward_cached",
            FORWARD_HEAD
            + """
    positions = cache.length + torch.arange(tokens.shape[1])
    x = model.embed(tokens)
    for block in model.layers:
        x = x + attend_with_cache(block.attn, block.attn_norm(x), positions, cache, 0)
        x = x + block.mlp(block.mlp_norm(x))
    return model.lm_head(model.norm(x))
""",
            "same-layer-index",
        ),
        "forward-no-mlp": (
            "forward_cached",
            FORWARD_HEAD
            + """
    positions = torch.arange(cache.length, cache.length + tokens.shape[1])
    h = model.embed(tokens)
    for i, block in enumerate(model.layers):
        h = h + attend_with_cache(block.attn, block.attn_norm(h), positions, cache, i)
    return model.lm_head(model.norm(h))
""",
            "mlp-missing",
        ),
        "forward-no-block-norms": (
            "forward_cached",
            FORWARD_HEAD
            + """
    positions = torch.arange(cache.length, cache.length + tokens.shape[1])
    x = model.embed(tokens)
    for i, block in enumerate(model.layers):
        x = x + attend_with_cache(block.attn, x, positions, cache, i)
        x = x + block.mlp(x)
    return model.lm_head(model.norm(x))
""",
            "block-norms-missing",
        ),
        "generate-whole-sequence": (
            "generate_cached",
            generate_with(
                PREFILL,
                "",
                """
        logits = forward_cached(model, tokens, cache)[:, -1, :]
""",
            ),
            "whole-sequence-every-step",
        ),
        "generate-fresh-cache": (
            "generate_cached",
            generate_with(
                PREFILL,
                "",
                """
        cache = KVCache()
        logits = forward_cached(model, next_token, cache)[:, -1, :]
""",
            ),
            "fresh-cache-every-step",
        ),
        "generate-last-token-twice": (
            "generate_cached",
            generate_with(
                """
    cache = KVCache()
    forward_cached(model, tokens, cache)
""",
                """
        logits = forward_cached(model, tokens[:, -1:], cache)[:, -1, :]
""",
                "",
            ),
            "last-prompt-token-twice",
        ),
        "generate-no-limit": (
            "generate_cached",
            generate_with(
                PREFILL,
                "",
                """
        logits = forward_cached(model, next_token, cache)[:, -1, :]
""",
                limit="",
            ),
            "context-limit-not-checked",
        ),
    }

    alternatives = {
        "alternative-a": {
            # a list per layer and a length attribute counted at layer 0
            "KVCache": """
class KVCache:
    def __init__(self):
        self.k, self.v = [], []
        self.length = 0

    def update(self, layer, k, v):
        if layer == len(self.k):
            self.k.append(k)
            self.v.append(v)
        else:
            self.k[layer] = torch.cat((self.k[layer], k), dim=-2)
            self.v[layer] = torch.cat((self.v[layer], v), dim=-2)
        if layer == 0:
            self.length += k.shape[-2]
        return self.k[layer], self.v[layer]
""",
            # one position at a time into its slot; the window read back with torch.roll; views of the buffer
            "RollingKVCache": """
class RollingKVCache:
    def __init__(self, window):
        self.size, self.keys, self.values, self.count = window, {}, {}, {}

    def update(self, layer, k, v):
        B, G, T, D = k.shape
        self.keys.setdefault(layer, torch.zeros(B, G, self.size, D, dtype=k.dtype))
        self.values.setdefault(layer, torch.zeros(B, G, self.size, D, dtype=v.dtype))
        n = self.count.get(layer, 0)
        for j in range(T):
            self.keys[layer][:, :, (n + j) % self.size] = k[:, :, j]
            self.values[layer][:, :, (n + j) % self.size] = v[:, :, j]
        n = self.count[layer] = n + T
        if n <= self.size:
            return self.keys[layer][:, :, :n], self.values[layer][:, :, :n]
        oldest = n % self.size
        return torch.roll(self.keys[layer], -oldest, dims=2), torch.roll(self.values[layer], -oldest, dims=2)

    @property
    def length(self):
        return self.count.get(0, 0)
""",
            # torch's scaled_dot_product_attention groups the heads itself
            "attend_with_cache": """
def attend_with_cache(attn, x, positions, cache, layer):
    B, T, D = x.shape
    q = attn.q_proj(x).reshape(B, T, attn.n_heads, -1).permute(0, 2, 1, 3)
    k = attn.k_proj(x).reshape(B, T, attn.n_kv_heads, -1).permute(0, 2, 1, 3)
    v = attn.v_proj(x).reshape(B, T, attn.n_kv_heads, -1).permute(0, 2, 1, 3)
    q = apply_rope(q, positions, base=attn.rope_base)
    k = apply_rope(k, positions, base=attn.rope_base)
    keys, values = cache.update(layer, k, v)
    mask = causal_mask(T, keys.shape[-2])
    out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=True)
    return attn.o_proj(out.permute(0, 2, 1, 3).reshape(B, T, D))
""",
            "forward_cached": """
@torch.no_grad()
def forward_cached(model, tokens, cache):
    first = cache.length
    positions = first + torch.arange(tokens.shape[-1])
    hidden = model.embed(tokens)
    for index in range(len(model.layers)):
        block = model.layers[index]
        attended = attend_with_cache(block.attn, block.attn_norm(hidden), positions, cache, index)
        hidden = hidden + attended
        hidden = hidden + block.mlp(block.mlp_norm(hidden))
    return model.lm_head(model.norm(hidden))
""",
            # the prompt fed one token at a time (no separate prefill), a new forward after every token
            "generate_cached": """
@torch.no_grad()
def generate_cached(model, tokens, max_new_tokens, temperature=1.0, top_k=None):
    total = tokens.size(1) + max_new_tokens
    if total > model.config.max_seq_len:
        raise ValueError(f"{total} tokens do not fit in max_seq_len={model.config.max_seq_len}")
    cache = KVCache()
    for t in range(tokens.size(1)):
        logits = forward_cached(model, tokens[:, t:t + 1], cache)[:, -1]
    for _ in range(max_new_tokens):
        if temperature == 0:
            choice = torch.argmax(logits, dim=-1, keepdim=True)
        else:
            scaled = logits / temperature
            if top_k is not None:
                top = scaled.topk(min(top_k, scaled.size(-1)), dim=-1).values
                scaled = torch.where(scaled < top[:, [-1]], torch.full_like(scaled, -float("inf")), scaled)
            choice = torch.multinomial(torch.softmax(scaled, dim=-1), 1)
        tokens = torch.cat((tokens, choice), dim=1)
        logits = forward_cached(model, choice, cache)[:, -1]
    return tokens
""",
        },
        "alternative-b": {
            # one dict of (k, v) pairs, length from layer 0
            "KVCache": """
class KVCache:
    def __init__(self):
        self.cache = {}

    def update(self, layer, k, v):
        if layer in self.cache:
            old_k, old_v = self.cache[layer]
            k = torch.cat([old_k, k], dim=2)
            v = torch.cat([old_v, v], dim=2)
        self.cache[layer] = (k, v)
        return self.cache[layer]

    @property
    def length(self):
        if 0 not in self.cache:
            return 0
        return self.cache[0][0].size(2)
""",
            # empty buffers, index_copy_ and index_select, length an attribute counted at layer 0
            "RollingKVCache": """
class RollingKVCache:
    def __init__(self, window):
        self.window = window
        self.length = 0
        self.keys, self.values = {}, {}

    def update(self, layer, k, v):
        W, new = self.window, k.shape[2]
        if layer == 0:
            self.length += new
        end = self.length
        if layer not in self.keys:
            self.keys[layer] = k.new_empty(k.shape[0], k.shape[1], W, k.shape[3])
            self.values[layer] = v.new_empty(v.shape[0], v.shape[1], W, v.shape[3])
        kept = min(new, W)
        slots = torch.arange(end - kept, end) % W
        self.keys[layer].index_copy_(2, slots, k[:, :, new - kept:])
        self.values[layer].index_copy_(2, slots, v[:, :, new - kept:])
        order = torch.arange(max(0, end - W), end) % W
        return self.keys[layer].index_select(2, order), self.values[layer].index_select(2, order)
""",
            # einsum in float64, heads repeated with expand, a large negative number for the mask
            "attend_with_cache": """
def attend_with_cache(attn, x, positions, cache, layer):
    B, T, _ = x.shape
    H, G, Dh = attn.n_heads, attn.n_kv_heads, attn.head_dim
    q = apply_rope(attn.q_proj(x).view(B, T, H, Dh).transpose(1, 2), positions, attn.rope_base)
    k = apply_rope(attn.k_proj(x).view(B, T, G, Dh).transpose(1, 2), positions, attn.rope_base)
    v = attn.v_proj(x).view(B, T, G, Dh).transpose(1, 2)
    k, v = cache.update(layer, k, v)
    S = k.shape[2]
    k = k[:, :, None].expand(B, G, H // G, S, Dh).reshape(B, H, S, Dh)
    v = v[:, :, None].expand(B, G, H // G, S, Dh).reshape(B, H, S, Dh)
    scores = torch.einsum("bhtd,bhsd->bhts", q.double(), k.double()) / math.sqrt(Dh)
    scores = scores.masked_fill(~causal_mask(T, S), -1e9)
    out = torch.einsum("bhts,bhsd->bhtd", scores.softmax(dim=-1), v.double()).to(x.dtype)
    return attn.o_proj(out.transpose(1, 2).reshape(B, T, H * Dh))
""",
            "forward_cached": """
@torch.no_grad()
def forward_cached(model, tokens, cache):
    T = tokens.shape[1]
    positions = torch.arange(T) + cache.length
    x = model.embed(tokens)
    for i, block in enumerate(model.layers):
        h = block.attn_norm(x)
        x = x + attend_with_cache(block.attn, h, positions, cache, i)
        h = block.mlp_norm(x)
        x = x + block.mlp(h)
    x = model.norm(x)
    return model.lm_head(x)
""",
            "generate_cached": generate_with(
                PREFILL,
                "",
                """
        logits = forward_cached(model, next_token, cache)[:, -1, :]
""",
            ),
        },
    }

    wrong_answers = {
        "KVCache": CACHE_REPLACES,
        "attend_with_cache": attend_with(
            """
    k, v = cache.update(layer, k, v)
    S = k.shape[2]
"""
            + ATTEND_TAIL
        ),
        "forward_cached": FORWARD_HEAD
        + """
    return model(tokens)
""",
        "generate_cached": """
@torch.no_grad()
def generate_cached(model, tokens, max_new_tokens, temperature=1.0, top_k=None):
    return torch.cat([tokens, tokens[:, -1:].repeat(1, max_new_tokens)], dim=1)
""",
        "RollingKVCache": ROLLING_SHIFTED,
    }
