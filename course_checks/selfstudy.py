"""Self-study in the learner's own kernel: the grader's diagnosis, solutions after trying, progress.

The released notebooks call three functions (from locked cells, so a submission
cannot change them)::

    self_assess("01_attention", "softmax", globals())   # in each check cell, before the visible asserts
    show_solution("01_attention", "softmax")           # under each check: a button
    progress("01_attention")                           # near the top; progress() in 00 shows the course

Two modes, decided per assignment by whether its reference notebook is in a
``solutions/`` folder above the notebook (``course.solutions_root``) and the grader
package is installed to judge with it:

* self-study (a clone or Binder): ``self_assess`` runs the grader's hidden check
  (``checks.diagnose``, with the in-kernel judge) on the learner's functions and
  prints what the feedback would say (the named misconception and its hint, never
  the test code); when the rest of the cell stops, it says why (``CheckCell``): an
  earlier exercise of the learner's that fails its own check, or the diagnosis
  instead of a traceback from inside the check. ``show_solution`` shows a button;
  a click shows the reference cell once the learner has tried: a check run on their
  own code, not on the stub. Running the cell (Run All) shows no solution;
* class mode (no ``solutions/``): ``self_assess`` says in one line that the cell
  runs the visible checks only; ``show_solution`` says the instructor has them.

Either way a check cell's outcome (hidden and visible checks together) is
recorded in ``.progress.json`` beside the notebook folders (ignored by git):
"passes", "fails", or "not tried" while the exercise is the stub (it still raises
``NotImplementedError``) or not defined. ``progress`` reads the file each time it
is shown, and updates live.

While nbgrader grades or validates (``NBGRADER_EXECUTION`` is set, or the kernel is linked
to ``./course grade``'s judge) every function here returns at once and prints nothing: the
hidden tests grade, no handler is set, and no line of this module can change a grade.
"""

from __future__ import annotations

import html
import json
import os
import time
from pathlib import Path

from IPython.display import Markdown, display

from . import checks, course
from .checks import GRADER_MISSING, Diagnosis, diagnose, judge_for
from .compat import show_error
from .files import write_atomically

PROGRESS_FILE = ".progress.json"
NOT_TRIED, FAILS, PASSES = "not tried", "fails", "passes"


def grading() -> bool:
    """True while nbgrader (or ./course grade) runs the notebook: then nothing here acts. Under
    ``./course grade`` the kernel's link to the grader says so, bound as the kernel started
    (``checks._LINK``, sealed): a notebook that removes ``NBGRADER_EXECUTION`` changes nothing."""
    return checks._LINK is not None or bool(os.environ.get("NBGRADER_EXECUTION"))


def self_study(assignment: str) -> bool:
    """Self-study mode: the reference notebook of ``assignment`` is at hand, and a judge to use it."""
    return judge_for(assignment) not in (None, GRADER_MISSING)


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
    """In a check cell, before its visible asserts: diagnose with the hidden check (self-study), then
    watch the rest of the cell (``CheckCell``): explain what stops it, record its outcome."""
    # Not named ``*check``: a graded notebook's feedback shows this line, and no feedback may
    # show anything that reads like the hidden tests' ``check("`` call.
    if grading():
        return
    outcome = None
    if self_study(assignment):
        outcome = _diagnose(assignment, name, namespace)
    else:
        print("Class mode: this cell runs the visible checks only; the hidden checks run when your instructor grades.")
    CheckCell(assignment, name, namespace, outcome).watch()


def _diagnose(assignment: str, name: str, namespace: dict) -> Diagnosis:
    """Run the grader's check on the learner's code, print its verdict, leave the namespace as it was."""
    from autograder.messages import without_tag  # self-study has the grader package (see self_study)

    try:
        outcome = diagnose(assignment, name, namespace)
        # the visible checks after this line must see the learner's own functions
        outcome.restore()
    except Exception as error:  # the self-check must never break the cell
        message = f"the self-check could not run: {type(error).__name__}: {error}"
        outcome = Diagnosis(assignment, name, passed=False, message=message)
    if outcome.passed:
        print(f"Self-check: `{name}` passes the grader's hidden checks.")
    elif outcome.unfinished:
        # "`softmax` is not implemented yet" (what to do follows where the visible checks stop)
        print(f"Self-check: not tried yet, nothing to check: {without_tag(outcome.message).split(': ')[0]}.")
    else:
        said = without_tag(outcome.message)
        print(f"Self-check: `{name}` fails a hidden check. The grader's feedback would say:\n  {said}")
    return outcome


def _raised_in(error: BaseException) -> str:
    """The qualified name of the function whose code raised ``error`` (``Llama.forward``), or ""."""
    traceback = error.__traceback__
    while traceback is not None and traceback.tb_next is not None:
        traceback = traceback.tb_next
    if traceback is None:
        return ""
    code = traceback.tb_frame.f_code
    return getattr(code, "co_qualname", code.co_name).split("<locals>.")[-1]


