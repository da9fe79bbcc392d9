"""nbgrader configuration: run nbgrader commands from this folder.

The flow is solutions/ (instructor sources) -> notebooks/ (student versions,
generated) -> coursework/submitted/ -> coursework/autograded/ ->
coursework/feedback/. The gradebook is coursework/gradebook.db. coursework/ holds
the class's data only (ignored by git), never code: the grader's code lives in
autograder/, beside it.
"""

import os

c = get_config()  # noqa: F821 (provided by nbgrader)
here = os.path.dirname(os.path.abspath(__file__))

c.CourseDirectory.course_id = "attention-transformers"
c.CourseDirectory.root = os.path.join(here, "coursework")
c.CourseDirectory.source_directory = os.path.join(here, "solutions")
c.CourseDirectory.release_directory = os.path.join(here, "notebooks")

# A fresh clone has no course root (git ignores it), and nbgrader's commands chdir into it
# first, or open the gradebook inside it: make it here, so that every command (db, generate,
# autograde, formgrader, the exchange's) works as the first one after cloning. Where the
# checkout is read-only to this user, nothing is made (an error here would make Jupyter
# skip this whole file): a command that needs the folder then says so itself.
try:
    os.makedirs(c.CourseDirectory.root, exist_ok=True)
except OSError:
    pass

# notebooks/ is committed, generated from solutions/ (./course generate). nbgrader would skip
# an existing release, leaving the gradebook without the assignment (autograde then refuses
# it): generate_assignment always regenerates, which writes the same files (a test checks
# that notebooks/ is current). If generation fails, nbgrader removes that assignment's
# folder in notebooks/ first: `git checkout notebooks/` brings it back.
c.GenerateAssignment.force = True

# Every graded kernel imports the trusted-function snapshot before any student
# code runs, so a notebook that patches torch or numpy cannot fool the checks.
c.Execute.extra_arguments = [
    "--HistoryManager.hist_file=:memory:",
    "--IPKernelApp.exec_lines=import course_checks.kernel_boot",
]

# Feedback shows each check's outcome and message, never hidden test code, and runs nothing of the
# submission: nbgrader's feedback page in an inert template (no script at all, a sanitized body).
c.GenerateFeedback.preprocessors = [
    "nbgrader.preprocessors.GetGrades",
    "nbconvert.preprocessors.CSSHTMLHeaderPreprocessor",
    "autograder.worker.feedback.HideHiddenTests",
]
c.GenerateFeedback.exporter_class = "autograder.worker.feedback.InertFeedbackExporter"

# Flat, LMS-style file names (an LMS's bulk download, `./course grade --from
# download.zip`, or `nbgrader zip_collect`): <student>_<notebook>.ipynb, with an
# optional _attempt_<timestamp> before the notebook's name and an optional copy
# number after it, e.g. alice_01_attention.ipynb,
# bob_smith_attempt_2026-03-01-10-00-00_01_attention.ipynb, carol_01_attention (1).ipynb.
# Change it to your LMS's convention; file_id must end up as the notebook's name.
c.FileNameCollectorPlugin.named_regexp = (
    r"^(?P<student_id>.+?)(?:_attempt_(?P<timestamp>[0-9\-]+))?_(?P<file_id>\d\d_[A-Za-z0-9_]+?)"
    r"(?:[ _-]*\(\d+\)|-\d+)?\.ipynb$"
)

# Releasing notebook N+1 hands out N's reference answers (its read-only setup_from_* cells): the
# release says so when N is not yet past its due date in the gradebook (docs/teaching.md).
c.ExchangeFactory.release_assignment = "autograder.release_guard.GuardedReleaseAssignment"
