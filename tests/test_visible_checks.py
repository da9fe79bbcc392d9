"""The visible checks do what their comments say.

Every check cell of the released notebooks lists its visible checks in its comment, one
``# - <label>: <what it runs>`` line each, and runs each as a block opened by ``# <label>``
(``tests/visible_checks.py`` reads them and runs them as a learner's kernel would). Here:

* every cell has that form, every assert a message, and the visible code uses nothing a
  student notebook lacks (no grading package, no solutions, no demo cell's variables);
* the reference answers and the correct alternatives of the grading tests pass every
  visible check;
* for every listed check, a wrong answer below (WRONG) fails the visible check in that
  check's own block: an assertion of the block, or an error the wrong answer raises while
  the block runs it, and never an error from the check's own code. A listed check that runs
  nothing, or checks less than it says, lets its wrong answer through.

A wrong answer is a whole answer cell, or the reference answer with a few lines changed:
the mistake a learner would make, passing the blocks before its own. Some are contrived
where the blocks before already pin everything a plain mistake would break (they say so).
"""

from __future__ import annotations

import ast
import importlib
import inspect
from dataclasses import dataclass

import pytest
import torch
from grading_suite import GradingSuite
from test_grading_08_kv_cache import ROLLING_SHIFTED
from visible_checks import assignments, check_cells, reference_answers, run_visible

ASSIGNMENTS = assignments()
CELLS = {(cell.assignment, cell.name): cell for assignment in ASSIGNMENTS for cell in check_cells(assignment)}
# The check that grades another exercise's answer cell (its exercise's target).
ANSWER_OF = {"no_head_loop": "MultiHeadAttention"}


@pytest.fixture(autouse=True)
def like_a_notebook_kernel():
    """One thread, as the notebooks that train and generate run (tiny models, a shared machine);
    what the cells change in torch (seeds, print options) is put back for the tests after these."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    with torch.random.fork_rng():
        yield
    torch.set_printoptions(profile="default")
    torch.set_num_threads(before)


@dataclass(frozen=True)
class Wrong:
    """A wrong answer: ``source``, or the reference answer with each ``old`` replaced once by its ``new``."""

    why: str
    edits: tuple = ()
    source: str = ""

    def answer(self, reference: str) -> str:
        if self.source:
            return self.source
        for old, new in self.edits:
            assert reference.count(old) == 1, f"{self.why}: {old!r} is not once in the reference answer"
            reference = reference.replace(old, new)
        return reference


def edit(why: str, *pairs: tuple[str, str]) -> Wrong:
    return Wrong(why, edits=pairs)


def whole(why: str, source: str) -> Wrong:
    return Wrong(why, source=source)


ATTEND_HEAD = """
def attend_with_cache(attn, x, positions, cache, layer):
    B, T, _ = x.shape
    H, G, Dh = attn.n_heads, attn.n_kv_heads, attn.head_dim
    q = attn.q_proj(x).view(B, T, H, Dh).transpose(1, 2)
    k = attn.k_proj(x).view(B, T, G, Dh).transpose(1, 2)
    v = attn.v_proj(x).view(B, T, G, Dh).transpose(1, 2)
