"""Execute a notebook in a real kernel (nbclient) and measure it.

Shared by the tests (every solution notebook runs without error) and the
benchmark (``./course bench``, which prints each notebook's run time and peak
memory). Kernels start the way nbgrader starts them (the trusted snapshot is
imported first), so solution notebooks' hidden checks run as in grading.
``solution_cell`` reads one code cell of a solution notebook, for tests that
run a demo cell alone.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import nbformat
from nbclient import NotebookClient

REPOSITORY = Path(__file__).resolve().parent.parent


def solution_cell(assignment: str, marker: str) -> str:
    """The source of the one code cell of solutions/<assignment> that contains ``marker``."""
    notebook = nbformat.read(REPOSITORY / "solutions" / assignment / f"{assignment}.ipynb", as_version=4)
    found = [cell.source for cell in notebook.cells if cell.cell_type == "code" and marker in cell.source]
    assert len(found) == 1, f"{assignment}: {len(found)} code cells contain {marker!r}"
    return found[0]


def kernel_arguments() -> list[str]:
    """The kernel arguments nbgrader_config.py gives graded kernels."""
    from autograder.release import course_config

    return list(course_config(REPOSITORY / "coursework", REPOSITORY / "notebooks").Execute.extra_arguments)


@dataclass
class Run:
    notebook: nbformat.NotebookNode
    seconds: float
    peak_rss_mb: float

    def errors(self) -> list[str]:
        """'cell N: Ename: message' for every error output."""
        found = []
        for index, cell in enumerate(self.notebook.cells):
            for output in cell.get("outputs", []):
                if output.output_type == "error":
                    found.append(f"cell {index}: {output.ename}: {output.evalue}")
        return found

    def stream_text(self) -> str:
        return "".join(
            output.get("text", "")
            for cell in self.notebook.cells
            for output in cell.get("outputs", [])
            if output.output_type == "stream"
        )


def _peak_rss_mb(pid: int) -> float:
    """The kernel process's high-water mark of resident memory (Linux)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def execute(path: Path, env: dict | None = None, timeout: int = 600) -> Run:
    """Run every cell of the notebook at ``path`` (errors recorded, not raised)."""
    path = Path(path)
    notebook = nbformat.read(path, as_version=4)
    previous = {key: os.environ.get(key) for key in (env or {})}
    os.environ.update(env or {})
    try:
        client = NotebookClient(
            notebook,
            timeout=timeout,
            kernel_name="python3",
            allow_errors=True,
            resources={"metadata": {"path": str(path.parent)}},
            extra_arguments=kernel_arguments(),
        )
        start = time.perf_counter()
        peak = float("nan")
        with client.setup_kernel():
            for index, cell in enumerate(notebook.cells):
                client.execute_cell(cell, index)
            seconds = time.perf_counter() - start
            process = getattr(client.km.provisioner, "process", None)
            if process is not None:
                peak = _peak_rss_mb(process.pid)
    finally:
        for key, value in previous.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    return Run(notebook, seconds, peak)
