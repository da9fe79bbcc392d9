"""Notebook 00: the warm-up exercise dot_scores.

Tolerance: a single matrix product of float32 values of order 1; any correct
ordering (einsum, matmul, a sum of products, float64) agrees to about 1e-6.
"""

import torch

from .catalogue import Case, Exercise, Mistake

ASSIGNMENT = "00_start_here"


def dot_scores_cases(ref):
    g = torch.Generator().manual_seed(7)
    yield Case(
        "2 queries and 3 keys of size 2 (the example)",
        (torch.tensor([[1.0, 0.0], [0.0, 1.0]]), torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])),
    )
    yield Case("4 queries and 6 keys of size 8", (torch.randn(4, 8, generator=g), torch.randn(6, 8, generator=g)))
    yield Case(
        "a batch (3, 2, 5) of queries and (3, 4, 5) of keys",
        (torch.randn(3, 2, 5, generator=g), torch.randn(3, 4, 5, generator=g)),
    )
    yield Case(
        "heads (2, 2, 3, 4) against (2, 2, 3, 4)",
        (torch.randn(2, 2, 3, 4, generator=g), torch.randn(2, 2, 3, 4, generator=g)),
    )
    yield Case(
        "float64, 3 queries and 3 keys of size 6",
        (torch.randn(3, 6, generator=g, dtype=torch.float64), torch.randn(3, 6, generator=g, dtype=torch.float64)),
    )


def _swapped(ref):
    return lambda q, k: ref.dot_scores(k, q)


EXERCISES = {
    "dot_scores": Exercise(
        "dot_scores",
        dot_scores_cases,
        atol=1e-5,
        mistakes=[
            Mistake(
                "keys-times-queries",
                "the table is transposed: keys against queries",
                "Entry [t, s] is q[t] · k[s]: compute q @ k.transpose(-2, -1), with queries on the left.",
                _swapped,
            ),
        ],
    ),
}
