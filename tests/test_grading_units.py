"""The grading command's parts on their own: no sandbox, no kernels (fast)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import zipfile

import nbformat
import pytest
import torch

from autograder.engine.collect import collect
from autograder.worker.tamper import suspicious_code
from course_checks import verdict

# ---------------------------------------------------------------- the wire


@pytest.mark.parametrize(
    "value",
    [
        torch.tensor([[1.0, 2.0], [3.0, float("nan")]]),
        torch.arange(6, dtype=torch.int64).reshape(2, 3),
        torch.tensor([True, False]),
        torch.zeros(0, 4, dtype=torch.float64),
        torch.tensor(2.5, dtype=torch.bfloat16),
        (torch.ones(2), [1, 2.5, None, "x", True]),
        float("inf"),
    ],
)
def test_outputs_cross_the_wire_unchanged(value):
    back = verdict.decode(verdict.encode(value))

    def same(a, b):
        if isinstance(a, torch.Tensor):
            return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.nan_to_num(7.0), b.nan_to_num(7.0))
        if isinstance(a, (tuple, list)):
            return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
        if isinstance(a, float) and math.isinf(a):
            return a == b
        return a == b

    assert same(value, back)


def test_unknown_objects_cross_as_their_type_name_only():
    class Sneaky:
        def __reduce__(self):
            raise AssertionError("never pickled")

    back = verdict.decode(verdict.encode(Sneaky()))
    assert type(back).__name__ == "Sneaky" and isinstance(back, verdict.Opaque)


@pytest.mark.parametrize(
    "data",
    [
        {"tensor": "float32", "shape": [2], "data": "AAAA"},  # 3 bytes for 8
        {"tensor": "object", "shape": [1], "data": ""},  # not a tensor dtype
        {"tensor": "float32", "shape": [-1], "data": ""},
        {"value": {"nested": "dict"}},
        {"float": "1e999"},
        {"sequence": "tuple", "items": "not a list"},
        {"__reduce__": "os.system"},
        "just a string",
    ],
)
def test_malformed_outputs_are_refused(data):
    with pytest.raises(verdict.ProtocolError):
        verdict.decode(data)


def test_mistake_tags_and_check_calls_are_read_from_text():
    from autograder.messages import mistake_of, without_tag

    assert mistake_of("`softmax`: wrong axis. Hint. [mistake:softmax-wrong-axis]") == "softmax-wrong-axis"
    assert without_tag("`softmax`: wrong axis. Hint. [mistake:softmax-wrong-axis]") == "`softmax`: wrong axis. Hint."
    assert mistake_of("no tag here") is None
    source = (
        '### BEGIN HIDDEN TESTS\nfrom course_checks.checks import check; check("01_attention", "softmax", globals())'
    )
    assert verdict.expected_checks(source) == [("01_attention", "softmax")]


def test_the_grade_commands_own_process_does_not_import_torch():
    """The command's one process only collects and commits; torch (hundreds of MB, a second to
    import) belongs to the workers and their sandboxes."""
    code = "import sys, autograder.grade, autograder.engine.runners; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.stdout.strip() == "False", result.stderr


# ---------------------------------------------------------------- tamper flags


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
        "def softmax(x, dim=-1):\n    e = (x - x.amax(dim, keepdim=True)).exp()\n    return e / e.sum(dim, keepdim=True)",
        "%matplotlib widget\nfrom course_widgets.attention import AttentionHeatmap",
    ],
)
def test_honest_code_is_not_suspicious(source):
    assert suspicious_code([source]) == []


# ---------------------------------------------------------------- collection

NOTEBOOKS = {"00_start_here": ["00_start_here"], "01_attention": ["01_attention"]}


def notebook_bytes() -> bytes:
    return nbformat.writes(nbformat.v4.new_notebook()).encode()


def collector_config():
    from traitlets.config import Config

    from autograder.engine.course import CourseFolder
    from autograder.reference import REPOSITORY

    return CourseFolder(REPOSITORY).config if (REPOSITORY / "nbgrader_config.py").is_file() else Config()


def test_a_zip_of_lms_style_names_is_filed_with_a_message_per_unusable_file(tmp_path):
    archive = tmp_path / "download.zip"
    with zipfile.ZipFile(archive, "w") as out:
        out.writestr("alice_01_attention.ipynb", notebook_bytes())
        out.writestr("bob_smith_attempt_2026-03-01-10-00-00_00_start_here.ipynb", notebook_bytes())
        out.writestr("carol_01_attention (1).ipynb", notebook_bytes())
        out.writestr("random notes.txt", b"hello")
        out.writestr("nobody.ipynb", notebook_bytes())
        out.writestr("dan_99_unknown.ipynb", notebook_bytes())
        out.writestr("../../escape_01_attention.ipynb", notebook_bytes())
        out.writestr("__MACOSX/._alice_01_attention.ipynb", b"junk")
    submitted = tmp_path / "submitted"
    found = collect(archive, NOTEBOOKS, None, collector_config(), submitted, tmp_path / "scratch")
    got = {(s.student, s.assignment) for s in found.submissions}
    assert got == {("alice", "01_attention"), ("bob_smith", "00_start_here"), ("carol", "01_attention")}
    assert (submitted / "alice" / "01_attention" / "01_attention.ipynb").is_file()
    assert (submitted / "bob_smith" / "00_start_here" / "timestamp.txt").read_text().strip() == "2026-03-01-10-00-00"
    text = "\n".join(found.messages)
    for name in ("random notes.txt", "nobody.ipynb", "dan_99_unknown.ipynb", "../../escape_01_attention.ipynb"):
        assert name in text, name
    assert not (tmp_path.parent / "escape_01_attention.ipynb").exists()


def test_a_zip_of_the_nbgrader_layout_and_a_wrongly_named_notebook(tmp_path):
    archive = tmp_path / "class.zip"
    with zipfile.ZipFile(archive, "w") as out:
        out.writestr("submitted/alice/01_attention/01_attention.ipynb", notebook_bytes())
        out.writestr("submitted/alice/01_attention/timestamp.txt", "2026-03-01 10:00:00")
        out.writestr("submitted/bob/01_attention/my attention.ipynb", notebook_bytes())
        out.writestr("submitted/carol/01_attention/notes.md", "no notebook")
        out.writestr("submitted/dan/99_unknown/99_unknown.ipynb", notebook_bytes())
    submitted = tmp_path / "submitted"
    found = collect(archive, NOTEBOOKS, None, collector_config(), submitted, tmp_path / "scratch")
    by_student = {s.student: s for s in found.submissions}
    assert by_student["alice"].timestamp == "2026-03-01 10:00:00"
    assert by_student["bob"].flags == ["wrong-file-name"] and by_student["bob"].path.name == "my attention.ipynb"
    assert by_student["carol"].path is None and "no 01_attention.ipynb was submitted" in by_student["carol"].notes[0]
    assert "dan" not in by_student and any("99_unknown" in m for m in found.messages)
    assert (submitted / "alice" / "01_attention" / "01_attention.ipynb").is_file()


def test_a_zip_never_replaces_a_different_collected_file_unless_asked(tmp_path):
    submitted = tmp_path / "submitted"
    (submitted / "alice" / "01_attention").mkdir(parents=True)
    existing = submitted / "alice" / "01_attention" / "01_attention.ipynb"
    existing.write_text("the first collection")
    archive = tmp_path / "again.zip"
    with zipfile.ZipFile(archive, "w") as out:
        out.writestr("alice_01_attention.ipynb", notebook_bytes())
    found = collect(archive, NOTEBOOKS, None, collector_config(), submitted, tmp_path / "scratch")
    assert existing.read_text() == "the first collection"
    assert any("--replace" in m for m in found.messages)
    collect(archive, NOTEBOOKS, None, collector_config(), submitted, tmp_path / "scratch", replace=True)
    assert existing.read_bytes() == notebook_bytes()


# ---------------------------------------------------------------- the judge

FAKE_CELLS = [
    ("setup_imports", "import torch\nfrom torch import nn"),
    ("double", "def double(x):\n    return 2 * x"),
    ("quad", "def quad(x):\n    return double(double(x))"),
    (
        "Tiny",
        "class Tiny(nn.Module):\n    def __init__(self, d):\n        super().__init__()\n"
        "        self.proj = nn.Linear(d, d, bias=False)\n    def forward(self, x):\n        return self.proj(x)",
    ),
]


@pytest.fixture
def fake_judge(monkeypatch):
    """A Judge for a made-up assignment with a function, a dependant and an nn.Module exercise."""
    import types

    from autograder.exercises import catalogue
    from autograder.worker import judge

    def cases(ref):
        g = torch.Generator().manual_seed(0)
        yield catalogue.Case("a vector", (torch.randn(4, generator=g),))

    def module_cases(ref):
        yield catalogue.module_case("a batch", (torch.ones(2, 3),), reference=ref.Tiny, init_args=(3,), seed=5)

    module = types.SimpleNamespace(
        ASSIGNMENT="99_fake",
        EXERCISES={
            "double": catalogue.Exercise("double", cases),
            "quad": catalogue.Exercise(
                "quad",
                cases,
                depends_on=("double",),
                mistakes=[catalogue.Mistake("times-two", "doubled once", "Double twice.", lambda ref: ref.double)],
            ),
            "Tiny": catalogue.Exercise("Tiny", module_cases),
        },
    )
    monkeypatch.setattr(judge, "module_for", lambda assignment: module)
    return judge.Judge("99_fake", FAKE_CELLS)


def test_dependencies_are_handed_over_only_after_their_own_check_and_never_as_code(fake_judge):
    graded = {"double", "quad", "Tiny"}
    early = fake_judge.shipment("quad", checked=set(), graded=graded)
    assert "checked before `double`" in early["message"]
    shipment = fake_judge.shipment("quad", checked={"double"}, graded=graded)
    assert shipment["setup"] == [FAKE_CELLS[0]]  # the set-up cell's code; no answer cell's
    assert shipment["answers"]["double"] == {"kind": "function"} and "quad" not in shipment["answers"]
    assert shipment["grant"] == ["double"]  # the one substitute this check may call
    assert "def double" not in json.dumps({k: v for k, v in shipment.items() if k != "grant"})
    own = fake_judge.shipment("double", checked=set(), graded=graded)
    assert own["grant"] == [] and "double" not in own["answers"]


def test_module_cases_ship_their_weights_but_not_the_reference_class(fake_judge):
    from course_checks import proxies, verdict

    shipment = fake_judge.shipment("Tiny", checked=set(), graded={"Tiny"})
    assert shipment["grant"] == [] and "Tiny" not in shipment["answers"]
    raw = verdict.b64decode(shipment["cases"])
    assert b"reference" not in raw and b"Tiny" not in raw
    (case,) = proxies.unpack(shipment["cases"])
    assert not hasattr(case, "reference") and set(case.state) == {"proj.weight"}
    output = case.run(fake_judge.ref.Tiny)  # the learner's class would be built the same way
    assert fake_judge.verdict("Tiny", None, [verdict.encode(output)], []) is None
    assert "does not match" in fake_judge.verdict("Tiny", None, [verdict.encode(output + 1)], [])


def test_verdicts_name_mistakes_and_refuse_tampering(fake_judge):
    from course_checks import verdict

    (case,) = fake_judge.cases("quad")
    right = verdict.encode(4 * case.args[0])
    once = verdict.encode(2 * case.args[0])
    assert fake_judge.verdict("quad", None, [right], []) is None
    assert fake_judge.verdict("quad", None, [once], []).endswith("[mistake:times-two]")
    assert "[mistake:tampering]" in fake_judge.verdict("quad", None, [right], ["torch.allclose"])
    assert fake_judge.verdict("quad", "`quad` raised TypeError: boom", [], []) == "`quad` raised TypeError: boom"
    assert "every case" in fake_judge.verdict("quad", None, [], [])


# ---------------------------------------------------------------- where code ends and data begins

REPOSITORY = __import__("pathlib").Path(__file__).resolve().parent.parent


def course_root():
    """nbgrader's course root as the repository's nbgrader_config.py sets it."""
    from pathlib import Path

    from nbgrader.coursedir import CourseDirectory
    from traitlets.config.loader import PyFileConfigLoader

    config = PyFileConfigLoader("nbgrader_config.py", path=str(REPOSITORY)).load_config()
    return Path(CourseDirectory(config=config).root).resolve()


def test_the_course_root_holds_data_and_lies_in_no_python_package():
    from autograder.engine.identity import PACKAGES, code_files, package_folder

    root = course_root()
    assert root == REPOSITORY / "coursework"
    for name in PACKAGES:
        folder = package_folder(name)
        assert not root.is_relative_to(folder) and not folder.is_relative_to(root), (name, folder)
    files = code_files()
    assert files and not [path for path in files if path.is_relative_to(root)]
    assert "coursework/" in (REPOSITORY / ".gitignore").read_text(encoding="utf-8").splitlines()


def test_no_student_file_changes_the_grading_codes_identity():
    """A submission may bring files of any kind (a helper .py too): the digest that Dask workers,
    which have no submissions, compare with the grade command's stays the same."""
    import shutil
    import subprocess
    import sys
    import uuid

    def digest() -> str:
        return subprocess.run(
            [sys.executable, "-c", "from autograder.engine.identity import code_digest; print(code_digest())"],
            cwd=REPOSITORY,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()

    before = digest()
    student = course_root() / "submitted" / f"test-student-{uuid.uuid4().hex[:8]}"
    folder = student / "01_attention"
    try:
        folder.mkdir(parents=True)
        (folder / "helpers.py").write_text("def softmax(x):\n    return x\n", encoding="utf-8")
        (folder / "__init__.py").write_text("", encoding="utf-8")
        (folder / "notes.txt").write_text("my notes", encoding="utf-8")
        assert digest() == before
    finally:
        shutil.rmtree(student, ignore_errors=True)
