"""The course's site, built as ``./course docs`` builds it, and the README that points to it.

The site is built once per module, by ``tools/docs.py`` (what ``./course docs`` runs), inside a
network namespace of its own (``unshare``), so the build provably fetches nothing: no theme, no
template, no intersphinx inventory. Warnings are errors there (a broken link, a missing page).
Then:
- every page of docs/ and every released notebook has its page, and the start page links them;
- each notebook page's launch buttons open that notebook on Binder, in Colab, and on the hub
  the build was given (nbgitpuller), from the repository it was given;
- no reference answer is anywhere in the built site (pages, search index, downloadable sources):
  the lines of solutions/ between nbgrader's solution markers that students do not get anyway
  (autograder.answers); the same scan finds them in the released notebooks, whose set-up cells
  carry earlier answers, so it can fail;
- every widget cell of a notebook page shows the browser tests' picture of it;
- the package metadata, the grader's, the site and ``course-grade --version`` agree on the version;
- the README stays short, and its links and ``./course`` lines resolve;
- in chromium, the start page and a notebook page render, with their launch buttons
  (screenshots in test-artifacts/site/, copied to assets/screenshots/ for the README and pages).
"""

from __future__ import annotations

import functools
import http.server
import json
import re
import shutil
import subprocess
import sys
import threading
import tomllib
from pathlib import Path

import pytest
from browser_harness import CHROMIUM

from autograder.answers import html_text, notebook_text, scan
from autograder.classcopy import course_answers
from autograder.release import assignments

REPOSITORY = Path(__file__).resolve().parent.parent
BUILD = REPOSITORY / "docs" / "_build" / "html"
HUB = "https://hub.course-test.invalid"
CLASS_REPOSITORY = "https://github.com/course-test-org/class-copy"
GITHUB = "https://github.com/attention-transformers/course"
PROBE = (
    "import socket\n"
    "try:\n"
    "    socket.create_connection(('151.101.0.223', 443), timeout=3)\n"  # a registry's address: no DNS needed
    "    print('network: reachable')\n"
    "except OSError as error:\n"
    "    print('network: unreachable', error.errno)\n"
)


def offline(*command: str) -> list[str]:
    """``command`` in a new network namespace (only a loopback that is down): nothing can be fetched."""
    return ["unshare", "--net", "--map-root-user", *command]


@pytest.fixture(scope="module")
def site():
    """The site, built offline for a hub and a class repository of the test's own."""
    if shutil.which("unshare") is None:
        pytest.fail("util-linux's unshare is missing: the offline build cannot be shown")
    probe = subprocess.run(offline(sys.executable, "-c", PROBE), capture_output=True, text=True, timeout=60)
    build = subprocess.run(
        offline(sys.executable, "tools/docs.py", "--hub", HUB, "--repository", CLASS_REPOSITORY),
        cwd=REPOSITORY,
        capture_output=True,
        text=True,
        timeout=900,
    )
    return probe, build


def test_the_site_builds_offline_with_no_warning(site):
    probe, build = site
    assert probe.stdout.startswith("network: unreachable"), probe.stdout + probe.stderr
    assert build.returncode == 0, (build.stdout + build.stderr)[-4000:]
    assert "WARNING" not in build.stderr
    assert f"the site is in {BUILD}" in build.stdout


def pages() -> list[str]:
    """The site's pages: docs/*.md and a page per released notebook (docs/notebooks/<a>/<a>)."""
    written = [p.stem for p in sorted((REPOSITORY / "docs").glob("*.md"))]
    return written + [f"notebooks/{a}/{a}" for a in assignments()]


def test_every_page_and_every_notebook_is_built_and_the_start_page_links_them(site):
    index = (BUILD / "index.html").read_text()
    for page in pages():
        assert (BUILD / f"{page}.html").is_file(), page
        if page != "index":
            assert f'href="{page}.html' in index, f"the start page has no link to {page}"


