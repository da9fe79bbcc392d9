"""Notebook 07: ModelConfig, Llama, generate, load_hf_llama_state_dict, lm_loss, lr_at.

Tolerances:

* ``ModelConfig`` returns the numbers it was given: exact (1e-12).
* ``Llama`` is a whole model (embedding, blocks, norm, output layer): float32
  sums in a different order (einsum or matmul, float64 inside) move logits of
  order 1 by up to about 1e-6; 1e-4 absolute, as for whole models elsewhere,
  leaves room for that and still catches every catalogued mistake (they move
  logits by more than 0.1).
* ``generate`` returns token ids. Greedy outputs are compared exactly (ids
  differ by at least 1). Sampled outputs are compared as distributions: each
  case draws 8000 continuations under a fixed seed and compares the share of
  every token with the reference's. Two correct samplers that use the random
  numbers differently disagree by sampling noise only: a share's standard
  deviation is at most sqrt(0.25 / 8000) = 0.0056, the difference of two at
  most 0.008, so a tolerance of 0.04 is five standard deviations; every
  catalogued mistake moves some share by more than 0.1.
* ``load_hf_llama_state_dict`` is judged by the logits of the loaded model:
  the same 1e-4 as ``Llama``.
* ``lm_loss`` is one cross-entropy averaged over a few dozen positions: float32
  log-softmax and a mean in another order (or float64 throughout) move it by
  about 1e-7; 1e-5 absolute and relative, while the catalogued mistakes move it
  by more than 0.1 (a sum instead of a mean by a factor B (T - 1)).
* ``lr_at`` is a few operations on floats: 1e-9 absolute and 1e-6 relative.
  Python floats agree with any other order of the arithmetic to about 1e-16; a
  learner who computes in float32 tensors is off by about 1e-7 relative, and by
  up to 3e-8 absolute where the cosine nearly cancels (1 + cos close to 0)
  with a min_lr of 0.1, which the relative tolerance covers. Every catalogued
  mistake moves some rate by more than 1 % of max_lr (at least 1e-5 here).

The mistakes' mutants are built from the reference module, as the mistaken
code would behave; every case set makes each mutant differ from the reference
and from the other mutants (tests/test_llama_reference.py checks it).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .catalogue import Case, Exercise, Mistake, module_case

ASSIGNMENT = "07_llama"
FIELDS = (
    "vocab_size",
    "d_model",
    "n_layers",
    "n_heads",
    "n_kv_heads",
    "d_hidden",
    "norm_eps",
    "rope_base",
    "max_seq_len",
)


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ---------------------------------------------------------------- ModelConfig


@dataclass
class ConfigCase(Case):
    """Build a ModelConfig; the result is the tuple of its fields, or whether it refused."""

    expect_error: bool = False

    def run(self, cls):
        if self.expect_error:
            try:
                cls(*self.args, **self.kwargs)
            except Exception:
                return True
            return False
        config = cls(*self.args, **self.kwargs)
        return tuple(getattr(config, name) for name in FIELDS)

    @property
    def item_names(self) -> tuple:
        return () if self.expect_error else tuple(f"field `{name}`" for name in FIELDS)


def model_config_cases(ref):
    sizes = dict(vocab_size=59, d_model=96, n_layers=3, n_heads=4, n_kv_heads=2, d_hidden=256)
    yield ConfigCase(
        "ModelConfig(vocab_size=59, d_model=96, n_layers=3, n_heads=4, n_kv_heads=2, d_hidden=256) (the defaults)",
        kwargs=sizes,
    )
    yield ConfigCase(
        "every field by keyword, norm_eps=1e-5, rope_base=500000.0, max_seq_len=64",
        kwargs=dict(sizes, norm_eps=1e-5, rope_base=500000.0, max_seq_len=64),
    )
    yield ConfigCase(
        "positional arguments ModelConfig(32000, 4096, 32, 32, 8, 14336)", args=(32000, 4096, 32, 32, 8, 14336)
    )
    yield ConfigCase(
        "positional arguments with norm_eps, rope_base and max_seq_len", args=(100, 64, 2, 8, 1, 128, 1e-5, 500.0, 4096)
    )
    yield ConfigCase("max_seq_len=1: a context of one token is small but possible", kwargs=dict(sizes, max_seq_len=1))
    yield ConfigCase("a multi-query model (n_kv_heads=1)", kwargs=dict(sizes, n_kv_heads=1))
    yield ConfigCase(
        "d_model=30, n_heads=4: 30 does not split into 4 heads (must raise)",
        kwargs=dict(sizes, d_model=30, n_heads=4),
        expect_error=True,
    )
    yield ConfigCase(
        "d_model=12, n_heads=4: heads of size 3 cannot be rotated in pairs (must raise)",
        kwargs=dict(sizes, d_model=12, n_heads=4, n_kv_heads=2),
        expect_error=True,
    )
    yield ConfigCase(
        "n_heads=4, n_kv_heads=3: 4 query heads do not form groups of 3 (must raise)",
        kwargs=dict(sizes, n_heads=4, n_kv_heads=3),
        expect_error=True,
    )
    yield ConfigCase(
        "max_seq_len=0: a model that may read no token (must raise)",
        kwargs=dict(sizes, max_seq_len=0),
        expect_error=True,
    )


def _config_with(eps_default=1e-6, check_heads=True, check_groups=True, check_even=True, check_context=True):
    def mutant(ref):
        @dataclass
        class ModelConfig:
            vocab_size: int
            d_model: int
            n_layers: int
            n_heads: int
            n_kv_heads: int
            d_hidden: int
            norm_eps: float = eps_default
            rope_base: float = 10000.0
            max_seq_len: int = 2048

            def __post_init__(self):
                if check_heads and self.d_model % self.n_heads:
                    raise ValueError("heads")
                if check_even and check_heads and (self.d_model // self.n_heads) % 2:
                    raise ValueError("odd head size")
                if check_groups and self.n_heads % self.n_kv_heads:
                    raise ValueError("groups")
                if check_context and self.max_seq_len < 1:
                    raise ValueError("context")

        return ModelConfig

    return mutant


def _is_dataclass(learner, ref) -> str | None:
    if not (isinstance(learner, type) and dataclasses.is_dataclass(learner)):
        return "`ModelConfig` should be a class decorated with @dataclass (from dataclasses import dataclass)."
    return None


# More specific mistakes first: a learner is matched on the cases they fail only,
# and "nothing validated" also explains a learner who skips just the group check.
MODEL_CONFIG_MISTAKES = [
    Mistake(
        "config-eps-default",
        "the default norm_eps is 1e-5, not 1e-6",
        "LLaMA's RMSNorm (and the course's, and Hugging Face's LlamaConfig) default to eps=1e-6; "
        "some later models chose 1e-5 explicitly.",
        _config_with(eps_default=1e-5),
    ),
    Mistake(
        "config-groups-not-checked",
        "n_heads is not checked against n_kv_heads",
        "Grouped-query attention needs n_heads to be a multiple of n_kv_heads (query head h reads "
        "kv head h // (n_heads / n_kv_heads)): raise ValueError when n_heads % n_kv_heads != 0.",
        _config_with(check_groups=False),
    ),
    Mistake(
        "config-context-not-checked",
        "max_seq_len below 1 is accepted",
        "A model must read at least one token: raise ValueError when max_seq_len < 1.",
        _config_with(check_context=False),
    ),
    Mistake(
        "config-not-validated",
        "impossible sizes are accepted",
        "In __post_init__, raise ValueError when d_model % n_heads != 0, when d_model // n_heads is odd, "
        "when n_heads % n_kv_heads != 0, or when max_seq_len < 1.",
        _config_with(check_heads=False, check_groups=False, check_context=False),
    ),
]


# ---------------------------------------------------------------- Llama


def _config(ref, **sizes):
    return ref.ModelConfig(**sizes)


def llama_cases(ref):
    g = _generator(707)
    small = _config(ref, vocab_size=50, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_hidden=64)
    mqa = _config(
        ref, vocab_size=37, d_model=48, n_layers=3, n_heads=4, n_kv_heads=1, d_hidden=80, norm_eps=1e-5, rope_base=500.0
    )
    mha = _config(ref, vocab_size=23, d_model=16, n_layers=1, n_heads=2, n_kv_heads=2, d_hidden=40)
    yield module_case(
        "a 2-layer model (V=50, D=32, 4 heads, 2 kv heads), tokens (2, 7)",
        (torch.randint(0, 50, (2, 7), generator=g),),
        reference=ref.Llama,
        init_args=(small,),
        seed=1,
    )
    yield module_case(
        "a 3-layer multi-query model (V=37, D=48), tokens (3, 11)",
        (torch.randint(0, 37, (3, 11), generator=g),),
        reference=ref.Llama,
        init_args=(mqa,),
        seed=2,
    )
    yield module_case(
        "a 1-layer multi-head model (V=23, D=16), tokens (1, 5)",
        (torch.randint(0, 23, (1, 5), generator=g),),
        reference=ref.Llama,
        init_args=(mha,),
        seed=3,
    )
    yield module_case(
        "the 2-layer model on a single token per sequence, tokens (4, 1)",
        (torch.randint(0, 50, (4, 1), generator=g),),
        reference=ref.Llama,
        init_args=(small,),
        seed=4,
    )


def _llama_mutant(forward):
    def mutant(ref):
        class Llama(ref.Llama):
            pass

        Llama.forward = forward
        return Llama

    return mutant


def _no_final_norm(self, tokens):
    x = self.embed(tokens)
    for layer in self.layers:
        x = layer(x)
    return self.lm_head(x)


def _layers_not_chained(self, tokens):
    x = self.embed(tokens)
    out = x
    for layer in self.layers:
        out = layer(x)
    return self.lm_head(self.norm(out))


def _residual_twice(self, tokens):
    x = self.embed(tokens)
    for layer in self.layers:
        x = x + layer(x)
    return self.lm_head(self.norm(x))


def _softmax_output(self, tokens):
    x = self.embed(tokens)
    for layer in self.layers:
        x = layer(x)
    return F.softmax(self.lm_head(self.norm(x)), dim=-1)


def _scaled_embedding(self, tokens):
    x = self.embed(tokens) * math.sqrt(self.config.d_model)
    for layer in self.layers:
        x = layer(x)
    return self.lm_head(self.norm(x))


def _last_position_only(self, tokens):
    x = self.embed(tokens)
    for layer in self.layers:
        x = layer(x)
    return self.lm_head(self.norm(x))[:, -1, :]


def _build_learner_llama(learner, ref, seed=11):
    """The learner's Llama with the reference's random weights (a small GQA model)."""
    case = next(iter(llama_cases(ref)))
    case = module_case(case.label, case.args, reference=ref.Llama, init_args=case.init_args, seed=seed)
    return case.build(learner), case


def _layers_registered(learner, ref) -> str | None:
    try:
        model = learner(_config(ref, vocab_size=50, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_hidden=64))
    except Exception:
        return None  # diagnose() reports the error with the case it happened on
    layers = getattr(model, "layers", None)
    if isinstance(layers, (list, tuple)):
        return (
            "`Llama`: `self.layers` is a plain Python list, so nn.Module does not see the blocks: their "
            "weights are missing from parameters() (never trained) and state_dict() (never saved or loaded). "
            "Wrap them in nn.ModuleList(...)."
        )
    return None


def _causal(learner, ref) -> str | None:
    """Changing later tokens never changes earlier logits."""
    try:
        model, case = _build_learner_llama(learner, ref)
        tokens = torch.randint(0, 50, (2, 9), generator=_generator(77))
        edited = tokens.clone()
        edited[:, 5:] = (edited[:, 5:] + 7) % 50
        with torch.no_grad():
            before, after = model(tokens), model(edited)
    except Exception:
        return None  # diagnose() reports it
    if not isinstance(before, torch.Tensor) or before.dim() != 3 or before.shape[1] != 9:
        return None  # diagnose() reports the shape
    moved = (after[:, :5].double() - before[:, :5].double()).abs().amax(dim=(0, 2))
    if bool((moved > 1e-5).any()):
        first = int(torch.nonzero(moved > 1e-5)[0])
        return (
            f"`Llama` is not causal: changing tokens 5..8 changed the logits at position {first} "
            f"(by {float(moved[first]):.2g}). Position t may depend on tokens 0..t only: use the given "
            "TransformerBlock (causal) and nothing that mixes positions."
        )
    return None


LLAMA_MISTAKES = [
    Mistake(
        "final-norm-missing",
        "the final RMSNorm is not applied",
        "The blocks are pre-norm, so the stream leaving the last one is not normalised: "
        "return self.lm_head(self.norm(x)).",
        _llama_mutant(_no_final_norm),
    ),
    Mistake(
        "layers-not-chained",
        "each block reads the embeddings instead of the previous block's output",
        "Feed each block's output to the next: `for layer in self.layers: x = layer(x)`.",
        _llama_mutant(_layers_not_chained),
    ),
    Mistake(
        "residual-added-twice",
        "the residual connection is added a second time around each block",
        "TransformerBlock already returns x + attention + MLP: write `x = layer(x)`, not `x = x + layer(x)`.",
        _llama_mutant(_residual_twice),
    ),
    Mistake(
        "softmax-on-logits",
        "forward returns probabilities (a softmax) instead of logits",
        "Return the raw scores of lm_head: F.cross_entropy and generate apply the softmax themselves.",
        _llama_mutant(_softmax_output),
    ),
    Mistake(
        "embedding-scaled",
        "the embeddings are multiplied by √d_model",
        "That is the original transformer's habit (its embeddings were shared with sinusoids); LLaMA feeds "
        "self.embed(tokens) to the first block unscaled.",
        _llama_mutant(_scaled_embedding),
    ),
    Mistake(
        "last-position-only",
        "forward returns the logits of the last position only",
        "Training needs a prediction at every position: return (B, T, V); generate picks [:, -1].",
        _llama_mutant(_last_position_only),
    ),
]


# ---------------------------------------------------------------- generate


@dataclass
class BigramConfig:
    """What ``generate`` (and a sampling case) reads of a model's config: its vocabulary and the
    context it was trained for."""

    vocab_size: int
    max_seq_len: int = 16


class Bigram(torch.nn.Module):
    """A stand-in model whose next-token logits depend on the last token only."""

    def __init__(self, table: torch.Tensor, max_seq_len: int = 16):
        super().__init__()
        self.config = BigramConfig(table.shape[-1], max_seq_len)
        self.register_buffer("table", table)

    def forward(self, tokens):
        return self.table[tokens]  # (B, T, V)


def _bigram_table() -> torch.Tensor:
    # 8 tokens; from each token, a distribution with clear gaps between the
    # top few tokens (so temperature and top-k change shares by > 0.1), and a
    # different favourite for each previous token (so the second step depends
    # on the first sampled token).
    base = torch.tensor([2.2, 1.5, 1.0, 0.4, 0.0, -0.5, -1.0, -1.6])
    return torch.stack([base.roll(2 * i + 1) for i in range(8)])


@dataclass
class SamplingCase(Case):
    """Draw many continuations under a seed; the result is each new position's token shares (steps, V).
    Notebook 08's generate_cached is checked with it too."""

    seed: int = 0

    def run(self, function):
        model, prompt, steps = self.args[:3]
        with torch.random.fork_rng():
            torch.manual_seed(self.seed)
            out = function(*self.args, **self.kwargs)
        expected = (prompt.shape[0], prompt.shape[1] + steps)
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != expected:
            shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            raise ValueError(
                f"it returned {shape} for a prompt of shape {tuple(prompt.shape)} and "
                f"max_new_tokens={steps}; expected {expected}, the prompt followed by the new tokens"
            )
        vocab = model.config.vocab_size
        new = out[:, prompt.shape[1] :].long()
        return torch.stack(
            [torch.bincount(new[:, j], minlength=vocab)[:vocab].double() / new.shape[0] for j in range(steps)]
        )


