"""Notebook 03 graded by real nbgrader (each catalogued mistake, correct alternatives,
tampering), and, without nbgrader, the reference against torch.nn.MultiheadAttention,
the catalogue's mutants and the no-loop check."""

import linecache
import math
import textwrap

import pytest
import torch
import torch.nn as nn
from grading_suite import GradingSuite

from autograder import reference
from autograder.exercises import multi_head_attention as catalogue
from course_checks.checks import CheckFailed, check

ASSIGNMENT = "03_multi_head_attention"

INIT = """
class MultiHeadAttention(nn.Module):
    def __init__(self, d_model, n_heads):
        super().__init__()
        self.n_heads = n_heads
        self.d_model = d_model
        self.head_dim = d_model // n_heads
        self.q_proj = nn.Linear(d_model, d_model, bias=False)
        self.k_proj = nn.Linear(d_model, d_model, bias=False)
        self.v_proj = nn.Linear(d_model, d_model, bias=False)
        self.o_proj = nn.Linear(d_model, d_model, bias=False)

    def forward(self, x, mask=None):
"""


def module_with(forward_body: str) -> str:
    """A learner's MultiHeadAttention: the usual __init__, then this forward body."""
    return INIT + textwrap.indent(textwrap.dedent(forward_body).strip("\n"), " " * 8) + "\n"


