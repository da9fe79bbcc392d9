"""Feedback pages: inert, and without hidden test code.

nbgrader's feedback shows every cell's source and its full traceback, hidden
tests included (nbgrader issue #917), and an IPython traceback quotes the lines
around the failing one. ``HideHiddenTests`` runs in ``generate_feedback`` (see
``nbgrader_config.py``): in every graded cell it replaces the hidden region by
one comment line and reduces each error to its name and message, which the
checks write for the learner; and any output that shows a line of hidden test
code (a cell that printed the kernel's current request, say) is withheld.

nbconvert's HTML export keeps a submission's markup live: a ``<script>`` in a
markdown cell, an ``<img onerror>``, HTML and JavaScript outputs run when the
page is opened. Two layers make a page inert, both on nh3 (the ammonia
sanitizer) with one allow-list (``inert_html``):

- ``inert_notebook`` (a step of the grading pipeline) keeps the graded notebook
  itself to the allow-list: the markdown and raw cells the release did not have,
  and every output (HTML sanitized, markdown rendered then sanitized, JavaScript,
  SVG and other kinds dropped). nbgrader's formgrader shows the instructor this
  notebook.
- The feedback page's template (``templates/inert_feedback``, which
  ``InertFeedbackExporter`` wraps around nbgrader's: ``FeedbackPages`` always
  uses it, ``nbgrader_config.py`` makes ``nbgrader generate_feedback`` use it) sanitizes
  the whole page body once more and puts a Content-Security-Policy first in the
  page's head: no script runs at all, none of the page's own either (MathJax is
  left out: formulas show as their TeX source), and nothing is fetched from
  elsewhere.
"""

import collections
import functools
import html
import json
import re
from pathlib import Path

import jinja2
import nbformat
import nbgrader
import nh3
from nbconvert.exporters import HTMLExporter
from nbconvert.filters.highlight import Highlight2HTML
from nbconvert.filters.markdown_mistune import markdown2html_mistune
from nbconvert.preprocessors import Preprocessor
from nbformat.v4 import new_output
from nbgrader import utils
from nbgrader.converters import GenerateFeedback
from nbgrader.coursedir import CourseDirectory
from nbgrader.preprocessors import NbGraderPreprocessor
from traitlets import Bool, Unicode

from .. import compat
from ..cells import nbgrader_of
from .read import released_notebook

HIDDEN_NOTICE = "# (hidden checks run here; their messages appear below)"


def strip_hidden(source: str, begin: str = "BEGIN HIDDEN TESTS", end: str = "END HIDDEN TESTS"):
    """(source without the hidden region, whether there was one)."""
    kept, inside, found = [], False, False
    for line in source.split("\n"):
        if begin in line:
            inside, found = True, True
            kept.append(HIDDEN_NOTICE)
        elif end in line:
            inside = False
        elif not inside:
            kept.append(line)
    return "\n".join(kept), found


WITHHELD = "(this output is withheld from the feedback: it shows hidden test code)"
SHORTEST_SECRET = 16  # letters and digits: a hidden line shorter than this could be anyone's output


def _letters(text: str) -> str:
    """Only the letters and digits of ``text``, lowercase, entities decoded: the same code printed
    plainly, as a repr, escaped for JSON or HTML, or with other spacing, gives the same string."""
    return re.sub(r"[^0-9a-z]+", "", html.unescape(text).lower())


def hidden_lines(nb, begin: str = "BEGIN HIDDEN TESTS", end: str = "END HIDDEN TESTS") -> set[str]:
    """The lines of the notebook's hidden test regions, as ``_letters`` gives them (the long ones)."""
    found, inside = set(), False
    for cell in nb.cells:
        if cell.get("cell_type") != "code":
            continue
        for line in cell.source.split("\n"):
            if begin in line:
                inside = True
            elif end in line:
                inside = False
            elif inside and len(_letters(line)) >= SHORTEST_SECRET:
                found.add(_letters(line))
        inside = False
    return found


def output_text(output) -> str:
    """Everything an output shows, as text."""
    parts = [str(output.get(key, "")) for key in ("text", "ename", "evalue")]
    parts += [str(line) for line in output.get("traceback", [])]
    for value in output.get("data", {}).values():
        parts.append(value if isinstance(value, str) else json.dumps(value))
    return "\n".join(parts)


