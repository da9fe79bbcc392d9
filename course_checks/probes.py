"""Probes: looks at the learner's whole object that a comparison of outputs cannot give, run where
the learner's code runs. A probe reports what it saw as plain data (a count, a flag, the
learner's own tokens); it computes no answer and names no mistake. The grader reads what it saw
outside (each exercise's ``Property`` in ``autograder/exercises/``), with the reference at hand
when the reading needs it (the learner's tokens against the reference's, say).

Each probe is a small dataclass the grader makes with its inputs; ``run(learner, given)`` looks
at the learner's object, ``given`` being what the check may use besides it (under ``./course
grade`` the set-up code and substitutes for the reference's answers, ``proxies.Given``).
"""

from __future__ import annotations

import ast
import dataclasses
import gc
import inspect
import linecache
import os
import sys
import sysconfig
import textwrap
from collections import Counter
from dataclasses import dataclass

import torch

# Bound now (the warm interpreter imports this module before any notebook): a notebook that
# swaps ``sys.settrace`` / ``sys.gettrace`` afterwards cannot keep a probe from counting.
_settrace, _gettrace = sys.settrace, sys.gettrace
# The collector runs finalizers of earlier cells' objects (a closed socket's, say) wherever it
# happens to start: the head-loop count runs with it collected first and paused.
_collect, _gc_disable, _gc_enable, _gc_isenabled = gc.collect, gc.disable, gc.enable, gc.isenabled


def _is_view_error(error: BaseException) -> bool:
    """True for torch's error when .view cannot merge the axes of a non-contiguous tensor."""
    return isinstance(error, RuntimeError) and "view size is not compatible" in str(error)


@dataclass
class ViewError:
    """Call the learner's function on ``args`` (or, with ``init_args``, build the learner's class
    and call the module): "view-error" when torch refused a ``.view`` of a non-contiguous tensor,
    else None (other errors are for the cases to describe)."""

    args: tuple = ()
    init_args: tuple | None = None

    def run(self, learner, given):
        try:
            target = learner(*self.init_args) if self.init_args is not None else learner
            target(*self.args)
        except Exception as error:
            if _is_view_error(error):
                return "view-error"
        return None


@dataclass
class IsDataclass:
    """Whether the learner's object is a class decorated with @dataclass."""

    def run(self, learner, given):
        return isinstance(learner, type) and dataclasses.is_dataclass(learner)


@dataclass
class LayersKept:
    """Build the learner's model from the given ``config_class`` (by name) with ``sizes``: "list"
    when its ``layers`` is a plain Python list or tuple (nn.Module does not see the blocks), else
    None (an error is for the cases to describe)."""

    sizes: dict = dataclasses.field(default_factory=dict)
    config_class: str = "ModelConfig"

    def run(self, learner, given):
        try:
            model = learner(getattr(given, self.config_class)(**self.sizes))
        except Exception:
            return None
        return "list" if isinstance(getattr(model, "layers", None), (list, tuple)) else None


@dataclass
class FutureMoves:
    """Build the learner's model from the given ``config_class`` with ``sizes``, give it random
    weights (drawn from ``seed``, as the cases draw theirs), and run it on ``tokens`` and on
    ``edited`` (the same from position ``first`` on changed): [the first earlier position whose
    logits moved by more than ``tolerance``, by how much]; None when none moved (or the model
    could not run: the cases describe that)."""

    sizes: dict = dataclasses.field(default_factory=dict)
    tokens: torch.Tensor = None
    edited: torch.Tensor = None
    first: int = 5
    seed: int = 11
    tolerance: float = 1e-5
    config_class: str = "ModelConfig"

    def run(self, learner, given):
        try:
            with torch.random.fork_rng():
                model = learner(getattr(given, self.config_class)(**self.sizes))
            generator = torch.Generator().manual_seed(self.seed)
            with torch.no_grad():
                for parameter in model.parameters():
                    if parameter.dim() >= 2:  # weight matrices: activations of order 1
                        parameter.copy_(torch.randn(parameter.shape, generator=generator) * parameter.shape[-1] ** -0.5)
                    else:  # norm gains and biases: around 1, all different
                        parameter.copy_(1.0 + 0.3 * torch.randn(parameter.shape, generator=generator))
                model.eval()
                before, after = model(self.tokens), model(self.edited)
        except Exception:
            return None
        T = self.tokens.shape[1]
        if not isinstance(before, torch.Tensor) or not isinstance(after, torch.Tensor) or before.dim() != 3:
            return None
        if before.shape != after.shape or before.shape[1] != T:
            return None
        moved = (after[:, : self.first].double() - before[:, : self.first].double()).abs().amax(dim=(0, 2))
        if bool((moved > self.tolerance).any()):
            position = int(torch.nonzero(moved > self.tolerance)[0])
            return [position, float(moved[position])]
        return None


