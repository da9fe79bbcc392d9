"""The vocabulary every catalogue is written in: ``Exercise``, ``Case``, ``ModuleCase``, ``Mistake``.

An exercise module (``autograder/exercises/<topic>.py``) describes each exercise
with these: the seeded inputs it is checked on, its tolerance, what it builds on,
and the known mistakes it can name. The same objects serve the check in the
learner's kernel (``autograder.checks``) and the judge outside it
(``autograder.judging.judge``); comparing outputs is ``autograder.compare``'s job.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
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