class TestMultiHeadAttentionGrading(GradingSuite):
    assignment = ASSIGNMENT

    mistakes = {
        "split-reshape-straight": (
            "split_heads",
            """
            def split_heads(x, n_heads):
                B, T, D = x.shape
                return x.view(B, n_heads, T, D // n_heads)
            """,
            "split-no-transpose",
        ),
        "split-strided": (
            "split_heads",
            """
            def split_heads(x, n_heads):
                B, T, D = x.shape
                head_dim = D // n_heads
                return x.view(B, T, head_dim, n_heads).permute(0, 3, 1, 2)
            """,
            "split-heads-strided",
        ),
        "split-forgot-transpose": (
            "split_heads",
            """
            def split_heads(x, n_heads):
                B, T, D = x.shape
                return x.reshape(B, T, n_heads, D // n_heads)
            """,
            "split-transpose-missing",
        ),
        "merge-reshape-straight": (
            "merge_heads",
            """
            def merge_heads(x):
                return x.reshape(x.shape[0], x.shape[2], -1)
            """,
            "merge-no-transpose",
        ),
        "merge-interleaved": (
            "merge_heads",
            """
            def merge_heads(x):
                return x.permute(0, 2, 3, 1).flatten(2)
            """,
            "merge-wrong-order",
        ),
        "merge-view-after-transpose": (
            "merge_heads",
            """
            def merge_heads(x):
                B, H, T, Dh = x.shape
                return x.transpose(1, 2).view(B, T, H * Dh)
            """,
            "merge-view-not-contiguous",
        ),
        "mha-scores-by-sqrt-d-model": (
            "MultiHeadAttention",
            module_with("""
            q = split_heads(self.q_proj(x), self.n_heads)
            k = split_heads(self.k_proj(x), self.n_heads)
            v = split_heads(self.v_proj(x), self.n_heads)
            scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_model)
            if mask is not None:
                scores = scores.masked_fill(~mask, float("-inf"))
            return self.o_proj(merge_heads(torch.softmax(scores, dim=-1) @ v))
            """),
            "scaled-by-sqrt-d-model",
        ),
        "mha-attention-with-extra-factor": (
            "MultiHeadAttention",
            module_with("""
            q = split_heads(self.q_proj(x), self.n_heads)
            k = split_heads(self.k_proj(x), self.n_heads)
            v = split_heads(self.v_proj(x), self.n_heads)
            # attention divides by sqrt(head_dim); the paper says sqrt(d_model)?
            q = q * math.sqrt(self.head_dim) / math.sqrt(self.d_model)
            return self.o_proj(merge_heads(attention(q, k, v, mask)))
            """),
            "scaled-by-sqrt-d-model",
        ),
        "mha-no-output-projection": (
            "MultiHeadAttention",
            module_with("""
            q = split_heads(self.q_proj(x), self.n_heads)
            k = split_heads(self.k_proj(x), self.n_heads)
            v = split_heads(self.v_proj(x), self.n_heads)
            return merge_heads(attention(q, k, v, mask))
            """),
            "no-output-projection",
        ),
        "mha-inline-view-no-transpose": (
            "MultiHeadAttention",
            module_with("""
            B, T, D = x.shape
            q = self.q_proj(x).view(B, self.n_heads, T, self.head_dim)
            k = self.k_proj(x).view(B, self.n_heads, T, self.head_dim)
            v = self.v_proj(x).view(B, self.n_heads, T, self.head_dim)
            return self.o_proj(merge_heads(attention(q, k, v, mask)))
            """),
            "split-no-transpose",
        ),
        "mha-inline-merge-no-transpose": (
            "MultiHeadAttention",
            module_with("""
            B, T, D = x.shape
            q = split_heads(self.q_proj(x), self.n_heads)
            k = split_heads(self.k_proj(x), self.n_heads)
            v = split_heads(self.v_proj(x), self.n_heads)
            out = attention(q, k, v, mask)
            return self.o_proj(out.reshape(B, T, D))
            """),
            "merge-no-transpose",
        ),
        "mha-inline-view-after-transpose": (
            "MultiHeadAttention",
            module_with("""
            B, T, D = x.shape
            q = split_heads(self.q_proj(x), self.n_heads)
            k = split_heads(self.k_proj(x), self.n_heads)
            v = split_heads(self.v_proj(x), self.n_heads)
            out = attention(q, k, v, mask).transpose(1, 2).view(B, T, D)
            return self.o_proj(out)
            """),
            "merge-view-not-contiguous",
        ),
        "mha-mask-like-torch": (
            "MultiHeadAttention",
            module_with("""
            if mask is not None:
                mask = ~mask  # nn.MultiheadAttention: True = masked out
            q = split_heads(self.q_proj(x), self.n_heads)
            k = split_heads(self.k_proj(x), self.n_heads)
            v = split_heads(self.v_proj(x), self.n_heads)
            return self.o_proj(merge_heads(attention(q, k, v, mask)))
            """),
            "mask-polarity",
        ),
        "mha-mask-forgotten": (
            "MultiHeadAttention",
            module_with("""
            q = split_heads(self.q_proj(x), self.n_heads)
            k = split_heads(self.k_proj(x), self.n_heads)
            v = split_heads(self.v_proj(x), self.n_heads)
            return self.o_proj(merge_heads(attention(q, k, v)))
            """),
            "mask-not-passed",
        ),
        # correct numbers, but a Python loop over heads: only test_no_head_loop is lost
        "mha-for-loop-over-heads": (
            "MultiHeadAttention",
            module_with("""
            q = split_heads(self.q_proj(x), self.n_heads)
            k = split_heads(self.k_proj(x), self.n_heads)
            v = split_heads(self.v_proj(x), self.n_heads)
            outputs = []
            for h in range(self.n_heads):
                outputs.append(attention(q[:, h], k[:, h], v[:, h], mask))
            return self.o_proj(merge_heads(torch.stack(outputs, dim=1)))
            """),
            "head-loop",
        ),
        "mha-slices-in-a-comprehension": (
            "MultiHeadAttention",
            module_with("""
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
            d = self.head_dim
            heads = [attention(q[..., h * d:(h + 1) * d], k[..., h * d:(h + 1) * d], v[..., h * d:(h + 1) * d], mask)
                     for h in range(self.n_heads)]
            return self.o_proj(torch.cat(heads, dim=-1))
            """),
            "head-loop",
        ),
    }
    # mistakes graded by another check cell than their exercise's own
    checked_by = {"head-loop": "no_head_loop"}

    alternatives = {
        "permute-einsum-1e9": {
            "split_heads": """
                def split_heads(x, n_heads):
                    B, T, D = x.shape
                    return x.reshape(B, T, n_heads, -1).permute(0, 2, 1, 3)
                """,
            "merge_heads": """
                def merge_heads(x):
                    return x.permute(0, 2, 1, 3).flatten(start_dim=2)
                """,
            "MultiHeadAttention": module_with("""
                H, Dh = self.n_heads, self.head_dim
                q, k, v = (split_heads(p(x), H) for p in (self.q_proj, self.k_proj, self.v_proj))
                scores = torch.einsum("bhtd,bhsd->bhts", q, k) / math.sqrt(Dh)
                if mask is not None:
                    scores = scores.masked_fill(~mask, -1e9)
                weights = scores.softmax(dim=-1)
                return self.o_proj(merge_heads(torch.einsum("bhts,bhsd->bhtd", weights, v)))
                """),
        },
        "view-contiguous-sdpa": {
            "split_heads": """
                def split_heads(x, n_heads):
                    B, T, D = x.shape
                    return x.view(B, T, n_heads, D // n_heads).transpose(1, 2).contiguous()
                """,
            "merge_heads": """
                def merge_heads(x):
                    B, H, T, Dh = x.shape
                    return x.transpose(1, 2).contiguous().view(B, T, H * Dh)
                """,
            "MultiHeadAttention": """
                import torch.nn.functional as F

                class MultiHeadAttention(nn.Module):
                    def __init__(self, d_model, n_heads):
                        super().__init__()
                        assert d_model % n_heads == 0
                        self.n_heads, self.head_dim = n_heads, d_model // n_heads
                        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
                            setattr(self, name, nn.Linear(d_model, d_model, bias=False))

                    def forward(self, x, mask=None):
                        q, k, v = [p(x).unflatten(-1, (self.n_heads, self.head_dim)).movedim(2, 1)
                                   for p in (self.q_proj, self.k_proj, self.v_proj)]
                        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
                        return self.o_proj(out.movedim(1, 2).flatten(2))
                """,
        },
        "split-stack-float64": {
            "split_heads": """
                def split_heads(x, n_heads):
                    head_dim = x.shape[-1] // n_heads
                    return torch.stack(x.split(head_dim, dim=-1), dim=1)
                """,
            "merge_heads": """
                def merge_heads(x):
                    return torch.cat(x.unbind(dim=1), dim=-1)
                """,
            "MultiHeadAttention": module_with("""
                q, k, v = (split_heads(p(x).double(), self.n_heads) for p in (self.q_proj, self.k_proj, self.v_proj))
                out = merge_heads(attention(q, k, v, mask)).to(x.dtype)
                return self.o_proj(out)
                """),
        },
    }

    wrong_answers = {
        "split_heads": """
            def split_heads(x, n_heads):
                B, T, D = x.shape
                return x.reshape(B, n_heads, T, D // n_heads)
            """,
        "merge_heads": """
            def merge_heads(x):
                B, H, T, Dh = x.shape
                return x.reshape(B, T, H * Dh)
            """,
        "MultiHeadAttention": module_with("""
            q, k, v = (split_heads(p(x), self.n_heads) for p in (self.q_proj, self.k_proj, self.v_proj))
            return merge_heads(attention(q, k, v, mask))
            """),
    }

    def exercises(self) -> list[str]:
        """The exercises with answer cells (no_head_loop grades MultiHeadAttention's)."""
        return [name for name, exercise in catalogue.EXERCISES.items() if exercise.target is None]

    def check_of(self, student: str) -> str:
        exercise, _, mistake_id = self.mistakes[student]
        return self.checked_by.get(mistake_id, exercise)

    def test_mistake_loses_only_its_exercise(self, graded, mistake_student):
        scores = graded.scores(mistake_student, self.assignment)
        expected = {**graded.max_scores(self.assignment), f"test_{self.check_of(mistake_student)}": 0.0}
        assert scores == expected

    def test_mistake_is_named_in_feedback(self, graded, mistake_student):
        _, _, mistake_id = self.mistakes[mistake_student]
        mistakes = catalogue.EXERCISES[self.check_of(mistake_student)].mistakes
        names = {m.name for m in mistakes if m.id == mistake_id}
        text = graded.feedback_text(mistake_student, self.assignment)
        assert names and f"[mistake:{mistake_id}]" in text
        assert any(name in text for name in names), names

    def test_loop_feedback_quotes_the_loop(self, graded):
        text = graded.feedback_text("mha-for-loop-over-heads", self.assignment)
        assert "for h in range(self.n_heads):" in text and "MultiHeadAttention.forward" in text