def _belongs_to(qualname: str, name: str) -> bool:
    return qualname == name or qualname.startswith(name + ".")


class CheckCell:
    """The rest of one check cell, after ``self_assess``: what the learner sees when it stops, and its record.

    While the cell runs, an exception goes to ``explain`` (IPython's custom exception handler, set
    for this cell only) instead of the traceback, when there is something better to say:

    * the exercise is still the stub (or not defined): "not written yet" in one line, and the
      progress view says "not tried" (no solution is offered for it);
    * the hidden checks passed (they run the exercise with the reference for the earlier exercises
      it builds on) but the visible checks, which run the learner's own earlier exercises, stopped:
      each of those is diagnosed in turn, and the ones that fail are named with their diagnosis;
    * the hidden checks failed and the visible checks' own set-up raised (not one of their asserts):
      the self-check's diagnosis, not a traceback from inside the check.

    Anything else (a visible assert's message, an error nothing explains) shows as usual. Once the
    cell ends, the handler is removed and the outcome is recorded: it passes when the hidden and
    the visible checks both did. Never set up while nbgrader grades (``self_assess`` returns first).
    """

    _current: CheckCell | None = None  # the cell whose handler is set
    _saved: tuple | None = None  # the shell's own custom exceptions and handler, put back after the cell

    def __init__(self, assignment: str, name: str, namespace: dict, outcome: Diagnosis | None):
        self.assignment, self.name, self.namespace = assignment, name, namespace
        self.outcome = outcome  # None in class mode: nothing was diagnosed

    # ---- the cell's life

    def watch(self) -> None:
        try:
            shell = get_ipython()  # noqa: F821 (defined inside IPython only)
        except NameError:
            record(self.assignment, self.name, self.status(None))
            return
        self.shell, self.cell = shell, shell.execution_count
        if CheckCell._current is None:
            CheckCell._saved = (shell.custom_exceptions, shell.CustomTB)
        CheckCell._current = self
        shell.set_custom_exc((Exception,), self._handler)
        shell.events.register("post_run_cell", self.finish)

    def finish(self, result=None) -> None:
        shell = self.shell
        shell.events.unregister("post_run_cell", self.finish)
        if CheckCell._current is self:
            shell.custom_exceptions, shell.CustomTB = CheckCell._saved
            CheckCell._current = CheckCell._saved = None
        error = getattr(result, "error_in_exec", None) or getattr(result, "error_before_exec", None)
        record(self.assignment, self.name, self.status(error, getattr(result, "success", True)))

    def status(self, error: BaseException | None, visible_passed: bool = True) -> str:
        if self.not_tried(error):
            return NOT_TRIED
        hidden_passed = self.outcome is None or self.outcome.passed
        return PASSES if hidden_passed and visible_passed and error is None else FAILS

    def not_tried(self, error: BaseException | None) -> bool:
        """The exercise is still the stub, or not defined: not a try (whatever else the cell did)."""
        if self.outcome is not None and self.outcome.available and self.outcome.unfinished:
            return True
        if isinstance(error, NotImplementedError):  # class mode: the stub raised it, or an earlier one did
            return _belongs_to(_raised_in(error), self.name)
        return isinstance(error, NameError) and getattr(error, "name", None) == self.name

    # ---- what the learner sees

    def _handler(self, shell, etype, value, tb, tb_offset=None):
        lines = None
        try:
            # only in the check cell itself (were its end ever missed, a later cell gets Python's traceback)
            lines = self.explain(value) if shell.execution_count == self.cell else None
        except Exception:  # explaining must never hide the error: then the usual traceback
            lines = None
        if lines is None:
            shell.showtraceback((etype, value, tb), tb_offset=tb_offset)
        else:
            show_error(shell, etype, value, lines)

    def explain(self, error: BaseException) -> list[str] | None:
        """What to show instead of ``error``'s traceback, or None for the usual traceback."""
        stopped = f"{type(error).__name__}: {_first_line(error)}"
        if self.not_tried(error):
            missing = isinstance(error, NameError)
            return [
                f"{type(error).__name__}: `{self.name}` is "
                + (
                    "not defined yet: run its exercise cell above, then this one."
                    if missing
                    else "not written yet: replace `raise NotImplementedError()` in its cell above with your "
                    "code, run that cell, then this one."
                )
            ]
        if self.outcome is None or not self.outcome.available:  # class mode: no diagnosis to give
            earlier = _raised_in(error).split(".")[0]
            if isinstance(error, NotImplementedError) and earlier in exercise_names(self.assignment):
                return [
                    f"NotImplementedError: this check also runs your `{earlier}`, which is not written yet: "
                    "write it first (its cell is above), then run this cell again."
                ]
            return None
        failing = self.failing_earlier_exercises()
        if failing:
            them = _and(f"`{n}`" for n, _ in failing)
            if self.outcome.passed:
                substituted = _and(f"`{n}`" for n in self.outcome.depends_on)
                head = (
                    f"Your `{self.name}` passes on its own: the grader's hidden checks pass (they run it with "
                    f"the reference {substituted}). This check also runs your {them}, which "
                    + ("fails its check:" if len(failing) == 1 else "fail their checks:")
                )
            else:
                head = (
                    f"The self-check above says what is wrong with your `{self.name}`. This check also runs "
                    f"your {them}, which " + ("fails its check:" if len(failing) == 1 else "fail their checks:")
                )
            from autograder.messages import without_tag  # self-study only: a class student has no grader package

            lines = [head]
            for _, diagnosis in failing:
                lines.append("  " + without_tag(diagnosis.message))
            lines.append(
                f"Make {them} pass {'its' if len(failing) == 1 else 'their'} own check first (above), "
                "then run this cell again."
            )
            lines.append(f"(The visible checks stopped at {stopped})")
            return lines
        if not self.outcome.passed and not isinstance(error, AssertionError):
            from autograder.messages import without_tag  # self-study only: a class student has no grader package

            return [
                f"The visible checks could not run to the end ({stopped}).",
                f"The self-check above says why: {without_tag(self.outcome.message)}",
            ]
        return None

    def failing_earlier_exercises(self) -> list[tuple[str, Diagnosis]]:
        """The learner's own earlier exercises of this notebook that this check runs, and fail their checks."""
        from autograder.exercises import module_for  # self-study has the grader package (see self_study)

        graded = module_for(self.assignment).EXERCISES  # not the earlier notebooks' functions restated here
        failing = []
        for earlier in self.outcome.depends_on:
            if earlier not in graded or earlier == self.name:
                continue
            diagnosis = diagnose(self.assignment, earlier, self.namespace)
            diagnosis.restore()
            if not diagnosis.passed:
                failing.append((earlier, diagnosis))
        return failing


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else "(no message)"


