"""The kernel side's one door to IPython's and torch's private parts, and the versions it was written for.

``tests/test_compat.py`` fails, naming the package, as soon as an installed version differs
from ``WRITTEN_FOR``.
"""

from __future__ import annotations

# package -> the version whose private parts this module was written against
WRITTEN_FOR = {"ipython": "9.18.1", "ipykernel": "7.4.0", "torch": "2.13.0"}


# What a cell runs through on the shell, its kernel and their session, and how its error is shown
# (IPython's and ipykernel's own methods): a notebook that swaps one can make a cell that failed (a
# check stopped, a visible assert) report success with no error. ``trusted`` watches them in the
# kernel; the grader's static scan (``autograder.worker.tamper``) flags code that assigns them.
SHELL_METHODS = {
    "shell": (
        "run_cell",
        "run_cell_async",
        "run_code",
        "run_ast_nodes",
        "showtraceback",
        "_showtraceback",
        "showsyntaxerror",
        "set_custom_exc",
        "transform_cell",
    ),
    "kernel": ("do_execute", "execute_request", "send_response", "shell_handlers"),
    "session": ("send",),
}


def show_error(shell, etype, value, lines: list[str]) -> None:
    """Show an error in the notebook as ``lines`` instead of its traceback: the error message
    ipykernel sends (its ``_showtraceback``), so the cell still counts as failed."""
    shell._showtraceback(etype, value, lines)


def tensor_base():
    """torch's C base class of ``Tensor``, whose methods a tensor method resolves to."""
    import torch  # here: the grade command's process reads this module without torch

    return torch._C.TensorBase
