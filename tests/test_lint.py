"""The code is formatted and lint-clean under the project's ruff settings (pyproject.toml's [tool.ruff]):
what a maintainer's `ruff check` and `ruff format` would change, this test reports."""

import subprocess
import sys
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parent.parent
RUFF = Path(sys.executable).parent / "ruff"


@pytest.mark.parametrize("command", [["check", "."], ["format", "--check", "."]], ids=["check", "format"])
def test_ruff_finds_nothing(command):
    assert RUFF.is_file(), f"ruff is not installed beside {sys.executable} (requirements/dev.in pins it)"
    result = subprocess.run([str(RUFF), *command], cwd=REPOSITORY, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"ruff {' '.join(command)}:\n{result.stdout}{result.stderr}"
