"""Where ./course takes torch from: pip's own choice, or PyTorch's CPU package index.

On Linux, the torch wheels on PyPI are the CUDA build: each requires NVIDIA's
libraries (cuda-toolkit, nvidia-cudnn-cu13, nvidia-nccl-cu13, ..., triton), several
GB that a course on CPUs never uses. PyTorch publishes the same release without
them, as version "2.13.0+cpu", on its own CPU index. macOS and Windows wheels on
PyPI need no NVIDIA libraries, and some machines' pip already finds a "+cpu" build
(a local wheel folder, a mirror): there pip's choice stands, and the CPU index is
never contacted.

The decision is read from what pip itself would install (`pip install --dry-run
--report`), so it follows the machine's pip configuration; torch is installed with
--no-deps, its pure-Python dependencies coming from the course's lock
(requirements/*.txt).

    python tools/torch_source.py decide     # print the decision, install nothing
    python tools/torch_source.py install    # what ./course runs after the lock
    python tools/torch_source.py install --progress   # the same, with pip's download bar
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

from packaging.markers import InvalidMarker
from packaging.requirements import Requirement

REPOSITORY = Path(__file__).resolve().parent.parent
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
# Names of the GPU libraries that torch's Linux wheels on PyPI require.
CUDA_PACKAGE = re.compile(r"^(nvidia-|cuda-|triton$)")
# pip's own network limits: seconds per connection attempt, and retries after a failure
PIP_TIMEOUT, PIP_RETRIES = 20, 2


@dataclass(frozen=True)
class Choice:
    use_cpu_index: bool
    reason: str


def torch_pin(requirements: Path = REPOSITORY / "requirements" / "student.in") -> str:
    """The torch line of the student set, e.g. 'torch==2.13.0'."""
    for line in requirements.read_text().splitlines():
        line = line.split("#")[0].strip()
        if re.match(r"torch\s*==", line):
            return line.replace(" ", "")
    raise SystemExit(f"{requirements} pins no torch")


def pip_report(python: str, requirement: str) -> dict:
    """What `pip install` would install for the requirement alone (a dry run: metadata only)."""
    result = subprocess.run(
        [
            python,
            "-m",
            "pip",
            "install",
            "--dry-run",
            "--quiet",
            "--report",
            "-",
            "--no-deps",
            "--ignore-installed",
            "--disable-pip-version-check",
            "--timeout",
            str(PIP_TIMEOUT),
            "--retries",
            str(PIP_RETRIES),
            requirement,
        ],
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        raise SystemExit(f"pip cannot find {requirement}:\n{result.stderr.strip()}")
    return json.loads(result.stdout)


def choose(report: dict) -> Choice:
    """Keep pip's choice unless its wheel would pull in NVIDIA's libraries on this machine."""
    [item] = [item for item in report["install"] if item["metadata"]["name"].lower() == "torch"]
    version = item["metadata"]["version"]
    wheel = unquote(item["download_info"]["url"].rsplit("/", 1)[-1])
    if version.endswith("+cpu"):
        return Choice(False, f"pip finds the CPU build {version} ({wheel})")
    # markers are evaluated for the machine pip reported on (its "environment")
    environment = report.get("environment") or None
    cuda = []
    for line in item["metadata"].get("requires_dist") or []:
        requirement = Requirement(line)
        if not CUDA_PACKAGE.match(requirement.name.lower()):
            continue
        try:
            applies = requirement.marker is None or requirement.marker.evaluate({**(environment or {}), "extra": ""})
        except (InvalidMarker, KeyError):
            applies = True
        if applies:
            cuda.append(requirement.name)
    if cuda:
        return Choice(
            True,
            f"pip would install the CUDA build {version} ({wheel}), which pulls "
            f"{', '.join(cuda)}: the CPU build comes from PyTorch's CPU index instead",
        )
    return Choice(False, f"pip's torch {version} ({wheel}) needs no NVIDIA libraries")


def install(
    python: str, requirement: str, choice: Choice, cpu_index: str, target: str | None = None, progress: bool = False
) -> int:
    """Install torch alone (--no-deps), from pip's usual sources or from the CPU index; with pip's
    own output and download bar (on a terminal) when ``progress``, else quietly."""
    command = [
        python,
        "-m",
        "pip",
        "install",
        *([] if progress else ["--quiet"]),
        "--no-deps",
        "--disable-pip-version-check",
        "--timeout",
        str(PIP_TIMEOUT),
        "--retries",
        str(PIP_RETRIES),
        requirement,
    ]
    if choice.use_cpu_index:
        # the index's versions read "2.13.0+cpu", which "torch==2.13.0" matches
        command += ["--index-url", cpu_index]
    if target:
        command += ["--target", target]
    result = subprocess.run(command, stderr=subprocess.PIPE, text=True)
    if result.returncode != 0:
        errors = "\n".join(line for line in result.stderr.splitlines() if not line.startswith("WARNING: Location"))
        where = f"PyTorch's CPU index ({cpu_index})" if choice.use_cpu_index else "pip's configured sources"
        print(
            f"{errors}\n\nCould not install {requirement} from {where}.\n"
            f"Why this source: {choice.reason}.\n"
            f"Check the connection and run the command again, or install it by hand:\n"
            f"  {python} -m pip install --no-deps {requirement}"
            + (f" --index-url {cpu_index}" if choice.use_cpu_index else ""),
            file=sys.stderr,
        )
    return result.returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=["decide", "install"])
    parser.add_argument("--requirement", default=None, help="default: the torch pin of requirements/student.in")
    parser.add_argument("--python", default=sys.executable, help="the interpreter whose pip installs torch")
    parser.add_argument("--cpu-index", default=os.environ.get("COURSE_TORCH_CPU_INDEX", CPU_INDEX))
    parser.add_argument("--report", type=Path, help="a saved `pip install --dry-run --report` instead of a new one")
    parser.add_argument("--target", help="install into this folder (pip --target) instead of the environment")
    parser.add_argument("--progress", action="store_true", help="show pip's output and download bar (a terminal)")
    args = parser.parse_args(argv)
    requirement = args.requirement or torch_pin()
    report = json.loads(args.report.read_text()) if args.report else pip_report(args.python, requirement)
    choice = choose(report)
    print(f"torch: {choice.reason}", file=sys.stderr)
    if args.action == "decide":
        return 0
    return install(args.python, requirement, choice, args.cpu_index, args.target, args.progress)


if __name__ == "__main__":
    sys.exit(main())