@pytest.mark.parametrize("assignment", assignments())
def test_a_notebook_page_launches_its_notebook_on_binder_colab_and_the_hub(site, assignment):
    page = (BUILD / "notebooks" / assignment / f"{assignment}.html").read_text()
    path = f"notebooks/{assignment}/{assignment}.ipynb"
    links = set(re.findall(r'<a href="([^"]+)" target="_blank"\s+class="btn btn-sm dropdown-item"', page))
    assert links == {
        f"https://mybinder.org/v2/gh/course-test-org/class-copy/main?urlpath=lab/tree/{path}",
        f"https://colab.research.google.com/github/course-test-org/class-copy/blob/main/{path}",
        f"{HUB}/hub/user-redirect/git-pull?repo=https%3A//github.com/course-test-org/class-copy"
        f"&urlpath=lab/tree/class-copy/{path}&branch=main",
    }


def built_texts() -> list[tuple[str, str]]:
    texts = []
    for path in sorted(BUILD.rglob("*")):
        if not path.is_file() or path.suffix in {".png", ".svg", ".woff", ".woff2", ".ttf", ".ico", ".eot"}:
            continue
        raw = path.read_text(encoding="utf-8", errors="replace")
        text = html_text(raw) if path.suffix == ".html" else notebook_text(raw)
        texts.append((str(path.relative_to(BUILD)), text))
    return texts


def test_the_built_site_holds_no_reference_answer(site):
    answers = course_answers(REPOSITORY)
    assert sum(map(len, answers.values())) > 100  # the answers exist, and are what is looked for
    released = [(str(p), notebook_text(p.read_text())) for p in sorted((REPOSITORY / "notebooks").glob("*/*.ipynb"))]
    assert scan(released, answers), "the scan finds the earlier answers the released set-up cells carry"
    assert scan(built_texts(), answers) == []


def test_every_widget_cell_shows_the_browser_tests_picture_of_it(site):
    for assignment in assignments():
        notebook = json.loads((REPOSITORY / "notebooks" / assignment / f"{assignment}.ipynb").read_text())
        for cell in notebook["cells"]:
            if "widget" not in cell["metadata"].get("tags", []):
                continue
            picture = REPOSITORY / "assets" / "screenshots" / "widgets" / f"{assignment}--{cell['id']}.png"
            assert picture.is_file(), (
                f"{assignment}'s widget cell {cell['id']} has no picture: run tests/test_browser_acceptance.py, "
                "then ./course docs --screenshots, and commit assets/screenshots/widgets/"
            )
    page = (BUILD / "notebooks" / "01_attention" / "01_attention.html").read_text()
    assert "the widget, as the browser tests drew it" not in page  # the picture is shown, not its text
    assert len(re.findall(r'<img alt="[^"]*" src="[^"]*\.png"', page)) >= 2  # 01's two widget cells


def test_one_version_in_the_metadata_the_site_and_course_grade(site):
    version = tomllib.loads((REPOSITORY / "pyproject.toml").read_text())["project"]["version"]
    grader = tomllib.loads((REPOSITORY / "autograder" / "pyproject.toml").read_text())["project"]
    assert grader["version"] == version
    assert f"attention-transformers-course=={version}" in grader["dependencies"]
    assert f"Attention &amp; Transformers {version}</title>" in (BUILD / "index.html").read_text()
    result = subprocess.run(
        [sys.executable, "-m", "autograder.grade", "--version"], capture_output=True, text=True, timeout=60
    )
    assert result.stdout.strip() == f"course-grade {version}", result.stdout + result.stderr
    assert f"## {version} " in (REPOSITORY / "CHANGELOG.md").read_text()


# ---------------------------------------------------------------- the README


def test_the_readme_is_short():
    assert len((REPOSITORY / "README.md").read_text().splitlines()) <= 150