class HideHiddenTests(Preprocessor):
    enabled = Bool(True)  # nbconvert preprocessors are off unless enabled
    begin_test_delimeter = Unicode("BEGIN HIDDEN TESTS").tag(config=True)
    end_test_delimeter = Unicode("END HIDDEN TESTS").tag(config=True)

    def preprocess(self, nb, resources):
        self.secrets = hidden_lines(nb, self.begin_test_delimeter, self.end_test_delimeter)
        return super().preprocess(nb, resources)

    def preprocess_cell(self, cell, resources, index):
        if cell.cell_type != "code":
            return cell, resources
        grade_cell = nbgrader_of(cell).get("grade", False)
        cell.source, had_hidden = strip_hidden(cell.source, self.begin_test_delimeter, self.end_test_delimeter)
        if grade_cell or had_hidden:
            for output in cell.get("outputs", []):
                if output.get("output_type") == "error":
                    output["traceback"] = [f"{output.get('ename', 'Error')}: {output.get('evalue', '')}"]
        if self.secrets:
            cell.outputs = [self._withheld(output) for output in cell.get("outputs", [])]
        return cell, resources

    def _withheld(self, output):
        shown = _letters(output_text(output))
        if not any(secret in shown for secret in self.secrets):
            return output
        if output.get("output_type") == "error":  # still an error, still the cell's failure
            return new_output("error", ename=output.get("ename", "Error"), evalue=WITHHELD, traceback=[WITHHELD])
        return new_output("stream", name="stdout", text=WITHHELD + "\n")


# ---------------------------------------------------------------- inert pages

# What a page may show of a submission: text, its structure, tables, images; no script, style, form,
# frame, embedded object or event handler. Links and images keep only harmless addresses.
INERT_TAGS = set(nh3.ALLOWED_TAGS) - {"map", "area"}
INERT_ATTRIBUTES = {
    "*": {"class", "id", "title", "lang", "dir"},
    "a": {"href", "name"},
    "img": {"src", "alt", "width", "height"},
    "td": {"colspan", "rowspan", "align"},
    "th": {"colspan", "rowspan", "align", "scope"},
    "ol": {"start"},
    "details": {"open"},
}
INERT_SCHEMES = {"http", "https", "mailto", "data", "attachment"}
INERT_IMAGES = re.compile(r"data:image/(png|jpeg|gif|webp|svg\+xml)[;,]", re.I)  # an image URL runs nothing
# The policy every feedback page carries: no script (none of the page's own either), nothing fetched.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'none'; style-src 'unsafe-inline'; img-src data:; font-src data:; "
    "base-uri 'none'; form-action 'none'"
)


def _keep(tag: str, attribute: str, value: str) -> str | None:
    if value.lower().lstrip().startswith("data:") and not (
        tag == "img" and attribute == "src" and INERT_IMAGES.match(value.strip())
    ):
        return None
    return value


def inert_html(markup: str) -> str:
    """``markup`` kept to the allow-list: no script, event handler, ``javascript:`` URL or style."""
    return nh3.clean(
        markup, tags=INERT_TAGS, attributes=INERT_ATTRIBUTES, url_schemes=INERT_SCHEMES, attribute_filter=_keep
    )


def inert_markdown(source: str) -> str:
    """Markdown rendered as nbconvert renders it, then kept to the allow-list (HTML is markdown too)."""
    return inert_html(markdown2html_mistune(source))


SAFE_OUTPUTS = {"text/plain", "text/latex", "application/json", "image/png", "image/jpeg", "image/gif"}


def inert_output(output):
    """An output a browser runs nothing of: HTML sanitized, markdown rendered then sanitized, safe kinds
    kept, every other kind (JavaScript, SVG, widgets, ...) dropped."""
    data = output.get("data")
    if not isinstance(data, dict):
        return output
    kept = {kind: value for kind, value in data.items() if kind in SAFE_OUTPUTS}
    text = lambda value: "".join(value) if isinstance(value, list) else str(value)  # noqa: E731
    if "text/html" in data:
        kept["text/html"] = inert_html(text(data["text/html"]))
    elif "text/markdown" in data:
        kept["text/html"] = inert_markdown(text(data["text/markdown"]))
    dropped = sorted(set(data) - set(kept) - {"text/markdown"})
    if not kept:
        kept["text/plain"] = f"(an output of kind {', '.join(dropped)}, not shown)"
    output["data"] = kept
    return output


def inert_notebook(nb, released_json: str) -> None:
    """Keep the graded notebook to the allow-list: the markdown and raw cells the release did not hold
    (as released they are the instructor's), and every output."""
    released = {
        (cell.cell_type, cell.source)
        for cell in released_notebook(released_json).cells
        if cell.cell_type in ("markdown", "raw")
    }
    for cell in nb.cells:
        if cell.get("cell_type") in ("markdown", "raw") and (cell.cell_type, cell.source) not in released:
            cell.source = inert_markdown(cell.source) if cell.cell_type == "markdown" else inert_html(cell.source)
        elif cell.get("cell_type") == "code":
            cell.outputs = [inert_output(output) for output in cell.get("outputs", [])]