# ---------------------------------------------------------------- without nbgrader


@pytest.fixture(scope="module")
def ref():
    return reference.load(ASSIGNMENT)


def torch_twin(mha: nn.Module, d_model: int, n_heads: int) -> nn.MultiheadAttention:
    twin = nn.MultiheadAttention(d_model, n_heads, bias=False, batch_first=True)
    with torch.no_grad():
        twin.in_proj_weight.copy_(torch.cat([mha.q_proj.weight, mha.k_proj.weight, mha.v_proj.weight]))
        twin.out_proj.weight.copy_(mha.o_proj.weight)
    return twin.to(mha.q_proj.weight.dtype)


@pytest.mark.parametrize(
    "d_model, n_heads, batch, tokens, dtype",
    [
        (8, 2, 1, 3, torch.float32),
        (16, 4, 2, 5, torch.float32),
        (32, 8, 3, 7, torch.float32),
        (12, 3, 2, 4, torch.float64),
        (8, 1, 2, 6, torch.float32),
    ],
)
def test_reference_matches_torch_multihead_attention(ref, d_model, n_heads, batch, tokens, dtype):
    """The reference (hence every hidden check) agrees with torch.nn.MultiheadAttention
    given the same weights, with no mask and with a causal one (torch: True = blocked)."""
    torch.manual_seed(d_model + n_heads)
    mha = ref.MultiHeadAttention(d_model, n_heads).to(dtype)
    twin = torch_twin(mha, d_model, n_heads)
    x = torch.randn(batch, tokens, d_model, dtype=dtype)
    causal = torch.ones(tokens, tokens, dtype=torch.bool).tril()
    tolerance = 1e-6 if dtype == torch.float32 else 1e-12
    with torch.no_grad():
        assert torch.allclose(mha(x), twin(x, x, x, need_weights=False)[0], atol=tolerance)
        assert torch.allclose(mha(x, causal), twin(x, x, x, attn_mask=~causal, need_weights=False)[0], atol=tolerance)
        # and the polarity matters: the unflipped mask gives other numbers
        assert not torch.allclose(mha(x, causal), twin(x, x, x, attn_mask=causal, need_weights=False)[0], atol=1e-3)


