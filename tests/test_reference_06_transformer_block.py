"""Notebook 06's reference answers agree with Hugging Face `transformers` (pinned in requirements/student.in).

RMSNorm against LlamaRMSNorm, SwiGLU against LlamaMLP, TransformerBlock against
LlamaDecoderLayer: tiny LlamaConfigs with random weights, because the default
initialisation (small matrices, norm gains exactly 1) would hide mistakes.
The block comparison needs three of Hugging Face's conventions handled:
q/k rows permuted from half-split to neighbour-pair RoPE order, an explicit
causal additive mask (the layer alone is not causal), and the rotation's
cos/sin from LlamaRotaryEmbedding.

Tolerance 1e-5: float32 end to end, the two implementations differ only in the
order of a few sums; they agree to about 1e-6.
"""

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from autograder import reference

REPOSITORY = Path(__file__).resolve().parent.parent
TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def ref():
    return reference.load("06_transformer_block")


@pytest.fixture(scope="module")
def llama():
    """transformers' LLaMA module, imported only when these tests run (it takes seconds, and
    it imports torch._dynamo, which rewraps torch.manual_seed for the whole process)."""
    return pytest.importorskip("transformers.models.llama.modeling_llama")


def tiny_config(llama, hidden=64, heads=4, kv_heads=2, intermediate=160, eps=1e-6, rope_theta=10000.0):
    config = llama.LlamaConfig(
        hidden_size=hidden,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        intermediate_size=intermediate,
        rms_norm_eps=eps,
        num_hidden_layers=1,
        vocab_size=100,
        rope_parameters={"rope_type": "default", "rope_theta": rope_theta},
    )
    config._attn_implementation = "eager"
    return config


def randomise(module, seed):
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in module.parameters():
            if parameter.dim() >= 2:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * parameter.shape[-1] ** -0.5)
            else:
                parameter.copy_(1.0 + 0.3 * torch.randn(parameter.shape, generator=generator))
    return module.eval()