# The feedback page's template and the filters it applies.
TEMPLATES = Path(__file__).resolve().parent / "templates"


# An <img> as the allow-list writes it (html5ever's serialiser: each value in double quotes, its own
# double quotes escaped), and whether it has an alt.
IMAGE_TAG = re.compile(r'<img((?:\s+[\w:-]+(?:="[^"]*")?)*)\s*/?>')
HAS_ALT = re.compile(r"\salt(?:=|\s|$)")


def with_alt_text(markup: str) -> str:
    """Each picture without an ``alt`` given nbconvert's stock one, as nbconvert's HTML export does."""

    def alt(found: re.Match) -> str:
        attributes = found.group(1)
        if HAS_ALT.search(attributes):
            return found.group(0)
        return f'<img{attributes} alt="{compat.STOCK_ALT}">'

    return IMAGE_TAG.sub(alt, markup)


def inert_body(markup: str) -> str:
    """The page's body (the notebook's cells, nbgrader's header and scores), kept to the allow-list."""
    return f"<body>\n{with_alt_text(inert_html(str(markup)))}\n</body>"


def with_policy(markup: str) -> str:
    """The page's head (the template's own) with the Content-Security-Policy as its first element, and
    without the scripts the policy would block anyway (MathJax's)."""
    meta = f'<meta http-equiv="Content-Security-Policy" content="{CONTENT_SECURITY_POLICY}">'
    markup = re.sub(r"<script\b.*?</script\s*>", "", str(markup), flags=re.I | re.S)
    head = re.search(r"<head[^>]*>", markup, re.I)
    if head is None:
        return meta + markup
    return markup[: head.end()] + "\n" + meta + markup[head.end() :]


class RememberedHighlight(Highlight2HTML):
    """nbconvert's code highlighting, each source's markup kept for the next page: the set-up and
    test cells of an assignment are the same in every submission, and highlighting was over half of
    a feedback page's rendering (0.13 s of 07's). The ``KEPT`` sources used last are kept, whatever
    lexers the notebooks name (``pygments_lexer`` is set per notebook, as nbconvert picks it)."""

    KEPT = 512  # about 50 code cells a notebook, 10 notebooks; a few MB

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._markup = functools.lru_cache(maxsize=self.KEPT)(self._highlighted)

    def __call__(self, source, language=None, metadata=None):
        magics = str((metadata or {}).get("magics_language", ""))
        return self._markup(source, language or self.pygments_lexer, magics)

    def _highlighted(self, source, language, magics_language):
        return super().__call__(source, language, {"magics_language": magics_language} if magics_language else None)


class InertFeedbackExporter(HTMLExporter):
    """nbgrader's feedback page, inert: its template wrapped in ``templates/inert_feedback`` (the body
    kept to the allow-list, the policy first in the head). ``GenerateFeedback.exporter_class``: here
    for ``FeedbackPages``, in ``nbgrader_config.py`` for ``nbgrader generate_feedback`` (and the
    formgrader's feedback button); the formgrader's own pages keep their exporter."""

    # nbconvert validates the notebook after each of its preprocessors (4 here: about a twelfth of
    # the page's time, profiled): once, after the last, is enough; an invalid notebook still fails the page
    optimistic_validation = Bool(True).tag(config=True)

    def __init__(self, config=None, **kwargs):
        nbgrader_templates = Path(nbgrader.__file__).resolve().parent / "server_extensions" / "formgrader" / "templates"
        # Over the configuration, which names nbgrader's template: this one wraps it.
        kwargs.update(
            extra_template_basedirs=[str(TEMPLATES), str(nbgrader_templates)],
            template_name="inert_feedback",
            template_file="inert.html.j2",
        )
        super().__init__(config=config, **kwargs)
        self.filters["highlight_code"] = self._highlight = RememberedHighlight(parent=self)
        self._markup: collections.OrderedDict = collections.OrderedDict()

    @jinja2.pass_context
    def markdown2html(self, context, source):
        """nbconvert's Markdown filter, each cell's markup kept for the next page, as the highlighted
        code is (``RememberedHighlight``): the released Markdown cells are the same in every
        submission. Keyed by all the filter reads of a cell: its source, its attachments and the
        notebook's folder (the rest is this exporter's configuration)."""
        cell = context.get("cell", {})
        key = (
            source,
            json.dumps(cell.get("attachments", {}), sort_keys=True, default=str),
            str(context.get("resources", {}).get("metadata", {}).get("path", "")),
        )
        if key in self._markup:
            self._markup.move_to_end(key)
            return self._markup[key]
        markup = self._markup[key] = super().markdown2html(context, source)
        while len(self._markup) > RememberedHighlight.KEPT:
            self._markup.popitem(last=False)
        return markup

    def from_notebook_node(self, nb, resources=None, **kw):
        info = nb.metadata.get("language_info", {})  # the notebook's language, as nbconvert picks it
        self._highlight.pygments_lexer = str(info.get("pygments_lexer", info.get("name")) or "ipython3")
        with compat.page_as_rendered():  # the body's filter does what nbconvert parses the page again for
            return super().from_notebook_node(nb, resources, **kw)

    def default_filters(self):
        yield from super().default_filters()
        yield ("inert_body", inert_body)
        yield ("with_policy", with_policy)


