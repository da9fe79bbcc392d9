"""The grader's one door to other packages' private parts, and the versions it was written for.

Everything the grader needs from nbgrader, nbclient, jupyter_client and jsonschema that their
public APIs do not offer is reached here, and only here; the rest of the grader uses the names
below. When one of those packages changes, this is the file to read again:
``tests/test_compat.py`` fails, naming the package, as soon as an installed version differs
from ``WRITTEN_FOR`` (which must also be the version the locks pin).
"""

from __future__ import annotations

import sys
import threading
from contextlib import contextmanager

# First, before anything imports nbformat: jsonschema (under nbformat) checks the "iri" string
# format with rfc3987-syntax when that is installed (Jupyter's event schemas pull it in), and
# importing it compiles 38 grammars: seconds in every process of the grade command, before it
# grades anything. Notebook schemas use no such format, so the grader's processes go without it
# (jsonschema treats a module it cannot import as absent, and skips that one check).
sys.modules.setdefault("rfc3987_syntax", None)

import nbconvert.exporters.html as _nbconvert_html  # noqa: E402
from jupyter_client.manager import AsyncKernelManager  # noqa: E402
from nbgrader.preprocessors import Execute  # noqa: E402

# package -> the version whose private parts this module was written against
WRITTEN_FOR = {
    "nbgrader": "0.9.6",
    "nbclient": "0.11.0",
    "jupyter-client": "8.10.0",
    "jsonschema": "4.26.0",
    "nbconvert": "7.17.2",
}


class ForkedKernelManager(AsyncKernelManager):
    """A kernel manager whose kernel some other process starts (a warm sandbox forks it).

    A subclass implements ``start``, ``alive``, ``interrupt``, ``shutdown`` and ``cleanup``
    (coroutines); jupyter_client calls both its public entry points and their underscored
    async twins, so both names lead to them here.
    """

    async def start(self, **kwargs) -> None:
        raise NotImplementedError

    async def alive(self) -> bool:
        raise NotImplementedError

    async def interrupt(self) -> None:
        raise NotImplementedError

    async def shutdown(self) -> None:
        raise NotImplementedError

    async def cleanup(self) -> None:
        raise NotImplementedError

    async def _async_start_kernel(self, **kwargs) -> None:  # type: ignore[override]
        await self.start(**kwargs)

    async def _async_is_alive(self) -> bool:  # type: ignore[override]
        return await self.alive()

    async def _async_interrupt_kernel(self) -> None:  # type: ignore[override]
        await self.interrupt()

    async def _async_shutdown_kernel(self, now: bool = False, restart: bool = False) -> None:  # type: ignore[override]
        await self.shutdown()

    async def _async_cleanup_resources(self, restart: bool = False) -> None:  # type: ignore[override]
        await self.cleanup()

    start_kernel = _async_start_kernel
    is_alive = _async_is_alive
    interrupt_kernel = _async_interrupt_kernel
    shutdown_kernel = _async_shutdown_kernel
    cleanup_resources = _async_cleanup_resources


class ObservedExecute(Execute):
    """nbgrader's ``Execute`` (nbclient's ``NotebookClient``) telling its subclass what its public
    hooks do not: that a cell timed out (``timed_out``), and each update of an existing display
    (``display_update``, which may refuse it)."""

    def timed_out(self, cell) -> None:
        """A cell ran past its time limit (nbclient interrupts it next)."""

    def display_update(self, display_id, msg) -> bool:
        """Whether an update of display ``display_id`` may land (default: yes)."""
        return True

    async def _async_handle_timeout(self, timeout, cell=None):
        self.timed_out(cell)
        return await super()._async_handle_timeout(timeout, cell)

    def _update_display_id(self, display_id, msg):
        if not self.display_update(display_id, msg):
            return None
        return super()._update_display_id(display_id, msg)

    def cells_showing(self, display_id) -> list[int]:
        """The indices of the cells that show display ``display_id``."""
        return list(self._display_id_map.get(display_id, {}))


def accept_kernel_info(client, reply) -> None:
    """Let a kernel client take a ``kernel_info_reply`` it did not wait for itself (its language,
    protocol version), as its own ``wait_for_ready`` would."""
    client._handle_kernel_info_reply(reply)


def late_penalty(late, notebook, student: str, seconds_late: float):
    """nbgrader's ``AssignLatePenalties`` applied to one gradebook notebook: its plugin's penalty for
    a submission ``seconds_late`` late, kept within the notebook's score; None when none applies."""
    penalty = late.plugin_inst.late_submission_penalty(student, notebook.score, seconds_late)
    return None if penalty is None else late._check_late_penalty(notebook, penalty)


# nbconvert's ``HTMLExporter.from_notebook_node`` parses its finished page once more with
# BeautifulSoup (``html.parser``), the name ``BeautifulSoup`` of ``nbconvert.exporters.html``, to
# give each ``<img>`` without ``alt`` a stock one and the lab template's cells a ``tabindex``, then
# serialises the page again: about 70% of rendering a feedback page (0.2-0.5 s a notebook). The
# feedback page needs neither: nbgrader's template is the classic one (no lab cells), and the page's
# body, where every picture is, goes through the allow-list, which gives the stock alt text itself
# (``feedback.inert_body``). Inside ``page_as_rendered`` that name hands back the page as rendered.
STOCK_ALT = "No description has been provided for this image"  # nbconvert's own words
_as_rendered = threading.local()


class _PageAsRendered:
    """What nbconvert's after-template pass uses of a parsed page: ``select`` (nothing to change) and
    ``str`` (the page as it came)."""

    def __init__(self, markup: str):
        self.markup = markup

    def select(self, selector: str) -> list:
        return []

    def __str__(self) -> str:
        return self.markup


def _soup_or_page(markup, *args, **kwargs):
    if getattr(_as_rendered, "on", False):
        return _PageAsRendered(markup)
    return _BeautifulSoup(markup, *args, **kwargs)


_BeautifulSoup = _nbconvert_html.BeautifulSoup
_nbconvert_html.BeautifulSoup = _soup_or_page  # other exporters, and other threads, parse as before


@contextmanager
def page_as_rendered():
    """In this thread, nbconvert's HTML export keeps its page as its template rendered it."""
    before = getattr(_as_rendered, "on", False)
    _as_rendered.on = True
    try:
        yield
    finally:
        _as_rendered.on = before
