"""The helper every hidden test calls.

A hidden test cell holds one line::

    check("01_attention", "softmax", globals())

``check`` takes the learner's ``softmax`` from the notebook's namespace, runs it
and the reference solution (``reference.load``) on the inputs the exercise's
catalogue lists (``autograder/exercises/``), and compares the two. When they
disagree it looks through the exercise's catalogue of known mistakes and, if
the learner's outputs match one of them, says which misconception it is.

Any failure raises ``CheckFailed`` (an ``AssertionError``), so nbgrader gives
the test cell no points; the message is what the feedback shows. Each message
about a catalogued mistake ends with ``[mistake:<id>]`` for the class report.

Exercises are checked independently: while an exercise is checked, the
functions it builds on (``depends_on``) are the reference ones, so a wrong
``softmax`` costs the ``softmax`` points only, not those of ``attention``.
When the hidden checks pass, that substitution lasts until the end of the
test cell, so the visible checks after them judge the exercise alone too;
then the learner's own functions are back.

Under the sandboxed grader (``./course grade``) the reference never enters the
notebook's kernel: ``observe`` runs the learner's function on the cases the
trusted grader hands in, the outputs go out through ``verdict``, and the judge
(``judging.judge``) compares them outside, where student code cannot reach the
comparison. Only
the reference versions of the exercise's dependencies come in (for the
substitution above), and only once their own checks have run.

The exercises' types are ``exercises.catalogue``'s and the comparison is
``compare``'s; this module is only what runs in the learner's kernel.
"""

from __future__ import annotations

from collections.abc import Callable

from . import compare, reference, trusted
from . import verdict as _verdict
from .exercises import catalogue
from .exercises.catalogue import Case, Exercise

_MISSING = object()


class CheckFailed(AssertionError):
    """A check did not pass; its message is written for the learner."""


# ---------------------------------------------------------------- observing the learner's code


def _snapshot_inputs(case: Case):
    import torch

    return [v.clone() if isinstance(v, torch.Tensor) else None for v in (*case.args, *case.kwargs.values())]


def _inputs_changed(case: Case, before) -> bool:
    import torch

    for value, saved in zip((*case.args, *case.kwargs.values()), before):
        if saved is not None and not torch.equal(value, saved):
            return True
    return False


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


def _restore_after_this_cell(restore: Callable[[], None]) -> None:
    """Run ``restore`` once the current notebook cell has finished, or now outside IPython."""
    try:
        shell = get_ipython()  # noqa: F821 (defined inside IPython only)
    except NameError:
        restore()
        return

    def once(_result=None) -> None:
        shell.events.unregister("post_run_cell", once)
        restore()

    shell.events.register("post_run_cell", once)


def _describe_error(name: str, error: BaseException, case: Case) -> str:
    if isinstance(error, NotImplementedError):
        return f"`{name}` is not implemented yet: replace `raise NotImplementedError()` with your code."
    return f"`{name}` raised {type(error).__name__}: {error} (on {case.label})."


def observe(exercise: Exercise, learner, cases) -> tuple[list, str | None]:
    """Run the learner's ``learner`` on every case: (outputs, None), or (partial, problem).

    This is the half of a check that must run where the learner's code lives;
    ``compare.disagreement`` is the half that compares, and may run elsewhere (the
    sandboxed grader runs it outside the sandbox, out of the learner's reach).
    """
    outputs = []
    for case in cases:
        before = _snapshot_inputs(case)
        actual, error = compare.run_case(learner, case)
        if error is not None:
            return outputs, _describe_error(exercise.name, error, case)
        if _inputs_changed(case, before):
            return outputs, (
                f"`{exercise.name}` changed its input in place (on {case.label}); "
                "compute new tensors instead of modifying the arguments."
            )
        outputs.append(actual)
    return outputs, None


def diagnose(exercise: Exercise, learner, ref_function, ref, cases) -> str | None:
    """None when ``learner`` agrees with the reference on every case, else the message."""
    outputs, problem = observe(exercise, learner, cases)
    if problem:
        return problem
    return compare.disagreement(exercise, cases, outputs, compare.reference_outputs(exercise, ref_function, cases), ref)


def check(assignment: str, name: str, namespace: dict) -> None:
    """Grade the learner's ``name`` from ``namespace``; raise ``CheckFailed`` if wrong.

    Under the sandboxed grader (``autograder.grade``) the reference is not
    here: the learner's outputs go out to the trusted grader, which compares
    them (``verdict.link``); otherwise the comparison runs here, against
    ``reference.load``.
    """
    from . import verdict
    from .exercises import exercise as find_exercise

    tampered = _replaced()
    link = verdict.link()
    if tampered and link is None:
        raise CheckFailed(compare.tampering_message(tampered))
    exercise = find_exercise(assignment, name)
    target = exercise.target or name
    learner = namespace.get(target, _MISSING)
    if learner is _MISSING:
        message = f"`{target}` is not defined: run its exercise cell, and keep the name `{target}`."
        if link is not None:
            link.report_missing(assignment, name, message, tampered)
        raise CheckFailed(message)
    if link is not None:
        _check_outside(link, assignment, exercise, learner, namespace, tampered)
        return
    ref = reference.load(assignment)
    restore = substitute(namespace, {dep: getattr(ref, dep) for dep in exercise.depends_on})
    try:
        problem = None
        for prop in exercise.properties:
            problem = problem or prop(learner)
        problem = problem or diagnose(exercise, learner, getattr(ref, target), ref, list(exercise.cases(ref)))
    except BaseException:
        restore()
        raise
    if problem:
        restore()
        raise CheckFailed(compare.finish(target, problem))
    # The visible checks that follow in the same cell also run with the
    # reference dependencies, so they too judge this exercise alone.
    _restore_after_this_cell(restore)
    print(f"{name}: all hidden checks passed.")


def _check_outside(link, assignment: str, exercise: Exercise, learner, namespace: dict, tampered) -> None:
    """The sandboxed half of a check: run the learner here, let the grader judge outside."""
    from . import verdict

    name = exercise.name
    shipment = link.begin(assignment, name, tampered)
    if shipment.get("message"):
        raise CheckFailed(shipment["message"])
    # What the check may see of the reference, and all ``reference.load`` gives in here
    reference.provide(assignment, shipment["cells"])
    dependencies = reference.load(assignment)
    cases = verdict.unpack(shipment["cases"])  # now: they may carry objects of those cells' classes
    restore = substitute(namespace, {dep: getattr(dependencies, dep) for dep in exercise.depends_on})
    try:
        problem = None
        for prop in exercise.properties:
            problem = problem or prop(learner)
        outputs = []
        if not problem:
            outputs, problem = observe(exercise, learner, cases)
        message = link.result(assignment, name, problem, outputs, _replaced())
    except BaseException:
        restore()
        raise
    if message:
        restore()
        raise CheckFailed(message)
    _restore_after_this_cell(restore)
    print(f"{name}: all hidden checks passed.")


# The detector, bound now: replacing ``trusted.replaced`` afterwards changes nothing here
# (and is itself one of the changes it reports).
_replaced = trusted.replaced
trusted.seal(trusted, _verdict, reference, compare, catalogue, __import__(__name__, fromlist=["_"]))