# ---------------------------------------------------------------- rendering where the notebook was graded

GET_GRADES = "nbgrader.preprocessors.GetGrades"


class GivenGrades(NbGraderPreprocessor):
    """nbgrader's ``GetGrades``, with the grades the grading worker computed instead of a gradebook.

    ``GetGrades`` reads each cell's score and comment, and the notebook's total,
    from the gradebook that ``SaveAutoGrades`` has just written. A grading worker
    has no gradebook; it has what the writer will write (``autograder.worker.verdicts.grades_of``:
    each test cell's points from the verdicts): ``resources["nbgrader"]["grades"]``
    ({grade id: [score, max]}) and ``["comments"]`` ({grade id: auto comment}).
    The result is the page ``generate_feedback`` gives when nobody has graded by
    hand and nothing is late; when the gradebook holds more, the writer renders
    the page again with ``GetGrades`` (``writer.Writer``).
    """

    def preprocess(self, nb, resources):
        given = resources["nbgrader"]
        self.grades, self.comments = given["grades"], given["comments"]
        nb, resources = super().preprocess(nb, resources)
        scores = [score for score, _ in self.grades.values() if score is not None]
        given["score"] = float(sum(scores)) if scores else 0.0
        given["max_score"] = float(sum(maximum or 0.0 for _, maximum in self.grades.values()))
        given["late_penalty"] = 0
        return nb, resources

    def preprocess_cell(self, cell, resources, index):

        grade_id = nbgrader_of(cell).get("grade_id")
        if utils.is_solution(cell) or utils.is_task(cell):
            cell.metadata.nbgrader["comment"] = self.comments.get(grade_id)
        if utils.is_grade(cell) or utils.is_task(cell):
            score, maximum = self.grades.get(grade_id, (None, cell.metadata.nbgrader.get("points", 0.0)))
            cell.metadata.nbgrader["score"] = score
            cell.metadata.nbgrader["points"] = maximum
        return cell, resources


class FeedbackPages:
    """The course's feedback exporter (``GenerateFeedback`` with the configured preprocessors).

    ``from_gradebook``: as ``nbgrader generate_feedback`` builds it (``GetGrades``
    reads the gradebook); otherwise ``GetGrades`` is swapped for ``GivenGrades``,
    for a grading worker, which renders a page from its own grades.
    """

    def __init__(self, config, from_gradebook: bool = False):

        config = config.copy()
        config.GenerateFeedback.exporter_class = InertFeedbackExporter
        if not from_gradebook:
            configured = list(config.GenerateFeedback.get("preprocessors", [GET_GRADES]))
            config.GenerateFeedback.preprocessors = [
                GivenGrades if _names(entry, GET_GRADES) else entry for entry in configured
            ]
        converter = GenerateFeedback(coursedir=CourseDirectory(config=config), config=config)
        self.exporter = converter.exporter_class(parent=converter, config=converter.config)
        for preprocessor in converter.preprocessors:
            self.exporter.register_preprocessor(preprocessor)

    def render(
        self,
        notebook_json: str,
        student: str,
        assignment: str,
        notebook: str,
        db_url: str | None = None,
        grades: dict | None = None,
        comments: dict | None = None,
    ) -> str:

        resources = {
            "unique_key": notebook,
            "output_files_dir": f"{notebook}_files",
            "nbgrader": {
                "student": student,
                "assignment": assignment,
                "notebook": notebook,
                "db_url": db_url,
                "grades": grades or {},
                "comments": comments or {},
            },
        }
        html, _ = self.exporter.from_notebook_node(nbformat.reads(notebook_json, as_version=4), resources=resources)
        return html


def _names(entry, dotted: str) -> bool:
    if isinstance(entry, str):
        return entry == dotted
    return f"{getattr(entry, '__module__', '')}.{getattr(entry, '__name__', '')}" in (
        dotted,
        "nbgrader.preprocessors.getgrades.GetGrades",
    )