def outputs(function, cases):
    results = []
    for case in cases:
        try:
            results.append(case.run(function))
        except Exception as error:  # a mutant that raises, as its mistaken code does
            results.append(error)
    return results


def differs(a, b, exercise) -> bool:
    if isinstance(a, Exception) or isinstance(b, Exception):
        return type(a) is not type(b)
    return any(catalogue_close(x, y, exercise) for x, y in zip(a, b))


def catalogue_close(x, y, exercise) -> bool:
    from autograder.compare import close

    return close(x, y, exercise.atol, exercise.rtol) is not None


@pytest.mark.parametrize("name", ["split_heads", "merge_heads", "MultiHeadAttention"])
def test_every_mutant_differs_from_the_reference_and_from_the_others(ref, name):
    """So that each catalogued mistake is told apart on the checked inputs."""
    exercise = catalogue.EXERCISES[name]
    cases = list(exercise.cases(ref))
    expected = outputs(getattr(ref, name), cases)
    produced = {}
    for mistake in exercise.mistakes:
        got = outputs(mistake.mutant(ref), cases)
        if any(isinstance(g, Exception) for g in got):  # recognised by a property, not by outputs
            assert mistake.id == "merge-view-not-contiguous", mistake.id
            continue
        assert any(catalogue_close(g, e, exercise) for g, e in zip(got, expected)), mistake.id
        produced[mistake.id] = got
    ids = list(produced)
    for i, first in enumerate(ids):
        for second in ids[i + 1 :]:
            assert any(catalogue_close(a, b, exercise) for a, b in zip(produced[first], produced[second])), (
                first,
                second,
            )


