"""Shared fixtures. Helpers for real nbgrader runs live in grading_harness.py and
grading_suite.py; the JupyterLab-in-chromium harness in browser_harness.py."""

import os
from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt
import pytest

pytest.register_assert_rewrite("grading_suite", "grading_harness", "browser_harness")

matplotlib.use("Agg")  # widget logic tests draw off screen
os.environ.pop("NBGRADER_EXECUTION", None)  # the suite sets it only where a test says so


def pytest_generate_tests(metafunc):
    """Parametrize GradingSuite tests over the subclass's mistakes and alternatives."""
    cls = metafunc.cls
    if cls is None:
        return
    if "mistake_student" in metafunc.fixturenames:
        metafunc.parametrize("mistake_student", list(cls.mistakes))
    if "alternative_student" in metafunc.fixturenames:
        metafunc.parametrize("alternative_student", list(cls.alternatives))


@pytest.fixture(scope="session", autouse=True)
def stock_graded(request, tmp_path_factory):
    """{assignment: Future of its graded Course} for every GradingSuite this session runs.

    Stock ``nbgrader autograde`` grades one notebook at a time and keeps one core busy, so the
    classes are graded side by side, one per core (at most 4), the biggest first; a suite's
    tests wait for their own class only, and a class whose grading failed fails its own suite.
    They start with the session, beside the other tests, at the lowest CPU priority
    (``Beside``): most of those tests keep one core busy or none, and the classes take the rest;
    the tests that read them run last (``pytest_collection_modifyitems``)."""
    from concurrent.futures import ThreadPoolExecutor

    from grading_harness import Beside

    suites = {item.cls for item in request.session.items if reads_a_stock_class(item)}
    # later notebooks have bigger classes and slower cells: start them first
    suites = sorted(suites, key=lambda suite: suite.assignment, reverse=True)
    workers = max(1, min(len(suites), os.cpu_count() or 1, 4))
    # one torch thread a kernel, as under ./course grade: side by side, a thread per core each would
    # wait for the other's, and even alone 07's class took 353 s with them against 276 s with one
    beside = Beside.at_lowest_priority(
        {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}, tmp_path_factory.mktemp("stock-kernels")
    )
    with ThreadPoolExecutor(workers, thread_name_prefix="stock-nbgrader") as pool:
        yield {
            suite.assignment: pool.submit(suite.grade_class, tmp_path_factory.mktemp(suite.assignment), beside)
            for suite in suites
        }
        pool.shutdown(cancel_futures=True)


@pytest.fixture(autouse=True)
def _close_figures():
    """Each test's figures are closed after it, so none piles up across the suite."""
    yield
    plt.close("all")


@pytest.fixture
def ipympl_canvas():
    """Figures get ipympl's canvas (what %matplotlib widget gives a notebook); its
    pictures are recorded instead of being sent to a browser."""
    previous, interactive = matplotlib.get_backend(), matplotlib.is_interactive()
    plt.switch_backend("module://ipympl.backend_nbagg")
    matplotlib.interactive(True)  # as in a notebook: a stale figure asks to be drawn again
    yield
    plt.close("all")
    matplotlib.interactive(interactive)
    plt.switch_backend(previous)


@pytest.fixture
def one_torch_thread():
    """One thread for PyTorch, as the notebooks set it: small models on a shared CPU run faster so."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def grading_env(monkeypatch):
    """Behave as while nbgrader grades a notebook."""
    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")


@pytest.fixture
def only_notes(grading_env):
    """While nbgrader grades: ``only_notes()`` checks that the widgets made since the test began are
    explorers, each holding its one-line note and nothing else: no control, no figure (each control
    would be a message to the grader, and state in the graded notebook)."""
    from ipywidgets import widgets
    from ipywidgets.widgets.widget import _instances

    from course_widgets import Explorer

    before = set(_instances)

    def check() -> list:
        # what shows on the page (a layout or a style goes with each of them)
        made = [
            widget for key, widget in _instances.items() if key not in before and isinstance(widget, widgets.DOMWidget)
        ]
        explorers = [widget for widget in made if isinstance(widget, Explorer)]
        assert explorers, made
        for explorer in explorers:
            assert explorer.skipped and not hasattr(explorer, "figure")
            (note,) = explorer.children
            assert isinstance(note, widgets.HTML) and "graded" in note.value
        assert len(made) == 2 * len(explorers), [type(widget).__name__ for widget in made]
        return explorers

    return check


# ---------------------------------------------------------------- browser tests

REPOSITORY = Path(__file__).resolve().parent.parent
VIEWPORT = {"width": 1400, "height": 1000}


@pytest.fixture(scope="session")
def lab(tmp_path_factory):
    """One real JupyterLab on 127.0.0.1 for the whole session, stopped at the end.
    Its root mirrors the repository's layout (assets/ is linked), so notebooks
    copied into it find their files at the same relative paths."""
    from browser_harness import JupyterLab, link_assets

    root = link_assets(tmp_path_factory.mktemp("lab"))
    with JupyterLab(root) as server:
        yield server


@pytest.fixture(scope="session")
def browser():
    """Debian's chromium, headless, driven by playwright."""
    from browser_harness import launch_browser
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = launch_browser(playwright)
        yield browser
        browser.close()


