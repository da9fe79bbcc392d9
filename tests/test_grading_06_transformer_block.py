"""Notebook 06 graded by real nbgrader: each catalogued mistake, correct alternatives, tampering.

Plus, without nbgrader: every catalogued mutant is named as itself by the
hidden check (so the cases tell every mistake apart from the reference and
from the others).
"""

import textwrap

import pytest
from grading_suite import GradingSuite

from autograder import reference
from autograder.exercises import module_for
from autograder.local_judge import judge_function

ASSIGNMENT = "06_transformer_block"

RMSNORM_INIT = """
class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
"""
SWIGLU_INIT = """
class SwiGLU(nn.Module):
    def __init__(self, d_model, d_hidden):
        super().__init__()
        self.w1 = nn.Linear(d_model, d_hidden, bias=False)
        self.w3 = nn.Linear(d_model, d_hidden, bias=False)
        self.w2 = nn.Linear(d_hidden, d_model, bias=False)
"""
BLOCK_INIT = """
class TransformerBlock(nn.Module):
    def __init__(self, d_model, n_heads, n_kv_heads, d_hidden, norm_eps=1e-6, rope_base=10000.0):
        super().__init__()
        self.attn_norm = RMSNorm(d_model, norm_eps)
        self.attn = GroupedQueryAttention(d_model, n_heads, n_kv_heads, rope_base)
        self.mlp_norm = RMSNorm(d_model, norm_eps)
        self.mlp = SwiGLU(d_model, d_hidden)
"""


def with_forward(init: str, forward: str) -> str:
    """A class answer: the usual __init__, and the forward given (indented into the class)."""
    return (
        textwrap.dedent(init).strip("\n")
        + "\n\n"
        + textwrap.indent(textwrap.dedent(forward).strip("\n"), "    ")
        + "\n"
    )


def rmsnorm(forward):
    return with_forward(RMSNORM_INIT, forward)


def swiglu(forward):
    return with_forward(SWIGLU_INIT, forward)


def block(forward):
    return with_forward(BLOCK_INIT, forward)


