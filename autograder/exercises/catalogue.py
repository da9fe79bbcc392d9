"""The vocabulary every catalogue is written in: ``Exercise``, ``Mistake``, ``Property``, and the kernel's case types.

An exercise module (``autograder/exercises/<topic>.py``) describes each exercise
with these: the seeded inputs it is checked on (``Case``, ``ModuleCase``, made with
``module_case``, and the scripts of ``course_checks.scripts``: the kernel side's types, which
run the learner's code and compute no answer), its tolerance, what it builds on, the
whole-object looks it needs (``Property``: a probe of ``course_checks.probes`` run where the
learner's code runs, read here), and the known mistakes it can name. The judge
(``autograder.worker.judge``, outside the sandbox) and the in-kernel judge
(``autograder.local_judge``) read them; comparing outputs is ``autograder.compare``'s job.

Nothing here is ever loaded in a graded kernel under ``./course grade``: the cases and probes
travel as data (pickled with the kernel side's classes only), the mistakes and readings stay
with the judge.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from course_checks.cases import Case, ModuleCase

__all__ = ["Case", "ModuleCase", "module_case", "Mistake", "Property", "Exercise"]


def module_case(
    label: str,
    args: tuple = (),
    kwargs: dict | None = None,
    *,
    reference,
    init_args: tuple = (),
    init_kwargs: dict | None = None,
    seed: int = 0,
    dtype: str | None = None,
) -> ModuleCase:
    """A ``ModuleCase`` whose weights are those of ``reference(*init_args, **init_kwargs)`` built under
    ``torch.manual_seed(seed)`` and randomised: default inits (norm weights all 1, zero biases) would
    hide mistakes such as swapped or unused weights. Only the weights travel with the case, never the
    reference class."""

    init_kwargs = dict(init_kwargs or {})
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        module = reference(*init_args, **init_kwargs)
        for parameter in module.parameters():
            if parameter.dim() >= 2:  # weight matrices: keep activations of order 1
                parameter.data.normal_(0.0, parameter.shape[-1] ** -0.5)
            else:  # norm gains and biases: around 1, all different
                parameter.data.normal_(1.0, 0.3)
    state = {k: v.detach().clone() for k, v in module.state_dict().items()}
    return ModuleCase(label, tuple(args), dict(kwargs or {}), tuple(init_args), init_kwargs, state, dtype)


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


class ForReview(str):
    """What a property's reading says when it cannot decide from what it could trust: no points
    lost, the notebook flagged for a human's look (``flags.OBSERVED_IN_KERNEL``) with this note."""


@dataclass
class Property:
    """A whole-object look at the learner's object that comparing outputs cannot give (no loop
    over heads, the blocks registered, causal, reproducible, one token per pass).

    ``probe`` (a ``course_checks.probes`` object, plain data, or a function of the reference
    module that makes one, as ``Exercise.cases`` does: a probe that carries a model with the
    reference's weights) runs where the learner's code runs and reports what it saw;
    ``reading(seen, probe, ref)`` turns that into the learner's message, or None, here with the
    judge (``ref``: the reference module, when the reading needs it).

    ``counted`` names a count the referee keeps of the work the check's substitutes did outside
    the kernel: ``"embedded"``, the token positions their embeddings read; ``"calls/<name>"``, the
    calls of the substitute ``name`` (``Exercise.counted_calls``), as {the shape of the first
    argument, e.g. ``"1x8x3x2"``: how many calls}. Under ``./course grade`` the reading then gets
    ``{"kernel": what the probe saw, "outside": that count}``: what the notebook's kernel cannot
    forge; elsewhere (no referee) what the probe saw alone.
    """

    probe: Any
    reading: Callable[[Any, Any, Any], str | None]
    counted: str | None = None

    def made(self, ref):
        """The probe, made from the reference module ``ref`` when it is made from it."""
        return self.probe(ref) if callable(self.probe) else self.probe


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
    # Whole-object looks (``Property``), read before the cases are compared: the first
    # reading that finds a problem is the check's message.
    properties: Sequence[Property] = ()
    # The learner's object this exercise grades when it is not ``name``: a check
    # with its own points on another exercise's object (e.g. "no loop over heads"
    # in ``MultiHeadAttention``), usually with properties and no cases.
    target: str | None = None
    # Reference objects the probes may use besides the dependencies (not
    # substituted into the learner's namespace; e.g. helpers to fall back on
    # when the learner's own fail). Under ``./course grade`` they are handed in
    # like the dependencies (substitutes for answers of the notebook), under
    # the same rule: only once their own checks ran.
    reference_uses: Sequence[str] = ()
    # Functions of the notebook's set-up code that, under ``./course grade``, the check hands in as
    # substitutes the referee answers (in the learner's namespace while it runs, like the
    # dependencies), so that the judge counts their calls outside the kernel (``Property.counted``
    # ``"calls/<name>"``): e.g. 03's ``attention``, whose calls show a loop over heads. They are in
    # the released notebook, so answering them outside gives nothing away.
    counted_calls: Sequence[str] = ()
