"""The notebooks themselves: solutions run clean, student versions degrade gracefully,
and notebooks/ is exactly what nbgrader generates from solutions/.

Each notebook runs top to bottom once per version (``solution_run``, ``student_run``);
the topic tests at the end read what those same runs printed."""

import ast
import json
import re
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from notebook_runner import execute

from autograder import release
from autograder.exercises import module_for
from autograder.reference import reference_cells

REPOSITORY = Path(__file__).resolve().parent.parent
ASSIGNMENTS = release.assignments()
# Binder gives 2 GB: the server (~150 MB), the notebook's kernel and Validate's
# second kernel (widgets and demos skipped, so no bigger) must fit.
NOTEBOOK_MEMORY_BUDGET_MB = 800


def readme_memory_mb() -> dict[str, int]:
    """{assignment: the memory the README's notebook table states for it, in MB}."""
    readme = (REPOSITORY / "README.md").read_text()
    rows = re.findall(r"^\| \[\d+\]\(notebooks/([^/]+)/[^)]+\) \|.*\| ≤ (\d+) MB \|$", readme, re.M)
    return {assignment: int(mb) for assignment, mb in rows}


def hidden_check_cells(notebook) -> int:
    return sum("BEGIN HIDDEN TESTS" in cell.source for cell in notebook.cells if cell.cell_type == "code")


def runs_of(folder: str, pool: ThreadPoolExecutor, wanted: list[str]):
    """run(assignment) -> notebook_runner.Run of <folder>/<assignment>, executed once per module: those
    the session's tests are parametrized over start at once, two at a time (a notebook's kernel keeps
    about one core busy), the others when a test first asks."""
    started = {}

    def start(assignment):
        if assignment not in started:
            started[assignment] = pool.submit(execute, REPOSITORY / folder / assignment / f"{assignment}.ipynb")
        return started[assignment]

    for assignment in wanted:
        start(assignment)
    return lambda assignment: start(assignment).result()


def wanted_by(request, fixture: str) -> list[str]:
    """The assignments of this module's selected tests that read ``fixture``, parametrized by assignment."""
    return [
        item.callspec.params["assignment"]
        for item in request.session.items
        if item.module is request.module
        and fixture in item.fixturenames
        and "assignment" in getattr(getattr(item, "callspec", None), "params", {})
    ]


@pytest.fixture(scope="module")
def runs(request):
    """The solution runs and the student runs, begun together as the module's first test needs one."""
    pool = ThreadPoolExecutor(2, thread_name_prefix="notebook-run")
    try:
        yield {
            folder: runs_of(folder, pool, wanted_by(request, fixture))
            for folder, fixture in (("solutions", "solution_run"), ("notebooks", "student_run"))
        }
    finally:
        pool.shutdown(cancel_futures=True)  # a run begun is waited for; those not begun are not


@pytest.fixture(scope="module")
def solution_run(runs):
    return runs["solutions"]


@pytest.fixture(scope="module")
def student_run(runs):
    return runs["notebooks"]


def printed(cell) -> str:
    return "".join(output.get("text", "") for output in cell.outputs if output.output_type == "stream")


def code_cell(run, marker: str):
    [cell] = [cell for cell in run.notebook.cells if cell.cell_type == "code" and marker in cell.source]
    return cell


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_solution_notebook_runs_top_to_bottom_without_errors(assignment, solution_run):
    run = solution_run(assignment)
    assert run.errors() == []
    # every hidden check really ran against the reference, and passed
    assert run.stream_text().count("all hidden checks passed") == hidden_check_cells(run.notebook)
    # the README tells students how much memory the notebook needs: it must stay true
    stated = readme_memory_mb().get(assignment)
    assert stated, f"README.md's notebook table states no memory for {assignment} (./course bench measures it)"
    assert run.peak_rss_mb <= stated, (
        f"{assignment} peaked at {run.peak_rss_mb:.0f} MB, more than the README's {stated} MB"
    )


