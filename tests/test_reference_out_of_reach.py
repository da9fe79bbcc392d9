"""No reference answer is reachable from student code under ``./course grade``, during or after any check.

Every notebook is submitted by a student whose answers are the reference's, rewritten (every
function first calls ``_look``, and the code is reformatted: other bytecode, other text), so the
checks pass and hand over their substitutes, and the student's own code never matches the
reference's. ``_look`` scans the kernel from inside: on its first call within each check (while
the check's substitutes are in the learner's namespace), and in a cell after each check cell. A
scan walks everything reachable (``gc.get_objects()`` and what they hold, ``sys.modules``, every
frame's globals and locals, the code objects of every function, class and frame) and the files
the kernel can write, and reports

- a code object compiled as ``<reference ...>`` (how the grader names the reference's cells);
- a code object with the bytecode of a function or class of an answer cell;
- a string (or bytes) holding a line of an answer cell's solution that the released and the
  submitted notebooks do not hold;
- a grader module in ``sys.modules``, or the catalogue importable at all.

The kernel only ever sees hashes of what it looks for (the test computes them from
``solutions/``), so the scan cannot find its own needles. Run on the grader before substitutes
(the reference's cells shipped into the kernel), every notebook with dependencies reports its
reference code here.
"""

from __future__ import annotations

import ast
import base64
import hashlib
import json
import re
import tempfile
import zlib
from pathlib import Path

import nbformat
import pytest
from grading_harness import NOTEBOOKS, Course, grade, grade_cells, reference_answers, sandbox_works

from autograder.flags import REVIEW_FLAGS
from autograder.release import assignments

pytestmark = pytest.mark.skipif(not sandbox_works(), reason="bubblewrap cannot start a sandbox here")

ASSIGNMENTS = assignments()  # every notebook of solutions/
MIN_LINE = 24  # shorter lines (`return x`) are common to any code

# The fingerprint of a code object, the same in the test and in the kernel (one source).
CODE_KEY = """
def _code_key(code, _types=__import__("types"), _hashlib=__import__("hashlib")):
    parts = [code.co_code, repr(code.co_names).encode()]
    for const in code.co_consts:
        if isinstance(const, _types.CodeType):
            parts.append(_code_key(const).encode())
        elif isinstance(const, frozenset):
            parts.append(repr(sorted(map(repr, const))).encode())
        else:
            parts.append(repr(const).encode())
    return _hashlib.sha256(b"\\0".join(parts)).hexdigest()
"""

