"""Cases that drive the learner's object through a script, for the exercises that need more than
one call: what each one does with the learner's code, and nothing that computes an answer.

The grader's catalogues (``autograder/exercises/``) make them with their seeded inputs; the
kernel runs them on the learner's code (``cases.observe``) and the grader runs the same script on
the reference, outside, to compare. Whatever reference object a script needs besides the
learner's (the cache of notebook 08's attention, the model a loader fills) is handed to it by
the grader: under ``./course grade`` a substitute answered outside (``proxies``).

- notebook 02: ``FutureChangeCase`` (do earlier outputs move when later tokens change?);
- notebook 07: ``ConfigCase``, ``SamplingCase`` (with the stand-in ``Bigram`` model), ``LoadCase``;
- notebook 08: ``CacheScript`` (``KVCache`` and ``RollingKVCache``), ``AttendScript``, ``ForwardScript``,
  ``LimitCase``;
- notebook 09: ``MergeCase`` (one call whose three results are named).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .cases import Case

# ---------------------------------------------------------------- notebook 02


@dataclass
class FutureChangeCase(Case):
    """Self-attention on a sequence, run twice: as given (``args[:3]`` = q, k, v)
    and with some tokens from position ``first`` on replaced (``args[3:]``).
    Returns how far the outputs before ``first`` moved: exactly 0 when no
    token sees the future."""

    first: int = 1

    def run(self, function):
        before = function(*self.args[:3], **self.kwargs)
        after = function(*self.args[3:], **self.kwargs)
        if not (isinstance(before, torch.Tensor) and isinstance(after, torch.Tensor)) or before.shape != after.shape:
            return before  # let the comparison say what is wrong with the output itself
        return after[..., : self.first, :] - before[..., : self.first, :]


# ---------------------------------------------------------------- notebook 07

MODEL_CONFIG_FIELDS = (
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
        return tuple(getattr(config, name) for name in MODEL_CONFIG_FIELDS)

    @property
    def item_names(self) -> tuple:
        return () if self.expect_error else tuple(f"field `{name}`" for name in MODEL_CONFIG_FIELDS)


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


@dataclass
class LoadCase(Case):
    """Load a Hugging Face-layout state dict into a fresh reference Llama; the result is its logits."""

    model_class: type = None  # the reference Llama (a dependency)
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


# ---------------------------------------------------------------- notebook 08


def _span(first, last) -> str:
    first, last = int(first), int(last)
    return f"position {first}" if first == last else f"positions {first} to {last}"


def _snapshot(returned) -> list:
    """What a cache returned, as it is now: a view of a buffer that later updates overwrite (a rolling
    buffer's slots) is right when it is returned, and is judged as it was then."""
    return [t.clone() if isinstance(t, torch.Tensor) else t for t in returned]


@dataclass
class CacheScript(Case):
    """Drive a fresh cache ``cls(*init_args)``: ("update", layer, k, v) returns (k, v); ("length",) reads
    cache.length; ("buffers", layer) reads the layer's storage, ``cache.keys[layer]`` and
    ``cache.values[layer]`` (the rolling buffer's slots, whose layout is part of its contract).

    A first cache is made and filled before the one the script uses, so a cache
    whose storage is shared between instances (a class-level dict) shows.
    """

    steps: tuple = ()
    init_args: tuple = ()

    def run(self, cls):
        decoy = cls(*self.init_args)
        decoy.update(0, torch.full((1, 1, 3, 2), 9.0), torch.full((1, 1, 3, 2), 9.0))
        cache = cls(*self.init_args)
        results = []
        for step in self.steps:
            if step[0] == "length":
                length = cache.length
                results.append(int(length) if isinstance(length, (int, float)) else length)
            elif step[0] == "buffers":
                keys, values = getattr(cache, "keys", None), getattr(cache, "values", None)
                if not (isinstance(keys, dict) and isinstance(values, dict)):
                    raise AttributeError(
                        "the buffers must be kept in `keys` and `values`, dicts from layer to (B, G, window, Dh)"
                    )
                results.extend(_snapshot((keys[step[1]], values[step[1]])))
            else:
                _, layer, k, v = step
                results.extend(_snapshot(cache.update(layer, k.clone(), v.clone())))
        return tuple(results)

    @property
    def item_names(self) -> tuple:
        """What each item of the result is, for a message that says which differs (``compare.close``)."""
        names, calls = [], 0
        for step in self.steps:
            if step[0] == "length":
                names.append(f"`length` after {calls} update calls" if calls else "`length` of the new cache")
            elif step[0] == "buffers":
                names += [f"`{kind}[{step[1]}]` (its slots) after {calls} update calls" for kind in ("keys", "values")]
            else:
                calls += 1
                positions = step[2].shape[2]
                where = f"(layer {step[1]}, {positions} new position{'s' if positions != 1 else ''})"
                names += [f"the {kind} update call {calls} returned {where}" for kind in ("keys", "values")]
        return tuple(names)


@dataclass
class AttendScript(Case):
    """Run attention steps on a fresh reference cache; the result is every output, then each layer's cached k and v.

    ``args`` = (layers, steps): the GroupedQueryAttention of each layer, and the
    steps as (layer, x, positions); ``cache_class`` the reference KVCache (a dependency).
    """

    cache_class: type = None

    def run(self, function):
        layers, steps = self.args
        cache = self.cache_class()
        outputs = []
        with torch.no_grad():
            for layer, x, positions in steps:
                outputs.append(function(layers[layer], x, positions, cache, layer))
        held = []
        keys, values = cache.keys, cache.values  # read once: under ./course grade the cache is held outside
        for layer in range(len(layers)):
            held.append(keys.get(layer, torch.zeros(0)))
            held.append(values.get(layer, torch.zeros(0)))
        return tuple(outputs + held)

    @property
    def item_names(self) -> tuple:
        layers, steps = self.args
        names = [
            f"the output of call {i} (layer {layer}, {_span(p[0], p[-1])})"
            for i, (layer, _, p) in enumerate(steps, start=1)
        ]
        for layer in range(len(layers)):
            names += [f"the {kind} cached for layer {layer} at the end" for kind in ("keys", "values")]
        return tuple(names)


@dataclass
class ForwardScript(Case):
    """Feed chunks of tokens to a fresh reference cache; the result is each chunk's logits and the final length."""

    cache_class: type = None

    def run(self, function):
        model, chunks = self.args
        cache = self.cache_class()
        outputs = [function(model, chunk, cache) for chunk in chunks]
        return tuple(outputs) + (int(cache.length),)

    @property
    def item_names(self) -> tuple:
        names, start = [], 0
        for i, chunk in enumerate(self.args[1], start=1):
            names.append(f"the logits of call {i} (the tokens at {_span(start, start + chunk.shape[1] - 1)})")
            start += chunk.shape[1]
        return (*names, "`cache.length` at the end")


@dataclass
class LimitCase(Case):
    """True when the call raises ValueError (a text longer than max_seq_len), False when it returns."""

    def run(self, function):
        try:
            function(*self.args, **self.kwargs)
        except ValueError:
            return True
        return False


# ---------------------------------------------------------------- notebook 09


@dataclass
class MergeCase(Case):
    """One call of a function that returns a partial softmax result (m, l, o): a plain call, whose
    three items a message names by what they are."""

    item_names: tuple = ("the running max m", "the running sum ℓ", "the partial output o")
