"""Notebook 07 graded by real nbgrader: each catalogued mistake, correct alternatives, tampering."""

from grading_suite import GradingSuite

# ---------------------------------------------------------------- ModelConfig answers

CONFIG_EPS_1E5 = '''
@dataclass
class ModelConfig:
    """The sizes of a LLaMA-style model."""
    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_hidden: int
    norm_eps: float = 1e-5
    rope_base: float = 10000.0
    max_seq_len: int = 2048

    def __post_init__(self):
        if self.d_model % self.n_heads or (self.d_model // self.n_heads) % 2:
            raise ValueError("bad head size")
        if self.n_heads % self.n_kv_heads:
            raise ValueError("bad groups")
        if self.max_seq_len < 1:
            raise ValueError("no context")
'''

CONFIG_UNCHECKED = '''
@dataclass
class ModelConfig:
    """The sizes of a LLaMA-style model."""
    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_hidden: int
    norm_eps: float = 1e-6
    rope_base: float = 10000.0
    max_seq_len: int = 2048

    def __post_init__(self):
        pass
'''

CONFIG_GROUPS_UNCHECKED = '''
@dataclass
class ModelConfig:
    """The sizes of a LLaMA-style model."""
    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_hidden: int
    norm_eps: float = 1e-6
    rope_base: float = 10000.0
    max_seq_len: int = 2048

    def __post_init__(self):
        head_dim, rest = divmod(self.d_model, self.n_heads)
        if rest != 0 or head_dim % 2 == 1:
            raise ValueError(f"d_model={self.d_model} cannot make {self.n_heads} heads of even size")
        if self.max_seq_len <= 0:
            raise ValueError("max_seq_len must be positive")
'''

CONFIG_CONTEXT_UNCHECKED = '''
@dataclass
class ModelConfig:
    """The sizes of a LLaMA-style model."""
    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_hidden: int
    norm_eps: float = 1e-6
    rope_base: float = 10000.0
    max_seq_len: int = 2048

    def __post_init__(self):
        if self.d_model % self.n_heads != 0 or (self.d_model // self.n_heads) % 2 != 0:
            raise ValueError("d_model must split into n_heads heads of even size")
        if self.n_heads % self.n_kv_heads != 0:
            raise ValueError("n_heads must be a multiple of n_kv_heads")
'''

# ---------------------------------------------------------------- Llama answers

LLAMA_INIT = """
class Llama(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        self.layers = nn.ModuleList([
            TransformerBlock(config.d_model, config.n_heads, config.n_kv_heads, config.d_hidden,
                             config.norm_eps, config.rope_base)
            for _ in range(config.n_layers)])
        self.norm = RMSNorm(config.d_model, config.norm_eps)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
"""


def llama_with(forward: str) -> str:
    return LLAMA_INIT + forward


# ---------------------------------------------------------------- generate answers


def generate_with(pick: str, body: str | None = None) -> str:
    """A generate whose sampling step (given the last logits, `logits`) is ``pick``."""
    body = (
        body
        or """
    for _ in range(max_new_tokens):
        logits = model(tokens[:, -model.config.max_seq_len:])[:, -1, :]
        if temperature == 0:
            next_token = torch.argmax(logits, dim=-1, keepdim=True)
        else:
{pick}
        tokens = torch.cat((tokens, next_token), dim=1)
    return tokens
"""
    )
    indented = "\n".join("            " + line if line else line for line in pick.strip("\n").splitlines())
    return "@torch.no_grad()\ndef generate(model, tokens, max_new_tokens, temperature=1.0, top_k=None):" + body.replace(
        "{pick}", indented
    )


RIGHT_PICK = """
logits = logits / temperature
if top_k is not None:
    v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
    logits[logits < v[:, [-1]]] = -float("inf")
probs = F.softmax(logits, dim=-1)
next_token = torch.multinomial(probs, num_samples=1)
"""

# ---------------------------------------------------------------- load answers

