"""Comparing a learner's outputs with the reference (autograder/compare.py)."""

from __future__ import annotations

import torch

from autograder import compare


def test_the_judge_checks_the_kind_before_the_values():
    real = torch.softmax(torch.randn(3, 4), dim=-1)
    assert compare.close(torch.complex(real, torch.ones_like(real)), real, 1e-6, 1e-5).startswith("returned complex")
    assert "integer" in compare.close(torch.ones(3, dtype=torch.int64), torch.ones(3), 1e-6, 1e-5)
    assert compare.close(real.double(), real, 1e-6, 1e-5) is None  # a wider float is the same kind
    assert compare.close(1 + 2j, 1.0, 1e-6, 1e-5) is not None
