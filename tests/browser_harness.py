"""A real JupyterLab on 127.0.0.1, driven by Debian's chromium through playwright.

    with JupyterLab(root_dir) as lab:            # started on a free port, stopped on exit
        page = browser.new_page()
        notebook = LabNotebook(page, lab.url("copy.ipynb"))
        notebook.open(); notebook.run_all()
        heatmap = notebook.only_explorer("attention-heatmap")   # see explorer_driver.py

Facts this relies on (see FIELD-NOTES): a temporary workspaces and settings
folder and a unique workspace URL per page; news fetching and notebook
windowing off (every cell rendered, so every prompt can be read); kernel readiness
read from the status bar, not the execution indicator; ipympl draws on a
<canvas>, compared through toDataURL().
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"
REPOSITORY = Path(__file__).resolve().parent.parent
ARTIFACTS = REPOSITORY / "test-artifacts"  # screenshots (ignored by git)
START_TIMEOUT_S = 300  # for a JupyterLab server to answer (see JupyterLab.start)
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class JupyterLab:
    """A JupyterLab server serving ``root_dir`` on 127.0.0.1 until stopped."""

    def __init__(
        self,
        root_dir: Path,
        extra_args: list[str] | None = None,
        env: dict | None = None,
        python: str | Path | None = None,
        news_answered: bool = True,
    ):
        self.root_dir = Path(root_dir)
        self.python = str(python or sys.executable)  # the environment the server (and its kernels) run in
        self.port = free_port()
        self.token = uuid.uuid4().hex
        self.scratch = Path(tempfile.mkdtemp(prefix="course-lab-"))
        self.extra_args = extra_args or []
        self.env = env or {}
        self.news_answered = news_answered  # False: a user who was never asked (see command)
        self.process = None

    def command(self) -> list[str]:
        """The command that starts the server, before the flags that put it on this port with this
        token (``start`` adds them). Here: the tests' own JupyterLab, with a temporary workspaces
        and settings folder (every cell rendered; JupyterLab's news question answered "no" unless
        ``news_answered`` is False). A subclass may start it otherwise."""
        settings = self.scratch / "settings"
        if self.news_answered:
            news = settings / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
            news.parent.mkdir(parents=True, exist_ok=True)
            news.write_text(json.dumps({"fetchNews": "false"}))
        # render every cell: with windowing, cells out of view have no prompt or output yet
        windowing = settings / "@jupyterlab" / "notebook-extension" / "tracker.jupyterlab-settings"
        windowing.parent.mkdir(parents=True, exist_ok=True)
        windowing.write_text(json.dumps({"windowingMode": "none"}))
        return [
            self.python,
            "-m",
            "jupyter",
            "lab",
            f"--ServerApp.root_dir={self.root_dir}",
            f"--LabApp.workspaces_dir={self.scratch / 'workspaces'}",
            f"--LabApp.user_settings_dir={settings}",
            *(["--allow-root"] if os.geteuid() == 0 else []),
            *self.extra_args,
        ]

    def start(self) -> JupyterLab:
        scripts = str(Path(self.python).parent)
        env = {**os.environ, "PATH": scripts + os.pathsep + os.environ.get("PATH", ""), **self.env}
        env.pop("NBGRADER_EXECUTION", None)
        self.log = open(self.scratch / "server.log", "w")
        self.process = subprocess.Popen(
            [
                *self.command(),
                "--no-browser",
                "--ServerApp.ip=127.0.0.1",
                f"--ServerApp.port={self.port}",
                "--ServerApp.port_retries=0",
                f"--IdentityProvider.token={self.token}",
            ],
            cwd=self.root_dir,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        # Starting takes 5 to 10 s on an idle machine; more than a minute on a busy one with a cold
        # page cache (JupyterLab, nbgrader and their extensions are read from disk). The limit is
        # only for a server that never comes up.
        started = time.monotonic()
        while time.monotonic() < started + START_TIMEOUT_S:
            if self.process.poll() is not None:
                log = (self.scratch / "server.log").read_text()
                self.stop()
                raise RuntimeError(f"JupyterLab exited:\n{log}")
            if self.status("api/status") == 200:
                return self
            time.sleep(0.3)
        log = (self.scratch / "server.log").read_text()
        self.stop()  # a server that never answered is not left running
        raise RuntimeError(f"JupyterLab did not start within {START_TIMEOUT_S} s:\n{log}")

    def status(self, path: str) -> int:
        """The HTTP status of ``path`` on this server (0: no answer)."""
        url = f"http://127.0.0.1:{self.port}/{path}?token={self.token}"
        try:
            with urllib.request.urlopen(url, timeout=30) as answer:
                return answer.status
        except urllib.error.HTTPError as error:
            return error.code
        except OSError:
            return 0

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if getattr(self, "log", None):
            self.log.close()
        shutil.rmtree(self.scratch, ignore_errors=True)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def url(self, path: str) -> str:
        """A unique workspace URL opening ``path`` (relative to the root)."""
        return f"http://127.0.0.1:{self.port}/lab/workspaces/{uuid.uuid4().hex}/tree/{path}?token={self.token}"


class LabNotebook:
    """One notebook open in a JupyterLab page."""

    def __init__(self, page, url: str):
        self.page, self.url = page, url

    def open(self) -> None:
        from explorer_driver import install_probe

        install_probe(self.page)  # times inputs and drawing (see explorer_driver.py)
        self.page.goto(self.url)
        # the kernel exists and is idle (the execution indicator says idle too early)
        self.page.get_by_text("(ipykernel) | Idle").first.wait_for(timeout=60_000)

    def run_all(self, timeout_s: float = 120) -> None:
        self.page.get_by_role("menuitem", name="Run", exact=True).click()
        self.page.get_by_role("menuitem", name="Run All Cells", exact=True).click()
        deadline = time.monotonic() + timeout_s
        stopped_at_error = 0
        while time.monotonic() < deadline:
            prompts = self.page.locator(".jp-CodeCell .jp-InputArea-prompt").all_inner_texts()
            done = prompts and all(p.strip() not in ("", "[ ]:", "[*]:") for p in prompts)
            idle = self.page.get_by_text("(ipykernel) | Idle").count()
            if done and idle:
                return
            # Run All stops at a cell that raises: the cells after it never run, so stop waiting
            # (the caller sees the error outputs) once the kernel has stayed idle with one for a second
            # and no cell is queued any more ("[*]"). Idle alone is no sign: the kernel is idle for a
            # moment between two cells, and a stderr output may be a warning or a progress bar.
            queued = any(p.strip() == "[*]:" for p in prompts)
            stopped_at_error = stopped_at_error + 1 if idle and not queued and self.error_outputs() else 0
            if stopped_at_error >= 4:
                return
            time.sleep(0.25)
        raise TimeoutError(f"Run All did not finish in {timeout_s} s: prompts {prompts}")

    def cells(self):
        """Locator of the notebook's cells, in notebook order (every cell is rendered)."""
        return self.page.locator(".jp-NotebookPanel .jp-Notebook .jp-Cell")

    def explorers(self, cell_index: int | None = None) -> list:
        """The course widgets (``explorer_driver.ExplorerOnPage``) in one cell's output, or in the notebook."""
        from explorer_driver import ExplorerOnPage

        scope = None if cell_index is None else self.cells().nth(cell_index)
        return ExplorerOnPage.all_in(self.page, scope)

    def only_explorer(self, css_class: str):
        """The notebook's one course widget of class ``css_class``, in view and quiet."""
        [explorer] = [e for e in self.explorers() if e.topic_class == css_class]
        explorer.locator.scroll_into_view_if_needed()
        explorer.settle()
        return explorer

    def error_outputs(self) -> list[str]:
        """Texts of error outputs (tracebacks) in the notebook."""
        return self.page.locator(
            '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]'
        ).all_inner_texts()