LOAD_HEAD = """
def load_hf_llama_state_dict(model, state_dict):
    cfg = model.config
    hd = cfg.d_model // cfg.n_heads
    sd = state_dict
    new = {
        "embed.weight": sd["model.embed_tokens.weight"],
        "norm.weight": sd["model.norm.weight"],
        "lm_head.weight": sd.get("lm_head.weight", sd["model.embed_tokens.weight"]),
    }
"""
LOAD_LAYERS = """
    for i in range(cfg.n_layers):
        p = f"model.layers.{i}."
        new[f"layers.{i}.attn_norm.weight"] = sd[p + "input_layernorm.weight"]
        new[f"layers.{i}.mlp_norm.weight"] = sd[p + "post_attention_layernorm.weight"]
        new[f"layers.{i}.attn.q_proj.weight"] = {q}
        new[f"layers.{i}.attn.k_proj.weight"] = {k}
        new[f"layers.{i}.attn.v_proj.weight"] = sd[p + "self_attn.v_proj.weight"]
        new[f"layers.{i}.attn.o_proj.weight"] = sd[p + "self_attn.o_proj.weight"]
        new[f"layers.{i}.mlp.w1.weight"] = sd[p + "mlp.{w1}.weight"]
        new[f"layers.{i}.mlp.w3.weight"] = sd[p + "mlp.{w3}.weight"]
        new[f"layers.{i}.mlp.w2.weight"] = sd[p + "mlp.down_proj.weight"]
    model.load_state_dict(new)
    return model
"""


def loader(q: str, k: str, w1: str = "gate_proj", w3: str = "up_proj", helper: str = "") -> str:
    return LOAD_HEAD + helper + LOAD_LAYERS.replace("{q}", q).replace("{k}", k).replace("{w1}", w1).replace("{w3}", w3)


PERMUTE_HELPER = """
    def permute(w, n):
        return w.view(n, 2, hd // 2, w.shape[1]).transpose(1, 2).reshape(n * hd, w.shape[1])
"""
RIGHT_Q = 'permute(sd[p + "self_attn.q_proj.weight"], cfg.n_heads)'
RIGHT_K = 'permute(sd[p + "self_attn.k_proj.weight"], cfg.n_kv_heads)'


