"""Self-study mode as a learner meets it, in a real JupyterLab and chromium.

The student notebook 01 is opened once in self-study mode (``solutions/`` is
there, as in a clone or on Binder) and worked through as a learner would: Run All
on the untouched notebook stops at the first check, which says in one line that
``softmax`` is not written yet; the progress view says "not tried" everywhere and
no solution shows. The reveal cell's button refuses before a try; a hint opens; a
catalogued mistake typed into ``softmax`` makes its check cell name that
misconception and the progress view turn to "fails"; the button then shows the
solution. A right ``attention_weights`` over a wrong ``softmax`` is told that its
check stops because of ``softmax``. Correct answers turn to "passes", and Run All
again shows the buttons, not the solutions. The same notebook served by a
JupyterLab whose kernels have no ``solutions/`` (class mode) shows the class-mode
lines, "not tried" for the stub, and no line of solution code, in the page or in
the saved notebook. Screenshots land in test-artifacts/selfstudy/ (docs/self-study.md's
come from there)."""

import json
import time

import pytest
from browser_harness import ARTIFACTS, REPOSITORY, JupyterLab, LabNotebook, link_assets, needs_chromium, place_in_lab

from autograder import reference
from autograder.exercises import exercise

VIEWPORT = {"width": 1400, "height": 1000}

pytestmark = needs_chromium

ASSIGNMENT = "01_attention"
STUDENT = REPOSITORY / "notebooks" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"
SCREENSHOTS = ARTIFACTS / "selfstudy"
NO_MAX_SOFTMAX = "def softmax(x, dim=-1):\n    e = torch.exp(x)\n    return e / e.sum(dim=dim, keepdim=True)\n"
WRONG_AXIS_SOFTMAX = (
    "def softmax(x, dim=-1):\n    e = torch.exp(x - x.amax(dim=0, keepdim=True))\n"
    "    return e / e.sum(dim=0, keepdim=True)\n"
)
RIGHT_ATTENTION_WEIGHTS = (
    "def attention_weights(q, k, mask=None):\n    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])\n"
    "    if mask is not None:\n        scores = scores.masked_fill(~mask, float('-inf'))\n"
    "    return softmax(scores, dim=-1)\n"
)
RIGHT_SOFTMAX = (
    "def softmax(x, dim=-1):\n    e = torch.exp(x - x.max(dim=dim, keepdim=True).values)\n"
    "    return e / e.sum(dim=dim, keepdim=True)\n"
)


def cell_index(grade_id: str) -> int:
    cells = json.loads(STUDENT.read_text())["cells"]
    return next(i for i, c in enumerate(cells) if c.get("metadata", {}).get("nbgrader", {}).get("grade_id") == grade_id)


def hint_cell_index(name: str) -> int:
    cells = json.loads(STUDENT.read_text())["cells"]
    return next(
        i
        for i, c in enumerate(cells)
        if "Hint 1 of" in "".join(c["source"]) and f"<code>{name}</code>" in "".join(c["source"])
    )


def solution_lines(assignment: str) -> list[str]:
    """The reference's answer lines (between nbgrader's markers), long enough to be telling."""
    lines = []
    for _grade_id, source in reference.source_cells(assignment):
        inside = False
        for line in source.splitlines():
            if line.strip() == "### BEGIN SOLUTION":
                inside = True
            elif line.strip() == "### END SOLUTION":
                inside = False
            elif inside and len(line.strip()) >= 12:
                lines.append(line.strip())
    return lines


def wait_for_text(locator, text: str, timeout_s: float = 60) -> str:
    deadline = time.monotonic() + timeout_s
    seen = ""
    while time.monotonic() < deadline:
        seen = locator.inner_text()
        if text in seen:
            return seen
        time.sleep(0.2)
    raise AssertionError(f"{text!r} did not appear within {timeout_s} s; the text was:\n{seen}")


def run_cell(notebook: LabNotebook, index: int, timeout_s: float = 120):
    """Run one cell (Ctrl+Enter) and wait until its prompt shows a new execution count; returns the cell."""
    cell = notebook.cells().nth(index)
    prompt = cell.locator(".jp-InputArea-prompt")
    before = prompt.inner_text().strip()
    editor = cell.locator(".cm-content")
    editor.scroll_into_view_if_needed()
    editor.click()
    notebook.page.keyboard.press("Control+Enter")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        now = prompt.inner_text().strip()
        if now not in ("", "[ ]:", "[*]:", before):
            return cell
        time.sleep(0.2)
    raise TimeoutError(f"cell {index} did not finish in {timeout_s} s")


