"""Real JupyterLab, real chromium: the solution notebook runs and its widgets respond."""
import shutil
import uuid
from pathlib import Path

import pytest

from browser_harness import CHROMIUM, JupyterLab, LabNotebook, launch_browser

REPOSITORY = Path(__file__).resolve().parent.parent
ARTIFACTS = REPOSITORY / "test-artifacts"

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed"),
]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    root = tmp_path_factory.mktemp("lab")
    with JupyterLab(root) as server:
        yield server


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = launch_browser(playwright)
        yield browser
        browser.close()


def open_copy(lab, browser, source: Path) -> LabNotebook:
    """Copy a notebook under a unique name into the server's root and open it."""
    name = f"{source.stem}-{uuid.uuid4().hex[:8]}.ipynb"
    shutil.copy(source, lab.root_dir / name)
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    notebook = LabNotebook(page, lab.url(name))
    notebook.open()
    return notebook


def test_attention_heatmap_renders_and_follows_the_query_slider(lab, browser):
    notebook = open_copy(lab, browser, REPOSITORY / "solutions" / "01_attention" / "01_attention.ipynb")
    notebook.run_all()
    assert notebook.error_outputs() == []
    heatmap = ".attention-heatmap"
    before = notebook.canvas_pixels(heatmap)
    notebook.page.locator(f"{heatmap} .query-slider").scroll_into_view_if_needed()
    ARTIFACTS.mkdir(exist_ok=True)
    notebook.page.locator(heatmap).screenshot(path=ARTIFACTS / "attention-heatmap.png")
    handle = notebook.page.locator(f"{heatmap} .query-slider .noUi-handle")
    handle.focus()
    notebook.page.keyboard.press("ArrowRight")
    notebook.wait_for_new_pixels(heatmap, before)
    assert "(2.20, 6.02)" in notebook.page.locator(f"{heatmap} .attention-output").inner_text()
    notebook.page.close()
