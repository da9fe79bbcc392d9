"""Read the check cells of the released notebooks and run their visible part in-process.

A check cell (``grade_id`` ``test_<name>``) of a released notebook is a comment, the
``self_assess`` line and the visible checks. The comment lists the visible checks in a
fixed form, and the code runs one block per check, opened by a comment line that is the
check's label::

    # The visible checks below, in order:
    # - worked example: the scores (1, 0, 1) / √2 give weights (0.40, 0.20, 0.40)
    # - large scores: softmax([1000, 0, 1000]) gives numbers, not nan
    # Hidden checks also: 9 inputs against the reference, naming the known mistakes.
    from autograder.selfstudy import self_assess; self_assess("01_attention", "softmax", globals())
    # worked example
    weights = softmax(torch.tensor([1.0, 0.0, 1.0]) / math.sqrt(2))
    assert ...
    # large scores
    ...

A bullet may go on over lines that start with ``#   ``; what follows the bullets is about
the hidden checks and starts with ``# Hidden checks``.

``run_visible`` runs a cell's visible part the way a learner's kernel would after
Restart and Run All, minus the demos: in a fresh namespace holding the notebook's setup
cells and its answer cells up to the check (the reference answers from ``solutions/``,
or other answers given for some of them), and reports in which block it failed and
whose code raised.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parent.parent
# The self-study line, ``from <the kernel-side package> import self_assess; self_assess(...)``
SELF_ASSESS = re.compile(r"^from [\w.]+ import self_assess; self_assess\(")
HEADER = "# The visible checks below, in order:"
BULLET = re.compile(r"^# - (?P<label>[^:]+): (?P<text>\S.*)$")
CONTINUED = re.compile(r"^#   \S")
HIDDEN = "# Hidden checks"
CHECK_FILE = "<visible check {}>"
ANSWER_FILE = "<answer {}>"
SETUP_FILE = "<setup {}>"


def assignments() -> list[str]:
    """The notebooks in course order: the folders of solutions/."""
    return sorted(p.name for p in (REPOSITORY / "solutions").iterdir() if (p / f"{p.name}.ipynb").is_file())


def _cells(path: Path) -> list[dict]:
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def _meta(cell: dict) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


def _source(cell: dict) -> str:
    return "".join(cell["source"])


def released(assignment: str) -> list[dict]:
    return _cells(REPOSITORY / "notebooks" / assignment / f"{assignment}.ipynb")


def reference_answers(assignment: str) -> dict[str, str]:
    """{answer cell grade_id: the reference answer} from solutions/."""
    cells = _cells(REPOSITORY / "solutions" / assignment / f"{assignment}.ipynb")
    return {_meta(c)["grade_id"]: _source(c) for c in cells if _meta(c).get("solution") and not _meta(c).get("grade")}


@dataclass
class Block:
    label: str
    first: int  # line numbers in the visible code, 1-based, inclusive
    last: int


@dataclass
class CheckCell:
    assignment: str
    grade_id: str  # test_<name>
    index: int  # in the released notebook
    comment: list[str]
    visible: str
    problems: list[str] = field(default_factory=list)  # where the cell leaves the fixed form
    bullets: list[str] = field(default_factory=list)
    blocks: list[Block] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.grade_id.removeprefix("test_")

    @property
    def filename(self) -> str:
        return CHECK_FILE.format(f"{self.assignment}/{self.grade_id}")

    def block_at(self, line: int) -> str | None:
        return next((b.label for b in self.blocks if b.first <= line <= b.last), None)


def _parse_comment(cell: CheckCell) -> None:
    lines = cell.comment
    if not lines or lines[0] != HEADER:
        cell.problems.append(f"the comment must open with {HEADER!r}")
        return
    i = 1
    while i < len(lines):
        bullet = BULLET.match(lines[i])
        if bullet:
            cell.bullets.append(bullet["label"].strip())
        elif not (cell.bullets and CONTINUED.match(lines[i])):
            break
        i += 1
    if not cell.bullets:
        cell.problems.append("the comment lists no visible check ('# - <label>: <what it runs>')")
    rest = lines[i:]
    if rest and not rest[0].startswith(HIDDEN):
        cell.problems.append(
            f"after the list, the comment may only describe the hidden checks ({HIDDEN} ...): {rest[0]!r}"
        )
    for line in rest:
        if not line.startswith("#"):
            cell.problems.append(f"the comment holds code before the self_assess line: {line!r}")


def _parse_blocks(cell: CheckCell) -> None:
    lines = cell.visible.splitlines()
    wanted = {f"# {label}": label for label in cell.bullets}
    starts = [(n, wanted[line]) for n, line in enumerate(lines, 1) if line in wanted]
    first_code = next((n for n, line in enumerate(lines, 1) if line.strip()), None)
    if starts and first_code != starts[0][0]:
        cell.problems.append(f"the visible code must open with a label line ('# {cell.bullets[0]}')")
    for (n, label), following in zip(starts, [*starts[1:], (len(lines) + 1, None)]):
        cell.blocks.append(Block(label, n, following[0] - 1))
    found = [b.label for b in cell.blocks]
    if found != cell.bullets:
        cell.problems.append(f"the listed checks {cell.bullets} and the labelled blocks {found} differ")


def check_cells(assignment: str) -> list[CheckCell]:
    found = []
    for index, cell in enumerate(released(assignment)):
        grade_id = _meta(cell).get("grade_id", "")
        if not grade_id.startswith("test_"):
            continue
        lines = _source(cell).splitlines()
        at = [n for n, line in enumerate(lines) if SELF_ASSESS.match(line)]
        check = CheckCell(assignment, grade_id, index, lines[: at[0]] if at else [], "")
        if len(at) != 1:
            check.problems.append("the cell must hold one self_assess line")
        else:
            check.visible = "\n".join(lines[at[0] + 1 :]) + "\n"
            _parse_comment(check)
            _parse_blocks(check)
        found.append(check)
    return found


@dataclass
class Outcome:
    error: BaseException | None  # None: the visible checks passed
    block: str | None = None  # the labelled block that was running
    raised_in: str = ""  # "check": the check's own code; "notebook": an answer or setup cell
    printed: str = ""

    def describe(self) -> str:
        if self.error is None:
            return "passed"
        return f"{type(self.error).__name__} in block {self.block!r} ({self.raised_in}): {self.error}"


def learner_namespace(cell: CheckCell, answers: dict[str, str] | None = None) -> dict:
    """A kernel after Run All up to ``cell``, without the demos: setup cells and answer cells only.

    ``answers`` replaces answer cells ({grade_id: source}); the others hold the reference.
    """
    reference = reference_answers(cell.assignment)
    answers = {**reference, **{k: textwrap.dedent(v) for k, v in (answers or {}).items()}}
    namespace: dict = {"__name__": "__main__"}
    for cell_json in released(cell.assignment)[: cell.index]:
        meta = _meta(cell_json)
        grade_id = meta.get("grade_id", "")
        if grade_id.startswith("setup"):
            exec(compile(_source(cell_json), SETUP_FILE.format(grade_id), "exec"), namespace)
        elif meta.get("solution") and not meta.get("grade"):
            exec(compile(answers[grade_id], ANSWER_FILE.format(grade_id), "exec"), namespace)
    return namespace


def run_visible(cell: CheckCell, answers: dict[str, str] | None = None) -> Outcome:
    """Run the visible part of ``cell`` with the reference answers, ``answers`` replacing some."""
    namespace = learner_namespace(cell, answers)
    code = compile(cell.visible, cell.filename, "exec")
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            exec(code, namespace)
    except Exception as error:
        frames = []
        trace = error.__traceback__
        while trace is not None:
            frames.append((trace.tb_frame.f_code.co_filename, trace.tb_lineno))
            trace = trace.tb_next
        check_lines = [line for filename, line in frames if filename == cell.filename]
        ours = [f for f, _ in frames if f == cell.filename or f.startswith(("<answer ", "<setup "))]
        block = cell.block_at(check_lines[-1]) if check_lines else None
        raised_in = "check" if ours and ours[-1] == cell.filename else "notebook"
        return Outcome(error, block, raised_in, printed.getvalue())
    return Outcome(None, printed=printed.getvalue())
