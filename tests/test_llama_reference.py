"""Notebook 07's reference against the real library, and its catalogue against itself.

* The reference ``load_hf_llama_state_dict`` loads what Hugging Face's
  ``LlamaForCausalLM.save_pretrained`` writes (random weights: HF's own
  initialisation is too small to tell models apart), and the logits agree
  within 1e-4; without the q/k permutation they differ by more than 0.1.
* The reference ``Llama`` is causal; ``generate`` is reproducible under a seed.
* Every catalogued mistake's mutant differs from the reference on some case
  and from every other mutant of its exercise, and a learner who wrote exactly
  the mutant is told that mistake.
* A config that differs in one field is told which field (not "item 8").
* Importing ``torch._dynamo`` (transformers does) is not taken for tampering.
* The notebook's optional hub cell: given a checkpoint folder in the hub's
  layout it loads it into the learner's model, matches transformers and
  writes; offline, while graded, or when the download fails it says so and skips.
"""

import ast
import dataclasses
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

from autograder import reference
from autograder.compare import close
from autograder.exercises.llama import EXERCISES, hf_state_dict
from autograder.local_judge import judge_function

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
    dict(
        vocab_size=97,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        tie_word_embeddings=False,
    ),
    dict(
        vocab_size=50,
        hidden_size=96,
        intermediate_size=128,
        num_hidden_layers=3,
        num_attention_heads=6,
        num_key_value_heads=1,
        rms_norm_eps=1e-5,
        rope_theta=500000.0,
        tie_word_embeddings=True,
    ),
    dict(
        vocab_size=40,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        rms_norm_eps=1e-6,
        rope_theta=500.0,
        tie_word_embeddings=False,
    ),
]


def hf_pair(ref, sizes, seed):
    sizes = dict(sizes)
    theta = sizes.pop("rope_theta")
    config = transformers.LlamaConfig(**sizes, rope_parameters={"rope_type": "default", "rope_theta": theta})
    hf = randomised(transformers.LlamaForCausalLM(config).eval(), seed)
    state = saved_and_read_back(hf)
    ours = ref.Llama(
        ref.ModelConfig(
            config.vocab_size,
            config.hidden_size,
            config.num_hidden_layers,
            config.num_attention_heads,
            config.num_key_value_heads,
            config.intermediate_size,
            config.rms_norm_eps,
            theta,
        )
    ).eval()
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


def test_a_config_that_differs_in_one_field_is_told_which(ref):
    @dataclasses.dataclass
    class ModelConfig(ref.ModelConfig):
        def __post_init__(self):
            super().__post_init__()
            self.rope_base = 1.0  # the field a learner overwrote

    message = judge_function(EXERCISES["ModelConfig"], ModelConfig, ref)
    assert "field `rope_base`: returned 1, expected 10000" in message and "item" not in message


def test_importing_torch_dynamo_is_not_tampering():
    code = (
        "import course_checks.trusted as t, torch\n"
        "import torch._dynamo\n"
        "assert t.replaced() == [], t.replaced()\n"
        "torch.manual_seed = lambda seed: None\n"
        "assert t.replaced() == ['torch.manual_seed'], t.replaced()\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# ---------------------------------------------------------------- the optional hub cell

NOTEBOOK = Path(__file__).resolve().parent.parent / "solutions" / "07_llama" / "07_llama.ipynb"


def notebook_cell(marker: str) -> str:
    """The source of the solution notebook's code cell that contains ``marker``."""
    cells = json.loads(NOTEBOOK.read_text())["cells"]
    found = [src for src in ("".join(c["source"]) for c in cells if c["cell_type"] == "code") if marker in src]
    assert len(found) == 1, marker
    return found[0]


def definitions(source: str):
    """A cell's imports and function definitions, without its other statements."""
    tree = ast.parse(source)
    tree.body = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom, ast.FunctionDef))]
    return compile(tree, "<notebook cell>", "exec")


@pytest.fixture
def hub_namespace(ref):
    """What the hub cell finds in the notebook: the answers, config_from_hf, the imports."""
    namespace = {name: getattr(ref, name) for name in ("ModelConfig", "Llama", "generate", "load_hf_llama_state_dict")}
    namespace.update(torch=torch, os=os, tempfile=tempfile, grading_now=lambda: False)
    exec(compile(notebook_cell("def config_from_hf"), "<notebook cell>", "exec"), namespace)  # imports transformers
    return namespace


HUB_CELL = "def run_published_checkpoint"


def test_hub_cell_loads_a_checkpoint_in_the_hubs_layout(hub_namespace, tmp_path, capsys):
    """What the cell does online, from a folder instead of the hub: a tied LLaMA with
    LLaMA's vocabulary and random weights, no tokenizer (so token ids are shown)."""
    exec(definitions(notebook_cell(HUB_CELL)), hub_namespace)
    config = transformers.LlamaConfig(
        vocab_size=32000,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )
    randomised(transformers.LlamaForCausalLM(config), seed=3).save_pretrained(tmp_path)
    hub_namespace["run_published_checkpoint"](str(tmp_path))
    out = capsys.readouterr().out
    assert "(no tokenizer" in out
    difference = float(re.search(r"largest logit difference from transformers (\S+)", out).group(1))
    assert difference < 1e-4
    ids = ast.literal_eval(out.strip().splitlines()[-1])
    assert ids[:5] == [1, 9038, 2501, 263, 931] and len(ids) == 5 + 60


class Unreachable:
    @staticmethod
    def from_pretrained(*args, **kwargs):
        raise OSError("huggingface.co: no route to host")


@pytest.mark.parametrize("situation", ["graded", "no transformers", "offline", "download fails"])
def test_hub_cell_skips_with_a_reason_and_never_fails(hub_namespace, monkeypatch, capsys, situation):
    import socket

    if situation == "graded":
        hub_namespace["grading_now"] = lambda: True
    if situation == "no transformers":
        hub_namespace["LlamaForCausalLM"] = None  # what the import cell leaves when the import fails
    if situation == "offline":

        def no_network(*args, **kwargs):
            raise OSError("Name or service not known")

        monkeypatch.setattr(socket, "create_connection", no_network)
    if situation == "download fails":
        monkeypatch.setattr(socket, "create_connection", lambda *args, **kwargs: socket.socket())
        hub_namespace["LlamaForCausalLM"] = Unreachable
    exec(compile(notebook_cell(HUB_CELL), "<notebook cell>", "exec"), hub_namespace)
    out = capsys.readouterr().out
    expected = {
        "graded": "skipped while the notebook is graded",
        "no transformers": "skipped: Hugging Face transformers is not installed",
        "offline": "skipped: the Hugging Face hub is not reachable",
        "download fails": "skipped: could not load the checkpoint (OSError",
    }[situation]
    assert out.startswith(expected)
