"""The feedback page as the grading worker renders it (``FeedbackPages``, the course's own exporter):
what nbconvert's HTML export adds after its template (an image's stock alternative text) is on the
page, though the page is not parsed again to add it (``compat.page_as_rendered``)."""

from __future__ import annotations

import base64
import contextlib
import html
import re

import nbformat
import pytest
from grading_harness import REPOSITORY
from nbconvert.exporters import HTMLExporter
from nbconvert.filters.highlight import Highlight2HTML
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output
from traitlets.config.loader import PyFileConfigLoader

from autograder import compat
from autograder.worker import feedback
from autograder.worker.feedback import FeedbackPages

# a 1x1 PNG, as a plot's output carries its picture
PIXEL = base64.b64encode(
    bytes.fromhex(
        "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
        "1f15c4890000000d49444154789c6360000002000154a24f5d0000000049454e44ae426082"
    )
).decode()


@pytest.fixture(scope="module")
def pages():
    config = PyFileConfigLoader("nbgrader_config.py", path=str(REPOSITORY)).load_config()
    return FeedbackPages(config)


def graded_notebook() -> str:
    plot = new_code_cell("plot()", execution_count=1)
    plot.outputs = [new_output("display_data", data={"image/png": PIXEL, "text/plain": "<Figure>"})]
    cells = [
        new_markdown_cell("A picture the author described: ![three heads](data:image/png;base64," + PIXEL + ")"),
        plot,
        new_markdown_cell('<img src="data:image/png;base64,' + PIXEL + '" width="4">'),  # markup, no alt
    ]
    return nbformat.writes(new_notebook(cells=cells))


def images(page: str) -> list[str]:
    return re.findall(r"<img\b[^>]*>", page)


def alt_of(tag: str) -> str | None:
    found = re.search(r'\balt="([^"]*)"', tag)
    return found.group(1) if found else None


def test_every_picture_on_the_page_has_its_alternative_text(pages):
    page = pages.render(graded_notebook(), "alice", "01_attention", "01_attention")
    found = images(page)
    assert len(found) == 3, found
    assert [alt_of(tag) for tag in found] == ["three heads", compat.STOCK_ALT, compat.STOCK_ALT]
    assert 'width="4"' in found[2]


def test_the_page_is_nbconverts_own_but_for_its_serialisation(pages, monkeypatch):
    """With nbconvert's after-template pass as it is (the page parsed again with BeautifulSoup), the
    same pictures, texts and text of the page come out."""
    ours = pages.render(graded_notebook(), "alice", "01_attention", "01_attention")
    monkeypatch.setattr(compat, "page_as_rendered", contextlib.nullcontext)
    theirs = pages.render(graded_notebook(), "alice", "01_attention", "01_attention")
    assert [alt_of(tag) for tag in images(ours)] == [alt_of(tag) for tag in images(theirs)]
    text = lambda page: re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", page))).strip()  # noqa: E731
    assert text(ours) == text(theirs)


def test_code_seen_on_an_earlier_page_is_highlighted_as_nbconvert_highlights_it(pages, monkeypatch):
    """The exporter keeps each source's highlighted markup for the next page (most cells of an
    assignment are the same in every submission): the pages come out as nbconvert's highlighter
    makes them, a source in another language (a cell magic's) highlighted as that language."""
    cells = [
        new_code_cell("scores = q @ k.transpose(-2, -1) / d ** 0.5", execution_count=1),
        new_code_cell("echo hi", execution_count=2, metadata={"magics_language": "bash"}),
        new_code_cell("echo hi", execution_count=3),
    ]
    notebook = nbformat.writes(new_notebook(cells=cells))
    first = pages.render(notebook, "alice", "01_attention", "01_attention")
    again = pages.render(notebook, "bob", "01_attention", "01_attention")
    monkeypatch.setattr(feedback.RememberedHighlight, "__call__", Highlight2HTML.__call__)
    config = PyFileConfigLoader("nbgrader_config.py", path=str(REPOSITORY)).load_config()
    stock = FeedbackPages(config).render(notebook, "alice", "01_attention", "01_attention")
    assert first == stock and again.replace("bob", "alice") == stock
    blocks = re.findall(r'<div class="[^"]*highlight[^"]*">.*?</pre>', stock, re.S)
    assert len(blocks) == 3 and blocks[1] != blocks[2]  # bash's tokens, then Python's