class TestLlamaGrading(GradingSuite):
    assignment = "07_llama"

    mistakes = {
        "config-eps-1e-5": ("ModelConfig", CONFIG_EPS_1E5, "config-eps-default"),
        "config-unchecked": ("ModelConfig", CONFIG_UNCHECKED, "config-not-validated"),
        "config-groups-unchecked": ("ModelConfig", CONFIG_GROUPS_UNCHECKED, "config-groups-not-checked"),
        "llama-no-final-norm": (
            "Llama",
            llama_with("""
    def forward(self, tokens):
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(x)
"""),
            "final-norm-missing",
        ),
        "llama-blocks-read-embeddings": (
            "Llama",
            llama_with("""
    def forward(self, tokens):
        h = self.embed(tokens)
        for block in self.layers:
            out = block(h)
        return self.lm_head(self.norm(out))
"""),
            "layers-not-chained",
        ),
        "llama-residual-twice": (
            "Llama",
            llama_with("""
    def forward(self, tokens):
        x = self.embed(tokens)
        for layer in self.layers:
            x = x + layer(x)   # residual connection
        return self.lm_head(self.norm(x))
"""),
            "residual-added-twice",
        ),
        "llama-returns-probabilities": (
            "Llama",
            llama_with("""
    def forward(self, tokens):
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        logits = self.lm_head(self.norm(x))
        return logits.softmax(dim=-1)
"""),
            "softmax-on-logits",
        ),
        "llama-scaled-embedding": (
            "Llama",
            llama_with("""
    def forward(self, tokens):
        x = self.embed(tokens) * self.config.d_model ** 0.5
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.norm(x))
"""),
            "embedding-scaled",
        ),
        "llama-last-position": (
            "Llama",
            llama_with("""
    def forward(self, tokens):
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        x = self.norm(x[:, -1, :])
        return self.lm_head(x)
"""),
            "last-position-only",
        ),
        "generate-temperature-after-softmax": (
            "generate",
            generate_with("""
probs = F.softmax(logits, dim=-1) / temperature
if top_k is not None:
    v, _ = torch.topk(probs, min(top_k, probs.size(-1)))
    probs[probs < v[:, [-1]]] = 0
next_token = torch.multinomial(probs, num_samples=1)
"""),
            "temperature-after-softmax",
        ),
        "generate-temperature-multiplied": (
            "generate",
            generate_with("""
logits = logits * temperature
if top_k is not None:
    v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
    logits[logits < v[:, [-1]]] = -float("inf")
next_token = torch.multinomial(F.softmax(logits, dim=-1), num_samples=1)
"""),
            "temperature-multiplied",
        ),
        "generate-top-k-ascending-sort": (
            "generate",
            generate_with("""
logits = logits / temperature
if top_k is not None:
    sorted_logits, _ = torch.sort(logits, dim=-1)
    cutoff = sorted_logits[:, top_k - 1].unsqueeze(-1)
    logits = logits.masked_fill(logits < cutoff, float("-inf"))
next_token = torch.multinomial(F.softmax(logits, dim=-1), num_samples=1)
"""),
            "top-k-sort-ascending",
        ),
        "generate-top-k-first-value": (
            "generate",
            generate_with("""
logits = logits / temperature
if top_k is not None:
    values, _ = torch.topk(logits, min(top_k, logits.size(-1)))
    logits[logits < values[:, 0:1]] = float("-inf")
next_token = torch.multinomial(F.softmax(logits, dim=-1), num_samples=1)
"""),
            "top-k-threshold-largest",
        ),
        "generate-last-token-only": (
            "generate",
            generate_with(
                RIGHT_PICK,
                """
    for _ in range(max_new_tokens):
        logits = model(tokens[:, -1:])[:, -1, :]
        if temperature == 0:
            next_token = torch.argmax(logits, dim=-1, keepdim=True)
        else:
{pick}
        tokens = torch.cat((tokens, next_token), dim=1)
    return tokens
""",
            ),
            "last-token-only",
        ),
        "generate-prompt-only": (
            "generate",
            generate_with(
                RIGHT_PICK,
                """
    out = tokens
    for _ in range(max_new_tokens):
        logits = model(tokens[:, -model.config.max_seq_len:])[:, -1, :]
        if temperature == 0:
            next_token = torch.argmax(logits, dim=-1, keepdim=True)
        else:
{pick}
        out = torch.cat((out, next_token), dim=1)
    return out
""",
            ),
            "sequence-not-extended",
        ),
        "generate-whole-sequence": (
            "generate",
            generate_with(
                RIGHT_PICK,
                """
    for _ in range(max_new_tokens):
        logits = model(tokens)[:, -1, :]   # the model reads everything written so far
        if temperature == 0:
            next_token = torch.argmax(logits, dim=-1, keepdim=True)
        else:
{pick}
        tokens = torch.cat((tokens, next_token), dim=1)
    return tokens
""",
            ),
            "context-not-cropped",
        ),
        "generate-first-tokens": (
            "generate",
            generate_with(
                RIGHT_PICK,
                """
    for _ in range(max_new_tokens):
        window = tokens[:, :model.config.max_seq_len]
        logits = model(window)[:, -1, :]
        if temperature == 0:
            next_token = torch.argmax(logits, dim=-1, keepdim=True)
        else:
{pick}
        tokens = torch.cat((tokens, next_token), dim=1)
    return tokens
""",
            ),
            "context-keeps-first-tokens",
        ),
        "config-context-unchecked": ("ModelConfig", CONFIG_CONTEXT_UNCHECKED, "config-context-not-checked"),
        "loss-no-shift": (
            "lm_loss",
            """
            def lm_loss(logits, tokens):
                B, T, V = logits.shape
                return F.cross_entropy(logits.reshape(B * T, V), tokens.reshape(B * T))
            """,
            "loss-no-shift",
        ),
        "loss-shift-wrong-way": (
            "lm_loss",
            """
            def lm_loss(logits, tokens):
                V = logits.shape[-1]
                return F.cross_entropy(logits[:, 1:].reshape(-1, V), tokens[:, :-1].reshape(-1))
            """,
            "loss-shift-wrong-way",
        ),
        "loss-wrong-axis": (
            "lm_loss",
            """
            def lm_loss(logits, tokens):
                log_probs = torch.log_softmax(logits[:, :-1], dim=1)
                picked = torch.gather(log_probs, 2, tokens[:, 1:].unsqueeze(-1))
                return -picked.mean()
            """,
            "loss-wrong-axis",
        ),
        "loss-summed": (
            "lm_loss",
            """
            def lm_loss(logits, tokens):
                V = logits.shape[-1]
                return F.cross_entropy(logits[:, :-1].reshape(-1, V), tokens[:, 1:].reshape(-1), reduction="sum")
            """,
            "loss-summed",
        ),
        "lr-warmup-from-zero": (
            "lr_at",
            """
            def lr_at(step, max_lr, warmup_steps, total_steps, min_lr=0.0):
                if step < warmup_steps:
                    return max_lr * step / warmup_steps
                if step >= total_steps:
                    return min_lr
                progress = (step - warmup_steps) / (total_steps - warmup_steps)
                return min_lr + 0.5 * (max_lr - min_lr) * (1 + math.cos(math.pi * progress))
            """,
            "lr-warmup-off-by-one",
        ),
        "lr-constant-after-warmup": (
            "lr_at",
            """
            def lr_at(step, max_lr, warmup_steps, total_steps, min_lr=0.0):
                if step < warmup_steps:
                    return max_lr * (step + 1) / warmup_steps
                return max_lr
            """,
            "lr-no-decay",
        ),
        "lr-cosine-runs-on": (
            "lr_at",
            """
            def lr_at(step, max_lr, warmup_steps, total_steps, min_lr=0.0):
                if step < warmup_steps:
                    return max_lr * (step + 1) / warmup_steps
                t = (step - warmup_steps) / (total_steps - warmup_steps)
                return min_lr + (max_lr - min_lr) * (1 + math.cos(math.pi * t)) / 2
            """,
            "lr-decay-past-end",
        ),
        "lr-decays-to-zero": (
            "lr_at",
            """
            def lr_at(step, max_lr, warmup_steps, total_steps, min_lr=0.0):
                if step < warmup_steps:
                    return max_lr * (step + 1) / warmup_steps
                if step >= total_steps:
                    return 0.0
                progress = (step - warmup_steps) / (total_steps - warmup_steps)
                return max_lr * 0.5 * (1 + math.cos(math.pi * progress))
            """,
            "lr-min-lr-ignored",
        ),
        "lr-cosine-from-step-zero": (
            "lr_at",
            """
            def lr_at(step, max_lr, warmup_steps, total_steps, min_lr=0.0):
                if step < warmup_steps:
                    return max_lr * (step + 1) / warmup_steps
                if step >= total_steps:
                    return min_lr
                return min_lr + 0.5 * (max_lr - min_lr) * (1 + math.cos(math.pi * step / total_steps))
            """,
            "lr-decay-from-step-zero",
        ),
        "load-no-permutation": (
            "load_hf_llama_state_dict",
            loader('sd[p + "self_attn.q_proj.weight"]', 'sd[p + "self_attn.k_proj.weight"]'),
            "no-qk-permutation",
        ),
        "load-converter-direction": (
            "load_hf_llama_state_dict",
            loader(
                'permute(sd[p + "self_attn.q_proj.weight"], cfg.n_heads)',
                'permute(sd[p + "self_attn.k_proj.weight"], cfg.n_kv_heads)',
                helper="""
    def permute(w, n):  # from the HF conversion script
        return w.view(n, hd // 2, 2, w.shape[1]).transpose(1, 2).reshape(n * hd, w.shape[1])
""",
            ),
            "qk-permutation-inverted",
        ),
        "load-k-as-query-heads": (
            "load_hf_llama_state_dict",
            loader(
                'permute(sd[p + "self_attn.q_proj.weight"])',
                'permute(sd[p + "self_attn.k_proj.weight"])',
                helper="""
    def permute(w):
        rows, dim = w.shape
        head = rows // cfg.n_heads
        return w.view(cfg.n_heads, 2, head // 2, dim).transpose(1, 2).reshape(rows, dim)
""",
            ),
            "k-permuted-with-query-heads",
        ),
        "load-gate-up-swapped": (
            "load_hf_llama_state_dict",
            loader(RIGHT_Q, RIGHT_K, w1="up_proj", w3="gate_proj", helper=PERMUTE_HELPER),
            "gate-up-swapped",
        ),
        "load-not-strict": (
            "load_hf_llama_state_dict",
            """
            def load_hf_llama_state_dict(model, state_dict):
                cfg = model.config
                head_dim = cfg.d_model // cfg.n_heads
                renames = [("model.embed_tokens", "embed"), ("model.norm", "norm"), ("model.layers", "layers"),
                           ("self_attn", "attn"), ("input_layernorm", "attn_norm"),
                           ("post_attention_layernorm", "mlp_norm"), ("gate_proj", "w1"), ("up_proj", "w3"),
                           ("down_proj", "w2")]
                ours = {}
                for name, tensor in state_dict.items():
                    for old, new in renames:
                        name = name.replace(old, new)
                    if name.endswith(("q_proj.weight", "k_proj.weight")):
                        heads = cfg.n_heads if "q_proj" in name else cfg.n_kv_heads
                        tensor = tensor.view(heads, 2, head_dim // 2, -1).transpose(1, 2).reshape(tensor.shape)
                    ours[name] = tensor
                model.load_state_dict(ours, strict=False)  # skip anything we do not have
                return model
            """,
            "tied-lm-head-not-loaded",
        ),
    }

    alternatives = {
        "frozen-sequential-categorical-indexing": {
            "lm_loss": """
                def lm_loss(logits, tokens):
                    # log-probabilities of the true next tokens, in float64, averaged by hand
                    log_probs = torch.log_softmax(logits[:, :-1].double(), dim=-1)
                    picked = log_probs.gather(-1, tokens[:, 1:, None]).squeeze(-1)
                    return -picked.sum() / picked.numel()
                """,
            "lr_at": """
                import numpy as np

                def lr_at(step, max_lr, warmup_steps, total_steps, min_lr=0.0):
                    if step >= warmup_steps:
                        frac = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
                        return float(min_lr + (max_lr - min_lr) * (np.cos(np.pi * frac) + 1) / 2)
                    return max_lr * (step + 1) / warmup_steps
                """,
            "ModelConfig": """
                from dataclasses import dataclass, field

                @dataclass(frozen=True)
                class ModelConfig:
                    vocab_size: int
                    d_model: int
                    n_layers: int
                    n_heads: int
                    n_kv_heads: int
                    d_hidden: int
                    norm_eps: float = field(default=1e-6)
                    rope_base: float = field(default=1e4)
                    max_seq_len: int = field(default=2 ** 11)

                    def __post_init__(self):
                        problems = []
                        if self.d_model % self.n_heads:
                            problems.append("d_model must be a multiple of n_heads")
                        elif (self.d_model // self.n_heads) % 2:
                            problems.append("the head size must be even")
                        if self.n_heads % self.n_kv_heads:
                            problems.append("n_heads must be a multiple of n_kv_heads")
                        if not self.max_seq_len >= 1:
                            problems.append("max_seq_len must be at least 1")
                        if problems:
                            raise ValueError("; ".join(problems))
                """,
            "Llama": """
                class Llama(nn.Module):
                    def __init__(self, config):
                        super().__init__()
                        self.config = config
                        self.embed = nn.Embedding(config.vocab_size, config.d_model)
                        self.layers = nn.Sequential(*[
                            TransformerBlock(d_model=config.d_model, n_heads=config.n_heads,
                                             n_kv_heads=config.n_kv_heads, d_hidden=config.d_hidden,
                                             norm_eps=config.norm_eps, rope_base=config.rope_base)
                            for _ in range(config.n_layers)])
                        self.norm = RMSNorm(config.d_model, eps=config.norm_eps)
                        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)

                    def forward(self, tokens):
                        return self.lm_head(self.norm(self.layers(self.embed(tokens))))
                """,
            "generate": """
                @torch.no_grad()
                def generate(model, tokens, max_new_tokens, temperature=1.0, top_k=None):
                    seq = tokens
                    window = model.config.max_seq_len
                    for _ in range(max_new_tokens):
                        start = max(0, seq.shape[1] - window)
                        last = model(seq[:, start:])[:, -1].double()
                        if temperature == 0:
                            choice = last.topk(1, dim=-1).indices
                        else:
                            probs = torch.softmax(last, dim=-1) ** (1.0 / temperature)
                            if top_k is not None:
                                kept, where = probs.topk(min(top_k, probs.shape[-1]), dim=-1)
                                pick = torch.distributions.Categorical(probs=kept).sample()
                                choice = where.gather(-1, pick[:, None])
                            else:
                                choice = torch.distributions.Categorical(probs=probs).sample()[:, None]
                        seq = torch.cat([seq, choice.to(seq.dtype)], dim=-1)
                    return seq
                """,
            "load_hf_llama_state_dict": """
                def load_hf_llama_state_dict(model, state_dict):
                    cfg = model.config
                    head_dim = cfg.d_model // cfg.n_heads
                    # row order within a head: 0, d/2, 1, d/2 + 1, ...
                    order = torch.arange(head_dim).view(2, head_dim // 2).t().reshape(-1)

                    def reorder(w, heads):
                        return w.view(heads, head_dim, -1)[:, order].reshape(heads * head_dim, -1)

                    sd = dict(state_dict)
                    sd.setdefault("lm_head.weight", sd["model.embed_tokens.weight"])
                    mine = {}
                    for name, tensor in sd.items():
                        if not (name.startswith("model.") or name == "lm_head.weight"):
                            continue
                        new = name.removeprefix("model.")
                        new = new.replace("embed_tokens", "embed").replace("self_attn", "attn")
                        new = new.replace("input_layernorm", "attn_norm").replace("post_attention_layernorm", "mlp_norm")
                        new = new.replace("gate_proj", "w1").replace("up_proj", "w3").replace("down_proj", "w2")
                        if new.endswith("q_proj.weight"):
                            tensor = reorder(tensor, cfg.n_heads)
                        elif new.endswith("k_proj.weight"):
                            tensor = reorder(tensor, cfg.n_kv_heads)
                        mine[new] = tensor
                    model.load_state_dict(mine, strict=True)
                    return model
                """,
        },
        "positional-where-scatter-copy": {
            "lm_loss": """
                def lm_loss(logits, tokens):
                    losses = [F.cross_entropy(logits[b, :-1], tokens[b, 1:]) for b in range(logits.shape[0])]
                    return torch.stack(losses).mean()   # every sequence has T - 1 predictions: the same mean
                """,
            "lr_at": """
                def lr_at(step, max_lr, warmup_steps, total_steps, min_lr=0.0):
                    step = torch.tensor(float(step))
                    warm = max_lr * (step + 1) / max(warmup_steps, 1)
                    progress = ((step - warmup_steps) / max(total_steps - warmup_steps, 1)).clamp(0.0, 1.0)
                    cosine = min_lr + (max_lr - min_lr) * 0.5 * (1 + torch.cos(torch.pi * progress))
                    return torch.where(step < warmup_steps, warm, cosine).item()
                """,
            "ModelConfig": """
                @dataclass
                class ModelConfig:
                    vocab_size: int
                    d_model: int
                    n_layers: int
                    n_heads: int
                    n_kv_heads: int
                    d_hidden: int
                    norm_eps: float = 0.000001
                    rope_base: float = 10_000.0
                    max_seq_len: int = 2048

                    def __post_init__(self):
                        if self.d_model % (2 * self.n_heads) != 0:
                            raise ValueError("d_model must split into n_heads heads of even size")
                        if self.n_heads % self.n_kv_heads != 0:
                            raise ValueError("n_heads must be a multiple of n_kv_heads")
                        if self.max_seq_len < 1:
                            raise ValueError("max_seq_len must be at least 1")
                """,
            "Llama": """
                class Llama(nn.Module):
                    def __init__(self, config):
                        super().__init__()
                        self.config = config
                        self.embed = nn.Embedding(config.vocab_size, config.d_model)
                        self.layers = nn.ModuleList()
                        for _ in range(config.n_layers):
                            self.layers.append(TransformerBlock(config.d_model, config.n_heads, config.n_kv_heads,
                                                                config.d_hidden, config.norm_eps, config.rope_base))
                        self.norm = RMSNorm(config.d_model, config.norm_eps)
                        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)

                    def forward(self, tokens):
                        B, T = tokens.shape
                        positions = torch.arange(T, device=tokens.device)
                        h = self.embed(tokens)
                        for i in range(len(self.layers)):
                            h = self.layers[i](h, positions)
                        h = self.norm(h)
                        return torch.einsum("btd,vd->btv", h, self.lm_head.weight)
                """,
            "generate": """
                def generate(model, tokens, max_new_tokens, temperature=1.0, top_k=None):
                    with torch.no_grad():
                        for step in range(max_new_tokens):
                            T = tokens.size(1)
                            context = tokens if T <= model.config.max_seq_len else tokens[:, T - model.config.max_seq_len:]
                            logits = model(context)[:, -1, :]
                            if temperature == 0:
                                new = logits.max(dim=-1).indices.unsqueeze(1)
                            else:
                                scaled = logits / temperature
                                if top_k:
                                    top = torch.topk(scaled, k=min(top_k, scaled.shape[-1]), dim=-1)
                                    scaled = torch.full_like(scaled, float("-inf")).scatter(-1, top.indices, top.values)
                                new = torch.multinomial(softmax(scaled), 1)
                            tokens = torch.cat([tokens, new], dim=1)
                    return tokens
                """,
            "load_hf_llama_state_dict": """
                import re

                def load_hf_llama_state_dict(model, state_dict):
                    cfg = model.config
                    hd = cfg.d_model // cfg.n_heads
                    names = {"self_attn.q_proj": "attn.q_proj", "self_attn.k_proj": "attn.k_proj",
                             "self_attn.v_proj": "attn.v_proj", "self_attn.o_proj": "attn.o_proj",
                             "input_layernorm": "attn_norm", "post_attention_layernorm": "mlp_norm",
                             "mlp.gate_proj": "mlp.w1", "mlp.up_proj": "mlp.w3", "mlp.down_proj": "mlp.w2"}
                    params = dict(model.named_parameters())
                    with torch.no_grad():
                        params["embed.weight"].copy_(state_dict["model.embed_tokens.weight"])
                        params["norm.weight"].copy_(state_dict["model.norm.weight"])
                        params["lm_head.weight"].copy_(
                            state_dict["lm_head.weight"] if "lm_head.weight" in state_dict
                            else state_dict["model.embed_tokens.weight"])
                        for name, w in state_dict.items():
                            m = re.fullmatch(r"model\\.layers\\.(\\d+)\\.(.+)\\.weight", name)
                            if not m:
                                continue
                            layer, part = m.groups()
                            if part in ("self_attn.q_proj", "self_attn.k_proj"):
                                n = cfg.n_heads if part.endswith("q_proj") else cfg.n_kv_heads
                                halves = w.reshape(n, 2, hd // 2, -1)
                                w = torch.stack([halves[:, 0], halves[:, 1]], dim=2).reshape(n * hd, -1)
                            params[f"layers.{layer}.{names[part]}.weight"].copy_(w)
                    return model
                """,
        },
    }

    wrong_answers = {
        "lm_loss": """
            def lm_loss(logits, tokens):
                return torch.tensor(1.0)
            """,
        "lr_at": """
            def lr_at(step, max_lr, warmup_steps, total_steps, min_lr=0.0):
                return max_lr
            """,
        "ModelConfig": """
            @dataclass
            class ModelConfig:
                vocab_size: int
                d_model: int
                n_layers: int
                n_heads: int
                n_kv_heads: int
                d_hidden: int
                norm_eps: float = 0.1
                rope_base: float = 1.0
            """,
        "Llama": LLAMA_INIT
        + """
    def forward(self, tokens):
        return torch.zeros(*tokens.shape, self.config.vocab_size)
""",
        "generate": """
            def generate(model, tokens, max_new_tokens, temperature=1.0, top_k=None):
                return torch.cat([tokens, torch.zeros(tokens.shape[0], max_new_tokens, dtype=tokens.dtype)], dim=1)
            """,
        "load_hf_llama_state_dict": """
            def load_hf_llama_state_dict(model, state_dict):
                return model
            """,
    }