def test_every_link_in_the_readme_resolves():
    """Relative links name files of the repository; links to this repository on GitHub, Colab or
    Binder name files it has. Other hosts cannot be reached from here, so they are only listed."""
    readme = (REPOSITORY / "README.md").read_text()
    targets = re.findall(r"\]\(([^)\s]+)\)", readme) + re.findall(r"^\[[^\]]+\]: (\S+)$", readme, re.M)
    assert len(targets) > 20
    for target in targets:
        path = target.split("#")[0]
        if not target.startswith("http"):
            assert (REPOSITORY / path).exists(), f"README.md links to {target}, which is missing"
            continue
        colab = "https://colab.research.google.com/github/attention-transformers/course/blob/main/"
        for prefix in (f"{GITHUB}/blob/main/", colab):
            if target.startswith(prefix):
                assert (REPOSITORY / target.removeprefix(prefix)).exists(), target
        if "mybinder.org" in target and "urlpath=lab/tree/" in target:
            assert (REPOSITORY / target.split("urlpath=lab/tree/")[1]).exists(), target


def commands_of_the_course_script() -> set[str]:
    """The commands the course script dispatches."""
    from course_setup import entry_point

    return set(entry_point().COMMANDS)


def test_every_course_command_in_the_readme_exists_with_its_options():
    readme = (REPOSITORY / "README.md").read_text()
    lines = re.findall(r"^\./course (\S+)(.*?)(?:\s+#.*)?$", readme, re.M)
    assert {command for command, _ in lines} >= {"lab", "test", "grade", "export-class"}
    known = commands_of_the_course_script()
    for command, rest in lines:
        assert command in known, f"README.md runs ./course {command}, which the script does not know"
        options = re.findall(r"(--[a-z-]+)", rest)
        if options and command in {"grade", "export-class", "docs", "test"}:
            modules = {"grade": "autograder.grade", "export-class": "autograder.classcopy", "test": "pytest"}
            module = modules.get(command)
            help_command = [sys.executable, "-m", module] if module else [sys.executable, "tools/docs.py"]
            shown = subprocess.run(
                [*help_command, "--help"], cwd=REPOSITORY, capture_output=True, text=True, timeout=180
            ).stdout
            for option in options:
                assert option in shown, f"./course {command} has no option {option}"
        elif options:
            assert all(option in (REPOSITORY / "course").read_text() for option in options), (command, options)


# ---------------------------------------------------------------- in a browser


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed")
@pytest.mark.browser
def test_the_start_page_and_a_notebook_page_render_with_their_launch_buttons(site, browser):
    """Through the session's browser (conftest), started with the browser tests: a later test may
    leave an asyncio loop marked running in this thread, where playwright's sync API cannot start."""
    from browser_harness import ARTIFACTS

    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(BUILD))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    shots = ARTIFACTS / "site"
    shots.mkdir(parents=True, exist_ok=True)
    try:
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto(f"{base}/index.html")
        assert page.title().startswith("Attention & Transformers")
        navigation = page.locator(".bd-sidebar-primary")
        for title in ("Start here", "Teaching a graded class", "What a submission cannot do", "01 · Attention"):
            assert navigation.get_by_text(title, exact=False).count() >= 1, title
        page.screenshot(path=shots / "start-page.png")

        page.goto(f"{base}/notebooks/01_attention/01_attention.html")
        assert page.locator("h1").first.inner_text().startswith("01")
        page.locator(".dropdown-launch-buttons > button").click()
        menu = page.locator(".dropdown-launch-buttons .dropdown-menu")
        menu.wait_for(state="visible")
        for name, start in (
            ("Binder", "https://mybinder.org/v2/gh/course-test-org/class-copy/main?"),
            ("Colab", "https://colab.research.google.com/github/course-test-org/class-copy/"),
            ("JupyterHub", f"{HUB}/hub/user-redirect/git-pull?"),
        ):
            link = menu.get_by_text(name, exact=True).locator("xpath=ancestor::a")
            assert link.get_attribute("href").startswith(start), name
        page.screenshot(path=shots / "notebook-page.png")
        # a widget's picture on the page has pixels, not a broken image
        pictures = page.locator("img[src$='.png']:not([alt$='logo'])")
        assert pictures.count() >= 2
        assert pictures.first.evaluate("img => img.complete && img.naturalWidth > 0")
        page.close()
    finally:
        server.shutdown()
        server.server_close()
