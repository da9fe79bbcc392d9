"""The detector of changed grading helpers in the learner's kernel (course_checks/trusted.py,
kernel_boot.py) and the static inspection of indirect routes to them (autograder/worker/tamper.py).
Each is also exercised through the real command by the hostile catalogue (tests/hostile/catalogue.yml)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

import course_checks.kernel_boot  # noqa: F401 (seals the grading helpers here, as in a graded kernel)
from autograder.worker.tamper import forges_helpers, suspicious_code
from course_checks import checks


def _kernel_like(code: str, first: str = "course_checks.kernel_boot") -> subprocess.CompletedProcess:
    """``code`` after the grading helpers load (``first`` first; graded kernels start with
    ``kernel_boot``), in a fresh interpreter; prints what the detector finds."""
    program = (
        f"import {first}\nimport course_checks.kernel_boot, course_checks.checks, course_checks.trusted\n"
        + textwrap.dedent(code)
        + ("\nprint(course_checks.checks._replaced())")
    )
    return subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("first", ["course_checks.kernel_boot", "course_checks.trusted", "course_checks.checks"])
def test_an_untouched_kernel_shows_no_change(first):
    result = _kernel_like("", first)
    assert result.stdout.strip().splitlines()[-1] == "[]", result.stderr


def test_pickling_a_tensor_is_no_tampering():
    """Pickling or deep-copying a tensor (torch.save, copy.deepcopy) makes Python cache
    ``__slotnames__`` on the tensor classes: a learner's legitimate code, not a change to watch.
    A method added to the class still is one."""
    result = _kernel_like("""
        import copy, pickle, torch
        pickle.dumps(torch.nn.Parameter(torch.ones(2)))
        copy.deepcopy(torch.nn.Parameter(torch.ones(2)))
        assert "__slotnames__" in vars(torch.Tensor)
        import course_checks.cases
        pickle.dumps(course_checks.cases.Case("a case", (torch.ones(1),)))  # a helper class's instance, too
        assert "__slotnames__" in vars(course_checks.cases.Case)
        print(course_checks.checks._replaced())
        torch.Tensor.item = lambda self: 0.0
    """)
    untouched, patched = result.stdout.strip().splitlines()[-2:]
    assert untouched == "[]", result.stderr
    assert "torch.Tensor.item" in patched


def _forked(code: str) -> str:
    """What the detector finds after ``code`` runs in a fork of this process (whose helpers
    were sealed when it imported them): the change stays in the fork."""
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            exec(textwrap.dedent(code), {})
            os.write(writer, repr(checks._replaced()).encode())
        finally:
            os._exit(0)
    os.close(writer)
    with os.fdopen(reader) as handle:
        found = handle.read()
    os.waitpid(pid, 0)
    return found


@pytest.mark.parametrize(
    "code, found",
    [
        ("m = __import__('course_' + 'checks.checks', fromlist=['x'])\nsetattr(m, 'observe', print)", "observe"),
        ("import course_checks.verdict as v\nv.Link.result = lambda *a: None", "Link.result"),
        ("import course_checks.verdict as v\nv.encode.__code__ = v.encode.__code__.replace()", "encode"),
        (
            "import sys, types\nsys.modules['course_checks.verdict'] = types.ModuleType('course_checks.verdict')",
            "sys.modules['course_checks.verdict']",
        ),
        ("import course_checks.trusted as t\nt.replaced = lambda: []", "course_checks.trusted.replaced"),
        ("import json\njson.dumps = repr", "json.dumps"),
        # the comparison and the catalogue's types, which a stock-nbgrader check runs in the kernel
        ("import autograder.compare as c\nc.close = lambda *a: None", "autograder.compare.close"),
        ("import course_checks.cases as c\nc.Case.run = lambda self, f: 0", "Case.run"),
        ("import autograder.local_judge as j\nj.LocalJudge.result = lambda *a: None", "LocalJudge.result"),
    ],
)
def test_changes_to_the_grading_helpers_are_detected(code, found):
    assert checks._replaced() == []
    assert found in _forked(code)


@pytest.mark.parametrize(
    "source",
    [
        "f.__code__ = g.__code__",
        "import sys\nm = sys.modules['course_' + 'checks.checks']",
        "setattr(__import__('x'), 'check', None)",
        "exec('import autograder')",
    ],
)
def test_indirect_routes_to_the_helpers_are_named(source):
    found = suspicious_code([source])
    assert found and any(forges_helpers(f) for f in found), found


def test_reload_helpers_are_flagged_but_cost_nothing():
    found = suspicious_code(["import importlib\nimportlib.reload(mymodule)", "from autograder import reference"])
    assert found and not any(forges_helpers(f) for f in found), found
