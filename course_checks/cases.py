"""How a check runs the learner's code on one input: ``Case`` (call a function) and ``ModuleCase``
(build an ``nn.Module`` with given weights, call it); ``observe`` runs it on every case of a check;
and ``Shipment``, all a judge hands a check.

A case describes an input and how to feed it to the learner's object; it computes no answer of
its own. The grader's catalogues (``autograder/exercises/``) make the cases; under ``./course
grade`` they travel pickled into the sandbox, where this module runs them on the learner's code.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


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
    """An input to an ``nn.Module`` exercise: build, load the given weights, call.

    ``run(cls)`` builds ``cls(*init_args, **init_kwargs)``, loads ``state`` (the weights
    of a reference module built the same way, drawn by the grader: learner and reference
    then share every weight, whatever order the learner creates them in), and returns
    ``forward(*args, **kwargs)`` in eval mode without gradients (in ``dtype``, e.g. "float64",
    when given). A learner whose parameter names differ from the contract gets
    load_state_dict's message naming the missing and unexpected keys.
    """

    init_args: tuple = ()
    init_kwargs: dict = field(default_factory=dict)
    state: dict | None = None
    dtype: str | None = None

    def build(self, cls):
        import torch  # here: the grade command's process reads this module without torch

        module = cls(*self.init_args, **self.init_kwargs)
        module.load_state_dict(self.state)
        if self.dtype is not None:
            module = module.to(getattr(torch, self.dtype))
        return module.eval()

    def run(self, cls) -> Any:
        import torch  # here: the grade command's process reads this module without torch

        module = self.build(cls)
        with torch.no_grad():
            return module(*self.args, **self.kwargs)


@dataclass
class Shipment:
    """What a judge hands a check before it observes the learner's code."""

    target: str  # the learner's object the check grades (usually the exercise's own name)
    depends_on: tuple[str, ...]  # names substituted by the reference while the check runs
    properties: tuple  # whole-object checks, each (learner, reference) -> message or None
    reference: Any  # the reference objects this check may use: its dependencies, nothing of its own
    cases: list  # what to run the learner's code on (``cases.Case``)


def _snapshot_inputs(case):
    import torch  # here: the grade command's process reads this module without torch

    return [v.clone() if isinstance(v, torch.Tensor) else None for v in (*case.args, *case.kwargs.values())]


def _inputs_changed(case, before) -> bool:
    import torch  # here: the grade command's process reads this module without torch

    for value, saved in zip((*case.args, *case.kwargs.values()), before):
        if saved is not None and not torch.equal(value, saved):
            return True
    return False


def _describe_error(name: str, error: BaseException, case) -> str:
    if isinstance(error, NotImplementedError):
        return f"`{name}` is not implemented yet: replace `raise NotImplementedError()` with your code."
    return f"`{name}` raised {type(error).__name__}: {error} (on {case.label})."


@dataclass
class Observation:
    outputs: list
    problem: str | None = None  # why the outputs stop short (an error, an input changed in place)
    unfinished: bool = False  # the problem is the stub's NotImplementedError


def check_properties(name: str, learner, properties, reference) -> Observation:
    """Run the whole-object checks; the first problem found, if any (a stub's NotImplementedError is one)."""
    for prop in properties:
        try:
            problem = prop(learner, reference)
        except NotImplementedError as error:  # the property could not run the learner's code: the stub
            return Observation([], _describe_error(name, error, None), unfinished=True)
        if problem:
            return Observation([], problem)
    return Observation([])


def observe(name: str, learner, cases) -> Observation:
    """Run the learner's ``learner`` on every case, until the first that fails."""
    outputs = []
    for case in cases:
        before = _snapshot_inputs(case)
        try:
            actual = case.run(learner)
        except Exception as error:  # the learner's code may raise anything
            return Observation(outputs, _describe_error(name, error, case), isinstance(error, NotImplementedError))
        if _inputs_changed(case, before):
            return Observation(
                outputs,
                f"`{name}` changed its input in place (on {case.label}); "
                "compute new tensors instead of modifying the arguments.",
            )
        outputs.append(actual)
    return Observation(outputs)
