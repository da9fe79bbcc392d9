"""The detector of changed grading helpers in the learner's kernel (course_checks/trusted.py,
kernel_boot.py) and the static inspection of indirect routes to them (autograder/worker/tamper.py).
Each is also exercised through the real command by the hostile catalogue (tests/hostile/catalogue.yml)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from torch import nn

import course_checks.kernel_boot  # noqa: F401 (seals the grading helpers here, as in a graded kernel)
from autograder.worker.tamper import forges_helpers, suspicious_code
from course_checks import checks, probes


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


def test_a_warning_while_a_helper_runs_is_no_tampering():
    """Any warning, even an ignored one (a ResourceWarning for a socket collected while a helper's frame
    runs), makes Python add ``__warningregistry__`` to that module's globals: no change to report."""
    found = _forked("""
        import course_checks.modules as m
        exec(compile("__import__('warnings').warn('collected', ResourceWarning)", "<x>", "exec"), vars(m))
        assert "__warningregistry__" in vars(m)
    """)
    assert found == "[]", found


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
        ("import json.encoder\njson.encoder.c_make_encoder = None", "json.encoder.c_make_encoder"),
        ("import json.encoder\njson.encoder.JSONEncoder.encode = repr", "json.encoder.JSONEncoder.encode"),
        ("import socket\nsocket.create_connection = print", "socket.create_connection"),
        ("import course_checks.proxies as p\np.Given._ask = lambda *a, **k: 0", "Given._ask"),
        ("import course_checks.probes as p\np.HeadLoop.run = lambda *a: {}", "HeadLoop.run"),
        # the comparison and the catalogue's types, which a stock-nbgrader check runs in the kernel
        ("import autograder.compare as c\nc.close = lambda *a: None", "autograder.compare.close"),
        ("import course_checks.cases as c\nc.Case.run = lambda self, f: 0", "Case.run"),
        ("import autograder.local_judge as j\nj.LocalJudge.result = lambda *a: None", "LocalJudge.result"),
        # the standard library the kernel side's cases, probes and substitutes call
        ("import ast\nast.walk = lambda node: iter(())", "ast.walk"),
        ("import inspect\ninspect.getsource = lambda f: ''", "inspect.getsource"),
        ("import textwrap\ntextwrap.dedent = str", "textwrap.dedent"),
        ("import io\nio.BytesIO = list", "io.BytesIO"),
        ("import copy\ncopy.deepcopy = lambda x, memo=None: x", "copy.deepcopy"),
        ("import dataclasses\ndataclasses.fields = lambda c: ()", "dataclasses.fields"),
    ],
)
def test_changes_to_the_grading_helpers_are_detected(code, found):
    assert checks._replaced() == []
    assert found in _forked(code)


def test_the_detectors_records_cannot_be_edited_and_a_second_seal_is_reported():
    """What issue 23's detector kept in a module dict (reachable through any helper's ``__globals__``)
    is now in closures, as immutable records: clearing every dict and set the detector's module holds,
    and rebinding its functions, hides nothing; sealing again records nothing and is reported."""
    found = _forked("""
        import course_checks.checks as c
        detector = c.check.__globals__["trusted"]
        for name, value in list(vars(detector).items()):
            if isinstance(value, (dict, set, list)) and not name.startswith("__"):
                value.clear()
        detector._helper_changes = lambda: []
        detector._library_changes = lambda: []
        detector.seal(c)
        import torch
        torch.allclose = lambda *a, **k: True
        c.observe = print
    """)
    for change in ("torch.allclose", "course_checks.checks.observe", "seal (called again", "_helper_changes"):
        assert change in found, (change, found)


SHELL_SWAP = """
import builtins
from IPython.core.interactiveshell import InteractiveShell

shell = InteractiveShell.instance()
builtins.get_ipython = shell.get_ipython
import course_checks.kernel_boot, course_checks.checks
before = course_checks.checks._replaced()
{swap}
print(before, course_checks.checks._replaced())
"""


@pytest.mark.parametrize(
    "swap, found",
    [
        ("shell.run_cell = lambda *a, **k: None", "IPython shell.run_cell"),
        ("shell.showtraceback = lambda *a, **k: None", "IPython shell.showtraceback"),
        ("type(shell).run_cell_async = lambda *a, **k: None", "IPython shell.run_cell_async"),
    ],
)
def test_swapping_the_shells_execution_or_traceback_methods_is_reported(swap, found):
    """A notebook that swaps the shell's ``run_cell``, ``run_cell_async`` or ``showtraceback`` could make
    a cell whose check it stopped report success with no error: the detector reports it."""
    program = SHELL_SWAP.format(swap=swap)
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120)
    before, after = result.stdout.strip().splitlines()[-1].split("] [")
    assert before == "[" and found in after, result.stdout + result.stderr


