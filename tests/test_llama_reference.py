"""Notebook 07's reference against the real library, and its catalogue against itself.

* The reference ``load_hf_llama_state_dict`` loads what Hugging Face's
  ``LlamaForCausalLM.save_pretrained`` writes (random weights: HF's own
  initialisation is too small to tell models apart), and the logits agree
  within 1e-4; without the q/k permutation they differ by more than 0.1.
* The reference ``Llama`` is causal; ``generate`` is reproducible under a seed.
* Every catalogued mistake's mutant differs from the reference on some case
  and from every other mutant of its exercise, and a learner who wrote exactly
  the mutant is told that mistake.
* Importing ``torch._dynamo`` (transformers does) is not taken for tampering.
"""
import os
import subprocess
import sys
import tempfile

import pytest
import torch

from autograder import reference
from autograder.checks import close, diagnose
from autograder.exercises.llama import EXERCISES, hf_state_dict

transformers = pytest.importorskip("transformers")
from safetensors.torch import load_file  # noqa: E402  (comes with transformers)


@pytest.fixture(scope="module")
def ref():
    return reference.load("07_llama")


def randomised(model, seed=0):
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            noise = torch.randn(p.shape, generator=generator)
            p.copy_(noise * p.shape[-1] ** -0.5 if p.dim() == 2 else 1 + 0.3 * noise)
    return model


def saved_and_read_back(hf_model):
    with tempfile.TemporaryDirectory() as folder:
        hf_model.save_pretrained(folder)
        return load_file(os.path.join(folder, "model.safetensors"))


HF_SIZES = [
    dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
         num_key_value_heads=2, rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=False),
    dict(vocab_size=50, hidden_size=96, intermediate_size=128, num_hidden_layers=3, num_attention_heads=6,
         num_key_value_heads=1, rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=True),
    dict(vocab_size=40, hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=2,
         num_key_value_heads=2, rms_norm_eps=1e-6, rope_theta=500.0, tie_word_embeddings=False),
]


def hf_pair(ref, sizes, seed):
    sizes = dict(sizes)
    theta = sizes.pop("rope_theta")
    config = transformers.LlamaConfig(**sizes, rope_parameters={"rope_type": "default", "rope_theta": theta})
    hf = randomised(transformers.LlamaForCausalLM(config).eval(), seed)
    state = saved_and_read_back(hf)
    ours = ref.Llama(ref.ModelConfig(config.vocab_size, config.hidden_size, config.num_hidden_layers,
                                     config.num_attention_heads, config.num_key_value_heads,
                                     config.intermediate_size, config.rms_norm_eps, theta)).eval()
    return hf, state, ours


@pytest.mark.parametrize("index", range(len(HF_SIZES)))
def test_reference_loader_matches_hugging_face(ref, index):
    hf, state, ours = hf_pair(ref, HF_SIZES[index], seed=index)
    assert ("lm_head.weight" in state) == (not HF_SIZES[index]["tie_word_embeddings"])
    ref.load_hf_llama_state_dict(ours, state)
    tokens = torch.randint(0, HF_SIZES[index]["vocab_size"], (2, 13), generator=torch.Generator().manual_seed(index))
    with torch.no_grad():
        expected = hf(tokens).logits
        assert float((ours(tokens) - expected).abs().max()) < 1e-4
        # the same weights without the q/k permutation do not match
        for i, layer in enumerate(ours.layers):
            layer.attn.q_proj.weight.copy_(state[f"model.layers.{i}.self_attn.q_proj.weight"])
            layer.attn.k_proj.weight.copy_(state[f"model.layers.{i}.self_attn.k_proj.weight"])
        assert float((ours(tokens) - expected).abs().max()) > 0.1


def test_hidden_checks_write_checkpoints_the_way_hugging_face_does(ref):
    """The grader's synthetic checkpoints (hf_state_dict) have HF's names, shapes and row order."""
    hf, state, ours = hf_pair(ref, HF_SIZES[0], seed=5)
    ref.load_hf_llama_state_dict(ours, state)
    rewritten = hf_state_dict(ours)
    assert set(rewritten) == set(state)
    for name, tensor in state.items():
        assert torch.equal(rewritten[name], tensor), name


def test_reference_llama_is_causal(ref):
    torch.manual_seed(0)
    model = randomised(ref.Llama(ref.ModelConfig(50, 32, 2, 4, 2, 64)).eval())
    tokens = torch.randint(0, 50, (3, 12))
    for cut in range(1, 12):
        edited = tokens.clone()
        edited[:, cut:] = torch.randint(0, 50, (3, 12 - cut))
        with torch.no_grad():
            assert torch.equal(model(edited)[:, :cut], model(tokens)[:, :cut])


def test_reference_generate_is_reproducible_and_greedy_at_temperature_zero(ref):
    torch.manual_seed(0)
    model = randomised(ref.Llama(ref.ModelConfig(30, 32, 1, 4, 2, 64)).eval())
    prompt = torch.randint(0, 30, (2, 3))
    runs = []
    for _ in range(2):
        torch.manual_seed(9)
        runs.append(ref.generate(model, prompt, 10, temperature=0.9, top_k=5))
    assert torch.equal(runs[0], runs[1]) and runs[0].shape == (2, 13)
    greedy = ref.generate(model, prompt, 5, temperature=0)
    sequence = prompt
    for _ in range(5):
        with torch.no_grad():
            sequence = torch.cat([sequence, model(sequence)[:, -1:].argmax(-1)], dim=1)
    assert torch.equal(greedy, sequence)


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
        message = diagnose(exercise, mutant, getattr(ref, name), ref, cases)
        assert message and f"[mistake:{mistake.id}]" in message, (mistake.id, message)
        outputs[mistake.id] = results
    ids = list(outputs)
    for a in range(len(ids)):
        for b in range(a + 1, len(ids)):
            assert any(close(x, y, exercise.atol, exercise.rtol) for x, y in zip(outputs[ids[a]], outputs[ids[b]])), \
                (ids[a], ids[b])


def test_importing_torch_dynamo_is_not_tampering():
    code = (
        "import autograder.trusted as t, torch\n"
        "import torch._dynamo\n"
        "assert t.replaced() == [], t.replaced()\n"
        "torch.manual_seed = lambda seed: None\n"
        "assert t.replaced() == ['torch.manual_seed'], t.replaced()\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
