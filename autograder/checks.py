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
trusted grader hands in, the outputs go out through ``verdict``, and ``judge``
compares them outside, where student code cannot reach the comparison. Only
the reference versions of the exercise's dependencies come in (for the
substitution above), and only once their own checks have run.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from . import reference, trusted
from . import verdict as _verdict

_MISSING = object()


class CheckFailed(AssertionError):
    """A check did not pass; its message is written for the learner."""


@dataclass
class Case:
    """One input to an exercise: ``label`` says in the learner's terms what it is."""

    label: str
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)

    def run(self, function: Callable) -> Any:
        return function(*self.args, **self.kwargs)


@dataclass
class ModuleCase(Case):
    """An input to an ``nn.Module`` exercise: build, load the reference weights, call.

    ``run(cls)`` builds ``cls(*init_args, **init_kwargs)``, loads the state dict
    of the reference class built the same way under ``torch.manual_seed(seed)``
    (so learner and reference share every weight, whatever order the learner
    creates them in), and returns ``forward(*args, **kwargs)`` in eval mode
    without gradients. A learner whose parameter names differ from the contract
    gets load_state_dict's message naming the missing and unexpected keys.
    """

    reference: Any = None  # the reference class, e.g. ref.MultiHeadAttention
    init_args: tuple = ()
    init_kwargs: dict = field(default_factory=dict)
    seed: int = 0

    def reference_state(self) -> dict:
        import torch

        if not hasattr(self, "_state"):
            with torch.random.fork_rng():
                torch.manual_seed(self.seed)
                module = self.reference(*self.init_args, **self.init_kwargs)
                # Randomise every parameter: default inits (norm weights all 1,
                # zero biases) would hide mistakes such as swapped or unused weights.
                for parameter in module.parameters():
                    if parameter.dim() >= 2:  # weight matrices: keep activations of order 1
                        parameter.data.normal_(0.0, parameter.shape[-1] ** -0.5)
                    else:  # norm gains and biases: around 1, all different
                        parameter.data.normal_(1.0, 0.3)
            self._state = {k: v.detach().clone() for k, v in module.state_dict().items()}
        return self._state

    def build(self, cls):
        module = cls(*self.init_args, **self.init_kwargs)
        module.load_state_dict(self.reference_state())
        return module.eval()

    def run(self, cls) -> Any:
        import torch

        module = self.build(cls)
        with torch.no_grad():
            return module(*self.args, **self.kwargs)


@dataclass
class Mistake:
    """A known misconception.

    ``mutant`` builds, from the reference module, a function that behaves the
    way the mistaken code does; a learner whose outputs match it wherever they
    differ from the reference made this mistake.
    """

    id: str
    name: str
    hint: str
    mutant: Callable[[Any], Callable]


@dataclass
class Exercise:
    """What ``check`` needs to know about one exercise."""

    name: str
    # The inputs to check on, given the reference module (class exercises
    # build their reference weights from it). Seeded: the same every run.
    cases: Callable[[Any], Iterable[Case]]
    # Absolute and relative tolerance for comparing outputs, chosen per exercise
    # (the exercise module says why).
    atol: float = 1e-6
    rtol: float = 1e-5
    depends_on: Sequence[str] = ()
    mistakes: Sequence[Mistake] = ()
    # Extra whole-function checks (e.g. "no loop over heads"): each takes the
    # learner's object and returns None or a message.
    properties: Sequence[Callable[[Any], str | None]] = ()
    # The learner's object this exercise grades when it is not ``name``: a check
    # with its own points on another exercise's object (e.g. "no loop over heads"
    # in ``MultiHeadAttention``), usually with properties and no cases.
    target: str | None = None
    # Reference objects the properties may take from ``reference.load`` (not
    # substituted into the learner's namespace; e.g. helpers to fall back on
    # when the learner's own fail). The sandboxed grader ships them in with
    # the dependencies, under the same rule: only once their own checks ran.
    reference_uses: Sequence[str] = ()


# ---------------------------------------------------------------- comparison


def _as_tensor(value):
    import torch

    if isinstance(value, torch.Tensor):
        return value.detach()
    return trusted.as_tensor(value)