def _greedy_model(ref, seed, max_seq_len=2048):
    case = module_case(
        "",
        reference=ref.Llama,
        seed=seed,
        init_args=(
            ref.ModelConfig(
                vocab_size=31, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_hidden=64, max_seq_len=max_seq_len
            ),
        ),
    )
    return case.build(ref.Llama)


def generate_cases(ref):
    g = _generator(808)
    model = _greedy_model(ref, seed=5)
    yield Case(
        "greedy (temperature=0) on a small Llama: prompt (2, 5), 6 new tokens",
        (model, torch.randint(0, 31, (2, 5), generator=g), 6),
        {"temperature": 0},
    )
    yield Case(
        "greedy on a small Llama: a one-token prompt (1, 1), 8 new tokens",
        (model, torch.randint(0, 31, (1, 1), generator=g), 8),
        {"temperature": 0.0},
    )
    yield Case(
        "greedy with top_k=5 (top-k changes nothing at temperature 0): prompt (3, 4), 4 new tokens",
        (model, torch.randint(0, 31, (3, 4), generator=g), 4),
        {"temperature": 0, "top_k": 5},
    )
    yield Case("max_new_tokens=0 returns the prompt", (model, torch.randint(0, 31, (2, 3), generator=g), 0))
    short = _greedy_model(ref, seed=6, max_seq_len=4)
    yield Case(
        "greedy on a Llama with max_seq_len=4: a prompt (2, 7) longer than its context, 5 new tokens",
        (short, torch.randint(0, 31, (2, 7), generator=g), 5),
        {"temperature": 0},
    )
    yield Case(
        "greedy on a Llama with max_seq_len=4: a prompt (2, 2) that grows past its context, 8 new tokens",
        (short, torch.randint(0, 31, (2, 2), generator=g), 8),
        {"temperature": 0},
    )
    bigram = Bigram(_bigram_table())
    prompt = torch.tensor([[3, 0]]).repeat(8000, 1)
    yield SamplingCase("8000 samples of 2 tokens at temperature 1 (shares of each token)", (bigram, prompt, 2), seed=1)
    yield SamplingCase("8000 samples of 2 tokens at temperature 0.5", (bigram, prompt, 2), {"temperature": 0.5}, seed=2)
    yield SamplingCase("8000 samples of 2 tokens at temperature 2", (bigram, prompt, 2), {"temperature": 2.0}, seed=3)
    yield SamplingCase("8000 samples of 1 token with top_k=3", (bigram, prompt, 1), {"top_k": 3}, seed=4)
    yield SamplingCase("8000 samples of 1 token with top_k=8 (all tokens)", (bigram, prompt, 1), {"top_k": 8}, seed=5)


