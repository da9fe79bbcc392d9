"""The widgets' one door to matplotlib's, ipympl's and torch's private parts, and the versions it was written for.

The fast redraw (``base.Explorer``) needs to know every text an axes can draw and the tick
labels it would draw now, the ipympl canvas needs its own way of sending a frame drawn before the page is
ready, and notebook 09's memory count needs to see every tensor an operation creates (torch's dispatch
modes): none of which has a public API. ``tests/test_compat.py`` fails, naming the package, as soon
as an installed version differs from ``WRITTEN_FOR``.
"""

from __future__ import annotations

import base64
import io
import json
import types

import numpy as np
import PIL.Image
from torch.utils._python_dispatch import TorchDispatchMode

# package -> the version whose private parts this module was written against
WRITTEN_FOR = {"matplotlib": "3.11.2", "ipympl": "0.10.0", "torch": "2.13.0"}

# The base class of a mode that sees every ATen operation with its results (torch's own FLOP
# counter, torch.utils.flop_counter, is one): ``__torch_dispatch__(func, types, args, kwargs)``.
TensorDispatchMode = TorchDispatchMode


def axes_titles(axes) -> tuple:
    """The three titles an axes draws (centre, left, right): only the centre one has an attribute."""
    return axes.title, axes._left_title, axes._right_title


def tick_labels(axis) -> list[str]:
    """The major tick labels ``axis`` would draw for its current limits."""
    return [tick.label1.get_text() for tick in axis._update_ticks()]


def send_frames_as_png(canvas) -> None:
    """Make ``canvas`` (an ipympl ``Canvas``) send every frame as the PNG it was given (``_send_frame``)."""
    canvas.send_binary = types.MethodType(_send_frame, canvas)


def _send_frame(canvas, png: bytes) -> None:
    """ipympl 0.10's ``Canvas.send_binary`` without its bug for early frames.

    A frame drawn before the page's view of the canvas has said "initialized" (an early frame)
    is also kept as the canvas's ``_data_url``, for a view made later; ipympl keeps it as bare
    base64, and then sends the frame's raw RGBA pixels instead of the PNG it was given. The page
    cannot decode those: its image is left "broken", the resize that follows fails on it (the
    page's drawImage throws), and the view keeps its first size, 0 x 0, for good. Early frames
    happen when the kernel draws before it has read the page's "initialized": on a busy machine
    under Run All (notebook 07's attention maps, in about half the runs at load 10). Here the PNG
    is sent, and the copy is a data: URL of the whole picture.
    """
    if canvas.syncing_data_url:
        pixels = canvas._last_buff.view(np.uint8).reshape((*canvas._last_buff.shape, 4))
        with io.BytesIO() as picture:
            PIL.Image.fromarray(pixels).save(picture, format="png")
            canvas._data_url = "data:image/png;base64," + base64.b64encode(picture.getvalue()).decode("ascii")
    canvas.send({"data": json.dumps({"type": "binary"})}, buffers=[png])
