"""The single writer: results into the gradebook, graded notebooks, feedback and the ledger.

Only the grading command's main process writes, one result at a time, so
parallel workers never corrupt a SQLite gradebook (a Postgres ``db_url`` works
the same way). Each step is nbgrader's own:

- ``SaveAutoGrades`` scores the graded notebook's cells into the gradebook,
  ``AssignLatePenalties`` applies the course's late policy;
- feedback is nbgrader's ``GenerateFeedback`` exporter with the course's
  configured preprocessors (``GetGrades``, the CSS header and
  ``feedback.HideHiddenTests``), so it shows each check's outcome, points and
  message and never the hidden test code.

Files are written whole or not at all (a temporary file renamed into place),
and the ledger (``autograder/.work/grading.sqlite``) records a submission as
graded only after its grades, notebook and feedback are in place: killing the
command at any moment and running it again grades exactly what is missing and
ends with the same gradebook as one clean run. A rerun skips submissions whose
file and grading setup (``AssignmentSpec.fingerprint``) have not changed.
"""
from __future__ import annotations

import json
import os
import sqlite3
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import nbformat

from .job import REVIEW_FLAGS, Result


def write_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            stream.write(text)
            stream.flush()
            os.fsync(stream.fileno())
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        raise


class Ledger:
    """What has been graded, from which file, with which grading setup; and what was found."""

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(str(path), timeout=60)
        self.db.execute("""CREATE TABLE IF NOT EXISTS graded (
            student TEXT, assignment TEXT, notebook TEXT, digest TEXT, fingerprint TEXT,
            summary TEXT, graded_at REAL, PRIMARY KEY (student, assignment, notebook))""")
        self.db.commit()

    def state(self) -> dict:
        return {(s, a, n): (d, f) for s, a, n, d, f in
                self.db.execute("SELECT student, assignment, notebook, digest, fingerprint FROM graded")}

    def record(self, result: Result) -> None:
        summary = {
            "graded": result.graded, "messages": result.messages, "flags": result.flags,
            "checks": [asdict(c) if not isinstance(c, dict) else c for c in result.checks],
            "cell_seconds": result.cell_seconds, "cell_cpu_seconds": result.cell_cpu_seconds,
            "seconds": result.seconds, "kernels": result.kernels,
            "kernel_seconds": result.kernel_seconds, "faults": result.faults, "worker": result.worker,
            "started": result.started,
        }
        with self.db:
            self.db.execute("INSERT OR REPLACE INTO graded VALUES (?, ?, ?, ?, ?, ?, ?)",
                            (result.student, result.assignment, result.notebook, result.digest,
                             result.fingerprint, json.dumps(summary), time.time()))

    def summaries(self) -> dict:
        return {(s, a, n): json.loads(summary) for s, a, n, summary in
                self.db.execute("SELECT student, assignment, notebook, summary FROM graded")}

    def close(self) -> None:
        self.db.close()


class Writer:
    """Commits results; the only place that writes grades, graded notebooks and feedback."""

    def __init__(self, coursedir, config, db_url: str, ledger: Ledger):
        from nbgrader.converters import GenerateFeedback

        self.coursedir = coursedir
        self.db_url = db_url
        self.ledger = ledger
        converter = GenerateFeedback(coursedir=coursedir, config=config)
        self.exporter = converter.exporter_class(parent=converter, config=converter.config)
        for preprocessor in converter.preprocessors:
            self.exporter.register_preprocessor(preprocessor)
        self.config = config

    def _path(self, folder: str, result: Result, extension: str) -> Path:
        return Path(self.coursedir.format_path(folder, result.student, result.assignment)) / (
            result.notebook + extension)

    def commit(self, result: Result) -> None:
        from nbgrader.api import Gradebook
        from nbgrader.preprocessors import AssignLatePenalties, SaveAutoGrades
        from nbgrader.utils import parse_utc

        nb = nbformat.reads(result.notebook_json, as_version=4)
        with Gradebook(self.db_url) as gradebook:
            gradebook.update_or_create_student(result.student)
            if result.timestamp:
                gradebook.update_or_create_submission(result.assignment, result.student,
                                                      timestamp=parse_utc(result.timestamp))
            else:
                gradebook.update_or_create_submission(result.assignment, result.student)
        write_atomically(self._path(self.coursedir.autograded_directory, result, ".ipynb"), result.notebook_json)
        resources = {"nbgrader": {"student": result.student, "assignment": result.assignment,
                                  "notebook": result.notebook, "db_url": self.db_url}}
        nb, resources = SaveAutoGrades(parent=None, config=self.config).preprocess(nb, resources)
        nb, resources = AssignLatePenalties(config=self.config).preprocess(nb, resources)
        review = any(flag in REVIEW_FLAGS for flag in result.flags)
        if review:
            with Gradebook(self.db_url) as gradebook:
                notebook = gradebook.find_submission_notebook(result.notebook, result.assignment, result.student)
                if not notebook.flagged:
                    notebook.flagged = True  # never cleared here: a human's flag stays
                    gradebook.db.commit()
        feedback_resources = {"unique_key": result.notebook, "output_files_dir": f"{result.notebook}_files",
                              "nbgrader": dict(resources["nbgrader"])}
        html, _ = self.exporter.from_notebook_node(nbformat.reads(result.notebook_json, as_version=4),
                                                   resources=feedback_resources)
        write_atomically(self._path(self.coursedir.feedback_directory, result, ".html"), html)
        self.ledger.record(result)