def type_answer(notebook: LabNotebook, index: int, source: str) -> None:
    editor = notebook.cells().nth(index).locator(".cm-content")
    editor.scroll_into_view_if_needed()
    editor.click()
    notebook.page.keyboard.press("Control+A")
    notebook.page.keyboard.insert_text(source)


def reveal_output(notebook: LabNotebook, name: str):
    return notebook.cells().nth(cell_index(f"reveal_{name}")).locator(".jp-Cell-outputArea")


def click_show_solution(notebook: LabNotebook, name: str, expect: str) -> str:
    """Click the reveal cell's button; the text it then shows below itself, once it holds ``expect``."""
    button = reveal_output(notebook, name).locator("button.course-show-solution")
    button.scroll_into_view_if_needed()
    button.click()
    return wait_for_text(reveal_output(notebook, name).locator(".course-solution"), expect, timeout_s=30)


def assert_no_solution_shown(notebook: LabNotebook) -> None:
    """No line of any of 01's reference answers in the page's outputs (the learner's own cells aside)."""
    shown = " ".join(notebook.page.locator(".jp-NotebookPanel .jp-OutputArea").all_inner_texts())
    for line in solution_lines(ASSIGNMENT):
        assert line not in shown, line


def test_a_self_learner_gets_hints_the_diagnosis_the_solution_after_trying_and_progress(lab, browser):
    (lab.root_dir / "notebooks" / ".progress.json").unlink(missing_ok=True)
    path = place_in_lab(lab, STUDENT)
    page = browser.new_page(viewport=VIEWPORT)
    notebook = LabNotebook(page, lab.url(path))
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    mistake = next(m for m in exercise(ASSIGNMENT, "softmax").mistakes if m.id == "softmax-no-max-subtraction")
    wrong_axis = next(m for m in exercise(ASSIGNMENT, "softmax").mistakes if m.id == "softmax-wrong-axis")
    try:
        notebook.open()

        # Run All on the untouched notebook (as 00 recommends): it stops at the first check, which says in
        # one line that softmax is not written yet; nothing is tried, no solution shows
        notebook.run_all()
        progress = notebook.cells().nth(cell_index("progress")).locator(".jp-OutputArea")
        view = wait_for_text(progress, "0 of 3 exercises pass")
        for name in ("softmax", "attention_weights", "attention"):
            assert f"{name}: not tried" in view
        check = notebook.cells().nth(cell_index("test_softmax"))
        text = wait_for_text(check.locator(".jp-OutputArea"), "not written yet")
        assert "Traceback" not in text and "Self-check: not tried yet" in text
        assert_no_solution_shown(notebook)
        check.scroll_into_view_if_needed()
        page.screenshot(path=SCREENSHOTS / "untouched_after_run_all.png")

        # the reveal cell, run by hand, shows a button; before a try its click says to try first
        run_cell(notebook, cell_index("reveal_softmax"))
        click_show_solution(notebook, "softmax", "Try softmax first")
        assert_no_solution_shown(notebook)

        # a hint opens on a click, the next one stays folded
        hints = notebook.cells().nth(hint_cell_index("softmax")).locator("details")
        assert hints.count() == 3
        hints.nth(0).locator("summary").scroll_into_view_if_needed()
        assert not hints.nth(0).locator("p").first.is_visible()
        hints.nth(0).locator("summary").click()
        assert hints.nth(0).get_attribute("open") is not None
        assert hints.nth(0).locator("p").first.is_visible()
        assert "keepdim=True" in hints.nth(0).inner_text()
        assert hints.nth(1).get_attribute("open") is None

        # a catalogued mistake: its check cell names it, with its hint
        type_answer(notebook, cell_index("softmax"), NO_MAX_SOFTMAX)
        run_cell(notebook, cell_index("softmax"))
        check = run_cell(notebook, cell_index("test_softmax"))
        text = wait_for_text(check.locator(".jp-OutputArea"), "fails a hidden check")
        assert mistake.name in text and mistake.hint in text
        assert "HIDDEN TESTS" not in text and "autograder" not in text
        assert "softmax: fails" in wait_for_text(progress, "softmax: fails")
        check.scroll_into_view_if_needed()
        page.screenshot(path=SCREENSHOTS / "hint_and_diagnosis.png")

        # after that real try, the same button shows the reference solution
        answer = next(s for g, s in reference.source_cells(ASSIGNMENT) if g == "softmax")
        key_line = next(line.strip() for line in answer.splitlines() if "amax" in line)
        shown = click_show_solution(notebook, "softmax", "Reference solution for softmax")
        assert key_line in shown, shown
        assert "BEGIN SOLUTION" not in shown
        reveal_output(notebook, "softmax").scroll_into_view_if_needed()
        page.screenshot(path=SCREENSHOTS / "revealed_solution.png")

        # attention_weights right, softmax over the wrong axis: its check passes the hidden checks
        # (run with the reference softmax) and says that the visible ones stop because of softmax
        type_answer(notebook, cell_index("softmax"), WRONG_AXIS_SOFTMAX)
        run_cell(notebook, cell_index("softmax"))
        type_answer(notebook, cell_index("attention_weights"), RIGHT_ATTENTION_WEIGHTS)
        run_cell(notebook, cell_index("attention_weights"))
        check = run_cell(notebook, cell_index("test_attention_weights"))
        text = wait_for_text(check.locator(".jp-OutputArea"), "which fails its check")
        assert "Your `attention_weights` passes on its own" in text and "runs your `softmax`" in text
        assert wrong_axis.name in text and "Traceback" not in text
        check.locator(".jp-OutputArea").scroll_into_view_if_needed()
        page.screenshot(path=SCREENSHOTS / "earlier_exercise_fails.png")

        # a correct answer of one's own: passes, and the progress view says so
        type_answer(notebook, cell_index("softmax"), RIGHT_SOFTMAX)
        run_cell(notebook, cell_index("softmax"))
        check = run_cell(notebook, cell_index("test_softmax"))
        assert "passes the grader's hidden checks" in wait_for_text(check.locator(".jp-OutputArea"), "Self-check")
        assert check.locator('[data-mime-type="application/vnd.jupyter.stderr"]').count() == 0
        check = run_cell(notebook, cell_index("test_attention_weights"))
        wait_for_text(check.locator(".jp-OutputArea"), "attention_weights: the visible checks pass")
        assert "softmax: passes" in wait_for_text(progress, "2 of 3 exercises pass")
        # shown again (as after reopening the notebook), the view reads the same from the file
        progress = run_cell(notebook, cell_index("progress")).locator(".jp-OutputArea")
        assert "attention: not tried" in wait_for_text(progress, "2 of 3 exercises pass")
        progress.scroll_into_view_if_needed()
        page.screenshot(path=SCREENSHOTS / "progress.png")
        recorded = json.loads((lab.root_dir / "notebooks" / ".progress.json").read_text())
        assert recorded["assignments"][ASSIGNMENT]["softmax"]["status"] == "passes"

        # Run All again: both tried exercises' reveal cells run now, and show their buttons, no solution
        notebook.run_all()
        for name in ("softmax", "attention_weights"):
            wait_for_text(reveal_output(notebook, name), "Stuck on")
            assert reveal_output(notebook, name).locator("button.course-show-solution").count() == 1
        assert_no_solution_shown(notebook)
    finally:
        page.close()