SCANNER = (
    CODE_KEY
    + '''
import gc, importlib.util, json, os, stat, sys, time, types, zlib, hashlib
_LINES = {int(k): set(v) for k, v in _NEEDLES["lines"].items()}
_CODE = set(_NEEDLES["code"])
_STATE = {"after": [], "during": [], "found": [], "seconds": [], "walked": [], "checks": set()}
_GRADER = "auto" + "grader"
_KERNEL_SIDE = "course" + "_checks"


def _line_found(text):
    for line in text.splitlines():
        line = line.strip()
        if len(line) >= _NEEDLES["min"]:
            data = line.encode("utf-8", "surrogatepass")  # any str a process holds, lone surrogates too
            shas = _LINES.get(zlib.crc32(data))
            if shas and hashlib.sha256(data).hexdigest() in shas:
                return line[:60]
    return None


def _scan(where):
    started = time.perf_counter()
    found, codes, texts, seen, frames, stack = [], [], [], set(), [], []
    try:
        _walk(where, found, codes, texts, seen, frames, stack)
        _STATE["found"] += found
        _STATE["seconds"].append(round(time.perf_counter() - started, 1))
        _STATE["walked"].append(len(seen))
    finally:
        # this frame's locals (read below as f_locals) and the frames list make a cycle that
        # outlives the call: emptied, a scan's bookkeeping is not the next scan's to walk
        for mine in (codes, texts, seen, frames, stack):
            mine.clear()


def _walk(where, found, codes, texts, seen, frames, stack):
    # the walk's own bookkeeping holds nothing a notebook left: what it holds is walked where found
    seen.update(map(id, (found, codes, texts, seen, frames, stack)))
    stack += gc.get_objects()
    frames += sys._current_frames().values()
    for frame in frames:
        while frame is not None:
            stack += [frame, frame.f_globals, frame.f_locals]
            frame = frame.f_back
    stack += [m.__dict__ for m in list(vars(sys)["modules"].values()) if hasattr(m, "__dict__")]
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        kind = type(obj)
        if kind is str or kind is bytes:
            if len(obj) >= _NEEDLES["min"]:
                texts.append(obj)
            continue
        if kind is types.CodeType:
            codes.append(obj)
            stack.extend(obj.co_consts)
            continue
        if kind is types.FunctionType:
            stack.append(obj.__code__)
        elif kind is types.FrameType:
            stack.append(obj.f_code)
        if kind in (tuple, list, dict, set, frozenset) or gc.is_tracked(obj):
            try:
                stack.extend(gc.get_referents(obj))
            except Exception:
                pass
    for code in codes:
        if code.co_filename.startswith("<reference"):
            found.append(f"{where}: code compiled as {code.co_filename} ({code.co_name})")
        elif not code.co_name.startswith("<") and _code_key(code) in _CODE:
            found.append(f"{where}: the bytecode of the reference's {code.co_name} ({code.co_filename})")
    for text in texts:
        if isinstance(text, bytes):
            text = text.decode("utf-8", "replace")
        line = _line_found(text)
        if line:
            found.append(f"{where}: a string holding the reference's line {line!r}")
    for name in list(vars(sys)["modules"]):
        grader = name.startswith(_GRADER + ".") and not name.startswith(_GRADER + ".sandboxing")
        if grader or name.startswith(_KERNEL_SIDE + ".reference"):
            found.append(f"{where}: module {name} is loaded")
    try:
        if importlib.util.find_spec(_GRADER + ".exercises") is not None:
            found.append(f"{where}: the catalogue can be imported")
    except Exception:
        pass
    # the installed course (the checkout, the venv: read-only here, as when they are outside /tmp) is
    # not what a notebook could have left; only where it can write is searched
    installed = tuple(
        os.path.realpath(place) + os.sep
        for place in (sys.prefix, os.path.dirname(os.path.dirname(os.path.abspath(os.__file__))))
    ) + tuple(
        os.path.dirname(os.path.realpath(spec.submodule_search_locations[0])) + os.sep
        for spec in [importlib.util.find_spec(_KERNEL_SIDE)]
        if spec is not None and spec.submodule_search_locations
    )
    for top in _NEEDLES.get("tops") or {"/tmp", os.getcwd(), os.environ.get("HOME", "/tmp")}:
        for folder, dirs, names in os.walk(top):
            if (os.path.realpath(folder) + os.sep).startswith(installed):
                dirs[:] = []
                continue
            for name in names[:500]:
                path = os.path.join(folder, name)
                try:
                    info = os.lstat(path)  # regular files only: reading a FIFO would wait for ever
                    if stat.S_ISREG(info.st_mode) and info.st_size < 2_000_000:
                        with open(path, "rb") as handle:
                            line = _line_found(handle.read().decode("utf-8", "replace"))
                        if line:
                            found.append(f"{where}: the file {path} holds the reference's line {line!r}")
                except OSError:
                    pass


def _look(label):
    """Called first thing by every function of the answers: scan once within each check."""
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if code.co_name == "diagnose" and code.co_filename.endswith(os.path.join(_KERNEL_SIDE, "checks.py")):
            # the check by its exercise (a finished check's frame may lend its address to the next)
            check = (frame.f_locals.get("assignment"), frame.f_locals.get("name"))
            if check not in _STATE["checks"]:
                _STATE["checks"].add(check)
                _STATE["during"].append(label)
                tracer = sys.gettrace()  # a probe counting the learner's steps counts none of the scan's
                sys.settrace(None)
                try:
                    _scan(f"during the check that runs {label}")
                finally:
                    sys.settrace(tracer)
            return
        frame = frame.f_back


def _look_after(cell):
    _STATE["after"].append(cell)
    _scan(f"after {cell}")


def _look_report():
    print("OUT-OF-REACH " + json.dumps({k: v for k, v in _STATE.items() if k != "checks"}))
'''
)


def rewritten(source: str, label: str) -> str:
    """``source`` with ``_look(label)`` first in every function, as ``ast.unparse`` writes it."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            node.body.insert(0, ast.parse(f"_look({label!r})").body[0])
    return ast.unparse(tree)


def solution_lines(source: str) -> set[str]:
    lines = set()
    for region in re.findall(r"### BEGIN SOLUTION\n(.*?)### END SOLUTION", source, re.S):
        lines |= {line.strip() for line in region.splitlines() if len(line.strip()) >= MIN_LINE}
    return lines


def needles(assignment: str, released: str, submitted: str) -> dict:
    """What the kernel looks for, as hashes: the reference answers' lines and bytecode."""
    namespace: dict = {}
    exec(CODE_KEY, namespace)
    shown = {line.strip() for line in (released + "\n" + submitted).splitlines()}
    lines: dict[int, list[str]] = {}
    codes = set()
    for source in reference_answers(assignment).values():
        for line in solution_lines(source) - shown:
            lines.setdefault(zlib.crc32(line.encode()), []).append(hashlib.sha256(line.encode()).hexdigest())
        stack = [compile(source, "<answer>", "exec")]
        while stack:
            code = stack.pop()
            stack += [c for c in code.co_consts if isinstance(c, type(code))]
            if not code.co_name.startswith("<"):
                codes.add(namespace["_code_key"](code))
    return {"lines": lines, "code": sorted(codes), "min": MIN_LINE}


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    course = Course.create(tmp_path_factory.mktemp("reach") / "course", ASSIGNMENTS)
    for assignment in ASSIGNMENTS:
        answers = {gid: rewritten(source, gid) for gid, source in reference_answers(assignment).items()}
        notebook = nbformat.read(course.root / "notebooks" / assignment / f"{assignment}.ipynb", as_version=4)
        released = "\n".join(cell.source for cell in notebook.cells)  # the cells' text, not the file's JSON
        hidden = json.dumps(needles(assignment, released, "\n".join(answers.values())))
        blob = base64.b64encode(f"_NEEDLES = {hidden}\n{SCANNER}".encode()).decode()

        def edit(notebook, blob=blob):
            def position(grade_id):
                return next(
                    i
                    for i, c in enumerate(notebook.cells)
                    if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id
                )

            checks = [
                c.metadata["nbgrader"]["grade_id"]
                for c in notebook.cells
                if c.metadata.get("nbgrader", {}).get("grade")
            ]
            for cell in reversed(checks):
                notebook.cells.insert(position(cell) + 1, nbformat.v4.new_code_cell(f"_look_after({cell!r})"))
            notebook.cells.insert(
                position("setup_imports") + 1,
                nbformat.v4.new_code_cell(f"import base64\nexec(base64.b64decode({blob!r}).decode())"),
            )
            notebook.cells.append(nbformat.v4.new_code_cell("_look_report()"))

        course.submit("scanner", assignment, answers, edit=edit)
    # every scan walks the whole kernel: cells get the time and the address space for it
    limits = ["--cell-timeout", "600", "--notebook-timeout", "3600", "--memory-mb", "8192"]
    result = grade(course.root, *limits, timeout=5400)
    assert result.returncode == 0, result.stderr[-3000:] + result.stdout[-3000:]
    return course


