"""`./course lab` is a student's lab; `./course lab --instructor` an instructor's. In a real browser.

Each test starts JupyterLab exactly as a learner does, `./course lab` (the script of a copy of the
course, with the test's environment as its venv), adding only the flags that put the server on a
free 127.0.0.1 port with a token and keep it from opening a browser; the user is new (an empty
Jupyter config folder of their own, so JupyterLab starts as on its first day). Then notebook 00 is
opened in chromium and the test reads what the learner sees:

* the student's lab: nbgrader's Validate button, and none of nbgrader's instructor tools (the
  Nbgrader menu, formgrader, the Create Assignment panel, the assignment and course lists, in the
  page and on the server); no news question over the notebook;
* with `--instructor`: the instructor tools are there too;
* and, to show that the missing news question is the course's doing: plain `jupyter lab` from the
  same environment asks it by the time notebook 00's kernel is ready.

Neither lab writes any configuration into the user's Jupyter folder (tools/lab-config is read
through JUPYTER_CONFIG_PATH).
"""

import os
import sys
from pathlib import Path

import pytest
from browser_harness import (
    JupyterLab,
    LabNotebook,
    copy_course,
    menu_titles,
    needs_chromium,
    news_question_shown,
)
from course_setup import require_course_setup

pytestmark = needs_chromium

NOTEBOOK_00 = "notebooks/00_start_here/00_start_here.ipynb"


class LabAsLaunched(JupyterLab):
    """JupyterLab started by the command line ``launch`` in ``course`` (its root), for a new user."""

    def __init__(self, course: Path, launch: list[str]):
        super().__init__(course)
        self.launch = launch
        self.user_config = self.scratch / "user-config"  # the user's own Jupyter folder (~/.jupyter)
        self.env = {"COURSE_VENV": sys.prefix, "JUPYTER_CONFIG_DIR": str(self.user_config)}

    def command(self) -> list[str]:
        return self.launch

    def configuration_written(self) -> list[str]:
        """The files in the user's Jupyter folder besides JupyterLab's workspaces (each page's
        layout) and jupyter_core's `migrated` mark (its first start, noted once): a lab that
        changed the user's configuration would leave them here."""
        if not self.user_config.exists():
            return []
        workspaces = self.user_config / "lab" / "workspaces"
        return sorted(
            str(path.relative_to(self.user_config))
            for path in self.user_config.rglob("*")
            if path.is_file() and workspaces not in path.parents and path != self.user_config / "migrated"
        )


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    require_course_setup()  # a copy's ./course lab then starts at once on this venv instead of installing
    return copy_course(tmp_path_factory.mktemp("clone") / "course")


def open_notebook_00(browser, lab: JupyterLab) -> LabNotebook:
    """Notebook 00 open in its own page, its kernel ready."""
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    notebook = LabNotebook(page, lab.url(NOTEBOOK_00))
    notebook.open()
    return notebook


def validate_button(page):
    return page.locator(".jp-NotebookPanel-toolbar jp-button", has_text="Validate")


def test_course_lab_is_a_students_validate_but_no_instructor_tools_and_no_news_question(course, browser):
    with LabAsLaunched(course, [str(course / "course"), "lab"]) as lab:
        page = open_notebook_00(browser, lab).page
        try:
            assert validate_button(page).is_visible()
            assert not news_question_shown(page)
            titles = menu_titles(page)
            assert "Nbgrader" not in titles, titles
            assert page.get_by_text("Create Assignment").count() == 0
            assert page.get_by_text("Formgrader").count() == 0
        finally:
            page.close()
        # nor on the server: formgrader, the assignment list and the course list are not loaded; Validate is
        assert lab.status("formgrader") == 404
        assert lab.status("assignments") == 404
        assert lab.status("formgraders") == 404
        assert lab.status("nbgrader_version") != 404
        assert lab.configuration_written() == []


def test_course_lab_instructor_switch_brings_the_instructor_tools(course, browser):
    with LabAsLaunched(course, [str(course / "course"), "lab", "--instructor"]) as lab:
        page = open_notebook_00(browser, lab).page
        try:
            assert validate_button(page).is_visible()
            assert not news_question_shown(page)
            assert "Nbgrader" in menu_titles(page)
            assert page.get_by_text("Create Assignment").count() > 0
            page.locator(".lm-MenuBar-itemLabel", has_text="Nbgrader").click()
            page.locator(".lm-Menu").first.wait_for()
            assert "Formgrader" in page.locator(".lm-Menu .lm-Menu-itemLabel").all_inner_texts()
            page.keyboard.press("Escape")
        finally:
            page.close()
        assert lab.status("formgrader") == 200
        assert lab.status("assignments") != 404
        assert lab.configuration_written() == []


def test_plain_jupyterlab_of_the_same_environment_asks_the_news_question(course, browser):
    """The control for the tests above: the question they find missing is asked by JupyterLab
    itself on a new user's first start, by the time notebook 00's kernel is ready."""
    plain = [sys.executable, "-m", "jupyter", "lab", *(["--allow-root"] if os.geteuid() == 0 else [])]
    with LabAsLaunched(course, plain) as lab:
        page = open_notebook_00(browser, lab).page
        try:
            assert news_question_shown(page)
            assert "Nbgrader" in menu_titles(page)
        finally:
            page.close()
