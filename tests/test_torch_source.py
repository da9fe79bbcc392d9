"""Where ./course takes torch from (tools/torch_source.py): pip's choice stands unless its
wheel would pull NVIDIA's libraries; then the CPU build comes from PyTorch's CPU index,
and an index that cannot be reached fails at once with a message that says what to do.

The reports below are pip's own `install --dry-run --report` output, cut to the fields
the decision reads; the torch requirements are those of torch 2.13.0's wheels on PyPI.
No test contacts PyTorch's index: the unreachable one is a closed port on 127.0.0.1.
"""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tools import torch_source

REPOSITORY = Path(__file__).resolve().parent.parent
TOOL = REPOSITORY / "tools" / "torch_source.py"

PURE_PYTHON = [
    "filelock",
    "typing-extensions>=4.10.0",
    "setuptools>=77.0.3",
    "sympy>=1.13.3",
    "networkx>=2.5.1",
    "jinja2",
    "fsspec>=0.8.5",
    'optree>=0.13.0; extra == "optree"',
    'opt-einsum>=3.3; extra == "opt-einsum"',
    'pyyaml; extra == "pyyaml"',
]
CUDA = [
    "cuda-toolkit[cublas,cudart,cufft,cufile,cupti,curand,cusolver,cusparse,nvjitlink,nvrtc,nvtx]==13.0.3; "
    'platform_system == "Linux"',
    'cuda-bindings<14,>=13.0.3; platform_system == "Linux" and python_version < "3.15"',
    'nvidia-cudnn-cu13==9.20.0.48; platform_system == "Linux"',
    'nvidia-cusparselt-cu13==0.8.1; platform_system == "Linux"',
    'nvidia-nccl-cu13==2.29.7; platform_system == "Linux"',
    'nvidia-nvshmem-cu13==3.4.5; platform_system == "Linux"',
    'triton==3.7.1; platform_system == "Linux" and python_version < "3.15"',
]
LINUX = {
    "platform_system": "Linux",
    "sys_platform": "linux",
    "platform_machine": "x86_64",
    "os_name": "posix",
    "python_version": "3.11",
    "python_full_version": "3.11.7",
    "implementation_name": "cpython",
}
MACOS = LINUX | {"platform_system": "Darwin", "sys_platform": "darwin", "platform_machine": "arm64"}
WINDOWS = LINUX | {"platform_system": "Windows", "sys_platform": "win32", "platform_machine": "AMD64", "os_name": "nt"}


def report(url: str, version: str, requires: list, environment: dict) -> dict:
    return {
        "version": "1",
        "environment": environment,
        "install": [
            {
                "download_info": {"url": url},
                "requested": True,
                "metadata": {"name": "torch", "version": version, "requires_dist": requires},
            }
        ],
    }


PYPI_LINUX = report(
    "https://files.example/torch-2.13.0-cp311-cp311-manylinux_2_28_x86_64.whl", "2.13.0", PURE_PYTHON + CUDA, LINUX
)


def test_a_local_cpu_build_is_kept():
    choice = torch_source.choose(
        report(
            "file:///opt/wheels/torch-2.13.0%2Bcpu-cp311-cp311-manylinux_2_28_x86_64.whl",
            "2.13.0+cpu",
            PURE_PYTHON,
            LINUX,
        )
    )
    assert not choice.use_cpu_index
    assert "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl" in choice.reason


def test_pypis_linux_wheel_which_pulls_nvidias_libraries_takes_the_cpu_index():
    choice = torch_source.choose(PYPI_LINUX)
    assert choice.use_cpu_index
    for name in ("cuda-toolkit", "nvidia-cudnn-cu13", "nvidia-nccl-cu13", "triton"):
        assert name in choice.reason


@pytest.mark.parametrize(
    "wheel, environment",
    [("torch-2.13.0-cp311-none-macosx_14_0_arm64.whl", MACOS), ("torch-2.13.0-cp311-cp311-win_amd64.whl", WINDOWS)],
)
def test_macos_and_windows_wheels_from_pypi_are_kept(wheel, environment):
    # the same requirements as on Linux, but their markers are false there: nothing from NVIDIA
    choice = torch_source.choose(report(f"https://files.example/{wheel}", "2.13.0", PURE_PYTHON + CUDA, environment))
    assert not choice.use_cpu_index, choice.reason


def test_a_linux_wheel_without_cuda_requirements_is_kept():
    choice = torch_source.choose(
        report(
            "https://mirror.example/torch-2.13.0-cp311-cp311-manylinux_2_28_x86_64.whl", "2.13.0", PURE_PYTHON, LINUX
        )
    )
    assert not choice.use_cpu_index


def test_the_pin_comes_from_the_student_set():
    assert torch_source.torch_pin() == "torch==2.13.0"


def test_this_machines_pip_report_is_read_and_decided():
    """A real dry run with this environment's pip: the decision matches the wheel pip picked."""
    result = torch_source.pip_report(sys.executable, torch_source.torch_pin())
    [item] = result["install"]
    assert item["metadata"]["version"].split("+")[0] == "2.13.0"
    choice = torch_source.choose(result)
    linux = result["environment"]["platform_system"] == "Linux"
    assert choice.use_cpu_index == (linux and not item["metadata"]["version"].endswith("+cpu"))


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]  # closed again when the block ends: nothing listens there


def test_an_unreachable_cpu_index_fails_at_once_with_a_clear_message(tmp_path):
    """The CPU branch against a closed port on 127.0.0.1: pip gives up after its retries, the tool
    exits non-zero and says which index, why it was chosen, and the command to run by hand."""
    saved = tmp_path / "report.json"
    saved.write_text(json.dumps(PYPI_LINUX))
    index = f"http://127.0.0.1:{closed_port()}/whl/cpu"
    # no other source of torch: neither this machine's pip configuration nor its local wheel folder
    environment = {key: value for key, value in os.environ.items() if not key.startswith("PIP_")}
    environment["PIP_CONFIG_FILE"] = os.devnull
    result = subprocess.run(
        [
            sys.executable,
            str(TOOL),
            "install",
            "--report",
            str(saved),
            "--cpu-index",
            index,
            "--target",
            str(tmp_path / "target"),
        ],
        capture_output=True,
        text=True,
        env=environment,
        timeout=180,
    )
    assert result.returncode != 0
    assert f"Could not install torch==2.13.0 from PyTorch's CPU index ({index})" in result.stderr
    assert "pulls cuda-toolkit" in result.stderr  # why this source
    assert f"pip install --no-deps torch==2.13.0 --index-url {index}" in result.stderr
    assert not list((tmp_path / "target").glob("torch*"))
