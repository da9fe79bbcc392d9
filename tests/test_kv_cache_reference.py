"""Notebook 08's reference against 07's model, and its catalogue against itself.

* The reference ``forward_cached``, fed a prompt and then one token at a time,
  gives the logits of one full forward pass; ``generate_cached`` gives
  ``generate``'s tokens, greedy and sampled under the same seed, and refuses a
  text longer than ``max_seq_len`` with a ValueError that names it.
* Every catalogued mistake's mutant differs from the reference on some case
  and from every other mutant of its exercise, and a learner who wrote exactly
  the mutant is told that mistake.
* A correct generate_cached that recomputes the sequence (07's generate) is
  told so by name, though its tokens are right.
* A message about a script's result (a tuple: what each call returned, what the
  cache holds) names the item that differs, never "item 9".
"""

import pytest
import torch

from autograder import reference
from autograder.compare import close
from autograder.exercises.kv_cache import EXERCISES
from autograder.local_judge import judge_function


@pytest.fixture(scope="module")
def ref():
    return reference.load("08_kv_cache")


def randomised(model, seed=0):
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            noise = torch.randn(p.shape, generator=generator)
            p.copy_(noise * p.shape[-1] ** -0.5 if p.dim() == 2 else 1 + 0.3 * noise)
    return model.eval()


def test_cached_forward_token_by_token_equals_one_full_forward(ref):
    model = randomised(ref.Llama(ref.ModelConfig(53, 48, 3, 6, 2, 96, rope_base=500.0)))
    tokens = torch.randint(0, 53, (2, 15), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = model(tokens)
    cache = ref.KVCache()
    pieces = [ref.forward_cached(model, tokens[:, :4], cache)]
    pieces += [ref.forward_cached(model, tokens[:, t : t + 1], cache) for t in range(4, 12)]
    pieces.append(ref.forward_cached(model, tokens[:, 12:], cache))
    assert cache.length == 15
    assert float((torch.cat(pieces, dim=1) - full).abs().max()) < 1e-5
    # the cache keeps G = 2 heads per layer, as kv_cache_bytes counts them
    assert [tuple(cache.keys[i].shape) for i in range(3)] == [(2, 2, 15, 8)] * 3
    held = sum(t.numel() * t.element_size() for store in (cache.keys, cache.values) for t in store.values())
    assert held == ref.kv_cache_bytes(3, 2, 8, 15, batch_size=2, bytes_per_value=4)


def test_cached_generation_gives_generates_tokens(ref):
    model = randomised(ref.Llama(ref.ModelConfig(41, 32, 2, 4, 1, 64, max_seq_len=40)), seed=2)
    prompt = torch.randint(0, 41, (3, 6), generator=torch.Generator().manual_seed(3))
    assert torch.equal(
        ref.generate_cached(model, prompt, 34, temperature=0), ref.generate(model, prompt, 34, temperature=0)
    )
    runs = []
    for generate in (ref.generate, ref.generate_cached):
        torch.manual_seed(11)
        runs.append(generate(model, prompt, 20, temperature=0.9, top_k=8))
    assert torch.equal(runs[0], runs[1])
    with pytest.raises(ValueError, match="max_seq_len=40"):
        ref.generate_cached(model, prompt, 35)


def test_rolling_cache_is_sliding_window_attention_in_every_layer(ref):
    """Through the reference RollingKVCache, forward_cached computes sliding-window attention: every layer attends to
    the last W positions of its own input. Checked against one full pass with torch's scaled_dot_product_attention
    and a band mask in every layer; the buffers stay W slots long."""
    W = 6
    model = randomised(ref.Llama(ref.ModelConfig(37, 32, 3, 4, 2, 64, max_seq_len=W)), seed=5)
    tokens = torch.randint(0, 37, (2, 20), generator=torch.Generator().manual_seed(6))
    cache = ref.RollingKVCache(W)
    pieces = [ref.forward_cached(model, tokens[:, :4], cache)]
    pieces += [ref.forward_cached(model, tokens[:, t : t + 1], cache) for t in range(4, 20)]
    T = tokens.shape[1]
    query, key = torch.arange(T)[:, None], torch.arange(T)[None, :]
    band = (key <= query) & (key > query - W)
    with torch.no_grad():
        x = model.embed(tokens)
        for block in model.layers:
            attn, h = block.attn, block.attn_norm(x)
            B, Dh = h.shape[0], attn.head_dim
            q = ref.apply_rope(attn.q_proj(h).view(B, T, attn.n_heads, Dh).transpose(1, 2), torch.arange(T))
            k = ref.apply_rope(attn.k_proj(h).view(B, T, attn.n_kv_heads, Dh).transpose(1, 2), torch.arange(T))
            v = attn.v_proj(h).view(B, T, attn.n_kv_heads, Dh).transpose(1, 2)
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=band, enable_gqa=True)
            x = x + attn.o_proj(out.transpose(1, 2).reshape(B, T, -1))
            x = x + block.mlp(block.mlp_norm(x))
        sliding_window = model.lm_head(model.norm(x))
    assert float((torch.cat(pieces, dim=1) - sliding_window).abs().max()) < 1e-5
    assert cache.length == T and [tuple(cache.keys[i].shape) for i in range(3)] == [(2, 2, W, 8)] * 3