def _sampler(logits_of, pick):
    """A generate built from two parts: which logits it reads, and how it picks from them."""

    @torch.no_grad()
    def generate(model, tokens, max_new_tokens, temperature=1.0, top_k=None):
        prompt = tokens
        for _ in range(max_new_tokens):
            logits = logits_of(model, tokens, prompt)
            if temperature == 0:
                next_token = logits.argmax(dim=-1, keepdim=True)
            else:
                next_token = pick(logits, temperature, top_k)
            tokens = torch.cat([tokens, next_token], dim=1)
        return tokens

    return generate


def _last_logits(model, tokens, prompt):
    return model(tokens[:, -model.config.max_seq_len :])[:, -1, :]


def _top_k_mask(logits, top_k):
    if top_k is None:
        return logits
    kth = torch.topk(logits, min(top_k, logits.shape[-1]), dim=-1).values[:, -1:]
    return logits.masked_fill(logits < kth, float("-inf"))


def _right_pick(logits, temperature, top_k):
    return torch.multinomial(F.softmax(_top_k_mask(logits / temperature, top_k), dim=-1), 1)


def _temperature_after_softmax(logits, temperature, top_k):
    probs = F.softmax(_top_k_mask(logits, top_k), dim=-1) / temperature
    return torch.multinomial(probs, 1)


