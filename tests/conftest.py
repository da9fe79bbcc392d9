"""Shared fixtures. Helpers for real nbgrader runs live in grading_harness.py and
grading_suite.py; the JupyterLab-in-chromium harness in browser_harness.py."""
import os

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
