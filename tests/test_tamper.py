"""What the grader reads as tampering in a submission's code (autograder/worker/tamper.py)."""

import pytest

from autograder.worker.tamper import suspicious_code


@pytest.mark.parametrize(
    "source, finding",
    [
        ("import torch\ntorch.allclose = lambda *a, **k: True", "replaces torch.allclose"),
        ("import numpy as np\nnp.testing.assert_allclose = print", "replaces numpy.testing.assert_allclose"),
        ("import torch.nn.functional as F\nsetattr(F, 'softmax', None)", "calls setattr on torch.nn.functional"),
        ("import builtins\nbuiltins.len = lambda x: 3", "replaces builtins.len"),
        ("import course_checks.checks as c\nc.check = print", "replaces course_checks.checks.check"),
        ("import sys\nsys.modules['course_checks.checks'] = None", "replaces an entry of sys.modules"),
        ("get_ipython().set_custom_exc((Exception,), print)", "installs a handler that hides errors (set_custom_exc)"),
        ("%matplotlib widget\nimport ctypes", "imports ctypes"),
    ],
)
def test_suspicious_code_is_named(source, finding):
    assert finding in suspicious_code([source])


@pytest.mark.parametrize(
    "source",
    [
        "import torch\ntorch.manual_seed(0)\nx = torch.ones(3)\nx.data = torch.zeros(3)",
        "import torch\ntorch.backends.cudnn.deterministic = True",
        "import numpy as np\nnp.set_printoptions(precision=2)",
        "def softmax(x, dim=-1):\n    e = (x - x.amax(dim, keepdim=True)).exp()\n"
        "    return e / e.sum(dim, keepdim=True)",
        "%matplotlib widget\nfrom course_widgets.attention import AttentionHeatmap",
    ],
)
def test_honest_code_is_not_suspicious(source):
    assert suspicious_code([source]) == []


@pytest.mark.parametrize(
    "source, finding",
    [
        (
            "def softmax(x, dim=-1):\n    import sys\n    return sys._getframe(1)",
            "inspects the call stack (sys._getframe)",
        ),
        ("import inspect as i\ncallers = i.stack()", "inspects the call stack (inspect.stack)"),
        ("from inspect import currentframe\ncurrentframe()", "inspects the call stack (inspect.currentframe)"),
        ("def f(frame):\n    return frame.f_back.f_locals", "inspects the call stack (f_back)"),
        ("import sys\nsys.settrace(print)", "inspects the call stack (sys.settrace)"),
        ("check_globals = check.__globals__", "reads function innards (__globals__)"),
        ("cells = getattr(check, '__closure__')", "reads function innards (__closure__)"),
        ("name = '__glo' 'bals__'", "names __globals__ in a string"),
        ("get_ipython().events.register('pre_run_cell', hook)", "registers an IPython event hook"),
        ("get_ipython().input_transformers_post.append(rewrite)", "adds an input transformer"),
        ("shell = get_ipython()\nshell.ast_transformers.append(node_rewriter)", "adds an AST transformer"),
        ("get_ipython().user_ns['softmax'] = twin", "reaches into IPython's user_ns"),
    ],
)
def test_introspection_and_shell_hooks_are_flagged_for_review_but_forge_nothing(source, finding):
    """Reading a call's or a function's innards, and hooking into the shell, are how an answer learns
    that it is checked (or swaps itself in while it is): flagged for review, the checks still count."""
    from autograder.worker.tamper import forges_helpers

    found = suspicious_code([source])
    assert any(finding in f for f in found), found
    assert not any(forges_helpers(f) for f in found), found


@pytest.mark.parametrize(
    "source, finding",
    [
        ("get_ipython().run_cell = lambda *a, **k: None", "replaces the shell's run_cell"),
        ("shell = get_ipython()\nshell.showtraceback = print", "replaces the shell's showtraceback"),
        ("setattr(get_ipython(), 'run_cell_async', fake)", "replaces the shell's run_cell_async"),
        ("kernel = get_ipython().kernel\nkernel.do_execute = fake", "replaces the shell's do_execute"),
    ],
)
def test_replacing_the_shells_execution_is_tampering(source, finding):
    """What a cell runs through and how its error shows: a notebook that swaps them can make a stopped
    check's cell report success, so no check of it counts."""
    from autograder.worker.tamper import forges_helpers

    found = suspicious_code([source])
    assert finding in found and forges_helpers(finding), found


def test_names_like_the_shells_in_honest_code_are_not_suspicious():
    source = (
        "class Log:\n    def __init__(self):\n        self.events = []\n        self.callbacks = {}\n"
        "    def register(self, event):\n        self.events.append(event)\n"
    )
    assert suspicious_code([source]) == []