def _temperature_multiplied(logits, temperature, top_k):
    return torch.multinomial(F.softmax(_top_k_mask(logits * temperature, top_k), dim=-1), 1)


def _top_k_sort_ascending(logits, temperature, top_k):
    logits = logits / temperature
    if top_k is not None:
        kth_smallest = torch.sort(logits, dim=-1).values[:, top_k - 1 : top_k]
        logits = logits.masked_fill(logits < kth_smallest, float("-inf"))
    return torch.multinomial(F.softmax(logits, dim=-1), 1)


def _top_k_threshold_at_largest(logits, temperature, top_k):
    logits = logits / temperature
    if top_k is not None:
        largest = torch.topk(logits, min(top_k, logits.shape[-1]), dim=-1).values[:, :1]
        logits = logits.masked_fill(logits < largest, float("-inf"))
    return torch.multinomial(F.softmax(logits, dim=-1), 1)


def _generate_mutant(logits_of=_last_logits, pick=_right_pick):
    return lambda ref: _sampler(logits_of, pick)


def _reproducible(learner, ref) -> str | None:
    """The same torch.manual_seed gives the same samples."""
    bigram = Bigram(_bigram_table())
    prompt = torch.tensor([[3, 0]]).repeat(64, 1)
    outputs = []
    try:
        for _ in range(2):
            with torch.random.fork_rng():
                torch.manual_seed(123)
                outputs.append(learner(bigram, prompt, 5))
        same = isinstance(outputs[0], torch.Tensor) and torch.equal(outputs[0], outputs[1])
    except Exception:
        return None  # diagnose() reports it
    if not same:
        return (
            "`generate` is not reproducible: two calls after the same torch.manual_seed(123) gave different "
            "tokens. Sample with torch (torch.multinomial), not with Python's random or NumPy."
        )
    return None


