"""What the local pool's fork server imports once, before it forks any grading process.

Every pool process is forked from that server (``runners.LocalPool``), so the
memory of these imports (torch, the executor, nbgrader's preprocessors and the
feedback exporter: about 200 MB) is shared by all of them instead of copied
into each. ``gc.freeze()`` moves what is loaded now out of the collector's
reach: a collection in a pool process would otherwise write to every object's
header and so copy the pages it meant to share.
"""

import gc

import torch  # noqa: F401

from ..judging import feedback, judge  # noqa: F401
from ..sandboxing import execute  # noqa: F401

gc.freeze()