def report(course: Course, assignment: str) -> dict:
    path = course.root / "coursework" / "autograded" / "scanner" / assignment / f"{assignment}.ipynb"
    for cell in reversed(nbformat.read(path, as_version=4).cells):
        for output in cell.get("outputs", []):
            for line in output.get("text", "").splitlines():
                if line.startswith("OUT-OF-REACH "):
                    return json.loads(line.removeprefix("OUT-OF-REACH "))
    raise AssertionError(f"{assignment}: the scan did not report")


def scan_cells(course: Course, assignment: str) -> list[str]:
    """What the scans' cells of the graded notebook show (errors: a scan that did not finish)."""
    path = course.root / "coursework" / "autograded" / "scanner" / assignment / f"{assignment}.ipynb"
    shown = []
    for cell in nbformat.read(path, as_version=4).cells:
        if cell.source.startswith("_look_after("):
            outputs = [o.get("text") or f"{o.get('ename')}: {o.get('evalue')}" for o in cell.get("outputs", [])]
            shown.append(f"{cell.source} -> {outputs}"[:500])
    return shown


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_no_reference_answer_is_reachable_during_or_after_any_check(graded, assignment):
    checks = grade_cells(graded.released(assignment))
    seen = report(graded, assignment)
    print(assignment, {key: value for key, value in seen.items() if key != "found"})
    assert seen["found"] == []
    # a scan after every check cell, and one inside every check, with its substitutes in place
    assert seen["after"] == list(checks), scan_cells(graded, assignment)
    assert len(seen["during"]) == len(checks), seen["during"]


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_the_rewritten_reference_gets_full_marks_through_the_substitutes(graded, assignment):
    assert graded.scores("scanner", assignment) == graded.max_scores(assignment)
    flags = json.loads(
        __import__("sqlite3")
        .connect(graded.root / "coursework" / ".work" / "grading.sqlite")
        .execute("SELECT summary FROM graded WHERE student = 'scanner' AND assignment = ?", (assignment,))
        .fetchone()[0]
    )["flags"]
    assert not set(flags) & REVIEW_FLAGS, flags


def test_the_scan_finds_the_reference_where_it_is():
    """The scan can fail: the reference's code and text, put where a kernel could reach them (a
    function compiled from its cells, its source in a variable, a file), are each reported."""
    released = nbformat.read(NOTEBOOKS / "01_attention" / "01_attention.ipynb", as_version=4)
    shown = "\n".join(cell.source for cell in released.cells)
    hidden = needles("01_attention", shown, "")
    namespace: dict = {"_NEEDLES": hidden}
    exec(SCANNER, namespace)
    source = reference_answers("01_attention")["softmax"]
    kept: dict = {}
    exec(compile(source, "<answer>", "exec"), {"torch": __import__("torch")}, kept)
    compiled_as_reference = compile(source, "<reference 01_attention>", "exec")
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "stash.txt").write_text(source)
        hidden["tops"] = [folder]
        namespace["_scan"]("here")
        namespace["_scan"]("again")
    found = namespace["_STATE"]["found"]
    # what a scan walked is not the next one's to walk (once, each held millions of ids)
    first, second = namespace["_STATE"]["walked"]
    assert second < first * 1.05, (first, second)
    assert any("the bytecode of the reference's softmax" in item for item in found), found
    assert any("code compiled as <reference 01_attention>" in item for item in found), found
    assert any("a string holding the reference's line" in item for item in found), found
    assert any("stash.txt holds the reference's line" in item for item in found), found
    del kept, compiled_as_reference
