"""The helper every hidden test calls, in the learner's kernel.

A hidden test cell holds one line::

    from course_checks.checks import check; check("01_attention", "softmax", globals())

A check has two halves. *Observing* runs the learner's code on the exercise's cases
(``observe``); it happens here, where that code lives. *Judging* compares what came out
with the reference and names the misconception when the outputs match a known mistake;
that is a judge's job, and this package holds no reference, no catalogue of mistakes and
no comparison. The judge is, in this order:

- under ``./course grade``: the grader outside the sandbox, over the wire
  (``proxies.RemoteJudge`` on the ``verdict.Link`` found when the kernel starts). No reference
  answer enters the kernel: the dependencies below are substitutes the grader answers from
  outside, and student code cannot reach the comparison;
- the grader package's in-kernel judge (``autograder.local_judge``), when that package is
  installed and the assignment's solution notebook is found above the working folder
  (``course.solutions_root``): stock nbgrader on the instructor's machine, and self-study
  in a clone;
- none: a class student's environment, whose released notebooks hold no hidden checks.

Exercises are checked independently: while an exercise is checked, the functions it builds
on (``depends_on``) are the reference ones (under ``./course grade`` substitutes answered by
the grader, ``proxies``), so a wrong ``softmax`` costs the ``softmax`` points only, not those
of ``attention``. When the hidden checks pass, ``check`` keeps that
substitution until the end of the test cell, so the visible checks after them judge the
exercise alone too; then the learner's own functions are back.

``diagnose`` gives a check's outcome as a ``Diagnosis`` (self-study shows it); ``check``
raises ``CheckFailed`` (an ``AssertionError``) with the judge's message, so nbgrader gives
the test cell no points.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field

from . import course, proxies, trusted, verdict
from .cases import look, observe

_MISSING = object()


class CheckFailed(AssertionError):
    """A check did not pass; its message is written for the learner."""


@dataclass
class Diagnosis:
    """The outcome of one check, as the learner may see it."""

    assignment: str
    name: str
    passed: bool
    message: str | None = None  # the judge's message, as the feedback shows it (None: passed)
    # not tried yet: the learner's code still raises NotImplementedError (the stub), or is not defined
    unfinished: bool = False
    available: bool = True  # False: no judge here (class mode), nothing was checked
    depends_on: tuple[str, ...] = ()
    restore: Callable[[], None] = field(default=lambda: None, repr=False)  # undoes the substitution


# ---------------------------------------------------------------- the check


def substitute(namespace: dict, replacements: dict) -> Callable[[], None]:
    """Put ``replacements`` into ``namespace``; return the function that undoes it."""
    saved = {name: namespace.get(name, _MISSING) for name in replacements}
    namespace.update(replacements)

    def restore() -> None:
        for name, value in saved.items():
            if value is _MISSING:
                namespace.pop(name, None)
            else:
                namespace[name] = value

    return restore


def after_this_cell(action: Callable[..., None]) -> None:
    """Run ``action(result)`` once the current notebook cell has finished, or ``action(None)`` now outside IPython."""
    try:
        shell = get_ipython()  # noqa: F821 (defined inside IPython only)
    except NameError:
        action(None)
        return

    def once(result=None) -> None:
        shell.events.unregister("post_run_cell", once)
        action(result)

    shell.events.register("post_run_cell", once)


GRADER_MISSING = "this environment lacks the grader package (attention-transformers-grader): install it where you grade"


def judge_for(assignment: str):
    """The judge of this kernel's checks of ``assignment`` (see the module's text), or None; or
    ``GRADER_MISSING`` when nbgrader autogrades next to ``solutions/`` without the grader package
    (the instructor's own run, in an environment set up for students)."""
    if _REMOTE is not None:
        return _REMOTE
    solutions = course.solutions_root(assignment)
    if solutions is None:
        return None
    try:
        from autograder.local_judge import LocalJudge  # the grader package, where grading happens
    except ImportError:
        return GRADER_MISSING if os.environ.get("NBGRADER_EXECUTION") == "autograde" else None
    return LocalJudge(solutions)


def not_available(assignment: str, name: str, message: str | None = None) -> Diagnosis:
    return Diagnosis(
        assignment,
        name,
        passed=False,
        available=False,
        message=message
        or f"The hidden checks of `{name}` run when your instructor grades; they are not part of this notebook.",
    )


def diagnose(assignment: str, name: str, namespace: dict, judge=None) -> Diagnosis:
    """Run the hidden check of exercise ``name`` on the learner's code in ``namespace``.

    The reference dependencies stay in ``namespace`` until the caller runs the
    diagnosis's ``restore`` (done already when the check did not pass).
    """
    judge = judge or judge_for(assignment)
    if judge is None or judge is GRADER_MISSING:
        return not_available(assignment, name, judge and f"The hidden checks of `{name}` cannot run: {judge}.")
    shipment = judge.begin(assignment, name, _replaced())
    if isinstance(shipment, str):  # refused: tampering, or out of order
        return Diagnosis(assignment, name, passed=False, message=shipment)
    learner = namespace.get(shipment.target, _MISSING)
    if learner is _MISSING:
        message = f"`{shipment.target}` is not defined: run its exercise cell, and keep the name `{shipment.target}`."
        verdict = judge.missing(assignment, name, message, _replaced())
        return Diagnosis(assignment, name, passed=False, message=verdict, unfinished=verdict == message)
    depends_on = tuple(shipment.depends_on)
    restore = substitute(namespace, {dep: getattr(shipment.given, dep) for dep in depends_on})
    try:
        looked = look(shipment.target, learner, shipment.probes, shipment.given)
        seen = looked if looked.problem else observe(shipment.target, learner, shipment.cases)
        message = judge.result(assignment, name, seen.problem, seen.outputs, _replaced(), looked.seen)
    except BaseException:
        restore()
        raise
    if message:
        restore()
        return Diagnosis(assignment, name, False, message, seen.unfinished, depends_on=depends_on)
    return Diagnosis(assignment, name, True, depends_on=depends_on, restore=restore)


def check(assignment: str, name: str, namespace: dict) -> None:
    """Grade the learner's ``name`` from ``namespace``; raise ``CheckFailed`` if it is wrong."""
    outcome = diagnose(assignment, name, namespace)
    if not outcome.passed:
        raise CheckFailed(outcome.message)
    # The visible checks that follow in the same cell also run with the
    # reference dependencies, so they too judge this exercise alone.
    after_this_cell(lambda _result: outcome.restore())
    print(f"{name}: all hidden checks passed.")


# Bound now, as the kernel starts (``kernel_boot``): replacing ``trusted.replaced`` or the
# link's environment variable afterwards changes nothing here (and the first is itself one
# of the changes the detector reports). Nothing else in the kernel reads the link from the environment.
_replaced = trusted.replaced
_LINK = verdict.link()
_REMOTE = proxies.RemoteJudge(_LINK) if _LINK is not None else None
proxies.register_check(diagnose)  # the one caller whose results a check's connection carries
