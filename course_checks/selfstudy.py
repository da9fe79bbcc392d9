"""Self-study in the learner's own kernel: the grader's diagnosis, solutions after trying, progress.

The released notebooks call three functions (from locked cells, so a submission
cannot change them)::

    self_assess("01_attention", "softmax", globals())   # in each check cell, before the visible asserts
    show_solution("01_attention", "softmax")           # under each exercise
    progress("01_attention")                           # near the top; progress() in 00 shows the course

Two modes, decided per assignment by whether its reference notebook is in a
``solutions/`` folder above the notebook (``course.solutions_root``) and the grader
package is installed to judge with it:

* self-study (a clone or Binder): ``self_assess`` runs the grader's hidden check
  (``checks.diagnose``, with the in-kernel judge) on the learner's functions and
  prints what the feedback would say (the named misconception and its hint, never
  the test code); ``show_solution`` shows the exercise's reference cell once its
  check has run;
* class mode (no ``solutions/``): ``self_assess`` says in one line that the cell
  runs the visible checks alone; ``show_solution`` says the instructor has them.

Either way a check cell's outcome (hidden and visible checks together) is
recorded in ``.progress.json`` beside the notebook folders (ignored by git),
which ``progress`` reads each time it is shown, and updates live.

While nbgrader grades or validates (``NBGRADER_EXECUTION`` is set) every
function here returns at once and prints nothing: the hidden tests grade, and
no line of this module can change a grade.
"""

from __future__ import annotations

import html
import json
import os
import time
from pathlib import Path

from . import course
from .checks import diagnose, judge_for
from .files import write_atomically

PROGRESS_FILE = ".progress.json"
NOT_TRIED, FAILS, PASSES = "not tried", "fails", "passes"


def grading() -> bool:
    """True while nbgrader (or ./course grade) runs the notebook: then nothing here acts."""
    return bool(os.environ.get("NBGRADER_EXECUTION"))


def self_study(assignment: str) -> bool:
    """Self-study mode: the reference notebook of ``assignment`` is at hand, and a judge to use it."""
    return judge_for(assignment) is not None


# ---------------------------------------------------------------- the progress file


def progress_path() -> Path:
    """``.progress.json`` in the folder that holds the notebook folders (the kernel runs in one of them)."""
    return course.notebooks_root() / PROGRESS_FILE


