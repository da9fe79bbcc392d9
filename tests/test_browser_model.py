"""Real JupyterLab, real chromium: notebook 07's solution runs and its three widgets respond.

The full training takes about a minute; here the notebook runs with
COURSE_QUICK=1 (documented in the notebook: the training shrinks to a few
steps and the optional hub download is skipped), on a JupyterLab of its own
started with that variable, so the kernel inherits it. The widgets are the
same; only the model is barely trained.
"""
import shutil
import uuid
from pathlib import Path

import pytest

from browser_harness import ARTIFACTS, JupyterLab, LabNotebook, needs_chromium

REPOSITORY = Path(__file__).resolve().parent.parent

pytestmark = needs_chromium


@pytest.fixture(scope="module")
def quick_lab(tmp_path_factory):
    with JupyterLab(tmp_path_factory.mktemp("lab07"), env={"COURSE_QUICK": "1"}) as server:
        yield server


def press(notebook, selector: str, key: str = "ArrowRight") -> None:
    handle = notebook.page.locator(f"{selector} .noUi-handle").first
    handle.scroll_into_view_if_needed()
    handle.focus()
    notebook.page.keyboard.press(key)


def test_notebook_07_runs_and_its_widgets_respond(quick_lab, browser):
    name = f"07_llama-{uuid.uuid4().hex[:8]}.ipynb"
    shutil.copy(REPOSITORY / "solutions" / "07_llama" / "07_llama.ipynb", quick_lab.root_dir / name)
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    try:
        notebook = LabNotebook(page, quick_lab.url(name))
        notebook.open()
        notebook.run_all(timeout_s=300)
        assert notebook.error_outputs() == []
        ARTIFACTS.mkdir(exist_ok=True)

        # the training monitor: under Run All it shows PNG frames while training (the
        # browser's handshake with the figure waits for the queued cells), then the
        # live figure; the smoothing slider redraws the average
        monitor = ".training-monitor"
        assert "step 7" in page.locator(f"{monitor} .training-stats").inner_text()
        page.locator(f"{monitor} .training-picture").wait_for(state="hidden", timeout=30_000)
        before = notebook.canvas_pixels(monitor)
        press(notebook, f"{monitor} .smooth-slider", "Home")
        notebook.wait_for_new_pixels(monitor, before)
        page.locator(monitor).screenshot(path=ARTIFACTS / "training-monitor.png")

        # generation: the temperature slider redraws the bars; the button writes text
        explorer = ".generation-explorer"
        before = notebook.canvas_pixels(explorer)
        press(notebook, f"{explorer} .temperature-slider", "Home")  # temperature 0: one bar
        notebook.wait_for_new_pixels(explorer, before)
        assert page.locator(f"{explorer} .generated-text").inner_text().strip() == ""
        page.locator(f"{explorer} .generate-button").click()
        page.locator(f"{explorer} .generated-text pre").wait_for(timeout=30_000)
        assert page.locator(f"{explorer} .generated-text").inner_text().startswith("The keeper ")
        page.locator(explorer).screenshot(path=ARTIFACTS / "generation-explorer.png")

        # attention maps: another head redraws the heatmap and the bars
        maps = ".attention-maps"
        before = notebook.canvas_pixels(maps)
        shaded = page.locator(f"{maps} .attention-text").inner_text()
        press(notebook, f"{maps} .head-slider")
        notebook.wait_for_new_pixels(maps, before)
        assert "the model expects" in shaded
        page.locator(maps).screenshot(path=ARTIFACTS / "attention-maps.png")
    finally:
        page.close()