# ---------------------------------------------------------------- the no-loop check, in process


def learner_namespace(ref, source: str = "", filename: str = "<cell>") -> dict:
    """A notebook-like namespace: the reference, then the learner's code (with its lines cached,
    as IPython does for cells)."""
    namespace = {"torch": torch, "nn": nn, "math": math, "__name__": "__main__"}
    for name in ("softmax", "attention_weights", "attention", "split_heads", "merge_heads"):
        namespace[name] = getattr(ref, name)
    source = textwrap.dedent(source)
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    exec(compile(source, filename, "exec"), namespace)
    if "MultiHeadAttention" not in namespace:
        exec(compile(catalogue_reference_class(), "<reference class>", "exec"), namespace)
    return namespace


def catalogue_reference_class() -> str:
    return module_with("""
        q = split_heads(self.q_proj(x), self.n_heads)
        k = split_heads(self.k_proj(x), self.n_heads)
        v = split_heads(self.v_proj(x), self.n_heads)
        return self.o_proj(merge_heads(attention(q, k, v, mask)))
        """)


def loop_check(namespace) -> str | None:
    try:
        check(ASSIGNMENT, "no_head_loop", namespace)
    except CheckFailed as failure:
        return str(failure)
    return None


def test_loop_check_passes_loop_free_code_and_loops_over_other_things(ref):
    assert loop_check(learner_namespace(ref)) is None
    over_projections = module_with("""
        q, k, v = [split_heads(p(x), self.n_heads) for p in (self.q_proj, self.k_proj, self.v_proj)]
        for _ in range(2):  # a loop that does not depend on the heads
            q = q * 1.0
        return self.o_proj(merge_heads(attention(q, k, v, mask)))
        """)
    assert loop_check(learner_namespace(ref, over_projections)) is None


def test_loop_check_names_a_loop_in_forward_and_quotes_it(ref):
    source = TestMultiHeadAttentionGrading.mistakes["mha-for-loop-over-heads"][1]
    message = loop_check(learner_namespace(ref, source))
    assert "[mistake:head-loop]" in message
    assert "`for h in range(self.n_heads):` (in `MultiHeadAttention.forward`)" in message


def test_loop_check_finds_a_loop_in_the_learners_split_heads(ref):
    source = (
        textwrap.dedent("""
        def split_heads(x, n_heads):
            d = x.shape[-1] // n_heads
            return torch.stack([x[..., h * d:(h + 1) * d] for h in range(n_heads)], dim=1)
        """)
        + catalogue_reference_class()
    )
    message = loop_check(learner_namespace(ref, source))
    assert "[mistake:head-loop]" in message and "split_heads" in message


def test_loop_check_falls_back_on_the_reference_helpers(ref):
    """A broken merge_heads costs merge_heads' points, not the loop check's."""
    source = textwrap.dedent(TestMultiHeadAttentionGrading.mistakes["merge-view-after-transpose"][1])
    source += catalogue_reference_class()
    assert loop_check(learner_namespace(ref, source)) is None


