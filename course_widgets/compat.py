"""The widgets' one door to matplotlib's and traitlets' private parts, and the versions it was written for.

The fast redraw (``base.Explorer``) needs to know every text an axes can draw and the tick
labels it would draw now, and the ipympl canvas needs a validator on one of its traits:
none of which has a public API. ``tests/test_compat.py`` fails, naming the package, as soon
as an installed version differs from ``WRITTEN_FOR``.
"""

from __future__ import annotations

# package -> the version whose private parts this module was written against
WRITTEN_FOR = {"matplotlib": "3.11.2", "traitlets": "5.16.1", "ipympl": "0.10.0"}


def axes_titles(axes) -> tuple:
    """The three titles an axes draws (centre, left, right): only the centre one has an attribute."""
    return axes.title, axes._left_title, axes._right_title


def tick_labels(axis) -> list[str]:
    """The major tick labels ``axis`` would draw for its current limits."""
    return [tick.label1.get_text() for tick in axis._update_ticks()]


def validate_trait(owner, name: str, function) -> None:
    """Run ``function(owner, proposal)`` whenever trait ``name`` of ``owner`` is set (one object,
    not its class: traitlets' ``@validate`` decorates classes only)."""
    owner._register_validator(function, [name])
