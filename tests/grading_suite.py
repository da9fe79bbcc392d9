"""The grading tests every notebook gets, through real nbgrader runs.

A notebook's test module subclasses ``GradingSuite`` and fills in:

* ``assignment``: e.g. ``"01_attention"``;
* ``mistakes``: {student id: (exercise, answer source, mistake id)}, each answer
  written the way a learner would make that catalogued mistake;
* ``alternatives``: {student id: {exercise: answer source}}, correct answers
  written differently from the reference (at least two per exercise);
* ``wrong_answers``: {exercise: answer source} of plausible-looking but wrong
  answers, used to show that patching torch or numpy gains nothing.

Conventions: an exercise's answer cell has ``grade_id`` = its name, and its
check cell ``grade_id`` = ``"test_" + name``.

The whole class is graded in one ``nbgrader autograde`` run (class-scoped
fixture ``graded``), then each test reads the gradebook and the feedback. The classes
of every suite a session runs are graded from the session's start, side by side and beside
the other tests, on the cores those leave idle (``stock_graded`` in conftest.py): a stock run
keeps one core busy, and the suites' tests then only read.
"""

from __future__ import annotations

import json
import textwrap

import nbformat
import pytest
from grading_harness import UNTOUCHED, Beside, Course

from autograder.exercises import module_for

PATCH_ALLCLOSE = "import torch\ntorch.allclose = lambda *args, **kwargs: True"
PATCH_NUMPY_TESTING = (
    "import numpy.testing\n"
    "numpy.testing.assert_allclose = lambda *args, **kwargs: None\n"
    "import torch\n"
    "torch.Tensor.__eq__ = lambda self, other: torch.ones_like(self, dtype=torch.bool)"
)


def insert_after_setup(source: str):
    """An ``edit`` for ``Course.submit``: a new code cell right after the setup cell."""

    def edit(notebook):
        index = next(
            i
            for i, cell in enumerate(notebook.cells)
            if cell.metadata.get("nbgrader", {}).get("grade_id", "").startswith("setup")
        )
        notebook.cells.insert(index + 1, nbformat.v4.new_code_cell(source))

    return edit


class GradingSuite:
    assignment: str = ""
    mistakes: dict = {}
    alternatives: dict = {}
    wrong_answers: dict = {}
    checked_by: dict = {}  # mistake id -> the exercise whose check catches it, when not its own

    # ------------------------------------------------------------ the class
    @classmethod
    def submit_class(cls, course: Course) -> dict:
        """Write the class's submissions into ``course``: {student: {grade cell: the points it should get}}.

        ``./course grade`` grades the same class (tests/test_grade_command.py).
        """
        full = course.max_scores(cls.assignment)
        zero = {cell: 0.0 for cell in full}
        expected = {"reference": full, "untouched": zero}
        course.submit("reference", cls.assignment)
        course.submit("untouched", cls.assignment, UNTOUCHED)
        for student, (exercise, source, mistake_id) in cls.mistakes.items():
            course.submit(student, cls.assignment, {exercise: textwrap.dedent(source)})
            expected[student] = {**full, f"test_{cls.checked_by.get(mistake_id, exercise)}": 0.0}
        for student, answers in cls.alternatives.items():
            course.submit(student, cls.assignment, {e: textwrap.dedent(s) for e, s in answers.items()})
            expected[student] = full
        wrong = {e: textwrap.dedent(s) for e, s in cls.wrong_answers.items()}
        course.submit("patches-allclose", cls.assignment, wrong, edit=insert_after_setup(PATCH_ALLCLOSE))
        course.submit("patches-numpy-testing", cls.assignment, wrong, edit=insert_after_setup(PATCH_NUMPY_TESTING))
        expected.update({"patches-allclose": zero, "patches-numpy-testing": zero})
        return expected

    @classmethod
    def grade_class(cls, directory, beside: Beside | None = None) -> Course:
        """A course in ``directory`` with this class submitted, graded by stock nbgrader, feedback made."""
        course = Course.create(directory, [cls.assignment], beside)
        cls.submit_class(course)
        course.autograde(cls.assignment)
        return course

    @pytest.fixture(scope="class")
    @classmethod
    def graded(cls, stock_graded) -> Course:
        return stock_graded[cls.assignment].result()

    def exercises(self) -> list[str]:
        return list(module_for(self.assignment).EXERCISES)

    # ------------------------------------------------------------ the tests
    def test_catalogue_is_covered(self):
        """Every catalogued mistake has a submission here, every exercise two alternatives."""
        catalogued = {m.id for e in module_for(self.assignment).EXERCISES.values() for m in e.mistakes}
        assert catalogued <= {mistake_id for _, _, mistake_id in self.mistakes.values()}
        for exercise in self.exercises():
            assert sum(exercise in answers for answers in self.alternatives.values()) >= 2, exercise
            assert exercise in self.wrong_answers, exercise

    def test_reference_solution_gets_full_marks(self, graded):
        assert graded.scores("reference", self.assignment) == graded.max_scores(self.assignment)

    def test_untouched_student_version_gets_zero(self, graded):
        scores = graded.scores("untouched", self.assignment)
        assert set(scores.values()) == {0.0}, scores
        text = graded.feedback_text("untouched", self.assignment)
        assert "is not implemented yet" in text

    def test_mistake_loses_only_its_exercise(self, graded, mistake_student):
        exercise, _, _ = self.mistakes[mistake_student]
        scores = graded.scores(mistake_student, self.assignment)
        expected = {**graded.max_scores(self.assignment), f"test_{exercise}": 0.0}
        assert scores == expected

    def test_mistake_is_named_in_feedback(self, graded, mistake_student):
        exercise, _, mistake_id = self.mistakes[mistake_student]
        names = {m.name for m in module_for(self.assignment).EXERCISES[exercise].mistakes if m.id == mistake_id}
        text = graded.feedback_text(mistake_student, self.assignment)
        assert f"[mistake:{mistake_id}]" in text
        assert any(name in text for name in names), names

    def test_alternative_gets_full_marks(self, graded, alternative_student):
        assert graded.scores(alternative_student, self.assignment) == graded.max_scores(self.assignment)

    @pytest.mark.parametrize("student", ["patches-allclose", "patches-numpy-testing"])
    def test_patching_checks_gains_nothing(self, graded, student):
        scores = graded.scores(student, self.assignment)
        assert set(scores.values()) == {0.0}, scores
        assert "[mistake:tampering]" in graded.feedback_text(student, self.assignment)

    def test_self_study_cells_stay_silent_while_grading(self, graded):
        """The self-study lines (autograder/selfstudy.py) in the released cells do nothing under
        nbgrader: no diagnosis, no solution, no progress view in any graded notebook."""
        students = ["reference", "untouched", *self.mistakes]
        for student in students:
            cells = graded.autograded(student, self.assignment)["cells"]
            assert any("course_checks.selfstudy" in "".join(c["source"]) for c in cells)
            shown = json.dumps([c.get("outputs", []) for c in cells])
            for line in ("Self-check", "Class mode", "Reference solution", "Your progress", "Try `"):
                assert line not in shown, f"{student}'s graded notebook shows {line!r}"

    def test_feedback_never_shows_hidden_tests(self, graded):
        students = ["reference", "untouched", *self.mistakes, *self.alternatives, "patches-allclose"]
        for student in students:
            page = graded.feedback(student, self.assignment)
            for secret in ("HIDDEN TESTS", "course_checks.checks", "checks.py", "check(&quot;", 'check("'):
                assert secret not in page, f"{student}'s feedback shows {secret!r}"