def test_the_head_loop_probe_counts_with_the_tracer_it_bound_before_student_code(monkeypatch):
    """A notebook that swaps ``sys.settrace`` / ``sys.gettrace`` (keeping the counter instead of
    installing it, and handing it back when asked) leaves the probe counting: it bound them when
    it was imported, before any student code."""
    kept = []
    monkeypatch.setattr(sys, "settrace", kept.append)
    monkeypatch.setattr(sys, "gettrace", lambda: kept[-1] if kept else None)

    class Looping(nn.Module):
        def __init__(self, width, n_heads):
            super().__init__()
            self.n_heads, self.proj = n_heads, nn.Linear(width, width)

        def forward(self, x):
            return sum(self.proj(x) / (h + 1) for h in range(self.n_heads))

    few, many = (probes.HeadLoop().steps(Looping, h) for h in (2, 8))
    assert sum(many.values()) > sum(few.values()) > 0
    assert kept == []


def test_the_head_loop_probe_tells_the_learners_lines_from_the_librarys_with_what_it_found_first(monkeypatch):
    """A notebook that patches ``sysconfig``, ``os.path`` or ``linecache`` so that every line looks
    like the library's (or reads as nothing) still has its loop over heads found and quoted."""
    import linecache
    import os.path
    import sysconfig

    source = "def forward(self, x):\n    return sum(self.proj(x) / (h + 1) for h in range(self.n_heads))\n"
    namespace, cell = {}, "/tmp/ipykernel_0/looping.py"
    exec(compile(source, cell, "exec"), namespace)
    linecache.cache[cell] = (len(source), None, source.splitlines(True), cell)

    class Looping(nn.Module):
        def __init__(self, width, n_heads):
            super().__init__()
            self.n_heads, self.proj = n_heads, nn.Linear(width, width)

        forward = namespace["forward"]

    monkeypatch.setattr(sysconfig, "get_paths", lambda *a, **k: dict.fromkeys(("stdlib", "purelib", "platlib"), "/tmp"))
    monkeypatch.setattr(os.path, "realpath", lambda path, **k: "/lib/" + path.lstrip("/"))
    monkeypatch.setattr(linecache, "getline", lambda *a, **k: "")
    few, many = (probes.HeadLoop().steps(Looping, h) for h in (2, 8))
    where = probes.HeadLoop._loop_line(few, many, {"Looping"})
    assert where is not None and "for h in range(self.n_heads)" in where, where


def test_a_loop_over_heads_compiled_under_a_library_file_name_is_still_counted_and_flagged():
    """A forward pass whose loop over heads is compiled with a library's file name (so that no line of
    it reads as the learner's): the probe counts every frame's steps, so the loop still shows as more
    steps with more heads and the check fails; the compile call is flagged for review."""
    import sysconfig

    from autograder.exercises.multi_head_attention import NO_HEAD_LOOP_PROPERTY

    source = "def forward(self, x):\n    return sum(self.proj(x) / (h + 1) for h in range(self.n_heads))\n"
    namespace = {}
    exec(compile(source, sysconfig.get_paths()["stdlib"] + "/json/heads.py", "exec"), namespace)

    class Looping(nn.Module):
        def __init__(self, width, n_heads):
            super().__init__()
            self.n_heads, self.proj = n_heads, nn.Linear(width, width)

        forward = namespace["forward"]

    seen = probes.HeadLoop().run(Looping, None)
    few, many = seen["steps"]
    assert many > few and seen["where"] is None, seen
    message = NO_HEAD_LOOP_PROPERTY.reading(seen, NO_HEAD_LOOP_PROPERTY.probe, None)
    assert message and "[mistake:head-loop]" in message, message
    found = suspicious_code(['exec(compile(source, "/usr/lib/python3.11/json/heads.py", "exec"))'])
    assert any("compiles code under a file name" in f for f in found) and not any(forges_helpers(f) for f in found)
    assert suspicious_code(['exec(compile(source, "<string>", "exec"))']) == []


def test_the_wire_writes_and_reads_with_what_it_bound_before_student_code():
    """A notebook that patches json (its encoder, its decoder) or base64 changes nothing the wire
    writes or reads: it bound their C parts when it was imported. (The change is reported too.)"""
    found = _forked("""
        import base64, json, json.decoder, json.encoder
        json.encoder.c_make_encoder = None
        json.encoder.JSONEncoder.encode = lambda self, o: '{"tampered": []}'
        json.dumps = lambda *a, **k: '{"tampered": []}'
        json.decoder.JSONDecoder.decode = lambda self, s: {}
        json.loads = lambda *a, **k: {}
        base64.b64encode = lambda data: b""
        from course_checks import verdict
        message = {"op": "result", "tampered": ["torch.allclose"], "outputs": [verdict.encode(1.5)]}
        assert verdict.dumps(message) == b'{"op":"result","tampered":["torch.allclose"],"outputs":[{"value":1.5}]}'
        assert verdict.loads(verdict.dumps(message)) == message
        import torch
        assert verdict.decode(verdict.encode(torch.arange(3.0))).tolist() == [0.0, 1.0, 2.0]
    """)
    assert "json.encoder.c_make_encoder" in found and "json.loads" in found and "base64.b64encode" in found


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