@pytest.mark.parametrize("name", list(EXERCISES))
def test_each_mutant_is_recognised_and_distinct(ref, name):
    exercise = EXERCISES[name]
    cases = list(exercise.cases(ref))
    expected = [case.run(getattr(ref, name)) for case in cases]
    outputs = {}
    for mistake in exercise.mistakes:
        mutant = mistake.mutant(ref)
        results = [case.run(mutant) for case in cases]
        assert any(close(r, e, exercise.atol, exercise.rtol) for r, e in zip(results, expected)), mistake.id
        message = judge_function(exercise, mutant, ref, cases)
        assert message and f"[mistake:{mistake.id}]" in message, (mistake.id, message)
        outputs[mistake.id] = results
    ids = list(outputs)
    for a in range(len(ids)):
        for b in range(a + 1, len(ids)):
            assert any(close(x, y, exercise.atol, exercise.rtol) for x, y in zip(outputs[ids[a]], outputs[ids[b]])), (
                ids[a],
                ids[b],
            )


def test_recomputing_the_sequence_is_named_though_its_tokens_are_right(ref):
    def calls_generate(model, tokens, max_new_tokens, temperature=1.0, top_k=None):
        return ref.generate(model, tokens, max_new_tokens, temperature, top_k)

    assert "[mistake:recomputes-sequence]" in judge_function(EXERCISES["generate_cached"], calls_generate, ref)
    assert judge_function(EXERCISES["generate_cached"], ref.generate_cached, ref) is None


class ValuesDoubledLate:
    """A KVCache right until a layer holds more than 6 positions; then the values it returns are doubled."""

    def __init__(self, base):
        self.cache = base()

    def update(self, layer, k, v):
        k, v = self.cache.update(layer, k, v)
        return k, v * (1 + (k.shape[2] > 6))

    @property
    def length(self):
        return self.cache.length


def test_a_message_names_the_item_of_a_script_result_that_differs(ref):
    for name, exercise in EXERCISES.items():
        for case in exercise.cases(ref):
            result = case.run(getattr(ref, name))
            if isinstance(result, tuple):
                names = case.item_names
                assert len(names) == len(result) and len(set(names)) == len(names), (name, case.label)

    def kv_cache():
        return ValuesDoubledLate(ref.KVCache)

    message = judge_function(EXERCISES["KVCache"], kv_cache, ref)
    assert "the values update call 5 returned (layer 0, 1 new position): largest difference" in message
    assert "item" not in message

    def offset_after_six(attn, x, positions, cache, layer):
        return ref.attend_with_cache(attn, x, positions, cache, layer) * (1 + 0.1 * (positions[0] >= 6))

    message = judge_function(EXERCISES["attend_with_cache"], offset_after_six, ref)
    assert "the output of call 5 (layer 0, position 6): largest difference 0.1" in message

    def length_off(model, tokens, cache):
        return ref.forward_cached(model, tokens, cache) + (cache.length > 7)

    message = judge_function(EXERCISES["forward_cached"], length_off, ref)
    assert "the logits of call 4 (the tokens at position 7)" in message