@pytest.fixture(scope="module")
def class_lab(tmp_path_factory):
    """JupyterLab whose notebooks have no solutions/ above them (an instructor's release): class mode."""
    root = link_assets(tmp_path_factory.mktemp("class-lab"), solutions=False)
    with JupyterLab(root) as server:
        yield server


def test_the_same_notebook_in_class_mode_says_so_and_holds_no_solution_code(class_lab, browser):
    path = place_in_lab(class_lab, STUDENT)
    page = browser.new_page(viewport=VIEWPORT)
    notebook = LabNotebook(page, class_lab.url(path))
    try:
        notebook.open()
        progress = run_cell(notebook, cell_index("progress")).locator(".jp-OutputArea")
        assert "visible checks only" in wait_for_text(progress, "0 of 3 exercises pass")
        run_cell(notebook, cell_index("setup_imports"))
        run_cell(notebook, cell_index("softmax"))  # as released: raise NotImplementedError()
        check = run_cell(notebook, cell_index("test_softmax")).locator(".jp-OutputArea")
        text = wait_for_text(check, "Class mode: this cell runs the visible checks only")
        assert "Self-check" not in text and "NotImplementedError: `softmax` is not written yet" in text
        reveal = run_cell(notebook, cell_index("reveal_softmax")).locator(".jp-OutputArea")
        assert "stay with your instructor" in reveal.inner_text()
        assert reveal.locator("button").count() == 0
        assert "softmax: not tried" in wait_for_text(progress, "softmax: not tried")
        assert "fails" not in progress.inner_text()
        page.keyboard.press("Control+S")
        time.sleep(1.5)
        page_text = page.locator(".jp-NotebookPanel .jp-Notebook").inner_text()
        saved = (class_lab.root_dir / path).read_text()
        assert "stay with your instructor" in saved  # the outputs were saved
        lines = solution_lines(ASSIGNMENT)
        assert lines
        for line in lines:
            assert line not in page_text, line
            assert json.dumps(line)[1:-1] not in saved, line
    finally:
        page.close()