"""
ATTEND_TAIL = """
    out = attention(q, repeat_kv(k, H // G), repeat_kv(v, H // G), causal_mask(T, S))
    return attn.o_proj(out.transpose(1, 2).reshape(B, T, H * Dh))
"""

# (assignment, check) -> {listed check: wrong answers it must catch}
WRONG = {
    ("00_start_here", "dot_scores"): {
        "worked example": [edit("keys times queries", ("q @ k.transpose(-2, -1)", "k @ q.transpose(-2, -1)"))],
        "batch dimensions": [edit(".T, which reverses every axis", ("q @ k.transpose(-2, -1)", "q @ k.T"))],
    },
    ("01_attention", "softmax"): {
        "worked example": [
            edit("divides by the largest instead of the sum", ("exponentials.sum(dim=dim", "exponentials.amax(dim=dim"))
        ],
        "shape": [edit("the sum without keepdim", ("sum(dim=dim, keepdim=True)", "sum(dim=dim)"))],
        "sums to 1": [
            edit("dim ignored", ("x.amax(dim=dim", "x.amax(dim=-1"), ("sum(dim=dim", "sum(dim=-1")),
            edit("always over the first axis", ("x.amax(dim=dim", "x.amax(dim=0"), ("sum(dim=dim", "sum(dim=0")),
        ],
        "large scores": [edit("no max subtraction", ("x - x.amax(dim=dim, keepdim=True)", "x"))],
    },
    ("01_attention", "attention_weights"): {
        "worked example": [
            edit("no sqrt(d)", (" / math.sqrt(d)", "")),
            edit("softmax over the queries", ("softmax(scores, dim=-1)", "softmax(scores, dim=-2)")),
        ],
        "batch dimensions": [edit(".T, which reverses every axis", ("k.transpose(-2, -1)", "k.T"))],
        "mask": [
            edit("mask ignored", ('scores = scores.masked_fill(~mask, float("-inf"))', "pass")),
            edit(
                "mask applied after the softmax",
                ('scores = scores.masked_fill(~mask, float("-inf"))', "return softmax(scores, dim=-1) * mask"),
            ),
        ],
    },
    ("01_attention", "attention"): {
        "worked example": [
            edit(
                "scores times values, no softmax", ("attention_weights(q, k, mask) @ v", "q @ k.transpose(-2, -1) @ v")
            )
        ],
        "mask": [edit("mask not passed on", ("attention_weights(q, k, mask)", "attention_weights(q, k)"))],
        "shapes": [
            edit(
                "torch.mm, for 2-D tensors only",
                ("attention_weights(q, k, mask) @ v", "torch.mm(attention_weights(q, k, mask), v)"),
            )
        ],
    },
    ("02_causal_masking", "causal_mask"): {
        "worked example": [
            edit("a float mask", ("dtype=torch.bool", "dtype=torch.float")),
            edit("the upper triangle", (".tril(diagonal=S - T)", ".triu(diagonal=S - T)")),
        ],
        "KV cache": [
            edit("the triangle at the top left", (".tril(diagonal=S - T)", ".tril()")),
            edit("S ignored", ("S = T if S is None else S", "S = T")),
        ],
        "sliding window": [
            edit("the window one too wide", ("S - T - window + 1", "S - T - window")),
            edit("the window ignored", ("mask = mask.triu(diagonal=S - T - window + 1)", "pass")),
            edit("the window measured from the query's index", ("S - T - window + 1", "-window + 1")),
        ],
    },
    ("02_causal_masking", "causal_attention"): {
        "worked example": [edit("no mask", ("attention(q, k, v, causal_mask(T, S))", "attention(q, k, v)"))],
        # contrived: the worked example pins every mask of 3 tokens
        "no future": [
            edit(
                "a mask only for sequences of up to 3 tokens",
                ("attention(q, k, v, causal_mask(T, S))", "attention(q, k, v, causal_mask(T, S) if S <= 3 else None)"),
            )
        ],
        "KV cache": [edit("S ignored", ("causal_mask(T, S)", "causal_mask(T)"))],
    },
    ("03_multi_head_attention", "split_heads"): {
        "worked example": [
            edit(
                "no transpose",
                (".view(B, T, n_heads, D // n_heads).transpose(1, 2)", ".view(B, n_heads, T, D // n_heads)"),
            )
        ],
        "batch": [
            edit(
                "the batch axis forgotten",
                ("x.view(B, T, n_heads, D // n_heads).transpose(1, 2)", "x.view(T, n_heads, -1).transpose(0, 1)[None]"),
            )
        ],
    },
    ("03_multi_head_attention", "merge_heads"): {
        "worked example": [
            edit("no transpose", ("x.transpose(1, 2).reshape(B, T, H * Dh)", "x.reshape(B, T, H * Dh)"))
        ],
        "undoes split_heads": [edit("a batch of one assumed", ("reshape(B, T, H * Dh)", "reshape(1, T, H * Dh)"))],
    },
    ("03_multi_head_attention", "MultiHeadAttention"): {
        "layers": [
            edit(
                "a bias on q_proj",
                ("self.q_proj = nn.Linear(d_model, d_model, bias=False)", "self.q_proj = nn.Linear(d_model, d_model)"),
            )
        ],
        "no mask": [edit("no output projection", ("return self.o_proj(merge_heads(", "return (merge_heads("))],
        "causal mask": [edit("mask not passed", ("attention(q, k, v, mask)", "attention(q, k, v)"))],
    },
    ("03_multi_head_attention", "no_head_loop"): {
        "one call": [
            edit(
                "a loop over the heads",
                (
                    "return self.o_proj(merge_heads(attention(q, k, v, mask)))",
                    "heads = [attention(q[:, h], k[:, h], v[:, h], mask) for h in range(self.n_heads)]\n"
                    "        return self.o_proj(merge_heads(torch.stack(heads, dim=1)))",
                ),
            )
        ],
    },
    ("04_rope", "rope_frequencies"): {
        "worked example": [edit("no minus sign", ("base ** (-torch.arange", "base ** (torch.arange"))],
        "LLaMA 3": [edit("base ignored", ("return base **", "return 10000.0 **"))],
    },
    ("04_rope", "apply_rope"): {
        "one turn": [
            edit(
                "clockwise",
                ("even * cos - odd * sin, even * sin + odd * cos", "even * cos + odd * sin, odd * cos - even * sin"),
            ),
            edit(
                "half-split pairs",
                ("even, odd = x[..., 0::2], x[..., 1::2]", "even, odd = x.chunk(2, dim=-1)"),
                ("return rotated.flatten(-2)", "return torch.cat((rotated[..., 0], rotated[..., 1]), dim=-1)"),
            ),
        ],
        "positions": [
            edit("positions ignored", ("positions.to(torch.float64)", "torch.arange(x.shape[-2], dtype=torch.float64)"))
        ],
        "worked example": [
            edit("base ignored", ("rope_frequencies(x.shape[-1], base)", "rope_frequencies(x.shape[-1])"))
        ],
        "m - n only": [
            edit(
                "angles in half precision",
                (
                    "angles = positions.to(torch.float64)[..., None] * theta",
                    "angles = (positions.half()[..., None] * theta.half()).double()",
                ),
            )
        ],
    },
    ("04_rope", "neighbour_to_half_split"): {
        "worked example": [
            edit(
                "the inverse order",
                (
                    "torch.cat((x[..., 0::2], x[..., 1::2]), dim=-1)",
                    "torch.stack(x.chunk(2, dim=-1), dim=-1).flatten(-2)",
                ),
            )
        ],
        "batch": [
            edit(
                "the batch flattened together",
                (
                    "torch.cat((x[..., 0::2], x[..., 1::2]), dim=-1)",
                    "torch.cat((x.flatten()[0::2], x.flatten()[1::2])).view(x.shape)",
                ),
            )
        ],
    },
    ("05_grouped_query_attention", "kv_head_index"): {
        "worked example": [edit("h % G", ("h // (n_heads // n_kv_heads)", "h % n_kv_heads"))],
        "the extremes": [
            edit("the worked example's group size of 4 written in", ("h // (n_heads // n_kv_heads)", "h // 4"))
        ],
    },
    ("05_grouped_query_attention", "repeat_kv"): {
        "in place": [edit("tiled", ("x.repeat_interleave(n_rep, dim=1)", "x.repeat(1, n_rep, 1, 1)"))],
        "every head": [
            edit(
                "each head doubled, whatever n_rep",
                ("x.repeat_interleave(n_rep, dim=1)", "x.repeat_interleave(2, dim=1)"),
            )
        ],
    },
    ("05_grouped_query_attention", "GroupedQueryAttention"): {
        "weights": [
            edit(
                "k_proj with H heads",
                (
                    "self.k_proj = nn.Linear(d_model, n_kv_heads * self.head_dim",
                    "self.k_proj = nn.Linear(d_model, d_model",
                ),
            )
        ],
        "causal": [edit("no mask", ("repeat_kv(v, n_rep), causal_mask(T))", "repeat_kv(v, n_rep))"))],
        "against torch": [
            edit(
                "kv heads tiled",
                ("repeat_kv(k, n_rep), repeat_kv(v, n_rep)", "k.repeat(1, n_rep, 1, 1), v.repeat(1, n_rep, 1, 1)"),
            ),
            edit(
                "RoPE on v instead of k",
                ("k = apply_rope(k, positions, self.rope_base)", "v = apply_rope(v, positions, self.rope_base)"),
            ),
        ],
        "the extremes": [
            edit(
                "positions ignored",
                (
                    "        if positions is None:\n            positions = torch.arange(T)\n",
                    "        positions = torch.arange(T)\n",
                ),
            )
        ],
    },
    ("05_grouped_query_attention", "kv_cache_bytes"): {
        "LLaMA-2-7B": [edit("keys only", ("return 2 * n_layers", "return n_layers"))],
        "LLaMA-3-8B": [edit("batch ignored", (" * batch_size", ""))],
    },
    ("05_grouped_query_attention", "mla_cache_bytes"): {
        "DeepSeek-V2": [
            edit("a key and a value, as in kv_cache_bytes", ("return n_layers *", "return 2 * n_layers *")),
            edit("the RoPE key left out", ("(latent_dim + rope_dim)", "latent_dim")),
        ],
        "tokens": [edit("seq_len ignored", (" * seq_len * batch_size", " * batch_size"))],
        "batch and precision": [edit("batch ignored", (" * batch_size *", " *"))],
    },
    ("06_transformer_block", "RMSNorm"): {
        "weight": [
            edit(
                "weight a plain tensor",
                ("self.weight = nn.Parameter(torch.ones(dim))", "self.weight = torch.ones(dim)"),
            )
        ],
        "worked example": [
            edit(
                "the mean of |x|, not of x²",
                ("x32.pow(2).mean(dim=-1, keepdim=True)", "x32.abs().mean(dim=-1, keepdim=True)"),
            )
        ],
        "RMS 1": [edit("the mean over every axis", ("x32.pow(2).mean(dim=-1, keepdim=True)", "x32.pow(2).mean()"))],
        "eps": [
            edit(
                "eps outside the square root",
                (
                    "torch.rsqrt(x32.pow(2).mean(dim=-1, keepdim=True) + self.eps)",
                    "1 / (torch.sqrt(x32.pow(2).mean(dim=-1, keepdim=True)) + self.eps)",
                ),
            )
        ],
        "scale": [edit("weight forgotten", ("return self.weight * normed", "return normed"))],
    },
    ("06_transformer_block", "SwiGLU"): {
        "layers": [
            edit(
                "a bias on w1",
                ("self.w1 = nn.Linear(d_model, d_hidden, bias=False)", "self.w1 = nn.Linear(d_model, d_hidden)"),
            )
        ],
        "worked example": [
            edit("w1 and w3 swapped", ("F.silu(self.w1(x)) * self.w3(x)", "F.silu(self.w3(x)) * self.w1(x)")),
            edit("GELU", ("F.silu(self.w1(x))", "F.gelu(self.w1(x))")),
        ],
        "shapes": [
            edit(
                "w2 the shape of w1",
                (
                    "self.w2 = nn.Linear(d_hidden, d_model, bias=False)",
                    "self.w2 = nn.Linear(d_model, d_hidden, bias=False)",
                ),
            )
        ],
    },
    ("06_transformer_block", "TransformerBlock"): {
        "parts": [
            edit("one norm for both", ("self.mlp_norm = RMSNorm(d_model, norm_eps)", "self.mlp_norm = self.attn_norm"))
        ],
        # contrived: the attention given is causal, and nothing else in a block mixes tokens
        "causal": [
            edit(
                "the MLP reads the mean over all tokens",
                (
                    "return x + self.mlp(self.mlp_norm(x))",
                    "h = self.mlp_norm(x)\n        return x + self.mlp(h + h.mean(dim=1, keepdim=True))",
                ),
            )
        ],
        "positions": [
            edit("positions not passed on", ("self.attn(self.attn_norm(x), positions)", "self.attn(self.attn_norm(x))"))
        ],
        "residuals": [
            edit(
                "post-norm",
                (
                    "x = x + self.attn(self.attn_norm(x), positions)\n        return x + self.mlp(self.mlp_norm(x))",
                    "x = self.attn_norm(x + self.attn(x, positions))\n        return self.mlp_norm(x + self.mlp(x))",
                ),
            ),
            edit("no residual around the attention", ("x = x + self.attn(", "x = self.attn(")),
        ],
    },
    ("07_llama", "ModelConfig"): {
        "fields": [edit("eps 1e-5", ("norm_eps: float = 1e-6", "norm_eps: float = 1e-5"))],
        "refused": [edit("groups not checked", ("if self.n_heads % self.n_kv_heads != 0:", "if False:"))],
    },
    ("07_llama", "Llama"): {
        "shapes": [
            edit(
                "the last position only",
                ("return self.lm_head(self.norm(x))      # (B, T, V)", "return self.lm_head(self.norm(x))[:, -1]"),
            )
        ],
        "layers": [edit("a plain list", ("self.layers = nn.ModuleList(", "self.layers = list("))],
        # contrived: every block given is causal
        "causal": [
            edit(
                "every position sees the mean embedding",
                (
                    "x = self.embed(tokens)                 # (B, T, D)",
                    "x = self.embed(tokens)\n        x = x + x.mean(dim=1, keepdim=True)",
                ),
            )
        ],
        "forward": [
            edit("no final norm", ("return self.lm_head(self.norm(x))      # (B, T, V)", "return self.lm_head(x)")),
            edit("a residual around each block", ("x = layer(x)  ", "x = x + layer(x)  ")),
            edit(
                "softmax on the logits",
                (
                    "return self.lm_head(self.norm(x))      # (B, T, V)",
                    "return self.lm_head(self.norm(x)).softmax(dim=-1)",
                ),
            ),
        ],
    },
    ("07_llama", "generate"): {
        "greedy": [
            edit(
                "the last token only",
                ("logits = model(context)[:, -1, :]", "logits = model(context[:, -1:])[:, -1, :]"),
            ),
            edit("only the new tokens returned", ("    return tokens\n", "    return tokens[:, -max_new_tokens:]\n")),
        ],
        "top_k=2": [edit("top_k ignored", ("if top_k is not None:", "if False:"))],
        "top_k=1": [
            edit(
                "the k-th largest dropped too",
                ("logits.masked_fill(logits < kth_largest", "logits.masked_fill(logits <= kth_largest"),
            )
        ],
        "same seed": [
            edit(
                "sampled with numpy",
                (
                    "next_token = torch.multinomial(F.softmax(logits, dim=-1), num_samples=1)",
                    "import numpy as np\n"
                    "            p = F.softmax(logits.double(), dim=-1).numpy()\n"
                    "            next_token = torch.tensor([[np.random.choice(len(r), p=r / r.sum())] for r in p])",
                ),
            )
        ],
        "context": [edit("no crop", ("context = tokens[:, -model.config.max_seq_len:]", "context = tokens"))],
    },
    ("07_llama", "load_hf_llama_state_dict"): {
        "q rows": [
            edit(
                "no permutation",
                (
                    "return w.view(n_heads, 2, head_dim // 2, dim).transpose(1, 2).reshape(n_heads * head_dim, dim)",
                    "return w",
                ),
            )
        ],
        "names": [
            edit(
                "gate and up swapped",
                ('state_dict[hf + "mlp.gate_proj.weight"]', 'state_dict[hf + "mlp.up_proj.weight"]'),
                (
                    'ours[me + "mlp.w3.weight"] = state_dict[hf + "mlp.up_proj.weight"]',
                    'ours[me + "mlp.w3.weight"] = state_dict[hf + "mlp.gate_proj.weight"]',
                ),
            ),
        ],
        "round trip": [
            edit(
                "k permuted with the query heads' count",
                (
                    'state_dict[hf + "self_attn.k_proj.weight"], config.n_kv_heads)',
                    'state_dict[hf + "self_attn.k_proj.weight"], config.n_heads)',
                ),
            ),
            edit(
                "the model not returned",
                ("    model.load_state_dict(ours)\n    return model\n", "    model.load_state_dict(ours)\n"),
            ),
        ],
    },
    ("07_llama", "lm_loss"): {
        "worked example": [
            edit(
                "no shift",
                ("predictions = logits[:, :-1]", "predictions = logits"),
                ("targets = tokens[:, 1:]", "targets = tokens"),
            )
        ],
        "batch": [
            edit(
                "summed over the batch",
                (
                    "return F.cross_entropy(predictions.flatten(0, 1), targets.flatten())",
                    "losses = F.cross_entropy(predictions.flatten(0, 1), targets.flatten(), reduction='none')\n"
                    "    return losses.view(targets.shape).mean(dim=1).sum()",
                ),
            )
        ],
    },
    ("07_llama", "lr_at"): {
        "worked numbers": [
            edit("warm-up from 0", ("max_lr * (step + 1) / warmup_steps", "max_lr * step / warmup_steps"))
        ],
        # contrived: the worked numbers pin a schedule of 12 steps
        "shape": [
            edit(
                "10 warm-up steps when 0 are given",
                (
                    "    if step < warmup_steps:\n",
                    "    warmup_steps = warmup_steps or 10\n    if step < warmup_steps:\n",
                ),
            )
        ],
    },
    ("08_kv_cache", "KVCache"): {
        "empty": [
            edit(
                "no length when empty",
                (
                    "        if not self.keys:\n            return 0\n",
                    "        if not self.keys:\n            return None\n",
                ),
            )
        ],
        "prompt": [
            edit(
                "length counts the layers", ("return next(iter(self.keys.values())).shape[2]", "return len(self.keys)")
            ),
            edit(
                "length counts every update",
                (
                    "return next(iter(self.keys.values())).shape[2]",
                    "return sum(k.shape[2] for k in self.keys.values())",
                ),
            ),
        ],
        "one token": [
            edit("update replaces", ("            k = torch.cat([self.keys[layer], k], dim=2)", "            pass")),
            edit(
                "new positions first",
                ("torch.cat([self.keys[layer], k], dim=2)", "torch.cat([k, self.keys[layer]], dim=2)"),
            ),
        ],
        "two caches": [
            whole(
                "one storage for every cache",
                """
                class KVCache:
                    keys, values = {}, {}

                    def update(self, layer, k, v):
                        if layer in self.keys:
                            k = torch.cat([self.keys[layer], k], dim=2)
                            v = torch.cat([self.values[layer], v], dim=2)
                        self.keys[layer], self.values[layer] = k, v
                        return k, v

                    @property
                    def length(self):
                        return next(iter(self.keys.values())).shape[2] if self.keys else 0
                """,
            )
        ],
    },
    ("08_kv_cache", "attend_with_cache"): {
        "prompt": [
            whole(
                "no mask",
                ATTEND_HEAD
                + """
    q, k = apply_rope(q, positions, attn.rope_base), apply_rope(k, positions, attn.rope_base)
    k, v = cache.update(layer, k, v)
    out = attention(q, repeat_kv(k, H // G), repeat_kv(v, H // G))
    return attn.o_proj(out.transpose(1, 2).reshape(B, T, H * Dh))
""",
            ),
            edit(
                "values rotated",
                (
                    "k = apply_rope(k, positions, attn.rope_base)",
                    "k, v = apply_rope(k, positions, attn.rope_base), apply_rope(v, positions, attn.rope_base)",
                ),
            ),
        ],
        "one token at a time": [
            edit(
                "positions from 0",
                (
                    "q = apply_rope(q, positions, attn.rope_base)",
                    "positions = torch.arange(T_new)\n    q = apply_rope(q, positions, attn.rope_base)",
                ),
            ),
            edit(
                "the mask at the top left", ("causal_mask(T_new, S)", "torch.ones(T_new, S, dtype=torch.bool).tril()")
            ),
            whole(
                "the cache bypassed",
                ATTEND_HEAD
                + """
    q, k = apply_rope(q, positions, attn.rope_base), apply_rope(k, positions, attn.rope_base)
    S = T
"""
                + ATTEND_TAIL,
            ),
        ],
        "a chunk": [
            edit(
                "no mask once the cache holds something (right for one token)",
                ("causal_mask(T_new, S))", "causal_mask(T_new, S) if T_new == S else None)"),
            )
        ],
        "what the cache gets": [
            whole(
                "the repeated heads cached",
                ATTEND_HEAD
                + """
    q, k = apply_rope(q, positions, attn.rope_base), apply_rope(k, positions, attn.rope_base)
    k, v = cache.update(layer, repeat_kv(k, H // G), repeat_kv(v, H // G))
    out = attention(q, k, v, causal_mask(T, k.shape[2]))
    return attn.o_proj(out.transpose(1, 2).reshape(B, T, H * Dh))
""",
            ),
            whole(
                "keys cached unrotated, all rotated at every step",
                ATTEND_HEAD
                + """
    q = apply_rope(q, positions, attn.rope_base)
    k, v = cache.update(layer, k, v)
    S = k.shape[2]
    k = apply_rope(k, torch.arange(S), attn.rope_base)
"""
                + ATTEND_TAIL,
            ),
        ],
        "multi-head and multi-query": [
            edit(
                "the default rope base",
                ("apply_rope(q, positions, attn.rope_base)", "apply_rope(q, positions)"),
                ("apply_rope(k, positions, attn.rope_base)", "apply_rope(k, positions)"),
            ),
            edit(
                "the group size of 8 heads over 2 written in", ("n_rep = attn.n_heads // attn.n_kv_heads", "n_rep = 4")
            ),
        ],
    },
    ("08_kv_cache", "forward_cached"): {
        "prompt": [
            edit("no MLP", ("        x = x + block.mlp(block.mlp_norm(x))\n", "")),
            edit("every block on layer 0 of the cache", ("positions, cache, i)", "positions, cache, 0)")),
        ],
        "then one token at a time and a chunk": [
            edit("positions from 0", ("start = cache.length ", "start = 0 ")),
            whole(
                "positions read in every layer",
                """
                @torch.no_grad()
                def forward_cached(model, tokens, cache):
                    x = model.embed(tokens)
                    for i, block in enumerate(model.layers):
                        positions = torch.arange(cache.length, cache.length + tokens.shape[1])
                        x = x + attend_with_cache(block.attn, block.attn_norm(x), positions, cache, i)
                        x = x + block.mlp(block.mlp_norm(x))
                    return model.lm_head(model.norm(x))
            """,
            ),
        ],
    },
    ("08_kv_cache", "generate_cached"): {
        "greedy": [
            edit(
                "a new cache at every step",
                (
                    "logits = forward_cached(model, next_token, cache)",
                    "logits = forward_cached(model, next_token, KVCache())",
                ),
            ),
            edit(
                "the whole sequence fed at every step",
                ("logits = forward_cached(model, next_token, cache)", "logits = forward_cached(model, tokens, cache)"),
            ),
        ],
        "sampled": [edit("temperature ignored", ("logits = logits / temperature", "pass"))],
        "one token per pass": [
            whole(
                "07's generate, with the limit",
                """
                def generate_cached(model, tokens, max_new_tokens, temperature=1.0, top_k=None):
                    if tokens.shape[1] + max_new_tokens > model.config.max_seq_len:
                        raise ValueError(f"longer than max_seq_len={model.config.max_seq_len}")
                    return generate(model, tokens, max_new_tokens, temperature, top_k)
            """,
            ),
            edit(
                "the whole sequence again on a new cache at every step",
                (
                    "logits = forward_cached(model, next_token, cache)",
                    "logits = forward_cached(model, tokens, KVCache())",
                ),
            ),
        ],
        "context limit": [
            edit("no limit", ("    if tokens.shape[1] + max_new_tokens > limit:\n", "    if False:\n")),
            edit(
                "the limit off by one",
                ("tokens.shape[1] + max_new_tokens > limit", "tokens.shape[1] + max_new_tokens >= limit"),
            ),
        ],
    },
    ("09_efficient_attention", "merge_partials"): {
        "worked example": [
            edit(
                "the merged output divided by the merged sum",
                ("scale_a * o_a + scale_b * o_b", "(scale_a * o_a + scale_b * o_b) / (scale_a * l_a + scale_b * l_b)"),
            )
        ],
        # the worked example's two blocks share their max, 0.71: a factor left out is 1 there
        "a larger max later": [
            edit("the old sum not rescaled", ("scale_a * l_a + scale_b * l_b", "l_a + scale_b * l_b")),
            edit("the old output not rescaled", ("scale_a * o_a + scale_b * o_b", "o_a + scale_b * o_b")),
        ],
        "either order": [
            whole(
                "the second partial's max taken as the merged one",
                """
def merge_partials(m_a, l_a, o_a, m_b, l_b, o_b):
    scale = torch.exp(m_a - m_b)
    return m_b, scale * l_a + l_b, scale * o_a + o_b
""",
            )
        ],
        "batch": [
            edit(
                "the larger max along axis 1, the last one of a 2-D column only",
                ("m = torch.maximum(m_a, m_b)", "m = torch.cat([m_a, m_b], dim=1).amax(dim=1, keepdim=True)"),
            )
        ],
        # contrived: the maximum written as m_b plus the clamped difference, nan when m_b is -inf
        "empty partial": [
            edit(
                "a max that is nan against -inf", ("m = torch.maximum(m_a, m_b)", "m = m_b + (m_a - m_b).clamp(min=0)")
            )
        ],
        "large scores": [
            whole(
                "the exponentials of the maxima themselves",
                """
def merge_partials(m_a, l_a, o_a, m_b, l_b, o_b):
    m = torch.maximum(m_a, m_b)
    total = l_a * torch.exp(m_a) + l_b * torch.exp(m_b)
    out = o_a * torch.exp(m_a) + o_b * torch.exp(m_b)
    return m, total / torch.exp(m), out / torch.exp(m)
""",
            )
        ],
    },
    ("09_efficient_attention", "blockwise_attention"): {
        "worked example": [edit("no sqrt(d)", (" / math.sqrt(d)", ""))],
        "any block size": [
            edit(
                "the last, shorter block of keys left out",
                ("for j0 in range(0, S, block_size):", "for j0 in range(0, S - block_size + 1, block_size):"),
            )
        ],
        "causal": [
            edit(
                "a query does not see itself on the diagonal",
                ("<= torch.arange(i0, i1)[:, None] + offset", "< torch.arange(i0, i1)[:, None] + offset"),
            ),
            edit(
                "the diagonal tiles skipped",
                ('scores = scores.masked_fill(~visible, float("-inf"))', "continue"),
            ),
        ],
        "KV cache": [
            edit("the queries taken as the first positions", ("offset = S - T", "offset = 0")),
            edit("no clamp: nan for a row that sees no key of a tile", (".clamp(min=-1e30)", "")),
        ],
        "batch and float64": [
            edit(
                "a float32 output whatever the inputs",
                (
                    "out = torch.empty(*batch, T, v.shape[-1], dtype=q.dtype)",
                    "out = torch.empty(*batch, T, v.shape[-1])",
                ),
            )
        ],
        "no T x S table": [
            whole(
                "01's attention on the whole table",
                """
def blockwise_attention(q, k, v, block_size, causal=False):
    T, S = q.shape[-2], k.shape[-2]
    return attention(q, k, v, causal_mask(T, S) if causal else None)
""",
            ),
            edit(
                "the diagonal tiles' masks cut from a full causal_mask",
                (
                    "visible = torch.arange(j0, j1) <= torch.arange(i0, i1)[:, None] + offset",
                    "visible = causal_mask(T, S)[i0:i1, j0:j1]",
                ),
            ),
        ],
        "causal skips the future": [
            edit(
                "the future tiles computed and masked away",
                ("                break ", "                pass "),
            )
        ],
    },
    ("08_kv_cache", "RollingKVCache"): {
        "slots": [
            edit(
                "the window returned in slot order",
                ("window = torch.arange(max(0, end - W), end) % W", "window = torch.arange(min(end, W))"),
            ),
            whole("the window kept oldest first by shifting", ROLLING_SHIFTED),
            edit(
                "length stops at the window",
                (
                    "return next(iter(self.written.values()), 0)",
                    "return min(next(iter(self.written.values()), 0), self.window)",
                ),
            ),
        ],
        "a long prompt": [
            edit(
                "only the first position of each update written",
                ("slots = torch.arange(first, end) % W", "slots = torch.tensor([start % W])"),
                (
                    "self.keys[layer][:, :, slots] = k[:, :, first - start:]",
                    "self.keys[layer][:, :, slots] = k[:, :, :1]",
                ),
                (
                    "self.values[layer][:, :, slots] = v[:, :, first - start:]",
                    "self.values[layer][:, :, slots] = v[:, :, :1]",
                ),
            )
        ],
        "against the recomputed window": [
            edit(
                "unwritten slots returned before the window fills",
                ("window = torch.arange(max(0, end - W), end) % W", "window = torch.arange(end - W, end) % W"),
            )
        ],
    },
}


def wrong_cases():
    for (assignment, name), by_label in WRONG.items():
        for label, wrongs in by_label.items():
            for wrong in wrongs:
                yield pytest.param(assignment, name, label, wrong, id=f"{assignment}-{name}-{label}-{wrong.why}")


def alternatives():
    """(assignment, student, answers) of the grading tests' correct alternatives."""
    for assignment in ASSIGNMENTS:
        module = importlib.import_module(f"test_grading_{assignment}")
        suites = [
            s for _, s in inspect.getmembers(module, inspect.isclass) if issubclass(s, GradingSuite) and s.assignment
        ]
        for suite in suites:
            for student, answers in suite.alternatives.items():
                yield pytest.param(assignment, answers, id=f"{assignment}-{student}")


# ------------------------------------------------------------ the form


@pytest.mark.parametrize("key", list(CELLS), ids="-".join)
def test_check_cell_lists_its_visible_checks_and_runs_each_in_a_labelled_block(key):
    cell = CELLS[key]
    assert cell.problems == [], f"{cell.assignment} {cell.grade_id}: " + "; ".join(cell.problems)


@pytest.mark.parametrize("key", list(CELLS), ids="-".join)
def test_every_visible_assert_says_what_to_look_at(key):
    tree = ast.parse(CELLS[key].visible)
    for node in ast.walk(tree):
        if isinstance(node, ast.Assert):
            assert node.msg is not None, f"{key}: line {node.lineno} asserts without a message"
        if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
            if getattr(node.exc.func, "id", "") == "AssertionError":
                assert node.exc.args, f"{key}: line {node.lineno} raises an AssertionError without a message"


# What a visible check may import: the standard library's and torch, which every notebook has.
VISIBLE_IMPORTS = {"dataclasses", "math", "torch", "traceback"}


@pytest.mark.parametrize("key", list(CELLS), ids="-".join)
def test_visible_checks_use_only_what_the_student_notebook_has(key):
    """No grading package, no solutions (the released notebook has neither): plain imports only.

    That the rest comes from the notebook's setup and answer cells alone shows in the runs below,
    which give the visible code nothing else.
    """
    for node in ast.walk(ast.parse(CELLS[key].visible)):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
            assert {n.split(".")[0] for n in names} <= VISIBLE_IMPORTS, f"{key} imports {names}"


def test_every_exercise_has_a_check_cell_read_here():
    """Every answer cell has its check cell here, and every check cell its wrong answers."""
    for assignment in ASSIGNMENTS:
        checked = {ANSWER_OF.get(cell.name, cell.name) for cell in check_cells(assignment)}
        assert checked == set(reference_answers(assignment)), assignment
    assert set(WRONG) == set(CELLS)


@pytest.mark.parametrize("key", list(CELLS), ids="-".join)
def test_every_listed_visible_check_has_a_wrong_answer_it_catches(key):
    assert list(WRONG[key]) == CELLS[key].bullets, (
        f"{key}: the wrong answers here are for {list(WRONG[key])}, the cell lists {CELLS[key].bullets}"
    )
    assert all(WRONG[key].values())


# ------------------------------------------------------------ what passes


@pytest.mark.parametrize("key", list(CELLS), ids="-".join)
def test_reference_answers_pass_the_visible_checks(key):
    outcome = run_visible(CELLS[key])
    assert outcome.error is None, f"{key}: {outcome.describe()}"
    assert "the visible check" in outcome.printed


@pytest.mark.parametrize(("assignment", "answers"), list(alternatives()))
def test_correct_alternatives_pass_the_visible_checks(assignment, answers):
    """The grading tests' alternatives get full marks; no visible check may reject them."""
    for cell in check_cells(assignment):
        answer = ANSWER_OF.get(cell.name, cell.name)
        if answer in answers:
            outcome = run_visible(cell, answers)
            assert outcome.error is None, f"{cell.grade_id} with the alternative {answer}: {outcome.describe()}"


# ------------------------------------------------------------ what fails where


@pytest.mark.filterwarnings("ignore:The use of `x.T`:UserWarning")  # the wrong answers that use it
@pytest.mark.parametrize(("assignment", "name", "label", "wrong"), list(wrong_cases()))
def test_wrong_answer_fails_in_the_visible_check_it_is_listed_for(assignment, name, label, wrong):
    cell = CELLS[(assignment, name)]
    answer = ANSWER_OF.get(name, name)
    source = wrong.answer(reference_answers(assignment)[answer])
    assert source != reference_answers(assignment)[answer]
    outcome = run_visible(cell, {answer: source})
    assert outcome.error is not None, f"{wrong.why}: every visible check of {cell.grade_id} passes"
    assert (outcome.block, outcome.raised_in) in ((label, "check"), (label, "notebook")), (
        f"{wrong.why}: expected to fail in {label!r}, got {outcome.describe()}"
    )
    if outcome.raised_in == "check":
        assert isinstance(outcome.error, AssertionError), (
            f"{wrong.why}: the check's own code raised {outcome.describe()}; a learner should get an assertion "
            "that says what to look at"
        )
