"""Binder's student mode and nbgrader's Validate button, in a real browser.

On Binder, repo2docker builds the environment, copies the repository and runs
postBuild, which keeps nbgrader's Validate button and disables the instructor
tools at the environment's (sys_prefix) level. Here the same postBuild runs,
unmodified, in a throwaway environment of its own: a fresh Python environment
that sees the course's installed packages (one .pth line) and Jupyter data (a
link), with a copy of the course environment's Jupyter configuration. Its
sys_prefix is a temporary folder, so postBuild's changes land there and never
in .venv (checked). JupyterLab then runs from that environment on a copy of the
course, as on Binder, and the tests check in chromium:

* Validate is in the notebook toolbar; nbgrader's menu, the create-assignment
  panel, formgrader and the assignment list are gone (in the page and on the
  server), while the course's normal JupyterLab has them; JupyterLab does not
  ask a new user about its news;
* Validate on a student notebook lists its failing exercises; once the answer
  cells hold correct code (typed into the editor), Validate reports success.
"""

import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from browser_harness import (
    REPOSITORY,
    JupyterLab,
    LabNotebook,
    copy_course,
    menu_titles,
    needs_chromium,
    news_question_shown,
)

pytestmark = needs_chromium

VALIDATED = "01_attention"  # the student notebook whose Validate button is pressed


def digest(folder: Path) -> str:
    hashed = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            hashed.update(str(path.relative_to(folder)).encode() + path.read_bytes())
    return hashed.hexdigest()


