"""Notebook 00 graded by real nbgrader: the warm-up exercise."""

from grading_suite import GradingSuite


class TestStartHereGrading(GradingSuite):
    assignment = "00_start_here"

    mistakes = {
        "keys-first": (
            "dot_scores",
            """
            def dot_scores(q, k):
                return (k @ q.transpose(-2, -1))
            """,
            "keys-times-queries",
        ),
    }

    alternatives = {
        "einsum": {
            "dot_scores": """
            def dot_scores(q, k):
                return torch.einsum("...td,...sd->...ts", q, k)
            """
        },
        "broadcast-sum": {
            "dot_scores": """
            def dot_scores(q, k):
                return (q.unsqueeze(-2) * k.unsqueeze(-3)).sum(dim=-1)
            """
        },
        "float64-matmul": {
            "dot_scores": """
            def dot_scores(q, k):
                return torch.matmul(q.double(), k.double().mT)
            """
        },
    }

    wrong_answers = {
        "dot_scores": """
        def dot_scores(q, k):
            return torch.zeros(*q.shape[:-1], k.shape[-2])
        """
    }