def test_readme_states_each_notebooks_memory_within_binders_budget():
    stated = readme_memory_mb()
    assert sorted(stated) == ASSIGNMENTS, "README.md's notebook table: one row per notebook, with its memory"
    assert max(stated.values()) <= NOTEBOOK_MEMORY_BUDGET_MB
    assert f"under {NOTEBOOK_MEMORY_BUDGET_MB} MB" in (REPOSITORY / "README.md").read_text()


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_student_notebook_widgets_wait_for_the_learner(assignment, student_run):
    """Untouched, every cell but the checks still runs: a widget or a demo says which exercise it
    waits for instead of failing."""
    run = student_run(assignment)
    for cell in run.notebook.cells:
        if cell.cell_type == "code" and not cell.metadata.get("nbgrader", {}).get("grade", False):
            errors = [f"{o.ename}: {o.evalue}" for o in cell.outputs if o.output_type == "error"]
            assert not errors, f"a cell that is not a check failed: {cell.source[:300]}\n{errors}"
    widget_cells = [cell for cell in run.notebook.cells if "widget" in cell.metadata.get("tags", [])]
    for cell in widget_cells:
        errors = [o for o in cell.outputs if o.output_type == "error"]
        assert not errors, f"widget cell failed: {cell.source}\n{errors}"
        state = json.dumps([o.get("data", {}) for o in cell.outputs])
        assert "application/vnd.jupyter.widget-view+json" in state


def test_notebooks_are_generated_from_solutions(capsys):
    assert release.main(["--check"]) == 0, capsys.readouterr().out


def test_release_check_notices_a_hand_edited_notebook(tmp_path):
    edited = tmp_path / "01_attention"
    shutil.copytree(REPOSITORY / "notebooks" / "01_attention", edited)
    path = edited / "01_attention.ipynb"
    notebook = json.loads(path.read_text())
    notebook["cells"][0]["source"] = "# edited by hand"
    path.write_text(json.dumps(notebook))
    problems = release.differences(REPOSITORY / "notebooks" / "01_attention", edited)
    assert problems == ["01_attention.ipynb: differs from what solutions/ generates"]


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_student_notebooks_hold_no_solutions_or_hidden_tests(assignment):
    text = (REPOSITORY / "notebooks" / assignment / f"{assignment}.ipynb").read_text()
    for secret in ("BEGIN SOLUTION", "HIDDEN TESTS", "course_checks.checks"):
        assert secret not in text
    assert "raise NotImplementedError()" in text


def top_level_definitions(source: str) -> dict:
    """{name: ast dump} of the functions and classes a cell defines."""
    return {
        node.name: ast.dump(node)
        for node in ast.parse(source).body
        if isinstance(node, (ast.FunctionDef, ast.ClassDef))
    }


def restated_cells():
    """(assignment, grade_id, origin, source) of every 'setup_from_<origin>' cell."""
    for assignment in ASSIGNMENTS:
        notebook = json.loads((REPOSITORY / "solutions" / assignment / f"{assignment}.ipynb").read_text())
        for grade_id, source in reference_cells(notebook):
            if grade_id.startswith("setup_from_"):
                yield assignment, grade_id, grade_id.removeprefix("setup_from_"), source


def test_restated_functions_match_their_originals():
    """A notebook that gives a learner an earlier notebook's functions (a read-only
    'setup_from_<assignment>' cell) copies that notebook's reference exactly."""
    for assignment, grade_id, origin, source in restated_cells():
        origin_notebook = json.loads((REPOSITORY / "solutions" / origin / f"{origin}.ipynb").read_text())
        answers = {}
        for cell in origin_notebook["cells"]:
            meta = cell.get("metadata", {}).get("nbgrader", {})
            if meta.get("solution") and not meta.get("grade"):
                answers.update(top_level_definitions("".join(cell["source"])))
        restated = top_level_definitions(source)
        assert restated, f"{assignment}/{grade_id} defines nothing"
        for name, tree in restated.items():
            assert name in answers, f"{assignment}/{grade_id}: {name} is not an answer of {origin}"
            assert tree == answers[name], f"{assignment}/{grade_id}: {name} differs from {origin}'s reference"


# ---------------------------------------------------------------- 00: the course at a glance


def test_start_here_lists_every_graded_exercise_of_every_notebook():
    """00's table names, for each notebook, exactly the exercises the grader grades and the
    progress view counts (the catalogues in autograder/exercises/)."""
    notebook = json.loads((REPOSITORY / "solutions" / "00_start_here" / "00_start_here.ipynb").read_text())
    text = "".join(notebook["cells"][0]["source"])
    rows = dict(re.findall(r"^\| (\d\d) \|[^|]*\| (.*) \|$", text, re.M))
    assert sorted(rows) == [assignment[:2] for assignment in ASSIGNMENTS]
    total = 0
    for assignment in ASSIGNMENTS:
        graded = list(module_for(assignment).EXERCISES)
        assert re.findall(r"`(\w+)`", rows[assignment[:2]]) == graded, assignment
        total += len(graded)
    assert f"{total} exercises in all" in text


# ---------------------------------------------------------------- 01, 02 and 04: what the runs printed


