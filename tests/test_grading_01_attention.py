"""Notebook 01 graded by real nbgrader: each catalogued mistake, correct alternatives, tampering."""

from grading_suite import GradingSuite


class TestAttentionGrading(GradingSuite):
    assignment = "01_attention"

    mistakes = {
        "softmax-no-max": (
            "softmax",
            """
            def softmax(x, dim=-1):
                e = torch.exp(x)
                return e / e.sum(dim=dim, keepdim=True)
            """,
            "softmax-no-max-subtraction",
        ),
        "softmax-axis-0": (
            "softmax",
            """
            def softmax(x, dim=-1):
                shifted = x - x.max(dim=0, keepdim=True).values
                e = shifted.exp()
                return e / e.sum(dim=0, keepdim=True)
            """,
            "softmax-wrong-axis",
        ),
        "softmax-last-axis-always": (
            "softmax",
            """
            def softmax(x, dim=-1):
                e = torch.exp(x - x.max(-1, keepdim=True).values)
                return e / e.sum(-1, keepdim=True)
            """,
            "softmax-ignores-dim",
        ),
        "weights-no-sqrt": (
            "attention_weights",
            """
            def attention_weights(q, k, mask=None):
                scores = q @ k.transpose(-2, -1)
                if mask is not None:
                    scores = scores.masked_fill(~mask, float("-inf"))
                return softmax(scores)
            """,
            "no-sqrt-d",
        ),
        "weights-divided-by-d": (
            "attention_weights",
            """
            def attention_weights(q, k, mask=None):
                scores = q @ k.transpose(-2, -1) / q.shape[-1]
                if mask is not None:
                    scores = scores.masked_fill(~mask, float("-inf"))
                return softmax(scores)
            """,
            "scaled-by-d",
        ),
        "weights-mask-after-softmax": (
            "attention_weights",
            """
            def attention_weights(q, k, mask=None):
                weights = softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]))
                if mask is not None:
                    weights = weights * mask
                return weights
            """,
            "mask-after-softmax",
        ),
        "weights-mask-inverted": (
            "attention_weights",
            """
            def attention_weights(q, k, mask=None):
                scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
                if mask is not None:
                    scores = scores.masked_fill(mask, -1e9)
                return softmax(scores)
            """,
            "mask-polarity",
        ),
        "weights-mask-ignored": (
            "attention_weights",
            """
            def attention_weights(q, k, mask=None):
                return softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]))
            """,
            "mask-ignored",
        ),
        "weights-softmax-over-queries": (
            "attention_weights",
            """
            def attention_weights(q, k, mask=None):
                scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
                if mask is not None:
                    scores = scores.masked_fill(~mask, float("-inf"))
                return softmax(scores, dim=-2)
            """,
            "softmax-over-queries",
        ),
        "attention-mask-dropped": (
            "attention",
            """
            def attention(q, k, v, mask=None):
                return attention_weights(q, k) @ v
            """,
            "attention-mask-not-passed",
        ),
        "attention-mask-inverted": (
            "attention",
            """
            def attention(q, k, v, mask=None):
                if mask is not None:
                    mask = ~mask
                return attention_weights(q, k, mask) @ v
            """,
            "mask-polarity",
        ),
        "attention-raw-scores": (
            "attention",
            """
            def attention(q, k, v, mask=None):
                d = q.shape[-1]
                return (q @ k.transpose(-2, -1) / math.sqrt(d)) @ v
            """,
            "scores-times-values",
        ),
    }

    alternatives = {
        "einsum-float64-1e9": {
            "softmax": """
                def softmax(x, dim=-1):
                    x64 = x.double()
                    e = torch.exp(x64 - torch.max(x64, dim=dim, keepdim=True).values)
                    return (e / torch.sum(e, dim=dim, keepdim=True)).to(x.dtype)
                """,
            "attention_weights": """
                def attention_weights(q, k, mask=None):
                    scores = torch.einsum("...td,...sd->...ts", q.double(), k.double()) / q.shape[-1] ** 0.5
                    if mask is not None:
                        scores = torch.where(mask, scores, torch.tensor(-1e9, dtype=scores.dtype))
                    return softmax(scores)
                """,
            "attention": """
                def attention(q, k, v, mask=None):
                    weights = attention_weights(q, k, mask)
                    return torch.einsum("...ts,...sd->...td", weights.to(v.dtype), v)
                """,
        },
        "logsumexp-matmul": {
            "softmax": """
                def softmax(x, dim=-1):
                    return torch.exp(x - torch.logsumexp(x, dim=dim, keepdim=True))
                """,
            "attention_weights": """
                def attention_weights(q, k, mask=None):
                    d = q.size(-1)
                    scores = torch.matmul(q / math.sqrt(d), k.transpose(-1, -2))
                    if mask is not None:
                        scores = scores.masked_fill(mask.logical_not(), -math.inf)
                    return softmax(scores, dim=-1)
                """,
            "attention": """
                def attention(q, k, v, mask=None):
                    weights = attention_weights(q, k, mask=mask)
                    return torch.matmul(weights, v)
                """,
        },
        "torch-functional": {
            "softmax": """
                import torch.nn.functional as F

                def softmax(x, dim=-1):
                    return F.softmax(x, dim=dim)
                """,
            "attention_weights": """
                def attention_weights(q, k, mask=None):
                    scale = 1.0 / math.sqrt(q.shape[-1])
                    scores = (q * scale) @ k.mT
                    if mask is not None:
                        scores = scores + torch.zeros_like(scores).masked_fill(~mask, float("-inf"))
                    return softmax(scores)
                """,
            "attention": """
                def attention(q, k, v, mask=None):
                    out = attention_weights(q, k, mask).unsqueeze(-1) * v.unsqueeze(-3)
                    return out.sum(dim=-2)
                """,
        },
    }

    wrong_answers = {
        "softmax": """
            def softmax(x, dim=-1):
                return torch.ones_like(x) / x.shape[dim]
            """,
        "attention_weights": """
            def attention_weights(q, k, mask=None):
                return torch.ones(*q.shape[:-1], k.shape[-2]) / k.shape[-2]
            """,
        "attention": """
            def attention(q, k, v, mask=None):
                return v.mean(dim=-2, keepdim=True).expand(*q.shape[:-1], v.shape[-1])
            """,
    }