@dataclass
class SameSamples:
    """Sample twice from the learner's generate after the same ``torch.manual_seed(seed)``: whether
    both gave the same tokens (None when it could not run)."""

    model: torch.nn.Module = None
    prompt: torch.Tensor = None
    steps: int = 5
    seed: int = 123

    def run(self, learner, given):
        outputs = []
        try:
            for _ in range(2):
                with torch.random.fork_rng():
                    torch.manual_seed(self.seed)
                    outputs.append(learner(self.model, self.prompt, self.steps))
            return isinstance(outputs[0], torch.Tensor) and torch.equal(outputs[0], outputs[1])
        except Exception:
            return None


# An attribute the grader sets on a model it hands over to be counted: under ``./course grade`` the
# referee counts the token positions that model's embeddings read in every forward pass it computes
# for the check's substitutes, outside the kernel (``Property.counted``).
COUNTED = "counted_by_the_grader"


@dataclass
class EmbeddedPositions:
    """Generate ``new_tokens`` greedily from ``prompt`` with the learner's function, counting the
    token positions ``model.embed`` reads (a forward hook; under ``./course grade`` forward passes
    made outside are replayed to it, and the referee counts them itself, ``COUNTED``): [the tokens it
    returned (None if it raised), positions]."""

    model: torch.nn.Module = None
    prompt: torch.Tensor = None
    new_tokens: int = 8

    def run(self, learner, given):
        counted = [0]

        def hook(module, inputs, output):
            counted[0] += inputs[0].shape[-1]

        handle = self.model.embed.register_forward_hook(hook)
        try:
            out = learner(self.model, self.prompt, self.new_tokens, temperature=0)
        except Exception:
            out = None
        finally:
            handle.remove()
        return [out if isinstance(out, torch.Tensor) else None, counted[0]]


# ---------------------------------------------------------------- a loop over heads


def _library_folders() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    folders = {os.path.dirname(torch.__file__), paths["stdlib"], paths["purelib"], paths["platlib"]}
    return tuple({form + os.sep for folder in folders for form in (os.path.abspath(folder), os.path.realpath(folder))})


# Found now, as the warm interpreter imports this module (before any notebook), and compared
# with a code object's file name as it stands: a notebook that patches ``sysconfig``,
# ``os.path`` or ``linecache`` afterwards cannot make its own lines pass for the library's.
_LIBRARY = _library_folders()
_getline = linecache.getline


class _TracerRemoved(Exception):
    pass


