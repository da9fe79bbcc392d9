"""The grader's check of a submission's grading metadata decides as nbgrader's own
``CheckCellMetadata`` does, on the first notebook that shows a cell's metadata and on every later one
(autograder/worker/sanitize.py remembers what passed)."""

import copy

import nbformat
import pytest
from nbgrader.preprocessors import CheckCellMetadata

from autograder.worker.sanitize import CheckCellMetadataOnce

GOOD = {"grade": True, "grade_id": "test_softmax", "locked": True, "points": 2, "schema_version": 3, "solution": False}
ANSWER = {"grade": False, "grade_id": "softmax", "locked": False, "schema_version": 3, "solution": True}

VARIANTS = {
    "a graded test cell": ("code", GOOD),
    "an answer cell": ("code", ANSWER),
    "points as text": ("code", {**GOOD, "points": "lots"}),
    "no points": ("code", {k: v for k, v in GOOD.items() if k != "points"}),
    "an empty grade id": ("code", {**GOOD, "grade_id": ""}),
    "a grade id of the wrong type": ("code", {**GOOD, "grade_id": 7}),
    "a markdown grade cell that is no answer": ("markdown", GOOD),
    "a task in a code cell": ("code", {**ANSWER, "solution": False, "task": True}),
    "an older schema": ("code", {**GOOD, "schema_version": 2}),
    "a cell type recorded as another": ("code", {**GOOD, "cell_type": "markdown"}),
}


def notebook(kind: str, meta: dict) -> nbformat.NotebookNode:
    cell = nbformat.v4.new_markdown_cell("x") if kind == "markdown" else nbformat.v4.new_code_cell("x = 1")
    cell.metadata["nbgrader"] = copy.deepcopy(meta)
    return nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("import torch"), cell])


def outcome(step, nb) -> str:
    try:
        step.preprocess(nb, {})
    except Exception as error:
        return f"{type(error).__name__}: {error}"
    return "passes"


@pytest.mark.parametrize("name", list(VARIANTS))
def test_each_cell_is_judged_as_nbgrader_judges_it_every_time(name):
    kind, meta = VARIANTS[name]
    expected = outcome(CheckCellMetadata(), notebook(kind, meta))
    seen = [outcome(CheckCellMetadataOnce(), notebook(kind, meta)) for _ in range(3)]
    assert seen == [expected] * 3


def test_a_remembered_cell_still_counts_against_a_duplicate_id():
    """Two copies of a cell that passed alone: the ids clash, and the notebook fails as in nbgrader."""
    CheckCellMetadataOnce().preprocess(notebook("code", GOOD), {})
    twice = notebook("code", GOOD)
    twice.cells.append(copy.deepcopy(twice.cells[1]))
    assert outcome(CheckCellMetadataOnce(), twice) == outcome(CheckCellMetadata(), twice) != "passes"
