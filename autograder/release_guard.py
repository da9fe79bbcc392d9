"""nbgrader's ``release_assignment``, warning when the release hands out answers not yet due.

Set in ``nbgrader_config.py`` (``ExchangeFactory.release_assignment``), so ``nbgrader
release_assignment 02_causal_masking`` (and the formgrader's Release button) say, before they
release, when 02's read-only set-up cells carry the reference answers of an assignment whose
due date in the gradebook has not passed (or that has none): the same check as
``./course export-class`` (``classcopy``). The release itself goes ahead, as nbgrader's does.
"""

from __future__ import annotations

import datetime
from pathlib import Path

from nbgrader.exchange.default import ExchangeReleaseAssignment

from .classcopy import due_dates, warnings_for


class GuardedReleaseAssignment(ExchangeReleaseAssignment):
    def copy_files(self):
        # this course's layout (nbgrader_config.py): notebooks/ and solutions/ side by side
        course = Path(self.coursedir.release_directory).resolve().parent
        assignment = self.coursedir.assignment_id
        if (course / "solutions" / assignment).is_dir() and (course / "notebooks" / assignment).is_dir():
            now = datetime.datetime.now(datetime.UTC).replace(tzinfo=None)
            for warning in warnings_for(course, [assignment], due_dates(course, self.coursedir.db_url), now):
                self.log.warning("%s; release it after they are due (the course's Teaching page)", warning)
        super().copy_files()