def _and(names) -> str:
    names = list(names)
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


# ---------------------------------------------------------------- the reference, after trying


def show_solution(assignment: str, name: str, now: bool = False) -> None:
    """Offer the reference solution of exercise ``name`` (self-study only).

    Running the reveal cell (as Run All does) shows a button and nothing else: showing a solution
    is the learner's own act, a click (or this function typed with ``now=True``), and it works only
    after a real try: a check run on the learner's own code, not on the stub."""
    if grading():
        return
    if not self_study(assignment):
        print(
            "Class mode: the reference solutions stay with your instructor; "
            "ask them, or read your feedback once your work is graded."
        )
        return

    if now:
        display(_reference_or_refusal(assignment, name))
        return
    try:
        import ipywidgets as widgets  # optional: a frontend without widgets gets the line below
    except ImportError:  # a frontend without widgets: the function typed by hand
        print(f'After a try of `{name}`, run show_solution("{assignment}", "{name}", now=True) for its reference.')
        return
    button = widgets.Button(
        description=f"Show the reference solution of {name}", icon="eye", layout=widgets.Layout(width="auto")
    )
    button.add_class("course-show-solution")
    shown = widgets.Output()
    shown.add_class("course-solution")

    def clicked(_button) -> None:
        shown.outputs = ()  # the trait, not clear_output(): a clear message could land after the new output
        shown.append_display_data(_reference_or_refusal(assignment, name))

    button.on_click(clicked)
    note = widgets.HTML(
        f"Stuck on <code>{html.escape(name)}</code>? Once you have run its check on your own code, the button "
        "shows the reference solution (one way among others). Running this cell shows nothing by itself."
    )
    display(widgets.VBox([note, button, shown]))


def _reference_or_refusal(assignment: str, name: str):
    """The reference cell of ``name`` as Markdown when it was tried (its progress is not "not tried"), else why not."""

    status = read_progress().get(assignment, {}).get(name, NOT_TRIED)
    if status == NOT_TRIED:
        return Markdown(
            f"Try `{name}` first: write it in its exercise cell (the stub that raises `NotImplementedError` is "
            "not a try) and run its check cell once, whatever the result; then ask again."
        )
    from autograder import reference  # self-study has the grader package (see self_study)
    from autograder.exercises import exercise  # self-study only: a class student has no grader package

    wanted = exercise(assignment, name).target or name
    solutions = course.solutions_root(assignment)
    sources = [source for grade_id, source in reference.source_cells(assignment, solutions) if grade_id == wanted]
    code = "\n".join(
        line
        for line in "\n".join(sources).splitlines()
        if line.strip() not in ("### BEGIN SOLUTION", "### END SOLUTION")
    )
    verdict = "your check passes: compare" if status == PASSES else "your check still fails: compare it with yours"
    return Markdown(f"**Reference solution for `{name}`** ({verdict}; one way among others):\n\n```python\n{code}\n```")


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

    handle = display(_Shown(*_view(assignment)), display_id=True)
    if handle is not None:
        _views[assignment] = handle  # a view shown again replaces the earlier one


def _refresh_views() -> None:
    for assignment, handle in list(_views.items()):
        try:
            handle.update(_Shown(*_view(assignment)))
        except Exception:  # a view whose notebook closed; the file stays right
            pass