@pytest.fixture(scope="session")
def ran_solution(lab, browser):
    """ran_solution(assignment) -> LabNotebook: the solution notebook
    solutions/<assignment>/<assignment>.ipynb open in its own page, after Run All.

    Opened and run once per session, on first use, and shared by every test that
    asks for it (the generic acceptance tests and each topic's browser tests):
    a test that changes a widget puts it back as it found it. A notebook whose
    opening or Run All failed fails every later test that asks for it, at once."""
    from browser_harness import LabNotebook, place_in_lab

    opened: dict = {}

    def ran(assignment: str) -> "LabNotebook":
        if assignment not in opened:
            source = REPOSITORY / "solutions" / assignment / f"{assignment}.ipynb"
            page = browser.new_page(viewport=VIEWPORT)
            try:
                notebook = LabNotebook(page, lab.url(place_in_lab(lab, source)))
                notebook.open()
                notebook.run_all(timeout_s=900)
            except Exception as error:
                page.close()
                opened[assignment] = error
                raise
            opened[assignment] = notebook
        if isinstance(opened[assignment], Exception):
            raise RuntimeError(f"{assignment}: opening it or Run All failed in an earlier test: {opened[assignment]!r}")
        return opened[assignment]

    yield ran
    for notebook in opened.values():
        if not isinstance(notebook, Exception):
            notebook.page.close()


# ---------------------------------------------------------------- the fast loop


# The fast loop (``./course test --quick``, docs/maintainers.md): everything but these files, which
# run or grade whole notebooks, build environments, start servers or clusters, or drive chromium
# (the ``browser`` marker leaves out the rest of the browser's tests) ... and one notebook's grading.
SLOW_FILES = {
    "test_gradebook_postgres",
    "test_grade_command",
    "test_grade_distributed",
    "test_grade_intake",
    "test_grader_package",
    "test_installed_course",
    "test_jupyterhub_cycle",
    "test_kernel_isolation",
    "test_lms",
    "test_llama_training",
    "test_nbgrader_fresh_clone",
    "test_notebooks",
    "test_reference_out_of_reach",
    "test_site",
    "test_student_package",
    "test_student_setup",
    "test_teaching",
    "test_watch",
    "test_without_transformers",
}
QUICK_GRADING = "test_grading_01_attention"

# Files whose tests leave a core idle for much of their time (they wait: for a server, a due date, a
# time limit, an installer, one kernel at a time), measured per file with the machine's idle share
# sampled every 5 s through a whole run at 45f727e (student_setup 114 idle core-seconds of 290,
# watch 75 of 190, proxies 55 of 80, nbgrader_fresh_clone 52 of 120, ...). They run first, while
# ``stock_graded`` grades its classes beside them and takes that core; run where they fell
# alphabetically, after the classes were done, about 600 core-seconds went unused.
LEAVE_A_CORE_IDLE = {
    "test_student_setup",
    "test_watch",
    "test_proxies",
    "test_nbgrader_fresh_clone",
    "test_student_package",
    "test_teaching",
    "test_reference_out_of_reach",
    "test_selfstudy",
    "test_kernel_isolation",
    "test_without_transformers",
    "test_trusted",
    "test_open_in_colab",
    "test_lms",
    "test_site",
}


def pytest_addoption(parser):
    parser.addoption(
        "--quick",
        action="store_true",
        help="the fast loop: the unit tests and notebook 01's grading, no browser (a few minutes)",
    )


def quick(item) -> bool:
    """Whether ``--quick`` keeps this test."""
    stem = item.path.stem
    if item.get_closest_marker("browser") or stem in SLOW_FILES:
        return False
    return not stem.startswith("test_grading_") or stem == QUICK_GRADING


def reads_a_stock_class(item) -> bool:
    """Whether the test reads a class that ``stock_graded`` grades beside the others."""
    from grading_suite import GradingSuite

    cls = getattr(item, "cls", None)
    return isinstance(cls, type) and issubclass(cls, GradingSuite) and bool(cls.assignment)


def pytest_collection_modifyitems(config, items):
    """``--quick``: only the fast loop's tests (the others are reported as deselected).

    The tests that read the stock classes run last, in their files' order: the classes are graded
    from the session's start on the CPU the other tests leave idle, and are done by then (run in
    the middle, two of them waited 54 and 66 s for their classes while those took both cores).
    The files that leave a core idle (``LEAVE_A_CORE_IDLE``) run first, while there is grading
    beside them to take it."""
    if config.getoption("quick"):
        config.hook.pytest_deselected(items=[item for item in items if not quick(item)])
        items[:] = [item for item in items if quick(item)]
    # stable: each file's tests stay together and in order, and the other files keep theirs
    items.sort(key=lambda item: (reads_a_stock_class(item), item.path.stem not in LEAVE_A_CORE_IDLE))
