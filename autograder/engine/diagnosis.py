"""The pages the watcher hands back besides the full feedback page (``engine.watch``).

- ``diagnosis_page``: the course's feedback page (nbgrader's layout, made inert by
  ``worker.feedback``) without its points: every check's outcome and message stay, the
  notebook's score, each cell's score and a late penalty go, and the heading says when the
  points come. It is made from the full page's own elements (nbgrader's ``feedback`` template:
  the heading ``h4``, the ``#toc`` list, each cell's ``span.pull-right``), so nothing a
  submission printed is touched, and the result stays as inert as the page it came from.
- ``one_line_page``: for a submission the grader itself failed on, twice: one sentence, with the
  policy that runs no script.
"""

from __future__ import annotations

import html
import re

from bs4 import BeautifulSoup

from ..worker.feedback import CONTENT_SECURITY_POLICY

SCORE = re.compile(r"\s*\(?Score:\s*-?[0-9.]+\s*(/\s*[0-9.]+)?\s*\)?\s*")


def diagnosis_page(full_page: str, when: str) -> str:
    """``full_page`` without points; its heading says the points come ``when`` (e.g. "after the due date")."""
    soup = BeautifulSoup(full_page, "html.parser")
    heading = soup.select_one("div.panel-heading h4")
    if heading is not None:
        notebook = SCORE.sub("", heading.get_text()).strip()
        heading.string = f"{notebook}: what the checks found (points {when})"
    for item in soup.select("#toc li"):
        if "late-penalty" in (item.get("class") or []):
            item.decompose()
            continue
        for text in item.find_all(string=SCORE):
            text.replace_with(SCORE.sub(" ", text).rstrip())
    for label in soup.select("div.panel-heading span.pull-right"):
        for text in label.find_all(string=SCORE):
            text.replace_with(SCORE.sub(" ", text))
    return str(soup)


def one_line_page(notebook: str, reason: str) -> str:
    """A page that says only why the submission was not graded."""
    return (
        "<!DOCTYPE html><html><head><meta charset='utf-8'>"
        f'<meta http-equiv="Content-Security-Policy" content="{CONTENT_SECURITY_POLICY}">'
        f"<title>{html.escape(notebook)}</title></head><body>"
        f"<p>This submission of {html.escape(notebook)} could not be graded: {html.escape(reason)}. "
        "Your instructor has been told; submitting again grades it again.</p></body></html>"
    )