_LOOPS = (ast.For, ast.AsyncFor, ast.While, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


@dataclass
class HeadLoop:
    """Count the Python steps of one forward pass of the learner's class, built as
    ``cls(width, h)`` for each ``h`` of ``heads``; with the given helpers ``fallback`` (by name)
    in place of the learner's own if theirs fail.

    What it saw, one of: {"steps": [steps per head count], "where": the learner's line that ran
    more often with more heads, quoted, or None}; {"tracer_removed": True} (the forward pass
    switched the counter off); {"raised": the error, "loop": [where, line] of a loop in the
    class's methods or None, "unreadable": True when its source could not be read} when no
    forward pass could run.
    """

    width: int = 16
    tokens: int = 3
    heads: tuple = (2, 8)
    fallback: tuple = ()

    def steps(self, cls, n_heads: int) -> Counter:
        """{(file, line, function's qualified name): Python events} of one forward pass.

        Every call, line and bytecode step of every Python frame counts, so a loop
        of any kind adds steps each time round.
        """
        module = cls(self.width, n_heads)
        x = torch.randn(1, self.tokens, self.width, generator=torch.Generator().manual_seed(9))
        with torch.no_grad():
            module(x)  # warm-up: first-call work (caches, lazy imports) is not counted
        counts = Counter()

        def trace(frame, event, arg):
            code = frame.f_code
            counts[code.co_filename, frame.f_lineno or 0, code.co_qualname.replace(".<locals>", "")] += 1
            if event == "call":
                frame.f_trace_opcodes = True
            return trace

        previous, collecting = _gettrace(), _gc_isenabled()
        _collect()
        _gc_disable()
        _settrace(trace)
        try:
            with torch.no_grad():
                module(x)
        finally:
            current = _gettrace()
            _settrace(previous)
            if collecting:
                _gc_enable()
        if current is not trace:
            raise _TracerRemoved()
        return counts

    def _with_fallback(self, cls, given) -> list:
        from .checks import substitute

        try:
            return [self.steps(cls, h) for h in self.heads]
        except _TracerRemoved:
            raise
        except Exception as failure:
            namespace = getattr(getattr(cls, "forward", None), "__globals__", None)
            if not isinstance(namespace, dict):
                raise
            try:
                helpers = {name: getattr(given, name) for name in self.fallback}
            except AttributeError:  # no helpers here: the learner's own failure stands
                raise failure from None
            restore = substitute(namespace, helpers)
            try:
                return [self.steps(cls, h) for h in self.heads]
            finally:
                restore()

    @staticmethod
    def _loop_line(few: Counter, many: Counter, classes: set) -> str | None:
        """The learner's line that ran more often with more heads, quoted.

        Lines of the class's own methods come first, then other notebook code; the
        earliest such line of a function is the loop's header (a body comes after it).
        """
        found = []
        for (filename, line, function), count in many.items():
            if count <= few.get((filename, line, function), 0):
                continue
            if filename.startswith(_LIBRARY) or "/autograder/" in filename or "/course_checks/" in filename:
                continue
            found.append((function.split(".")[0] not in classes, filename, line, function))
        if not found:
            return None
        _, filename, line, function = min(found)
        text = _getline(filename, line).strip()
        return f"`{text}` (in `{function}`)" if text else f"line {line} of `{function}`"

    @staticmethod
    def _static(cls, error: Exception) -> dict:
        """When the forward pass cannot run: a loop in the class's methods (``__init__`` aside)."""
        seen = {"raised": f"{type(error).__name__}: {error}"[:2000], "loop": None}
        loops = []  # (not about heads, line number, where, line)
        for klass in cls.__mro__:
            if klass.__module__.split(".")[0] == "torch" or klass is object:
                continue
            for method, function in vars(klass).items():
                if method == "__init__" or not inspect.isfunction(function):
                    continue
                try:
                    source = textwrap.dedent(inspect.getsource(function))
                    tree = ast.parse(source)
                except (OSError, TypeError, SyntaxError):
                    return {**seen, "unreadable": True}
                for node in ast.walk(tree):
                    if isinstance(node, _LOOPS):
                        iterables = (
                            [node.iter] if hasattr(node, "iter") else [g.iter for g in getattr(node, "generators", [])]
                        )
                        text = " ".join(ast.unparse(i) for i in iterables).lower()
                        about_heads = "head" in text or text.startswith("range(")
                        line = source.splitlines()[node.lineno - 1].strip()
                        loops.append((not about_heads, node.lineno, f"{klass.__name__}.{method}", line))
        if loops:
            _, _, where, line = min(loops)
            seen["loop"] = [where, line]
        return seen

    def run(self, learner, given):
        try:
            counts = self._with_fallback(learner, given)
        except NotImplementedError:
            raise  # the stub: the check helper says "not implemented yet" (and self-study "not tried")
        except _TracerRemoved:
            return {"tracer_removed": True}
        except Exception as error:  # judged by the syntax tree instead
            return self._static(learner, error)
        few, many = counts[0], counts[-1]
        totals = [sum(count.values()) for count in counts]
        where = None
        if totals[-1] > totals[0]:
            classes = {klass.__name__ for klass in learner.__mro__ if klass.__module__.split(".")[0] != "torch"}
            where = self._loop_line(few, many, classes)
        return {"steps": totals, "where": where}