def half_split_to_neighbours(weight, n_heads):
    """Per head, Hugging Face's row i and row i + d/2 become our rows 2i and 2i + 1."""
    rows, columns = weight.shape
    head_dim = rows // n_heads
    order = torch.arange(rows).view(n_heads, 2, head_dim // 2).transpose(1, 2).reshape(rows)
    return weight[order]


def block_state_from(layer, config):
    hf = layer.state_dict()
    return {
        "attn_norm.weight": hf["input_layernorm.weight"],
        "attn.q_proj.weight": half_split_to_neighbours(hf["self_attn.q_proj.weight"], config.num_attention_heads),
        "attn.k_proj.weight": half_split_to_neighbours(hf["self_attn.k_proj.weight"], config.num_key_value_heads),
        "attn.v_proj.weight": hf["self_attn.v_proj.weight"],
        "attn.o_proj.weight": hf["self_attn.o_proj.weight"],
        "mlp_norm.weight": hf["post_attention_layernorm.weight"],
        "mlp.w1.weight": hf["mlp.gate_proj.weight"],
        "mlp.w3.weight": hf["mlp.up_proj.weight"],
        "mlp.w2.weight": hf["mlp.down_proj.weight"],
    }


def hugging_face_block(llama, layer, config, x, positions, causal=True):
    """The layer on x (B, T, D) at positions (T,), with a causal additive mask unless told otherwise."""
    T = x.shape[1]
    position_ids = positions[None].expand(x.shape[0], T)
    cos, sin = llama.LlamaRotaryEmbedding(config)(x, position_ids)
    mask = None
    if causal:
        mask = torch.triu(torch.full((T, T), float("-inf")), diagonal=1)[None, None]
    out = layer(x, attention_mask=mask, position_ids=position_ids, position_embeddings=(cos, sin))
    return out[0] if isinstance(out, tuple) else out


def test_rmsnorm_matches_llama_rmsnorm(ref, llama):
    for eps, scale in ((1e-6, 1.0), (1e-6, 1e-3), (1e-2, 0.1)):
        theirs = randomise(llama.LlamaRMSNorm(24, eps=eps), seed=1)
        ours = ref.RMSNorm(24, eps=eps)
        ours.load_state_dict({"weight": theirs.weight.detach()})
        x = torch.randn(3, 5, 24, generator=torch.Generator().manual_seed(2)) * scale
        with torch.no_grad():
            assert (ours(x) - theirs(x)).abs().max() < TOLERANCE, (eps, scale)


def test_swiglu_matches_llama_mlp(ref, llama):
    config = tiny_config(llama, hidden=32, intermediate=88)
    theirs = randomise(llama.LlamaMLP(config), seed=3)
    ours = ref.SwiGLU(32, 88)
    ours.load_state_dict(
        {
            "w1.weight": theirs.gate_proj.weight.detach(),
            "w3.weight": theirs.up_proj.weight.detach(),
            "w2.weight": theirs.down_proj.weight.detach(),
        }
    )
    x = torch.randn(2, 7, 32, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        assert (ours(x) - theirs(x)).abs().max() < TOLERANCE


@pytest.mark.parametrize(
    "heads, kv_heads, rope_theta",
    [(4, 2, 10000.0), (4, 4, 10000.0), (4, 1, 500.0)],
    ids=["grouped", "multi-head", "multi-query-rope-500"],
)
def test_block_matches_llama_decoder_layer(ref, llama, heads, kv_heads, rope_theta):
    config = tiny_config(llama, heads=heads, kv_heads=kv_heads, rope_theta=rope_theta)
    layer = randomise(llama.LlamaDecoderLayer(config, layer_idx=0), seed=5)
    block = ref.TransformerBlock(64, heads, kv_heads, 160, rope_base=rope_theta).eval()
    block.load_state_dict(block_state_from(layer, config))
    x = torch.randn(2, 9, 64, generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        assert (block(x) - hugging_face_block(llama, layer, config, x, torch.arange(9))).abs().max() < TOLERANCE
        positions = torch.tensor([0, 1, 3, 4, 8, 9, 15, 16, 20])  # uneven: RoPE sees real gaps
        assert (block(x, positions) - hugging_face_block(llama, layer, config, x, positions)).abs().max() < TOLERANCE


def test_the_conventions_matter(ref, llama):
    """What the notebook shows: without the permutation, or without a mask, the two differ."""
    config = tiny_config(llama)
    layer = randomise(llama.LlamaDecoderLayer(config, layer_idx=0), seed=7)
    state = block_state_from(layer, config)
    x = torch.randn(1, 7, 64, generator=torch.Generator().manual_seed(8))
    block = ref.TransformerBlock(64, 4, 2, 160).eval()
    block.load_state_dict(state)
    unpermuted = ref.TransformerBlock(64, 4, 2, 160).eval()
    hf = layer.state_dict()
    unpermuted.load_state_dict(
        {
            **state,
            "attn.q_proj.weight": hf["self_attn.q_proj.weight"],
            "attn.k_proj.weight": hf["self_attn.k_proj.weight"],
        }
    )
    with torch.no_grad():
        expected = hugging_face_block(llama, layer, config, x, torch.arange(7))
        assert (unpermuted(x) - expected).abs().max() > 0.1
        unmasked = hugging_face_block(llama, layer, config, x, torch.arange(7), causal=False)
        assert (block(x) - unmasked)[:, :-1].abs().max() > 0.1  # the layer alone looks ahead
        assert (block(x) - unmasked)[:, -1].abs().max() < TOLERANCE  # the last token sees everything anyway


def test_checks_still_work_after_transformers_is_imported():
    """The notebook imports transformers after its checks; importing it wraps torch.manual_seed
    (torch._dynamo does), which must not read as tampering when a learner re-runs a check."""
    script = textwrap.dedent("""
        import course_checks.trusted
        import torch
        from autograder import reference
        from course_checks import checks
        namespace = {"RMSNorm": reference.load("06_transformer_block").RMSNorm}
        checks.check("06_transformer_block", "RMSNorm", namespace)
        import transformers.models.llama.modeling_llama
        checks.check("06_transformer_block", "RMSNorm", namespace)
        torch.manual_seed = lambda seed: None  # a real replacement is still caught
        try:
            checks.check("06_transformer_block", "RMSNorm", namespace)
        except checks.CheckFailed as failure:
            assert "[mistake:tampering]" in str(failure), failure
        else:
            raise AssertionError("a replaced torch.manual_seed went unnoticed")
    """)
    pytest.importorskip("transformers")
    run = subprocess.run([sys.executable, "-c", script], cwd=REPOSITORY, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]