def test_attention_notebook_draws_the_theorys_example(solution_run):
    """The theory's √d example: 8 scores with standard deviation 11, largest weight 0.99999 unscaled and
    0.41 divided by √128, from the notebook's own draw (not explained away)."""
    text = printed(code_cell(solution_run("01_attention"), "torch.manual_seed(18261)"))
    assert "their standard deviation: 11.1\n" in text, text
    assert "largest weight, unscaled:      0.99999\n" in text, text
    assert "largest weight, divided by √d: 0.41\n" in text, text


def test_masking_notebook_measures_the_windows_reach_and_padding(solution_run):
    run = solution_run("02_causal_masking")
    reach = printed(code_cell(run, "def windowed_stack"))
    assert "the earliest is 8 positions back; L (W - 1) = 8" in reach, reach
    poisoned = printed(code_cell(run, "second = attention(first, first, first, mask)"))
    assert "nan" in poisoned.split("second layer, the long prompt")[0] and "finite = True" in poisoned, poisoned
    fixed = printed(code_cell(run, "safe = mask | torch.eye(5"))
    difference = re.search(r"padded vs alone, two layers: largest difference (\S+)", fixed)
    assert difference and float(difference.group(1)) < 1e-6, fixed
    assert "nan" not in fixed, fixed


def test_rope_notebook_measures_interpolation_and_ntk_scaling(solution_run):
    text = printed(code_cell(solution_run("04_rope"), "ntk_base = 10000.0"))
    rows = {
        name.strip(): (float(step), int(beyond), float(most))
        for name, step, beyond, most in re.findall(r"^(.+?)\| +([\d.]+) rad \| +(\d+) \| ([\d.]+) x$", text, re.M)
    }
    plain, interpolated, ntk = (
        rows["plain RoPE"],
        rows["position interpolation (positions / 4)"],
        rows["NTK-aware (base 40,890)"],
    )
    assert plain == (1.0, 18, 4.0) and interpolated == (0.25, 0, 1.0), rows
    assert ntk[0] == 1.0 and 1.0 < ntk[2] < 2.0, rows


# ---------------------------------------------------------------- 07 and 08: what the runs printed


def test_llama_training_finishes_its_schedule_or_says_it_stopped(solution_run):
    run = solution_run("07_llama")
    trained = printed(code_cell(run, "def get_batch(source"))
    by_position = printed(code_cell(run, "loss_by_position(model"))
    if "stopped after" in trained:  # out of processor time: the notebook says its figures do not apply
        assert "The schedule is unfinished" in trained and "(this model trained" in by_position
    else:
        assert trained.startswith("250 steps in "), trained
    # the windows train every position the cropped generate predicts from, 0 to 63
    assert "reading everything: loss " in by_position and " at positions 0-63 (" in by_position


def test_kv_cache_notebook_shows_the_sliding_cache_the_slopes_and_tokens_per_second(solution_run):
    run = solution_run("08_kv_cache")
    sliding = dict(
        re.findall(
            r"^(\d) layers?\s*: largest logit difference (\S+)",
            printed(code_cell(run, "def sliding_vs_recomputed")),
            re.M,
        )
    )
    assert float(sliding["1"]) < 1e-5 < 1e-2 < float(sliding["2"])
    plot = code_cell(run, "axes.loglog(length_array")
    assert any("image/png" in output.get("data", {}) for output in plot.outputs)
    slopes = re.search(r"fitted slopes .*: without the cache ([\d.]+), with it ([\d.]+)", printed(plot))
    assert slopes, printed(plot)
    assert float(slopes.group(1)) > float(slopes.group(2))  # without a cache the time grows faster
    assert re.search(
        r"16 sequences: +[\d,]+ tokens/s without the cache, +[\d,]+ with it",
        printed(code_cell(run, "def tokens_per_second")),
    )


def test_kv_cache_demos_name_the_exercise_they_wait_for(student_run):
    """Untouched, each 08 demo says in one line which exercise it needs, before it spends any time:
    the timing cell prints nothing else (no uncached generation timed before it stops)."""
    run = student_run("08_kv_cache")
    demos = [
        cell
        for cell in run.notebook.cells
        if cell.cell_type == "code" and re.search(r"^\s*with explain_unfinished\(\):", cell.source, re.M)
    ]
    assert len(demos) >= 6
    for cell in demos:
        lines = printed(cell).splitlines()
        assert lines and re.fullmatch(
            r"This cell needs your `\w+`, which still raises NotImplementedError\..*", lines[-1]
        ), (
            cell.source[:200],
            lines,
        )
    assert len(printed(code_cell(run, "def seconds(generator, length)")).splitlines()) == 1
    assert printed(code_cell(run, "axes.loglog(length_array")).startswith("Nothing to plot yet")
