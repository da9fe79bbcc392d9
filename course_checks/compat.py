"""The kernel side's one door to IPython's and torch's private parts, and the versions it was written for.

``tests/test_compat.py`` fails, naming the package, as soon as an installed version differs
from ``WRITTEN_FOR``.
"""

from __future__ import annotations

# package -> the version whose private parts this module was written against
WRITTEN_FOR = {"ipython": "9.18.1", "ipykernel": "7.4.0", "torch": "2.13.0"}


def show_error(shell, etype, value, lines: list[str]) -> None:
    """Show an error in the notebook as ``lines`` instead of its traceback: the error message
    ipykernel sends (its ``_showtraceback``), so the cell still counts as failed."""
    shell._showtraceback(etype, value, lines)


def tensor_base():
    """torch's C base class of ``Tensor``, whose methods a tensor method resolves to."""
    import torch  # here: the grade command's process reads this module without torch

    return torch._C.TensorBase