GENERATE_MISTAKES = [
    Mistake(
        "temperature-after-softmax",
        "the temperature is applied after the softmax",
        "Dividing probabilities by the temperature changes nothing once they are renormalised: divide the "
        "logits by the temperature, then take the softmax.",
        _generate_mutant(pick=_temperature_after_softmax),
    ),
    Mistake(
        "temperature-multiplied",
        "the logits are multiplied by the temperature instead of divided",
        "A temperature below 1 must sharpen the distribution: logits / temperature.",
        _generate_mutant(pick=_temperature_multiplied),
    ),
    Mistake(
        "top-k-sort-ascending",
        "top-k takes its threshold from an ascending sort",
        "torch.sort sorts in ascending order, so [:, k - 1] is the k-th smallest logit and almost every "
        "token survives. Use torch.topk(logits, k).values[:, -1:] (the k-th largest), or sort with "
        "descending=True.",
        _generate_mutant(pick=_top_k_sort_ascending),
    ),
    Mistake(
        "top-k-threshold-largest",
        "top-k compares with the largest logit, keeping only one token",
        "torch.topk sorts in descending order: the k-th largest value is values[:, -1:], not values[:, :1].",
        _generate_mutant(pick=_top_k_threshold_at_largest),
    ),
    Mistake(
        "last-token-only",
        "the model only sees the last token at each step",
        "Without a KV cache the model needs the sequence so far (its last max_seq_len tokens): "
        "call model(tokens[:, -model.config.max_seq_len:]) and take [:, -1].",
        _generate_mutant(logits_of=lambda model, tokens, prompt: model(tokens[:, -1:])[:, -1, :]),
    ),
    Mistake(
        "sequence-not-extended",
        "the model reads the prompt at every step, not the growing sequence",
        "Append each new token to the sequence the model reads next: tokens = torch.cat([tokens, next_token], dim=1).",
        _generate_mutant(
            logits_of=lambda model, tokens, prompt: model(prompt[:, -model.config.max_seq_len :])[:, -1, :]
        ),
    ),
    Mistake(
        "context-not-cropped",
        "feeds the whole sequence past max_seq_len",
        "The model was trained on at most max_seq_len tokens; beyond that it meets positions it never "
        "learned and its predictions fall apart. Feed the last max_seq_len tokens: "
        "model(tokens[:, -model.config.max_seq_len:]).",
        _generate_mutant(logits_of=lambda model, tokens, prompt: model(tokens)[:, -1, :]),
    ),
    Mistake(
        "context-keeps-first-tokens",
        "the context is the first max_seq_len tokens, not the last",
        "tokens[:, :max_seq_len] keeps the start of the text and never looks at what was just written: "
        "take the end, tokens[:, -model.config.max_seq_len:].",
        _generate_mutant(
            logits_of=lambda model, tokens, prompt: model(tokens[:, : model.config.max_seq_len])[:, -1, :]
        ),
    ),
]


# ---------------------------------------------------------------- load_hf_llama_state_dict


def to_half_split(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Neighbour-pair rows -> Hugging Face's half-split rows, per head (the converter's direction)."""
    rows, dim = w.shape
    head_dim = rows // n_heads
    return w.view(n_heads, head_dim // 2, 2, dim).transpose(1, 2).reshape(rows, dim)


def hf_state_dict(model, tied: bool = False) -> dict:
    """``model``'s weights (a reference Llama) written the way LlamaForCausalLM.save_pretrained writes them."""
    config = model.config
    ours = {name: value.detach().clone() for name, value in model.state_dict().items()}
    out = {"model.embed_tokens.weight": ours["embed.weight"], "model.norm.weight": ours["norm.weight"]}
    if not tied:
        out["lm_head.weight"] = ours["lm_head.weight"]
    for i in range(config.n_layers):
        hf, me = f"model.layers.{i}.", f"layers.{i}."
        out[hf + "input_layernorm.weight"] = ours[me + "attn_norm.weight"]
        out[hf + "post_attention_layernorm.weight"] = ours[me + "mlp_norm.weight"]
        out[hf + "self_attn.q_proj.weight"] = to_half_split(ours[me + "attn.q_proj.weight"], config.n_heads)
        out[hf + "self_attn.k_proj.weight"] = to_half_split(ours[me + "attn.k_proj.weight"], config.n_kv_heads)
        for name in ("v_proj", "o_proj"):
            out[hf + f"self_attn.{name}.weight"] = ours[me + f"attn.{name}.weight"]
        out[hf + "mlp.gate_proj.weight"] = ours[me + "mlp.w1.weight"]
        out[hf + "mlp.up_proj.weight"] = ours[me + "mlp.w3.weight"]
        out[hf + "mlp.down_proj.weight"] = ours[me + "mlp.w2.weight"]
    return out