def read_progress() -> dict:
    """{assignment: {exercise: status}}; empty when nothing was recorded (or the file is unreadable)."""
    try:
        data = json.loads(progress_path().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {
        a: {n: r.get("status", NOT_TRIED) for n, r in exercises.items() if isinstance(r, dict)}
        for a, exercises in data.get("assignments", {}).items()
        if isinstance(exercises, dict)
    }


def record(assignment: str, name: str, status: str) -> None:
    """Store the outcome of one check run (read, change, replace the file whole)."""
    path = progress_path()
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        data = {}
    data.setdefault("assignments", {}).setdefault(assignment, {})[name] = {"status": status, "time": time.time()}
    try:
        write_atomically(path, json.dumps(data, indent=1, sort_keys=True))
    except OSError as error:  # a read-only folder: progress is a convenience, never an error
        print(f"(progress not saved: {error})")
        return
    _refresh_views()


def exercise_names(assignment: str) -> list[str]:
    return course.exercise_names(assignment)


# ---------------------------------------------------------------- the check cell


def self_assess(assignment: str, name: str, namespace: dict) -> None:
    """In a check cell, before its visible asserts: diagnose with the hidden check (self-study) and record."""
    # Not named ``*check``: a graded notebook's feedback shows this line, and no feedback may
    # show anything that reads like the hidden tests' ``check("`` call.
    if grading():
        return
    hidden_passed = True
    if self_study(assignment):
        hidden_passed = _diagnose(assignment, name, namespace)
    else:
        print("Class mode: this cell runs the visible checks only; the hidden checks run when your instructor grades.")
    _record_after_cell(assignment, name, hidden_passed)


def _diagnose(assignment: str, name: str, namespace: dict) -> bool:
    """Run the grader's check on the learner's code, print its verdict, leave the namespace as it was."""
    from autograder.messages import without_tag  # self-study has the grader package (see self_study)

    try:
        outcome = diagnose(assignment, name, namespace)
        # the visible checks after this line must see the learner's own functions
        outcome.restore()
        passed, message = outcome.passed, outcome.message
    except Exception as error:  # the self-check must never break the cell
        passed, message = False, f"the self-check could not run: {type(error).__name__}: {error}"
    if passed:
        print(f"Self-check: `{name}` passes the grader's hidden checks.")
    else:
        print(f"Self-check: `{name}` fails a hidden check. The grader's feedback would say:\n  {without_tag(message)}")
    return passed


def _record_after_cell(assignment: str, name: str, hidden_passed: bool) -> None:
    """Record once the cell ends: it passes when the hidden and the visible checks both did."""
    try:
        shell = get_ipython()  # noqa: F821 (defined inside IPython only)
    except NameError:
        record(assignment, name, PASSES if hidden_passed else FAILS)
        return

    def once(result) -> None:
        shell.events.unregister("post_run_cell", once)
        visible_passed = getattr(result, "success", True)
        record(assignment, name, PASSES if hidden_passed and visible_passed else FAILS)

    shell.events.register("post_run_cell", once)


# ---------------------------------------------------------------- the reference, after trying


def show_solution(assignment: str, name: str) -> None:
    """Show the reference cell of exercise ``name`` once its check cell has run (self-study only)."""
    if grading():
        return
    if not self_study(assignment):
        print(
            "Class mode: the reference solutions stay with your instructor; "
            "ask them, or read your feedback once your work is graded."
        )
        return
    status = read_progress().get(assignment, {}).get(name, NOT_TRIED)
    if status == NOT_TRIED:
        print(
            f"Try `{name}` first: run its check cell once (whatever the result), "
            "then run this cell again to see the reference solution."
        )
        return
    from autograder import reference  # self-study has the grader package (see self_study)
    from autograder.exercises import exercise

    wanted = exercise(assignment, name).target or name
    solutions = course.solutions_root(assignment)
    sources = [source for grade_id, source in reference.source_cells(assignment, solutions) if grade_id == wanted]
    code = "\n".join(
        line
        for line in "\n".join(sources).splitlines()
        if line.strip() not in ("### BEGIN SOLUTION", "### END SOLUTION")
    )
    from IPython.display import Markdown, display

    verdict = "your check passes: compare" if status == PASSES else "your check still fails: compare it with yours"
    display(
        Markdown(f"**Reference solution for `{name}`** ({verdict}; one way among others):\n\n```python\n{code}\n```")
    )


# ---------------------------------------------------------------- progress views

_views: dict = {}  # assignment (None: the course) -> the display handle of its latest view in this kernel


def _counts(assignment: str, recorded: dict) -> tuple[dict, int]:
    statuses = {n: recorded.get(assignment, {}).get(n, NOT_TRIED) for n in exercise_names(assignment)}
    return statuses, sum(s == PASSES for s in statuses.values())


def _view(assignment: str | None) -> tuple[str, str]:
    """(HTML, plain text) of the progress view of ``assignment``, or of the course for None."""
    recorded = read_progress()
    mark = {
        PASSES: '<span style="color:#1a7f37">✓</span>',
        FAILS: '<span style="color:#cf222e">✗</span>',
        NOT_TRIED: '<span style="color:#888">○</span>',
    }
    rows, lines = [], []
    if assignment is None:
        title = "Your progress in the course"
        total = passing = 0
        for each in course.assignments():
            statuses, k = _counts(each, recorded)
            total, passing = total + len(statuses), passing + k
            fails = sum(s == FAILS for s in statuses.values())
            text = f"{each}: {k} of {len(statuses)} pass" + (f", {fails} fail" if fails else "")
            rows.append(f"<li>{html.escape(text)}</li>")
            lines.append(text)
        title += f": {passing} of {total} exercises pass"
    else:
        statuses, k = _counts(assignment, recorded)
        title = f"Your progress in {assignment}: {k} of {len(statuses)} exercises pass"
        for name, status in statuses.items():
            text = f"{name}: {status}"
            rows.append(f"<li>{mark[status]} <code>{html.escape(name)}</code>: {status}</li>")
            lines.append(text)
    note = "from your own check runs, saved in notebooks/.progress.json"
    if assignment is not None and not self_study(assignment):
        note += "; in class mode these are the visible checks only"
    body = (
        f'<div class="course-progress"><b>{html.escape(title)}</b> <small>({html.escape(note)})</small>'
        f"<ul>{''.join(rows)}</ul></div>"
    )
    plain = "\n".join([f"{title} ({note})", *("  " + line for line in lines)])
    return body, plain


class _Shown:
    """A progress view as IPython displays it: HTML in JupyterLab, text elsewhere."""

    def __init__(self, rich: str, plain: str):
        self.rich, self.plain = rich, plain

    def _repr_html_(self):
        return self.rich

    def __repr__(self):
        return self.plain


def progress(assignment: str | None = None) -> None:
    """Show which exercises pass, fail or are not tried yet; the whole course without ``assignment``."""
    if grading():
        return
    from IPython.display import display

    handle = display(_Shown(*_view(assignment)), display_id=True)
    if handle is not None:
        _views[assignment] = handle  # a view shown again replaces the earlier one


def _refresh_views() -> None:
    for assignment, handle in list(_views.items()):
        try:
            handle.update(_Shown(*_view(assignment)))
        except Exception:  # a view whose notebook closed; the file stays right
            pass
