"""Keep hidden test code out of the feedback students get.

nbgrader's feedback shows every cell's source and its full traceback, hidden
tests included (nbgrader issue #917), and an IPython traceback quotes the lines
around the failing one. ``HideHiddenTests`` runs in ``generate_feedback`` (see
``nbgrader_config.py``): in every graded cell it replaces the hidden region by
one comment line and reduces each error to its name and message, which the
checks write for the learner.
"""

import nbformat
from nbconvert.preprocessors import Preprocessor
from nbgrader import utils
from nbgrader.converters import GenerateFeedback
from nbgrader.coursedir import CourseDirectory
from nbgrader.preprocessors import NbGraderPreprocessor
from traitlets import Bool, Unicode

from ..cells import nbgrader_of

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


class HideHiddenTests(Preprocessor):
    enabled = Bool(True)  # nbconvert preprocessors are off unless enabled
    begin_test_delimeter = Unicode("BEGIN HIDDEN TESTS").tag(config=True)
    end_test_delimeter = Unicode("END HIDDEN TESTS").tag(config=True)

    def preprocess_cell(self, cell, resources, index):
        if cell.cell_type != "code":
            return cell, resources
        grade_cell = nbgrader_of(cell).get("grade", False)
        cell.source, had_hidden = strip_hidden(cell.source, self.begin_test_delimeter, self.end_test_delimeter)
        if grade_cell or had_hidden:
            for output in cell.get("outputs", []):
                if output.get("output_type") == "error":
                    output["traceback"] = [f"{output.get('ename', 'Error')}: {output.get('evalue', '')}"]
        return cell, resources


# ---------------------------------------------------------------- rendering where the notebook was graded

GET_GRADES = "nbgrader.preprocessors.GetGrades"


class GivenGrades(NbGraderPreprocessor):
    """nbgrader's ``GetGrades``, with the grades the grading worker computed instead of a gradebook.

    ``GetGrades`` reads each cell's score and comment, and the notebook's total,
    from the gradebook that ``SaveAutoGrades`` has just written. A grading worker
    has no gradebook; it has what ``SaveAutoGrades`` will write, computed by the
    same rules (``autograder.worker.verdicts.grades_of``): ``resources["nbgrader"]["grades"]``
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