def throwaway_environment(root: Path) -> tuple[Path, dict]:
    """A Python environment like Binder's: the course's packages, its own sys_prefix."""
    env = root / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    python = env / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    # the course's packages, without running their .pth files: the course's own
    # package comes from postBuild's `pip install -e .`, as on Binder
    (Path(purelib) / "course-packages.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    (env / "share").mkdir()
    (env / "share" / "jupyter").symlink_to(Path(sys.prefix) / "share" / "jupyter", target_is_directory=True)
    shutil.copytree(Path(sys.prefix) / "etc" / "jupyter", env / "etc" / "jupyter")
    # the jupyter commands postBuild calls, run by this environment's Python
    for command in ("jupyter", "jupyter-lab", "jupyter-labextension", "jupyter-server"):
        body = (Path(sys.prefix) / "bin" / command).read_text().split("\n", 1)[1]
        script = env / "bin" / command
        script.write_text(f"#!{python}\n{body}")
        script.chmod(0o755)
    variables = {
        "PATH": os.pathsep.join([str(env / "bin"), "/usr/local/bin", "/usr/bin", "/bin"]),  # not .venv/bin
        "JUPYTER_CONFIG_DIR": str(root / "user-config"),
        "JUPYTER_DATA_DIR": str(root / "user-data"),
    }
    return python, variables


@pytest.fixture(scope="module")
def student_lab(tmp_path_factory):
    """JupyterLab as on Binder after postBuild, serving a copy of the course."""
    root = tmp_path_factory.mktemp("binder")
    python, variables = throwaway_environment(root)
    course_config = Path(sys.prefix) / "etc" / "jupyter"
    before = digest(course_config)
    environment = {key: value for key, value in os.environ.items() if key != "VIRTUAL_ENV"} | variables
    result = subprocess.run(
        ["bash", str(REPOSITORY / "postBuild")],
        cwd=REPOSITORY,
        env=environment,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, f"postBuild failed:\n{result.stdout}\n{result.stderr}"
    assert digest(course_config) == before, "postBuild changed the course's own environment"
    course = copy_course(root / "course")
    # a learner who was never asked about JupyterLab's news: postBuild keeps the question away
    with JupyterLab(course, python=python, env=variables, news_answered=False) as server:
        yield server


def open_page(browser, lab, path: str):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    notebook = LabNotebook(page, lab.url(path))
    notebook.open()
    return notebook


def test_binder_mode_keeps_validate_and_hides_the_instructor_tools(student_lab, lab, browser):
    # the course environment's JupyterLab as it is (./course lab --instructor) has the instructor tools ...
    normal = browser.new_page(viewport={"width": 1400, "height": 1000})
    normal.goto(lab.url(""))
    assert "Nbgrader" in menu_titles(normal)
    assert normal.get_by_text("Create Assignment").count() > 0
    normal.close()
    assert lab.status("formgrader") == 200

    # ... Binder's has none of them, and keeps Validate
    notebook = open_page(browser, student_lab, f"notebooks/{VALIDATED}/{VALIDATED}.ipynb")
    try:
        page = notebook.page
        assert page.locator(".jp-NotebookPanel-toolbar jp-button", has_text="Validate").is_visible()
        assert not news_question_shown(page)
        assert "Nbgrader" not in menu_titles(page)
        assert page.get_by_text("Create Assignment").count() == 0
        assert student_lab.status("formgrader") == 404
        assert student_lab.status("assignments") == 404  # the assignment list's server side
        assert student_lab.status("nbgrader_version") != 404  # Validate's server side is there
    finally:
        notebook.page.close()


def reference_answers(assignment: str) -> dict[str, str]:
    """{grade_id: the reference answer without nbgrader's markers} of the answer cells."""
    notebook = json.loads((REPOSITORY / "solutions" / assignment / f"{assignment}.ipynb").read_text())
    answers = {}
    for cell in notebook["cells"]:
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if meta.get("solution") and not meta.get("grade") and cell["cell_type"] == "code":
            lines = "".join(cell["source"]).splitlines()
            answers[meta["grade_id"]] = "\n".join(
                line for line in lines if line.strip() not in ("### BEGIN SOLUTION", "### END SOLUTION")
            )
    return answers


def press_validate(page) -> str:
    """Press Validate, wait for nbgrader's verdict; returns the dialog's text and closes it."""
    page.locator(".jp-NotebookPanel-toolbar jp-button", has_text="Validate").click()
    message = page.locator(".jp-Dialog #validation-message")
    message.wait_for(timeout=600_000)
    text = message.inner_text()
    verdict = message.get_attribute("class")
    page.locator(".jp-Dialog .jp-Dialog-button.jp-mod-accept").click()
    message.wait_for(state="detached")
    return f"{verdict}\n{text}"


def test_validate_lists_the_failing_exercises_then_passes_once_they_are_answered(student_lab, browser):
    path = f"notebooks/{VALIDATED}/{VALIDATED}.ipynb"
    student = json.loads((student_lab.root_dir / path).read_text())
    graded_checks = [
        cell
        for cell in student["cells"]
        if cell.get("metadata", {}).get("nbgrader", {}).get("grade")
        and not cell["metadata"]["nbgrader"].get("solution")
    ]
    answers = reference_answers(VALIDATED)
    assert graded_checks and answers

    notebook = open_page(browser, student_lab, path)
    page = notebook.page
    try:
        # untouched: every check fails, and Validate names each one
        verdict = press_validate(page)
        assert verdict.startswith("validation-failed"), verdict
        assert verdict.count("The following cell failed:") == len(graded_checks), verdict
        for check in graded_checks:
            assert "".join(check["source"]).splitlines()[0] in verdict

        # type each reference answer into its cell, as a learner would write it
        cells = notebook.cells()
        for index, cell in enumerate(student["cells"]):
            grade_id = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
            if grade_id in answers:
                editor = cells.nth(index).locator(".cm-content")
                editor.scroll_into_view_if_needed()
                editor.click()
                page.keyboard.press("Control+A")
                page.keyboard.insert_text(answers[grade_id])
                assert editor.inner_text().strip() == answers[grade_id].strip()
        verdict = press_validate(page)  # Validate saves the notebook first
        assert verdict.startswith("validation-success"), verdict
        assert "Success! Your notebook passes all the tests." in verdict
    finally:
        page.close()