COURSE_COPY_IGNORES = shutil.ignore_patterns(
    ".venv",
    ".git",
    "test-artifacts",
    "__pycache__",
    "*.egg-info",
    ".pytest_cache",
    ".ipynb_checkpoints",
    "gradebook.db*",
    "submitted",
    "autograded",
    "feedback",
    "exchange",
    "release",
    "reports",
    ".work",
    "coursework",
)


def copy_course(target: Path) -> Path:
    """A copy of the repository as a learner's clone holds it (no venv, no git, no class data)."""
    shutil.copytree(REPOSITORY, target, ignore=COURSE_COPY_IGNORES, symlinks=True)
    return target


NEWS_QUESTION = "Would you like to get notified about official Jupyter news?"


def news_question_shown(page, within_s: float = 5) -> bool:
    """JupyterLab's news question appears within ``within_s`` of a notebook's kernel being ready
    (it is asked once the page has restored its layout, before a kernel starts: see the control in
    test_browser_course_lab.py)."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        page.get_by_text(NEWS_QUESTION).first.wait_for(timeout=within_s * 1000)
    except PlaywrightTimeout:
        return False
    return True


def menu_titles(page) -> list[str]:
    """The titles of JupyterLab's main menu bar, once it is there."""
    page.locator(".lm-MenuBar-itemLabel").first.wait_for(timeout=60_000)
    return page.locator(".lm-MenuBar-itemLabel").all_inner_texts()


def link_assets(root: Path, solutions: bool = True) -> Path:
    """Give a lab root the repository's assets/ (linked), as notebooks expect beside them; and, as in a
    clone (self-study), each solution notebook at solutions/<assignment>/<assignment>.ipynb (linked files
    in folders of the lab's own, so notebooks placed beside them never land in the repository)."""
    (root / "assets").symlink_to(REPOSITORY / "assets", target_is_directory=True)
    if solutions:
        for notebook in sorted((REPOSITORY / "solutions").glob("*/*.ipynb")):
            folder = root / "solutions" / notebook.parent.name
            folder.mkdir(parents=True, exist_ok=True)
            (folder / notebook.name).symlink_to(notebook)
    return root


def place_in_lab(lab, source: Path) -> str:
    """Copy a notebook into the lab's root, in the same folder as in the repository
    (with the other files of its folder), under its own name. Returns its path
    relative to the root."""
    source = Path(source).resolve()
    try:
        folder = source.parent.relative_to(REPOSITORY)
    except ValueError:
        folder = Path()
    target_dir = lab.root_dir / folder
    target_dir.mkdir(parents=True, exist_ok=True)
    for sibling in source.parent.iterdir():
        if sibling.is_file() and sibling.suffix != ".ipynb" and not (target_dir / sibling.name).exists():
            shutil.copy(sibling, target_dir / sibling.name)
    target = target_dir / source.name
    if target.is_symlink():  # a solution notebook link_assets put there: the page gets a copy of its own
        target.unlink()
    shutil.copy(source, target)
    return (folder / source.name).as_posix()


def launch_browser(playwright):
    return playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)


def _needs_chromium():
    import pytest

    return [
        pytest.mark.browser,
        pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed"),
    ]


needs_chromium = _needs_chromium()  # pytestmark for browser test modules