class TestTransformerBlockGrading(GradingSuite):
    assignment = ASSIGNMENT

    mistakes = {
        "rmsnorm-eps-outside": (
            "RMSNorm",
            rmsnorm("""
            def forward(self, x):
                rms = torch.sqrt(torch.mean(x ** 2, dim=-1, keepdim=True))
                return self.weight * x / (rms + self.eps)
            """),
            "rmsnorm-eps-outside-sqrt",
        ),
        "rmsnorm-plain-mean": (
            "RMSNorm",
            rmsnorm("""
            def forward(self, x):
                mean = x.mean(-1, keepdim=True)
                return self.weight * x / torch.sqrt(mean + self.eps)
            """),
            "rmsnorm-mean-not-mean-of-squares",
        ),
        "rmsnorm-whole-tensor": (
            "RMSNorm",
            rmsnorm("""
            def forward(self, x):
                return self.weight * x / torch.sqrt(torch.mean(x * x) + self.eps)
            """),
            "rmsnorm-wrong-axis",
        ),
        "rmsnorm-forgot-root": (
            "RMSNorm",
            rmsnorm("""
            def forward(self, x):
                return x / (x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight
            """),
            "rmsnorm-no-sqrt",
        ),
        "rmsnorm-layer-norm": (
            "RMSNorm",
            rmsnorm("""
            def forward(self, x):
                return F.layer_norm(x, (x.shape[-1],), self.weight, None, self.eps)
            """),
            "rmsnorm-centred",
        ),
        "rmsnorm-unscaled": (
            "RMSNorm",
            rmsnorm("""
            def forward(self, x):
                return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
            """),
            "rmsnorm-no-weight",
        ),
        "swiglu-silu-on-up": (
            "SwiGLU",
            swiglu("""
            def forward(self, x):
                return self.w2(self.w1(x) * F.silu(self.w3(x)))
            """),
            "swiglu-w1-w3-swapped",
        ),
        "swiglu-gelu": (
            "SwiGLU",
            swiglu("""
            def forward(self, x):
                return self.w2(F.gelu(self.w1(x)) * self.w3(x))
            """),
            "swiglu-gelu",
        ),
        "swiglu-relu": (
            "SwiGLU",
            swiglu("""
            def forward(self, x):
                return self.w2(torch.relu(self.w1(x)) * self.w3(x))
            """),
            "swiglu-relu",
        ),
        "swiglu-sigmoid-gate": (
            "SwiGLU",
            swiglu("""
            def forward(self, x):
                return self.w2(torch.sigmoid(self.w1(x)) * self.w3(x))
            """),
            "swiglu-sigmoid",
        ),
        "swiglu-ungated": (
            "SwiGLU",
            swiglu("""
            def forward(self, x):
                return self.w2(F.silu(self.w1(x)))
            """),
            "swiglu-no-gate",
        ),
        "block-post-norm": (
            "TransformerBlock",
            block("""
            def forward(self, x, positions=None):
                x = self.attn_norm(x + self.attn(x, positions))
                x = self.mlp_norm(x + self.mlp(x))
                return x
            """),
            "block-post-norm",
        ),
        "block-no-mlp-residual": (
            "TransformerBlock",
            block("""
            def forward(self, x, positions=None):
                h = x + self.attn(self.attn_norm(x), positions)
                return self.mlp(self.mlp_norm(h))
            """),
            "block-missing-residual",
        ),
        "block-normed-residual": (
            "TransformerBlock",
            block("""
            def forward(self, x, positions=None):
                x = self.attn_norm(x)
                x = x + self.attn(x, positions)
                x = self.mlp_norm(x)
                x = x + self.mlp(x)
                return x
            """),
            "block-residual-from-normed",
        ),
        "block-one-norm": (
            "TransformerBlock",
            block("""
            def forward(self, x, positions=None):
                x = x + self.attn(self.attn_norm(x), positions)
                return x + self.mlp(self.attn_norm(x))
            """),
            "block-norm-reused",
        ),
        "block-parallel": (
            "TransformerBlock",
            block("""
            def forward(self, x, positions=None):
                return x + self.attn(self.attn_norm(x), positions) + self.mlp(self.mlp_norm(x))
            """),
            "block-parallel",
        ),
        "block-no-positions": (
            "TransformerBlock",
            block("""
            def forward(self, x, positions=None):
                x = x + self.attn(self.attn_norm(x))
                return x + self.mlp(self.mlp_norm(x))
            """),
            "block-positions-dropped",
        ),
    }

    alternatives = {
        "rsqrt-fused-explicit-positions": {
            "RMSNorm": """
                class RMSNorm(nn.Module):
                    def __init__(self, dim, eps=1e-6):
                        super().__init__()
                        self.weight = nn.Parameter(torch.ones(dim))
                        self.eps = eps

                    def forward(self, x):
                        return x * x.pow(2).mean(-1, keepdim=True).add(self.eps).rsqrt() * self.weight
                """,
            "SwiGLU": """
                class SwiGLU(nn.Module):
                    def __init__(self, d_model, d_hidden):
                        super().__init__()
                        self.w1 = nn.Linear(d_model, d_hidden, bias=False)
                        self.w2 = nn.Linear(d_hidden, d_model, bias=False)
                        self.w3 = nn.Linear(d_model, d_hidden, bias=False)

                    def forward(self, x):
                        # one fused product for both branches, split in two
                        fused = torch.cat([self.w1.weight, self.w3.weight], dim=0)
                        gate, up = F.linear(x, fused).chunk(2, dim=-1)
                        return self.w2(gate * torch.sigmoid(gate) * up)
                """,
            "TransformerBlock": """
                class TransformerBlock(nn.Module):
                    def __init__(self, d_model, n_heads, n_kv_heads, d_hidden, norm_eps=1e-6, rope_base=10000.0):
                        super().__init__()
                        self.mlp = SwiGLU(d_model, d_hidden)
                        self.mlp_norm = RMSNorm(d_model, eps=norm_eps)
                        self.attn = GroupedQueryAttention(d_model, n_heads, n_kv_heads, rope_base=rope_base)
                        self.attn_norm = RMSNorm(d_model, eps=norm_eps)

                    def forward(self, x, positions=None):
                        if positions is None:
                            positions = torch.arange(x.shape[-2])
                        h = torch.add(x, self.attn(self.attn_norm(x), positions=positions))
                        return torch.add(h, self.mlp(self.mlp_norm(h)))
                """,
        },
        "float64-sqrt-matmul-loop": {
            "RMSNorm": """
                class RMSNorm(nn.Module):
                    def __init__(self, dim, eps=1e-6):
                        super().__init__()
                        self.eps = eps
                        self.weight = nn.Parameter(torch.ones(dim))

                    def forward(self, x):
                        x64 = x.to(torch.float64)
                        rms = torch.sqrt((x64 * x64).sum(dim=-1, keepdim=True) / x.shape[-1] + self.eps)
                        return (x64 / rms * self.weight.to(torch.float64)).to(x.dtype)
                """,
            "SwiGLU": """
                class SwiGLU(nn.Module):
                    def __init__(self, d_model, d_hidden):
                        super().__init__()
                        self.w1 = nn.Linear(d_model, d_hidden, bias=False)
                        self.w3 = nn.Linear(d_model, d_hidden, bias=False)
                        self.w2 = nn.Linear(d_hidden, d_model, bias=False)

                    def forward(self, x):
                        gate = x @ self.w1.weight.T
                        up = x @ self.w3.weight.T
                        return (gate * torch.sigmoid(gate) * up) @ self.w2.weight.T
                """,
            "TransformerBlock": """
                class TransformerBlock(nn.Module):
                    def __init__(self, d_model, n_heads, n_kv_heads, d_hidden, norm_eps=1e-6, rope_base=10000.0):
                        super().__init__()
                        self.attn_norm = RMSNorm(d_model, norm_eps)
                        self.attn = GroupedQueryAttention(d_model, n_heads, n_kv_heads, rope_base)
                        self.mlp_norm = RMSNorm(d_model, norm_eps)
                        self.mlp = SwiGLU(d_model, d_hidden)

                    def forward(self, x, positions=None):
                        sublayers = ((self.attn_norm, lambda h: self.attn(h, positions)), (self.mlp_norm, self.mlp))
                        for norm, sublayer in sublayers:
                            x = x + sublayer(norm(x))
                        return x
                """,
        },
        "torch-functional": {
            "RMSNorm": """
                class RMSNorm(nn.Module):
                    def __init__(self, dim, eps=1e-6):
                        super().__init__()
                        self.eps = eps
                        self.weight = nn.Parameter(torch.ones(dim))

                    def forward(self, x):
                        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
                """,
            "SwiGLU": """
                class SwiGLU(nn.Module):
                    def __init__(self, d_model, d_hidden):
                        super().__init__()
                        self.w1 = nn.Linear(d_model, d_hidden, bias=False)
                        self.w3 = nn.Linear(d_model, d_hidden, bias=False)
                        self.w2 = nn.Linear(d_hidden, d_model, bias=False)

                    def forward(self, x):
                        return self.w2(F.silu(self.w1(x)).mul(self.w3(x)))
                """,
        },
        # A block is judged by what it computes, not by the classes of its parts: torch's own
        # RMSNorm, or a norm and an MLP of the learner's own (other class names, the contract's
        # parameter names), get full marks.
        "torch-rmsnorm": {
            "TransformerBlock": """
                class TransformerBlock(nn.Module):
                    def __init__(self, d_model, n_heads, n_kv_heads, d_hidden, norm_eps=1e-6, rope_base=10000.0):
                        super().__init__()
                        self.attn_norm = nn.RMSNorm(d_model, eps=norm_eps)
                        self.attn = GroupedQueryAttention(d_model, n_heads, n_kv_heads, rope_base)
                        self.mlp_norm = nn.RMSNorm(d_model, eps=norm_eps)
                        self.mlp = SwiGLU(d_model, d_hidden)

                    def forward(self, x, positions=None):
                        x = x + self.attn(self.attn_norm(x), positions)
                        return x + self.mlp(self.mlp_norm(x))
                """,
        },
        "own-norm-and-mlp-classes": {
            "TransformerBlock": """
                class RootMeanSquareNorm(nn.Module):
                    def __init__(self, size, eps):
                        super().__init__()
                        self.eps = eps
                        self.weight = nn.Parameter(torch.ones(size))

                    def forward(self, x):
                        return self.weight * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


                class GatedFeedForward(nn.Module):
                    def __init__(self, d_model, d_hidden):
                        super().__init__()
                        self.w1 = nn.Linear(d_model, d_hidden, bias=False)
                        self.w3 = nn.Linear(d_model, d_hidden, bias=False)
                        self.w2 = nn.Linear(d_hidden, d_model, bias=False)

                    def forward(self, x):
                        return self.w2(F.silu(self.w1(x)) * self.w3(x))


                class TransformerBlock(nn.Module):
                    def __init__(self, d_model, n_heads, n_kv_heads, d_hidden, norm_eps=1e-6, rope_base=10000.0):
                        super().__init__()
                        self.attn_norm = RootMeanSquareNorm(d_model, norm_eps)
                        self.attn = GroupedQueryAttention(d_model, n_heads, n_kv_heads, rope_base)
                        self.mlp_norm = RootMeanSquareNorm(d_model, norm_eps)
                        self.mlp = GatedFeedForward(d_model, d_hidden)

                    def forward(self, x, positions=None):
                        h = x + self.attn(self.attn_norm(x), positions)
                        return h + self.mlp(self.mlp_norm(h))
                """,
        },
    }

    wrong_answers = {
        "RMSNorm": rmsnorm("""
            def forward(self, x):
                return x * self.weight
            """),
        "SwiGLU": swiglu("""
            def forward(self, x):
                return self.w2(self.w1(x))
            """),
        "TransformerBlock": block("""
            def forward(self, x, positions=None):
                return x + self.mlp(self.mlp_norm(x))
            """),
    }


# ---------------------------------------------------------------- the catalogue, without nbgrader


def catalogue():
    for name, exercise in module_for(ASSIGNMENT).EXERCISES.items():
        for index, mistake in enumerate(exercise.mistakes):
            yield pytest.param(name, index, id=f"{name}-{mistake.id}-{index}")


@pytest.mark.parametrize("name, index", list(catalogue()))
def test_each_catalogued_mutant_is_named_as_itself(name, index):
    """Every mutant differs from the reference, and no other mistake is named in its place."""
    ref = reference.load(ASSIGNMENT)
    exercise = module_for(ASSIGNMENT).EXERCISES[name]
    mistake = exercise.mistakes[index]
    message = judge_function(exercise, mistake.mutant(ref), ref, list(exercise.cases(ref)))
    assert message is not None, f"{mistake.id}: no case tells it from the reference"
    assert f"[mistake:{mistake.id}]" in message, message


def test_the_reference_passes_its_own_cases():
    ref = reference.load(ASSIGNMENT)
    for name, exercise in module_for(ASSIGNMENT).EXERCISES.items():
        assert judge_function(exercise, getattr(ref, name), ref) is None
