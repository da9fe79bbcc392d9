"""The judge inside the learner's kernel: stock nbgrader on the instructor's machine, and self-study.

``course_checks.checks`` asks a judge for what to observe (``begin``) and for the verdict on
what it observed (``result``). Under ``./course grade`` the judge is outside the sandbox
(``worker.judge``, over the wire); where no sandbox is (``nbgrader autograde``, a learner's
clone with ``solutions/``) it is this one, in the kernel itself, reading the reference from
the solution notebooks and the cases and mistakes from the catalogues. Either way the same
catalogue and the same comparison (``compare``) decide.
"""

from __future__ import annotations

from pathlib import Path

from course_checks.cases import Shipment, check_properties, observe

from . import compare, messages, reference
from .exercises import exercise as find_exercise


class LocalJudge:
    """Judges checks against the reference in ``solutions`` (a folder of solution notebooks)."""

    def __init__(self, solutions: Path):
        self.solutions = Path(solutions)
        self._cases: dict = {}

    def _reference(self, assignment: str):
        return reference.load(assignment, self.solutions)

    def _cases_of(self, assignment: str, name: str) -> list:
        # a ModuleCase draws its weights when made: the same cases for begin and result
        key = (assignment, name)
        if key not in self._cases:
            self._cases[key] = list(find_exercise(assignment, name).cases(self._reference(assignment)))
        return self._cases[key]

    def begin(self, assignment: str, name: str, tampered) -> Shipment | str:
        if tampered:
            return messages.tampering_message(list(tampered))
        exercise = find_exercise(assignment, name)
        return Shipment(
            target=exercise.target or name,
            depends_on=tuple(exercise.depends_on),
            properties=tuple(exercise.properties),
            reference=self._reference(assignment),
            cases=self._cases_of(assignment, name),
        )

    def result(self, assignment: str, name: str, problem, outputs, tampered) -> str | None:
        if tampered:
            return messages.tampering_message(list(tampered))
        exercise = find_exercise(assignment, name)
        target = exercise.target or name
        if problem:
            return messages.finish(target, problem)
        ref = self._reference(assignment)
        cases = self._cases_of(assignment, name)
        expected = compare.reference_outputs(exercise, getattr(ref, target), cases)
        return messages.finish(target, compare.disagreement(exercise, cases, outputs, expected, ref))

    def missing(self, assignment: str, name: str, message: str, tampered) -> str:
        return messages.tampering_message(list(tampered)) if tampered else message


def judge_function(exercise, learner, ref, cases=None) -> str | None:
    """The message for ``learner`` as ``exercise`` (None when it passes), with ``ref`` the reference module:
    properties, then every case (``exercise.cases(ref)`` unless given), in this process. For tests and
    tools that hold a function, not a kernel."""
    target = exercise.target or exercise.name
    seen = check_properties(target, learner, exercise.properties, ref)
    if seen.problem:
        return messages.finish(target, seen.problem)
    cases = list(exercise.cases(ref)) if cases is None else list(cases)
    seen = observe(target, learner, cases)
    if seen.problem:
        return messages.finish(target, seen.problem)
    expected = compare.reference_outputs(exercise, getattr(ref, target), cases)
    return messages.finish(target, compare.disagreement(exercise, cases, seen.outputs, expected, ref))