def test_loop_check_waits_for_an_implementation(ref):
    source = """
        class MultiHeadAttention(nn.Module):
            def __init__(self, d_model, n_heads):
                super().__init__()
                raise NotImplementedError()
        """
    assert "is not implemented yet" in loop_check(learner_namespace(ref, source))


def test_loop_check_cannot_be_switched_off(ref):
    source = module_with("""
        import sys
        sys.settrace(None)
        q, k, v = (split_heads(p(x), self.n_heads) for p in (self.q_proj, self.k_proj, self.v_proj))
        return self.o_proj(merge_heads(attention(q, k, v, mask)))
        """)
    assert "switched off the step counter" in loop_check(learner_namespace(ref, source))


def test_loop_check_reads_the_code_of_a_forward_pass_that_fails(ref):
    """A .view error costs MultiHeadAttention's points; the loop check then reads the syntax tree."""
    failing = TestMultiHeadAttentionGrading.mistakes["mha-inline-view-after-transpose"][1]
    assert loop_check(learner_namespace(ref, failing)) is None
    failing_with_loop = module_with("""
        B, T, D = x.shape
        q, k, v = (split_heads(p(x), self.n_heads) for p in (self.q_proj, self.k_proj, self.v_proj))
        heads = [attention(q[:, h], k[:, h], v[:, h], mask) for h in range(self.n_heads)]
        return self.o_proj(torch.stack(heads, dim=1).transpose(1, 2).view(B, T, D))
        """)
    message = loop_check(learner_namespace(ref, failing_with_loop))
    assert "[mistake:head-loop]" in message and "could not be counted" in message
    assert "for h in range(self.n_heads)" in message


# ---------------------------------------------------------------- the no-loop check's visible part


def visible_loop_check(namespace) -> str:
    """Run the visible half of the notebook's no-loop check cell in ``namespace``: what it prints."""
    import contextlib
    import io
    import json
    from pathlib import Path

    notebook = Path(__file__).resolve().parent.parent / "solutions" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"
    cell = next(
        c
        for c in json.loads(notebook.read_text())["cells"]
        if c.get("metadata", {}).get("nbgrader", {}).get("grade_id") == "test_no_head_loop"
    )
    source = "".join(cell["source"])
    visible = source[source.index("### END HIDDEN TESTS") + len("### END HIDDEN TESTS") :]
    # the self-study line (the grader's diagnosis in a learner's own kernel) is not the visible check
    visible = "\n".join(line for line in visible.splitlines() if "self_assess(" not in line)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(visible, "<test_no_head_loop>", "exec"), namespace)
    return printed.getvalue()


def test_visible_loop_check_passes_a_loop_free_forward(ref):
    assert "the visible check passes" in visible_loop_check(learner_namespace(ref))


def test_visible_loop_check_asks_for_multi_head_attention_first(ref):
    """Unimplemented, there is nothing to count: the check fails and says what to do (it never 'passes')."""
    for unimplemented in ("__init__", "forward"):
        source = (
            module_with("raise NotImplementedError()")
            if unimplemented == "forward"
            else """
            class MultiHeadAttention(nn.Module):
                def __init__(self, d_model, n_heads):
                    super().__init__()
                    raise NotImplementedError()
            """
        )
        with pytest.raises(AssertionError, match="implement MultiHeadAttention first"):
            visible_loop_check(learner_namespace(ref, source))


def test_visible_loop_check_leaves_an_unfinished_helper_to_its_own_check(ref):
    """MultiHeadAttention written, split_heads not: the hidden check judges the forward with the
    reference helpers, so the visible part must not take those points away."""
    source = (
        textwrap.dedent("""
        def split_heads(x, n_heads):
            raise NotImplementedError()
        """)
        + catalogue_reference_class()
    )
    printed = visible_loop_check(learner_namespace(ref, source))
    assert "nothing to count until `split_heads` runs" in printed and "passes" not in printed
    assert loop_check(learner_namespace(ref, source)) is None