@dataclass
class LoadCase(Case):
    """Load a Hugging Face-layout state dict into a fresh reference Llama; the result is its logits."""

    model_class: type = None  # the reference Llama (a dependency: it travels as its cell)
    config: object = None
    state_dict: dict = None
    tokens: torch.Tensor = None
    seed: int = 0

    def run(self, function):
        with torch.random.fork_rng():
            torch.manual_seed(self.seed)  # the same starting weights for every loader
            model = self.model_class(self.config)
        function(model, {name: value.clone() for name, value in self.state_dict.items()})
        model.eval()
        with torch.no_grad():
            return model(self.tokens)


def load_cases(ref):
    g = _generator(909)
    # head sizes of 16 and 8 (>= 8, so that the inverse permutation differs from the right one;
    # for head size 4 the two coincide), and n_heads / n_kv_heads such that a k permuted as if it
    # had n_heads heads still has a valid shape
    sizes = [
        (
            "a 2-layer GQA checkpoint (4 heads of 16, 2 kv heads) with its own lm_head",
            False,
            dict(vocab_size=61, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_hidden=96),
        ),
        (
            "a 1-layer multi-query checkpoint (4 heads of 16, 1 kv head) with tied embeddings (no lm_head.weight)",
            True,
            dict(vocab_size=45, d_model=64, n_layers=1, n_heads=4, n_kv_heads=1, d_hidden=80, norm_eps=1e-5),
        ),
        (
            "a 3-layer multi-head checkpoint (4 heads of 8) with rope_base 500",
            False,
            dict(vocab_size=29, d_model=32, n_layers=3, n_heads=4, n_kv_heads=4, d_hidden=48, rope_base=500.0),
        ),
    ]
    for index, (label, tied, config_sizes) in enumerate(sizes):
        config = ref.ModelConfig(**config_sizes)
        source = module_case("", reference=ref.Llama, init_args=(config,), seed=100 + index).build(ref.Llama)
        tokens = torch.randint(0, config.vocab_size, (2, 9), generator=g)
        yield LoadCase(
            label,
            model_class=ref.Llama,
            config=config,
            state_dict=hf_state_dict(source, tied),
            tokens=tokens,
            seed=200 + index,
        )


def _loader(q_rows=None, k_rows=None, gate="mlp.gate_proj", up="mlp.up_proj", tied_fallback=True, strict=True):
    """A loader built from its parts: how q and k rows are reordered, the MLP mapping, tied weights."""

    def load(model, state_dict):
        config = model.config
        head_dim = config.d_model // config.n_heads
        ours = {"embed.weight": state_dict["model.embed_tokens.weight"], "norm.weight": state_dict["model.norm.weight"]}
        if "lm_head.weight" in state_dict:
            ours["lm_head.weight"] = state_dict["lm_head.weight"]
        elif tied_fallback:
            ours["lm_head.weight"] = state_dict["model.embed_tokens.weight"]
        for i in range(config.n_layers):
            hf, me = f"model.layers.{i}.", f"layers.{i}."
            q = state_dict[hf + "self_attn.q_proj.weight"]
            k = state_dict[hf + "self_attn.k_proj.weight"]
            ours[me + "attn.q_proj.weight"] = q_rows(q, config, head_dim) if q_rows else q
            ours[me + "attn.k_proj.weight"] = k_rows(k, config, head_dim) if k_rows else k
            ours[me + "attn.v_proj.weight"] = state_dict[hf + "self_attn.v_proj.weight"]
            ours[me + "attn.o_proj.weight"] = state_dict[hf + "self_attn.o_proj.weight"]
            ours[me + "attn_norm.weight"] = state_dict[hf + "input_layernorm.weight"]
            ours[me + "mlp_norm.weight"] = state_dict[hf + "post_attention_layernorm.weight"]
            ours[me + "mlp.w1.weight"] = state_dict[hf + gate + ".weight"]
            ours[me + "mlp.w3.weight"] = state_dict[hf + up + ".weight"]
            ours[me + "mlp.w2.weight"] = state_dict[hf + "mlp.down_proj.weight"]
        model.load_state_dict(ours, strict=strict)
        return model

    return lambda ref: load


