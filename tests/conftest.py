"""Shared fixtures. Helpers for real nbgrader runs live in grading_harness.py and
grading_suite.py; the JupyterLab-in-chromium harness in browser_harness.py."""
import os
import shutil
import uuid
from pathlib import Path

import matplotlib
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


@pytest.fixture
def grading_env(monkeypatch):
    """Behave as while nbgrader grades a notebook."""
    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")


# ---------------------------------------------------------------- browser tests

@pytest.fixture(scope="session")
def lab(tmp_path_factory):
    """One real JupyterLab on 127.0.0.1 for the whole session, stopped at the end."""
    from browser_harness import JupyterLab

    with JupyterLab(tmp_path_factory.mktemp("lab")) as server:
        yield server


@pytest.fixture(scope="session")
def browser():
    """Debian's chromium, headless, driven by playwright."""
    from playwright.sync_api import sync_playwright

    from browser_harness import launch_browser

    with sync_playwright() as playwright:
        browser = launch_browser(playwright)
        yield browser
        browser.close()


@pytest.fixture
def open_copy(lab, browser):
    """open_copy(path) copies a notebook under a unique name into the lab's root,
    opens it in a new page and waits for its kernel; the page closes after the test."""
    from browser_harness import LabNotebook

    pages = []

    def open_notebook(source: Path) -> "LabNotebook":
        name = f"{Path(source).stem}-{uuid.uuid4().hex[:8]}.ipynb"
        shutil.copy(source, lab.root_dir / name)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        pages.append(page)
        notebook = LabNotebook(page, lab.url(name))
        notebook.open()
        return notebook

    yield open_notebook
    for page in pages:
        page.close()
