"""Small plotting helpers shared by the widgets and the notebooks."""

from __future__ import annotations

import math

import torch


def heatmap(axes, values, x_labels, y_labels, vmin=None, vmax=None, cmap="viridis", fmt=None):
    """Draw ``values`` (rows, cols) as an image with labelled ticks.

    Returns the image (update it with ``set_data``) and, when ``fmt`` is given,
    a dict {(row, col): text} of per-cell labels to update with ``set_text``.
    """
    values = torch.as_tensor(values, dtype=torch.float64)
    image = axes.imshow(values.numpy(), vmin=vmin, vmax=vmax, cmap=cmap, aspect="auto")
    axes.set_xticks(range(values.shape[1]), x_labels, rotation=30, ha="right")
    axes.set_yticks(range(values.shape[0]), y_labels)
    texts = {}
    if fmt is not None:
        for row in range(values.shape[0]):
            for col in range(values.shape[1]):
                texts[row, col] = axes.text(
                    col,
                    row,
                    fmt.format(float(values[row, col])),
                    ha="center",
                    va="center",
                    color="white",
                    fontsize=9,
                )
    return image, texts


def nice_ceiling(x: float) -> float:
    """The smallest of 1, 2, 5, 10, 20, 50, ... (times a power of ten) that is at
    least ``x``. An axis limit rounded up this way changes only now and then, so
    a widget's update redraws its data alone instead of the whole figure."""
    if x <= 0:
        return 1.0
    power = 10.0 ** math.floor(math.log10(x))
    return next(step * power for step in (1, 2, 5, 10) if step * power >= x * (1 - 1e-12))