def _pairs(n_heads_of, head_dim_of=lambda w, config, head_dim: head_dim, inverse=False):
    def reorder(w, config, head_dim):
        n, d, dim = n_heads_of(config), head_dim_of(w, config, head_dim), w.shape[-1]
        if inverse:  # the converter's direction: neighbour pairs -> half-split
            return w.view(n, d // 2, 2, dim).transpose(1, 2).reshape(n * d, dim)
        return w.view(n, 2, d // 2, dim).transpose(1, 2).reshape(n * d, dim)

    return reorder


_Q = _pairs(lambda c: c.n_heads)
_K = _pairs(lambda c: c.n_kv_heads)

LOAD_MISTAKES = [
    Mistake(
        "no-qk-permutation",
        "q_proj and k_proj are copied without the RoPE permutation",
        "Hugging Face's rows are in half-split order; your apply_rope pairs neighbours. Within each head, "
        "row i of the first half and row i of the second half must become rows 2i and 2i + 1: reorder "
        "q_proj (n_heads heads) and k_proj (n_kv_heads heads) that way.",
        _loader(),
    ),
    Mistake(
        "qk-permutation-inverted",
        "the q/k rows are permuted in the converter's direction",
        "Your reordering turns neighbour pairs into half-split order (what the conversion to Hugging Face "
        "did); loading, you undo it: a head's rows 0..7 stored as half-split must come out as "
        "[0, 4, 1, 5, 2, 6, 3, 7] (pair i = rows i and i + head_dim / 2), not [0, 2, 4, 6, 1, 3, 5, 7].",
        _loader(q_rows=_pairs(lambda c: c.n_heads, inverse=True), k_rows=_pairs(lambda c: c.n_kv_heads, inverse=True)),
    ),
    Mistake(
        "k-permuted-with-query-heads",
        "k_proj is permuted as if it had n_heads heads",
        "Under grouped-query attention k_proj has n_kv_heads heads of size head_dim = d_model // n_heads: "
        "permute it with n_kv_heads, not n_heads.",
        _loader(q_rows=_Q, k_rows=_pairs(lambda c: c.n_heads, lambda w, c, d: w.shape[0] // c.n_heads)),
    ),
    Mistake(
        "gate-up-swapped",
        "gate_proj and up_proj are swapped",
        "gate_proj is the gate inside SiLU: it goes to mlp.w1; up_proj goes to mlp.w3 (the LLaMA MLP is "
        "w2(silu(w1 x) * w3 x)).",
        _loader(q_rows=_Q, k_rows=_K, gate="mlp.up_proj", up="mlp.gate_proj"),
    ),
    Mistake(
        "tied-lm-head-not-loaded",
        "with tied embeddings the output layer is left untrained",
        "When the checkpoint has no lm_head.weight, the output layer shares the embedding: load "
        "model.embed_tokens.weight into lm_head.weight too (and keep load_state_dict strict, so a "
        "missing weight fails loudly).",
        _loader(q_rows=_Q, k_rows=_K, tied_fallback=False, strict=False),
    ),
]


# ---------------------------------------------------------------- lm_loss


def lm_loss_cases(ref):
    g = _generator(1010)
    # V differs from T - 1 everywhere, so that a softmax over the wrong axis gives other numbers
    for B, T, V, dtype in [
        (2, 9, 11, torch.float32),
        (1, 2, 5, torch.float32),
        (4, 6, 30, torch.float32),
        (3, 17, 7, torch.float64),
    ]:
        logits = (2.0 * torch.randn(B, T, V, generator=g)).to(dtype)
        tokens = torch.randint(0, V, (B, T), generator=g)
        kind = "" if dtype == torch.float32 else " in float64"
        yield Case(f"logits ({B}, {T}, {V}){kind} and tokens ({B}, {T})", (logits, tokens))


def _cross_entropy(logits, targets, reduction="mean"):
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction=reduction)


def _loss_no_shift(ref):
    return lambda logits, tokens: _cross_entropy(logits, tokens)


def _loss_shifted_back(ref):
    return lambda logits, tokens: _cross_entropy(logits[:, 1:], tokens[:, :-1])


def _loss_wrong_axis(ref):
    def lm_loss(logits, tokens):
        log_probs = F.log_softmax(logits[:, :-1], dim=1)  # over positions instead of the vocabulary
        return -log_probs.gather(-1, tokens[:, 1:, None]).mean()

    return lm_loss


def _loss_summed(ref):
    return lambda logits, tokens: _cross_entropy(logits[:, :-1], tokens[:, 1:], reduction="sum")


LM_LOSS_MISTAKES = [
    Mistake(
        "loss-no-shift",
        "the logits at t are scored against token t itself",
        "Position t has read tokens 0..t, so predicting token t is copying: score logits[:, :-1] "
        "against tokens[:, 1:] (the next token at every position).",
        _loss_no_shift,
    ),
    Mistake(
        "loss-shift-wrong-way",
        "the targets are shifted the wrong way (logits at t predict token t - 1)",
        "Drop the last position's logits (nothing follows it) and the first token (nothing predicts it): "
        "logits[:, :-1] against tokens[:, 1:], not logits[:, 1:] against tokens[:, :-1].",
        _loss_shifted_back,
    ),
    Mistake(
        "loss-wrong-axis",
        "the softmax runs over the positions instead of the vocabulary",
        "Each position's V logits are one distribution over the next token: the softmax (or "
        "F.cross_entropy's class axis) is the last axis. F.cross_entropy wants (N, V) logits and (N,) "
        "targets: flatten(0, 1) both.",
        _loss_wrong_axis,
    ),
    Mistake(
        "loss-summed",
        "the losses are summed instead of averaged",
        "Average over every predicted position (and the batch), so the loss is in nats per token whatever "
        "B and T are: reduction='mean', F.cross_entropy's default.",
        _loss_summed,
    ),
]


# ---------------------------------------------------------------- lr_at

SCHEDULES = [  # (max_lr, warmup_steps, total_steps, min_lr)
    (1e-3, 10, 100, 0.0),
    (4e-3, 30, 250, 4e-4),
    (0.5, 4, 20, 0.05),
    (1.0, 0, 10, 0.1),  # no warm-up: the cosine starts at step 0
]


def lr_at_cases(ref):
    for max_lr, warmup, total, min_lr in SCHEDULES:
        steps = sorted(
            {0, 1, max(warmup - 1, 0), warmup, (warmup + total) // 2, total - 1, total, total + 3, 2 * total}
        )
        for step in steps:
            yield Case(
                f"lr_at({step}, max_lr={max_lr}, warmup_steps={warmup}, total_steps={total}, min_lr={min_lr})",
                (step, max_lr, warmup, total),
                {"min_lr": min_lr},
            )


def _schedule(warmup="after step", decay_from_warmup=True, decays=True, stops_at_end=True, floor=True):
    """An lr_at built from its parts, the way a mistaken one behaves."""

    def lr_at(step, max_lr, warmup_steps, total_steps, min_lr=0.0):
        low = min_lr if floor else 0.0
        if step < warmup_steps:
            return max_lr * ((step + 1) if warmup == "after step" else step) / warmup_steps
        if not decays:
            return max_lr
        if step >= total_steps and stops_at_end:
            return low
        start = warmup_steps if decay_from_warmup else 0
        progress = (step - start) / max(1, total_steps - start)
        return low + 0.5 * (max_lr - low) * (1 + math.cos(math.pi * progress))

    return lambda ref: lr_at


LR_AT_MISTAKES = [
    Mistake(
        "lr-warmup-off-by-one",
        "the warm-up starts at 0 (off by one)",
        "At step 0 the rate must already be max_lr / warmup_steps (a step at rate 0 is wasted), and the "
        "last warm-up step, warmup_steps - 1, reaches max_lr: max_lr * (step + 1) / warmup_steps.",
        _schedule(warmup="at step"),
    ),
    Mistake(
        "lr-no-decay",
        "the rate stays at max_lr after the warm-up",
        "After the warm-up the rate follows half a cosine from max_lr down to min_lr at total_steps.",
        _schedule(decays=False),
    ),
    Mistake(
        "lr-decay-past-end",
        "the cosine goes on past total_steps, so the rate rises again",
        "cos(pi * progress) climbs back once progress passes 1: from total_steps on, return min_lr.",
        _schedule(stops_at_end=False),
    ),
    Mistake(
        "lr-min-lr-ignored",
        "the rate decays to 0 instead of to min_lr",
        "The cosine runs between max_lr and min_lr: min_lr + 0.5 * (max_lr - min_lr) * (1 + cos(pi * progress)), "
        "and min_lr from total_steps on.",
        _schedule(floor=False),
    ),
    Mistake(
        "lr-decay-from-step-zero",
        "the cosine's progress is counted from step 0, not from the end of the warm-up",
        "The decay starts where the warm-up ends: progress = (step - warmup_steps) / (total_steps - warmup_steps), "
        "so the rate is exactly max_lr at step warmup_steps.",
        _schedule(decay_from_warmup=False),
    ),
]


EXERCISES = {
    "ModelConfig": Exercise(
        "ModelConfig",
        model_config_cases,
        atol=1e-12,
        rtol=0.0,
        mistakes=MODEL_CONFIG_MISTAKES,
        properties=(_is_dataclass,),
    ),
    "Llama": Exercise(
        "Llama",
        llama_cases,
        atol=1e-4,
        rtol=1e-4,
        depends_on=("ModelConfig", "TransformerBlock", "RMSNorm"),
        mistakes=LLAMA_MISTAKES,
        properties=(_layers_registered, _causal),
    ),
    "generate": Exercise(
        "generate",
        generate_cases,
        atol=0.04,
        rtol=0.0,
        depends_on=("softmax", "ModelConfig", "Llama"),
        mistakes=GENERATE_MISTAKES,
        properties=(_reproducible,),
    ),
    "load_hf_llama_state_dict": Exercise(
        "load_hf_llama_state_dict",
        load_cases,
        atol=1e-4,
        rtol=1e-4,
        depends_on=("ModelConfig", "Llama"),
        mistakes=LOAD_MISTAKES,
    ),
    "lm_loss": Exercise("lm_loss", lm_loss_cases, atol=1e-5, rtol=1e-5, mistakes=LM_LOSS_MISTAKES),
    "lr_at": Exercise("lr_at", lr_at_cases, atol=1e-9, rtol=1e-6, mistakes=LR_AT_MISTAKES),
}
