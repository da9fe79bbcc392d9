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
