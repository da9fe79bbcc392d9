"""nbgrader configuration: run nbgrader commands from this folder.

The flow is solutions/ (instructor sources) -> notebooks/ (student versions,
generated) -> autograder/submitted/ -> autograder/autograded/ ->
autograder/feedback/. The gradebook is autograder/gradebook.db.
"""
import os

c = get_config()  # noqa: F821 (provided by nbgrader)
here = os.path.dirname(os.path.abspath(__file__))

c.CourseDirectory.course_id = "attention-transformers"
c.CourseDirectory.root = os.path.join(here, "autograder")
c.CourseDirectory.source_directory = os.path.join(here, "solutions")
c.CourseDirectory.release_directory = os.path.join(here, "notebooks")

# Every graded kernel imports the trusted-function snapshot before any student
# code runs, so a notebook that patches torch or numpy cannot fool the checks.
c.Execute.extra_arguments = [
    "--HistoryManager.hist_file=:memory:",
    "--IPKernelApp.exec_lines=import autograder.trusted",
]

# Feedback shows each check's outcome and message, never hidden test code.
c.GenerateFeedback.preprocessors = [
    "nbgrader.preprocessors.GetGrades",
    "nbconvert.preprocessors.CSSHTMLHeaderPreprocessor",
    "autograder.feedback.HideHiddenTests",
]
