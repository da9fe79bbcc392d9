"""Comparing a learner's outputs with the reference's, and naming the mistake when they differ.

``close`` says in words how one output differs from the expected one (its
kind, shape, values; which item of a tuple, by the name its case gives it);
``disagreement`` goes over every case of an exercise and, when some differ,
looks through the exercise's catalogue of known mistakes for one whose mutant
reproduces every difference. Under ``./course grade`` it runs only outside the
sandbox, in the judge (``autograder.worker.judge``); under stock nbgrader and
in self-study, in the learner's kernel (``autograder.local_judge``).

A message about a catalogued mistake ends with its ``[mistake:<id>]`` (``messages``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from course_checks import trusted
from course_checks.cases import Case

from .exercises.catalogue import Exercise, ForReview, Mistake
from .messages import tagged


def _as_tensor(value):

    if isinstance(value, torch.Tensor):
        return value.detach()
    return trusted.as_tensor(value)


def close(actual, expected, atol: float, rtol: float, names: Sequence[str] = ()) -> str | None:
    """None when ``actual`` matches ``expected``; otherwise what differs, in words.

    A tuple's items are named by ``names`` when it names them all (a case's ``item_names``,
    e.g. "the keys update 3 returned"), else "item 0", "item 1", ..."""

    if isinstance(expected, (tuple, list)):
        if not isinstance(actual, (tuple, list)) or len(actual) != len(expected):
            return (
                f"returned {type(actual).__name__} where a {len(expected)}-item {type(expected).__name__} was expected"
            )
        names = list(names) if len(names) == len(expected) else [f"item {i}" for i in range(len(expected))]
        for name, a, e in zip(names, actual, expected):
            problem = close(a, e, atol, rtol)
            if problem:
                return f"{name}: {problem}"
        return None
    if isinstance(expected, (int, float, bool)) and not isinstance(actual, torch.Tensor):
        try:
            a = float(actual)
        except (TypeError, ValueError):
            return f"returned {type(actual).__name__}, expected a number"
        if isinstance(expected, (int, bool)) and a != expected:
            return f"returned {actual!r}, expected {expected!r}"
        if not math.isclose(a, expected, rel_tol=rtol, abs_tol=atol):
            return f"returned {a:.6g}, expected {expected:.6g}"
        return None
    if actual is None:
        return "returned None (is a `return` missing?)"
    try:
        a = _as_tensor(actual)
    except Exception:
        return f"returned {type(actual).__name__}, expected a tensor"
    e = _as_tensor(expected)
    # The kind of the output before its values: a complex tensor whose real part
    # is right, or integers where real numbers are expected, is a wrong answer
    # (a cast would drop the difference, with a warning at most).
    kind = kind_problem(a, e, strict=not isinstance(expected, (int, float, bool)))
    if kind:
        return kind
    if tuple(a.shape) != tuple(e.shape):
        return f"returned shape {tuple(a.shape)}, expected {tuple(e.shape)}"
    if e.dtype == torch.bool or a.dtype == torch.bool:
        if a.dtype != e.dtype:
            return f"returned dtype {a.dtype}, expected {e.dtype}"
        if not bool((a == e).all()):
            return f"{int((a != e).sum())} of {a.numel()} entries differ"
        return None
    a64, e64 = a.to(torch.float64), e.to(torch.float64)
    if trusted.allclose(a64, e64, atol=atol, rtol=rtol, equal_nan=True):
        return None
    bad_nan = trusted.isnan(a64) & ~trusted.isnan(e64)
    if bool(bad_nan.any()):
        return f"{int(bad_nan.sum())} entries are nan where the reference has numbers"
    difference = (a64 - e64).abs().nan_to_num(nan=math.inf)
    return f"largest difference {float(difference.max()):.3g} (tolerance {atol:g} + {rtol:g}·|expected|)"


def kind_problem(actual, expected, strict: bool = True) -> str | None:
    """What is wrong with the kind of ``actual`` (complex, floating, integer, boolean), if anything.

    Against a plain Python number (``strict`` False) only complex values are refused."""

    def kind(tensor) -> str:
        if tensor.is_complex():
            return "complex"
        if tensor.is_floating_point():
            return "real (floating-point)"
        return "boolean" if str(tensor.dtype) == "torch.bool" else "integer"

    if kind(actual) != kind(expected) and (strict or "complex" in (kind(actual), kind(expected))):
        return (
            f"returned {kind(actual)} values of dtype {actual.dtype}, "
            f"expected {kind(expected)} values ({expected.dtype})"
        )
    return None


def item_names(case: Case) -> Sequence[str]:
    """What each item of ``case``'s output is, when the output is a tuple and the case says so
    (an optional ``item_names`` of the catalogue's case classes); () otherwise."""
    try:
        return tuple(getattr(case, "item_names", ()))
    except Exception:  # a case that cannot name its items: numbered, as any other
        return ()


def run_case(function, case: Case):
    """(output, None) or (None, exception)."""
    try:
        return case.run(function), None
    except Exception as error:  # the learner's code may raise anything
        return None, error


def matches_mistake(mistake: Mistake, ref, failing, exercise: Exercise, predict=None) -> bool:
    """Whether the mutant of ``mistake`` reproduces every failing (index, case, output).

    ``predict(mistake, index, case)`` gives the mutant's (output, error) on a case;
    the grader outside the sandbox passes one that remembers them across notebooks.
    """
    if predict is None:
        try:
            mutant = mistake.mutant(ref)
        except Exception:
            return False

        def predict(_mistake, _index, case):
            return run_case(mutant, case)

    for index, case, actual in failing:
        try:
            predicted, error = predict(mistake, index, case)
        except Exception:
            return False
        if error is not None or close(actual, predicted, exercise.atol, exercise.rtol) is not None:
            return False
    return True


def disagreement(exercise: Exercise, cases, outputs, expected, ref, predict=None) -> str | None:
    """None when ``outputs`` match the reference's ``expected`` on every case, else the message."""
    failing = []  # (index, case, learner output) where it differs from the reference
    first_problem = None
    for index, (case, actual, wanted) in enumerate(zip(cases, outputs, expected)):
        problem = close(actual, wanted, exercise.atol, exercise.rtol, item_names(case))
        if problem:
            failing.append((index, case, actual))
            first_problem = first_problem or f"on {case.label}: {problem}"
    if not failing:
        return None
    for mistake in exercise.mistakes:
        if matches_mistake(mistake, ref, failing, exercise, predict):
            return tagged(f"`{exercise.name}`: {mistake.name}. {mistake.hint}", mistake.id)
    return (
        f"`{exercise.name}` does not match the reference {first_problem} ({len(failing)} of the checked inputs differ)."
    )


def property_problem(exercise: Exercise, probes, seen, ref, notes: list | None = None) -> str | None:
    """The first problem the exercise's properties read in what their probes saw (``seen``, in
    the probes' order; fewer when the probes stopped early), or None. A reading that asks only for
    a human's look (``ForReview``) costs nothing: it goes to ``notes``."""
    target = exercise.target or exercise.name
    for prop, probe, observation in zip(exercise.properties, probes, seen):
        try:
            message = prop.reading(observation, probe, ref)
        except Exception as error:  # what a probe reports comes from the learner's kernel: it may be anything
            message = f"`{target}`: what the check saw could not be read ({type(error).__name__})."
        if isinstance(message, ForReview):
            if notes is not None:
                notes.append(str(message))
            continue
        if message:
            return message
    return None


def reference_outputs(exercise: Exercise, ref_function, cases) -> list:
    """The reference's output on every case (it must not fail)."""
    expected = []
    for case in cases:
        output, error = run_case(ref_function, case)
        if error is not None:
            raise RuntimeError(f"the reference {exercise.name} failed on {case.label}") from error
        expected.append(output)
    return expected
