"""nbgrader's exchange, for the watcher (``engine.watch``): collect what students submitted, hand back feedback.

Both directions go through nbgrader's own exchange classes (``ExchangeFactory``: the default
file-system exchange, or whichever the hub configures), with the configuration nbgrader's
commands would read (``exchange_config``: the Jupyter configuration folders, where a hub's
``/etc/jupyter/nbgrader_config.py`` names the exchange, then the course's own file).

- ``Inbox.collect``: nbgrader's ``collect --update`` for every assignment, into a staging copy
  of ``submitted/`` (``coursework/.work/watch/collected``); only the latest submission of each
  student is kept, as nbgrader's rule says. nbgrader copies a submission file by file, so a kill
  in the middle could leave a notebook cut short beside its new ``timestamp.txt``: the staging
  folder is started afresh after a pass that did not finish collecting, and each new or changed
  submission then moves into the course's ``submitted/`` whole (a copy beside it, then a rename).
  A kill between the renames leaves the folder missing, and the next pass files it again.
- ``release``: nbgrader's ``release_feedback`` for one student's assignment, from any folder laid
  out as ``feedback/`` is (the full pages nbgrader and ``course-grade`` write, or the watcher's
  own pages): the student's ``nbgrader fetch_feedback`` (or the Assignments tab) finds the page
  under the submission's secret, so each submission gets its own page.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

STAMP, SECRET = "timestamp.txt", "submission_secret.txt"


def exchange_config(course):
    """nbgrader's configuration as its commands read it in the course folder: the Jupyter
    configuration path (a hub's ``/etc/jupyter``, the user's ``~/.jupyter``), then the course's
    ``nbgrader_config.py``, the later winning."""
    from jupyter_core.paths import jupyter_config_path  # here: the grade command starts without it
    from traitlets.config import Config  # here: the grade command starts without it
    from traitlets.config.loader import PyFileConfigLoader  # here: the grade command starts without it

    config = Config()
    for folder in reversed(jupyter_config_path()):
        if (Path(folder) / "nbgrader_config.py").is_file():
            config.merge(PyFileConfigLoader("nbgrader_config.py", path=folder).load_config())
    config.merge(course.config)
    return config


# What nbgrader's exchange says on every pass about every assignment and student: nothing new.
ROUTINE = ("No submissions of", "No newer submission to collect", "Processing ", "Source:", "Destination:")


class _Routine(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(ROUTINE)


def _quiet(app, log: logging.Logger):
    """``app`` logging into the watcher's log, without the lines that repeat on every pass."""
    exchange_log = log.getChild("exchange")
    if not exchange_log.filters:
        exchange_log.addFilter(_Routine())
    app.log = exchange_log
    return app


class Inbox:
    """Collects from the exchange into the course's ``submitted/``, whole submissions at a time."""

    def __init__(self, course, log: logging.Logger):
        from nbgrader.auth import Authenticator  # here: the grade command starts without it
        from nbgrader.coursedir import CourseDirectory  # here: the grade command starts without it
        from nbgrader.exchange import ExchangeFactory  # here: the grade command starts without it

        self.course, self.log = course, log
        self.config = exchange_config(course)
        self.root = Path(course.coursedir.root)
        self.staging = course.work / "watch" / "collected"
        self.marker = course.work / "watch" / "collecting"
        self.coursedir = CourseDirectory(config=self.config)
        self.coursedir.submitted_directory = os.path.relpath(self.staging, self.root)
        self.authenticator = Authenticator(config=self.config)
        self.factory = ExchangeFactory(config=self.config)
        self.missing_inbound_said = False

    def collect(self, assignments: list[str]) -> tuple[set[tuple[str, str]], list[str]]:
        """nbgrader collect --update for each assignment; the (student, assignment) pairs whose
        latest submission is new in ``submitted/``, and problems in words."""
        from nbgrader.exchange import ExchangeError  # here: the grade command starts without it

        if self.marker.exists():  # the last pass was killed while nbgrader copied: collect afresh
            shutil.rmtree(self.staging, ignore_errors=True)
        self.marker.parent.mkdir(parents=True, exist_ok=True)
        self.marker.touch()
        problems = []
        for assignment in assignments:
            self.coursedir.assignment_id = assignment
            app = _quiet(
                self.factory.Collect(coursedir=self.coursedir, authenticator=self.authenticator, config=self.config),
                self.log,
            )
            app.update = True
            try:
                app.start()
            except ExchangeError as error:
                if "Course not found" in str(error):  # nothing released yet: say it once
                    if not self.missing_inbound_said:
                        problems.append(f"the exchange has no inbound folder for this course yet ({error})")
                        self.missing_inbound_said = True
                    break
                problems.append(f"{assignment}: nbgrader collect failed ({error})")
            except (OSError, RuntimeError) as error:  # a submission too large, a file it cannot read
                problems.append(f"{assignment}: nbgrader collect failed ({type(error).__name__}: {error})")
        self.marker.unlink()
        return self._file_new(assignments), problems

    def _file_new(self, assignments: list[str]) -> set[tuple[str, str]]:
        """Move each staged submission whose time differs from the one in ``submitted/`` into place."""
        filed = set()
        submitted = self.course.submitted
        work = self.course.work / "watch"
        for leftover in work.glob("filing-*"):  # a kill between copy and rename
            shutil.rmtree(leftover, ignore_errors=True)
        if not self.staging.is_dir():
            return filed
        for student_dir in sorted(p for p in self.staging.iterdir() if p.is_dir()):
            for assignment in assignments:
                staged = student_dir / assignment
                if not (staged / STAMP).is_file():
                    continue
                target = submitted / student_dir.name / assignment
                if (target / STAMP).is_file() and (target / STAMP).read_bytes() == (staged / STAMP).read_bytes():
                    continue
                copy = work / f"filing-{student_dir.name}-{assignment}"
                shutil.copytree(staged, copy)
                old = work / f"filing-old-{student_dir.name}-{assignment}"
                target.parent.mkdir(parents=True, exist_ok=True)
                if target.exists():
                    os.rename(target, old)
                os.rename(copy, target)
                shutil.rmtree(old, ignore_errors=True)
                filed.add((student_dir.name, assignment))
        return filed


class Outbox:
    """Hands back feedback through the exchange, as nbgrader's ``release_feedback`` does."""

    def __init__(self, course, log: logging.Logger):
        from nbgrader.auth import Authenticator  # here: the grade command starts without it
        from nbgrader.exchange import ExchangeFactory  # here: the grade command starts without it

        self.course, self.log = course, log
        self.config = exchange_config(course)
        self.authenticator = Authenticator(config=self.config)
        self.factory = ExchangeFactory(config=self.config)

    def release(self, folder: Path, student: str, assignment: str) -> None:
        """nbgrader release_feedback for ``student``'s ``assignment``, from ``folder`` (laid out as the
        course's ``feedback/``: ``<student>/<assignment>/<notebook>.html`` with the submission's
        ``timestamp.txt`` and ``submission_secret.txt``). Raises ``ExchangeError`` when it cannot."""
        from nbgrader.coursedir import CourseDirectory  # here: the grade command starts without it

        coursedir = CourseDirectory(config=self.config)
        coursedir.feedback_directory = os.path.relpath(folder, coursedir.root)
        coursedir.assignment_id = assignment
        coursedir.student_id = student
        app = self.factory.ReleaseFeedback(coursedir=coursedir, authenticator=self.authenticator, config=self.config)
        _quiet(app, self.log).start()