def close(actual, expected, atol: float, rtol: float) -> str | None:
    """None when ``actual`` matches ``expected``; otherwise what differs, in words."""
    import torch

    if isinstance(expected, (tuple, list)):
        if not isinstance(actual, (tuple, list)) or len(actual) != len(expected):
            return (
                f"returned {type(actual).__name__} where a {len(expected)}-item {type(expected).__name__} was expected"
            )
        for index, (a, e) in enumerate(zip(actual, expected)):
            problem = close(a, e, atol, rtol)
            if problem:
                return f"item {index}: {problem}"
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
    kind = _kind_problem(a, e, strict=not isinstance(expected, (int, float, bool)))
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


def _kind_problem(actual, expected, strict: bool = True) -> str | None:
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


def _run(function, case: Case):
    """(output, None) or (None, exception)."""
    try:
        return case.run(function), None
    except Exception as error:  # the learner's code may raise anything
        return None, error


def _matches_mistake(mistake: Mistake, ref, failing, exercise: Exercise, predict=None) -> bool:
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
            return _run(mutant, case)

    for index, case, actual in failing:
        try:
            predicted, error = predict(mistake, index, case)
        except Exception:
            return False
        if error is not None or close(actual, predicted, exercise.atol, exercise.rtol) is not None:
            return False
    return True


def observe(exercise: Exercise, learner, cases) -> tuple[list, str | None]:
    """Run the learner's ``learner`` on every case: (outputs, None), or (partial, problem).

    This is the half of a check that must run where the learner's code lives;
    ``judge`` is the half that compares, and may run elsewhere (the sandboxed
    grader runs it outside the sandbox, out of the learner's reach).
    """
    outputs = []
    for case in cases:
        before = _snapshot_inputs(case)
        actual, error = _run(learner, case)
        if error is not None:
            return outputs, _describe_error(exercise.name, error, case)
        if _inputs_changed(case, before):
            return outputs, (
                f"`{exercise.name}` changed its input in place (on {case.label}); "
                "compute new tensors instead of modifying the arguments."
            )
        outputs.append(actual)
    return outputs, None


def judge(exercise: Exercise, cases, outputs, expected, ref, predict=None) -> str | None:
    """None when ``outputs`` match the reference's ``expected`` on every case, else the message."""
    failing = []  # (index, case, learner output) where it differs from the reference
    first_problem = None
    for index, (case, actual, wanted) in enumerate(zip(cases, outputs, expected)):
        problem = close(actual, wanted, exercise.atol, exercise.rtol)
        if problem:
            failing.append((index, case, actual))
            first_problem = first_problem or f"on {case.label}: {problem}"
    if not failing:
        return None
    for mistake in exercise.mistakes:
        if _matches_mistake(mistake, ref, failing, exercise, predict):
            return f"`{exercise.name}`: {mistake.name}. {mistake.hint} [mistake:{mistake.id}]"
    return (
        f"`{exercise.name}` does not match the reference {first_problem} ({len(failing)} of the checked inputs differ)."
    )


def reference_outputs(exercise: Exercise, ref_function, cases) -> list:
    """The reference's output on every case (it must not fail)."""
    expected = []
    for case in cases:
        output, error = _run(ref_function, case)
        if error is not None:
            raise RuntimeError(f"the reference {exercise.name} failed on {case.label}") from error
        expected.append(output)
    return expected


def diagnose(exercise: Exercise, learner, ref_function, ref, cases) -> str | None:
    """None when ``learner`` agrees with the reference on every case, else the message."""
    outputs, problem = observe(exercise, learner, cases)
    if problem:
        return problem
    return judge(exercise, cases, outputs, reference_outputs(exercise, ref_function, cases), ref)


def tampering_message(tampered: Sequence[str]) -> str:
    shown = ", ".join(tampered[:5]) + (" ..." if len(tampered) > 5 else "")
    return (
        f"This notebook replaced functions the checks rely on ({shown}), so no check "
        "in it can be trusted and it gets no points for them; it is flagged for review. "
        "[mistake:tampering]"
    )


def finish(name: str, problem: str | None) -> str | None:
    """The learner-facing message for a failed check (None when it passed)."""
    if not problem:
        return None
    return problem if problem.startswith("`") else f"`{name}`: {problem}"


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
        raise CheckFailed(tampering_message(tampered))
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
        raise CheckFailed(finish(target, problem))
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
trusted.seal(trusted, _verdict, reference, __import__(__name__, fromlist=["_"]))