def test_markdown_seen_on_an_earlier_page_is_rendered_as_nbconvert_renders_it(pages, monkeypatch):
    """The exporter keeps each Markdown cell's markup for the next page (the released cells are the
    same in every submission): the pages come out as nbconvert's filter makes them, and a cell with
    the same text but other attachments gets its own picture, not the one kept."""

    def notebook(picture: str) -> str:
        cell = new_markdown_cell("The heads: ![heads](attachment:heads.png) and *more* $x^2$")
        cell.attachments = {"heads.png": {"image/png": picture}}
        return nbformat.writes(new_notebook(cells=[cell, new_markdown_cell("# A title")]))

    other = base64.b64encode(b"another picture").decode()
    first = pages.render(notebook(PIXEL), "alice", "01_attention", "01_attention")
    nbconverts = HTMLExporter.markdown2html
    rendered = []

    def counted(self, context, source):
        rendered.append(source)
        return nbconverts(self, context, source)

    monkeypatch.setattr(HTMLExporter, "markdown2html", counted)
    again = pages.render(notebook(PIXEL), "bob", "01_attention", "01_attention")
    assert rendered == []  # both cells kept from the first page
    changed = pages.render(notebook(other), "alice", "01_attention", "01_attention")
    assert len(rendered) == 1  # the cell whose picture changed, alone
    monkeypatch.setattr(HTMLExporter, "markdown2html", nbconverts)
    monkeypatch.setattr(feedback.InertFeedbackExporter, "markdown2html", nbconverts)
    config = PyFileConfigLoader("nbgrader_config.py", path=str(REPOSITORY)).load_config()
    stock = FeedbackPages(config).render(notebook(PIXEL), "alice", "01_attention", "01_attention")
    stock_changed = FeedbackPages(config).render(notebook(other), "alice", "01_attention", "01_attention")
    assert first == stock and again.replace("bob", "alice") == stock
    assert changed == stock_changed and other in changed and PIXEL not in changed


def test_the_notebook_is_validated_once_after_the_preprocessors_and_an_invalid_one_fails(pages, monkeypatch):
    """nbconvert validates after each preprocessor by default (4 here): the course's exporter once,
    after the last; a notebook a preprocessor leaves invalid still fails the page."""
    validated = []
    real = nbformat.validate

    def counted(nb, *args, **kwargs):
        validated.append(1)
        return real(nb, *args, **kwargs)

    node, broken = (nbformat.reads(graded_notebook(), as_version=4) for _ in range(2))
    monkeypatch.setattr(nbformat, "validate", counted)
    pages.exporter.from_notebook_node(node, resources=resources_for())
    assert len(validated) == 1

    def breaks(nb, resources):
        nb.cells[0]["source"] = 1  # a number: not a string, as the schema says
        return nb, resources

    pages.exporter.register_preprocessor(breaks, enabled=True)
    try:
        with pytest.raises(nbformat.ValidationError):
            pages.exporter.from_notebook_node(broken, resources=resources_for())
    finally:
        pages.exporter._preprocessors.remove(breaks)


def resources_for() -> dict:
    """What ``FeedbackPages.render`` gives the exporter."""
    return {
        "unique_key": "01_attention",
        "output_files_dir": "01_attention_files",
        "nbgrader": {
            "student": "alice",
            "assignment": "01_attention",
            "notebook": "01_attention",
            "db_url": None,
            "grades": {},
            "comments": {},
        },
    }
