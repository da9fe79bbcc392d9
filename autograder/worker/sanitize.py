"""Sanitize a submission with nbgrader's own preprocessors: a step of the pipeline.

nbgrader's sanitizing steps (``ClearOutput``, ``DeduplicateIds``,
``OverwriteKernelspec``, ``OverwriteCells`` with missing cells added back,
``CheckCellMetadata``) need the gradebook only to read the assignment's source
cells. ``GradebookView`` holds those, read once by the grader, so a worker (or
a machine without the database) can sanitize a notebook: the sanitizing is
nbgrader's, the data comes from the snapshot.
"""

from __future__ import annotations

import json

from nbgrader.nbgraderformat import MetadataValidator, ValidationError
from nbgrader.preprocessors import (
    CheckCellMetadata,
    ClearOutput,
    DeduplicateIds,
    NbGraderPreprocessor,
    OverwriteCells,
    OverwriteKernelspec,
)
from traitlets import Any

from ..records import GradebookView


class ViewOverwriteCells(OverwriteCells):
    """nbgrader's OverwriteCells, reading a ``GradebookView`` instead of the database."""

    view = Any()

    def preprocess(self, nb, resources):
        self.notebook_id = resources["nbgrader"]["notebook"]
        self.assignment_id = resources["nbgrader"]["assignment"]
        self.gradebook = self.view
        nb, resources = NbGraderPreprocessor.preprocess(self, nb, resources)
        if self.add_missing_cells:
            nb, resources = self.add_missing_grade_cells(nb, resources)
            nb, resources = self.add_missing_task_cells(nb, resources)
        return nb, resources


class ViewOverwriteKernelspec(OverwriteKernelspec):
    view = Any()

    def preprocess(self, nb, resources):
        kernelspec = self.view.notebook.kernelspec
        if kernelspec:
            nb.metadata["kernelspec"] = json.loads(kernelspec)
        return nb, resources


class RememberingValidator(MetadataValidator):
    """nbgrader's metadata validator, which checks each cell's ``nbgrader`` metadata against its
    JSON schema (and the schema itself against the JSON Schema meta-schema, every time): a cell's
    metadata and kind that passed once pass again without the schema. Nine in ten of a class's cells
    carry the release's metadata; the schema was nine tenths of sanitizing (1.2 s of a class of 30
    in a profile). Only what passed is remembered (at most ``KEEP`` of them); the checks across
    cells (duplicate ids) run on every notebook."""

    KEEP = 4096

    def __init__(self) -> None:
        super().__init__()
        self.passed: set[str] = set()

    def validate_cell(self, cell) -> None:
        if "nbgrader" not in cell.metadata:
            return
        try:
            key = json.dumps([cell.cell_type, cell.metadata["nbgrader"]], sort_keys=True)
        except (TypeError, ValueError):  # not JSON (nothing read from a file is): checked, not kept
            key = None
        if key in self.passed:
            return
        super().validate_cell(cell)
        if key is not None and len(self.passed) < self.KEEP:
            self.passed.add(key)


_VALIDATOR = RememberingValidator()  # one a process (the pool's fork server makes it once for all)


class CheckCellMetadataOnce(CheckCellMetadata):
    """nbgrader's ``CheckCellMetadata`` (its message, its log) with the process's ``RememberingValidator``."""

    def preprocess(self, nb, resources):
        try:
            _VALIDATOR.validate_nb(nb)
        except ValidationError:
            return super().preprocess(nb, resources)  # nbgrader's own run says why, in its words
        return nb, resources


def sanitize(nb, view: GradebookView, resources: dict):
    """nbgrader's sanitizing preprocessors, in autograde's order; deleted graded cells come back.

    nbgrader's ``DeduplicateIds`` keeps the last copy of a duplicated cell; run
    on the reversed notebook it keeps the first, the one in its original place
    (a copy moved to the end would otherwise be checked after the exercises
    that build on it). The copies it demotes keep an empty ``nbgrader``
    metadata dict, which ``CheckCellMetadata`` rejects: those are removed.
    """
    nb, resources = ClearOutput().preprocess(nb, resources)
    nb.cells.reverse()
    nb, resources = DeduplicateIds().preprocess(nb, resources)
    nb.cells.reverse()
    for cell in nb.cells:
        if "nbgrader" in cell.metadata and not cell.metadata["nbgrader"]:
            del cell.metadata["nbgrader"]
    for step in (
        ViewOverwriteKernelspec(view=view),
        ViewOverwriteCells(view=view, add_missing_cells=True),
        CheckCellMetadataOnce(),
    ):
        nb, resources = step.preprocess(nb, resources)
    return nb, resources
