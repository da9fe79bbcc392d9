"""What the local pool's fork server imports once, before it forks any grading process.

Every pool process is forked from that server (``runners.LocalPool``), so the
memory of these imports (torch, the executor, nbgrader's preprocessors and the
feedback exporter) is shared by all of them instead of copied
into each. It also imports what grading a first notebook would otherwise import
in each process (IPython's cell transformer for the tamper scan the most of it,
then the feedback page's Markdown plugins and code highlighting).
``gc.freeze()`` moves what is loaded now out of the collector's reach: a
collection in a pool process would otherwise write to every object's header
and so copy the pages it meant to share.

Each process the server forks starts its referees' factory first thing, while it
still has one thread (``referee.start_factory``): a Dask worker process (the same
preload, ``dask_nanny``) has started threads of its own before any of the grader's
code runs in it, and its referees would otherwise be fresh interpreters.
"""

import codeop  # noqa: F401
import gc
import os

import IPython.core.inputtransformer2  # noqa: F401
import jinja2.ext  # noqa: F401
import mistune.plugins.def_list  # noqa: F401
import mistune.plugins.task_lists  # noqa: F401
import mistune.plugins.url  # noqa: F401
import pygments.lexers.python  # noqa: F401
import pygments.styles.default  # noqa: F401
import torch  # noqa: F401
import torch.fx.experimental.symbolic_shapes  # noqa: F401  (torch.broadcast_shapes' first call: sympy)

from ..worker import (
    pipeline,  # noqa: F401  (the judge, the executor, the feedback exporter)
    referee,
)

_SERVER = os.getpid()


def _start_referee_factory() -> None:
    if os.getppid() == _SERVER:  # a process this server forked, not one of that process's own forks
        referee.start_factory()


os.register_at_fork(after_in_child=_start_referee_factory)
gc.freeze()
