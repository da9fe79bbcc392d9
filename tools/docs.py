"""./course docs: build the course's site into docs/_build/html (offline, warnings are errors).

    ./course docs                       # build
    ./course docs --hub URL             # the hub the notebook pages' JupyterHub buttons open
    ./course docs --repository URL     # the repository the launch buttons open (a class: its students' copy)
    ./course docs --screenshots         # first take the browser tests' widget pictures into assets/

The pages are docs/*.md. The notebook pages are the student versions in notebooks/, copied
into docs/notebooks/ (generated, ignored by git) and shown without execution, with two changes:
- a widget cell shows the browser tests' picture of it (assets/screenshots/widgets/<notebook>--
  <cell id>.png, taken by tests/test_browser_acceptance.py), since a static page runs no kernel;
- a read-only ``setup_from_<assignment>`` cell, which holds the earlier notebooks' reference
  answers, shows a line saying so instead: the site holds no reference answer
  (tests/test_site.py scans the built pages for every one).
"""

from __future__ import annotations

import argparse
import base64
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat

REPOSITORY = Path(__file__).resolve().parent.parent
DOCS = REPOSITORY / "docs"
BUILD = DOCS / "_build" / "html"
PAGES = DOCS / "notebooks"
WIDGET_PICTURES = REPOSITORY / "assets" / "screenshots" / "widgets"
TAKEN = REPOSITORY / "test-artifacts" / "widgets" / "cells"
SITE_TAKEN = REPOSITORY / "test-artifacts" / "site"  # tests/test_site.py's pictures of two pages


def page_of(notebook: nbformat.NotebookNode, assignment: str) -> nbformat.NotebookNode:
    """The notebook as its site page shows it (see the module's docstring)."""
    for cell in notebook.cells:
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id", "")
        if grade_id.startswith("setup_from_"):
            origin = grade_id.removeprefix("setup_from_")
            cell.source = (
                f"# Read-only set-up: the reference functions of {origin}, which this notebook builds on.\n"
                "# They are in the notebook itself (open it with a button above), not on the site."
            )
        if cell.cell_type == "code" and "widget" in cell.metadata.get("tags", []):
            picture = WIDGET_PICTURES / f"{assignment}--{cell.get('id')}.png"
            if picture.is_file():
                data = {"image/png": base64.b64encode(picture.read_bytes()).decode("ascii")}
                data["text/plain"] = "(the widget, as the browser tests drew it)"
                cell.outputs = [nbformat.v4.new_output("display_data", data=data)]
            else:
                text = "(an interactive widget: open the notebook to use it)"
                cell.outputs = [nbformat.v4.new_output("display_data", data={"text/plain": text})]
    return notebook


def write_notebook_pages() -> list[str]:
    """docs/notebooks/<a>/<a>.ipynb for every released notebook; returns the assignments."""
    if PAGES.exists():
        shutil.rmtree(PAGES)
    done = []
    for folder in sorted((REPOSITORY / "notebooks").iterdir()):
        source = folder / f"{folder.name}.ipynb"
        if not source.is_file():
            continue
        target = PAGES / folder.name / source.name
        target.parent.mkdir(parents=True)
        nbformat.write(page_of(nbformat.read(source, as_version=4), folder.name), target)
        done.append(folder.name)
    return done


def take_screenshots() -> int:
    """Copy the browser tests' pictures (the widget cells, two pages of the site) into assets/;
    returns how many."""
    pictures = sorted(TAKEN.glob("*.png"))
    WIDGET_PICTURES.mkdir(parents=True, exist_ok=True)
    for picture in pictures:
        shutil.copy2(picture, WIDGET_PICTURES / picture.name)
    pages = sorted(SITE_TAKEN.glob("*.png"))
    for picture in pages:
        shutil.copy2(picture, WIDGET_PICTURES.parent / f"site-{picture.name}")
    return len(pictures) + len(pages)


def build(hub: str | None = None, repository: str | None = None, quiet: bool = False) -> subprocess.CompletedProcess:
    write_notebook_pages()
    environment = dict(os.environ)
    if hub:
        environment["COURSE_HUB_URL"] = hub
    if repository:
        environment["COURSE_REPOSITORY"] = repository
    # -W --keep-going: every warning (a broken link, a missing page) fails the build, all reported;
    # -E: a fresh environment, so a page left from an earlier build cannot hide a missing one
    command = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-E", "-b", "html", str(DOCS), str(BUILD)]
    if quiet:
        command.insert(3, "-q")
    return subprocess.run(command, env=environment, cwd=REPOSITORY, capture_output=quiet, text=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="./course docs", description="Build the course's site into docs/_build/html.")
    parser.add_argument("--hub", help="the JupyterHub the notebook pages' JupyterHub button opens (nbgitpuller)")
    parser.add_argument("--repository", help="the git repository the launch buttons open (a class: the students' copy)")
    parser.add_argument(
        "--screenshots", action="store_true", help="first copy the browser tests' widget pictures into assets/"
    )
    args = parser.parse_args(argv)
    if args.screenshots:
        print(f"docs: {take_screenshots()} pictures copied from the browser tests' into assets/screenshots/")
    result = build(args.hub, args.repository)
    if result.returncode == 0:
        print(f"docs: the site is in {BUILD} (open {BUILD / 'index.html'})")
    return result.returncode


if __name__ == "__main__":
    sys.exit(main())
