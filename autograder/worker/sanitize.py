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
        CheckCellMetadata(),
    ):
        nb, resources = step.preprocess(nb, resources)
    return nb, resources
