"""A student's first `./course setup student`, in a fresh copy of the course, as on a laptop without
Linux's extras: PATH holds only a `python3` (this machine's Python 3.11): no flock, apt-get, sudo,
bash or uv. The set-up must succeed, announce each step with what it installs and its size, show
the installer's own output on a terminal (a pty here), and end with the time taken, the size
installed and the ready line; with colours on the terminal, none in a pipe or with NO_COLOR.

Then the same copy's set-up is made stale (its stamp removed, as a changed lock would) and three
set-ups start together, in pipes, under `python -X dev -W error`: one installs, the others wait
and find the work done. Last, where uv is available (it is in the dev set), uv installs the
student lock into another venv: the same versions as pip's.

What this machine cannot show: a Mac or a Windows laptop (see tests/test_entry_point.py for the
per-system parts), and a download of torch from PyPI or PyTorch's index (pip finds torch's CPU
build in this machine's wheel folder; uv reads PyPI).
"""

import os
import re
import select
import subprocess
import sys
from pathlib import Path

import pytest
from browser_harness import copy_course
from course_setup import REPOSITORY, entry_point

ESCAPE = "\033["
READY = "ready: ./course lab opens notebook 00"
# the student lock's packages, as the set-up counts them (some are for other systems or Pythons)
PACKAGES = entry_point().lock_packages(REPOSITORY / "requirements" / "student.txt")


def only_python_on_path(folder: Path) -> dict:
    """An environment whose PATH is one folder holding python3 (this machine's Python 3.11, not the
    venv's), and this process's other variables (HOME, pip's configuration)."""
    folder.mkdir()
    python = Path(sys.base_prefix) / "bin" / f"python{sys.version_info[0]}.{sys.version_info[1]}"
    (folder / "python3").symlink_to(python)
    env = {key: value for key, value in os.environ.items() if key not in ("VIRTUAL_ENV", "PYTHONPATH", "COURSE_VENV")}
    return env | {"PATH": str(folder)}


def run_in_a_terminal(command: list[str], cwd: Path, env: dict, timeout: float = 1800) -> tuple[int, str]:
    """Run a command with a pty as its stdin, stdout and stderr, as in a terminal window; return its
    exit status and everything it wrote there."""
    import pty

    leader, follower = pty.openpty()
    process = subprocess.Popen(command, cwd=cwd, env=env, stdin=follower, stdout=follower, stderr=follower)
    os.close(follower)
    output = bytearray()
    try:
        while True:
            ready, _, _ = select.select([leader], [], [], timeout)
            if not ready:
                process.kill()
                raise AssertionError(f"no output for {timeout} s:\n{output.decode(errors='replace')[-3000:]}")
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: every end of the terminal is closed
                break
            if not chunk:
                break
            output += chunk
    finally:
        os.close(leader)
    return process.wait(timeout=60), output.decode(errors="replace").replace("\r\n", "\n")


@pytest.fixture(scope="module")
def fresh_course(tmp_path_factory):
    """A fresh copy of the course (no venv), set up for the student set in a terminal."""
    root = tmp_path_factory.mktemp("student")
    course = copy_course(root / "course")
    env = only_python_on_path(root / "bin")
    for tool in ("flock", "apt-get", "sudo", "bash", "uv", "python3.11"):
        assert subprocess.run(["/bin/sh", "-c", f"command -v {tool}"], env=env).returncode != 0, tool
    # nothing in pip's cache, as on a student's laptop: what pip takes from PyPI it downloads
    first = env | {"PIP_CACHE_DIR": str(root / "pip-cache")}
    status, output = run_in_a_terminal(["./course", "setup", "student"], course, first)
    return course, env, status, output


def test_a_fresh_copy_sets_up_the_student_set_with_only_python_on_path(fresh_course):
    course, _, status, output = fresh_course
    assert status == 0, output[-5000:]
    assert (course / ".venv" / ".course-installed").read_text().split()[1] == "student"
    imports = "import torch, nbgrader, ipympl, jupyterlab, course_widgets, course_checks, autograder"
    assert subprocess.run([course / ".venv" / "bin" / "python", "-c", imports]).returncode == 0


def test_in_a_terminal_each_step_is_announced_in_bold_with_the_installers_own_progress(fresh_course):
    _, _, status, output = fresh_course
    assert status == 0
    course = f"{ESCAPE}1m[course]{ESCAPE}0m"
    assert re.search(rf"^{re.escape(course)} creating .*/\.venv with Python 3\.11\.\d+ \(", output, re.M)
    steps = re.findall(rf"^{re.escape(course)} step (\d)/3: (.*)$", output, re.M)
    assert [number for number, _ in steps] == ["1", "2", "3"], output[-5000:]
    assert steps[0][1].startswith(
        f"installing the student set with pip: {PACKAGES} packages from requirements/student.txt"
    )
    assert re.search(
        r"\(about \d+ MB to download, \d+ MB installed\), each file checked against the lock's hash$", steps[0][1]
    )
    assert steps[1][1].startswith("installing torch==2.13.0 alone, the CPU build (about 190 MB to download")
    # pip's own lines between the announcements (quiet in a pipe): each package as it comes (from a
    # local folder, or downloaded with pip's bar), then done
    lock_step = output[output.index("step 1/3") : output.index("step 2/3")]
    assert lock_step.count("Collecting ") + lock_step.count("Processing ") >= 130, lock_step[:3000]
    assert re.search(r"━+\S* \S*[\d.]+/[\d.]+ [kM]B", lock_step), "no download bar"
    assert "Installing collected packages:" in lock_step and "Successfully installed" in lock_step
    assert "Successfully installed torch-2.13.0" in output[output.index("step 2/3") : output.index("step 3/3")]


def test_the_set_up_ends_with_its_time_and_size_then_the_ready_line(fresh_course):
    _, _, status, output = fresh_course
    assert status == 0
    lines = output.rstrip("\n").splitlines()
    assert lines[-1] == READY
    summary = re.fullmatch(
        rf"{re.escape(ESCAPE)}1m\[course\]{re.escape(ESCAPE)}0m set up the student set in (?:\d+ min )?\d+ s: "
        r"([\d.]+) GB installed, .*/\.venv holds ([\d.]+) GB",
        lines[-2],
    )
    assert summary, lines[-2]
    installed = float(summary.group(1))
    # the announced sizes (the lock's 800 MB and torch's 750 MB) are what a venv comes to here
    assert 1.3 <= installed <= 1.9, installed


def test_a_stale_set_up_started_three_times_together_installs_once_in_a_pipe_without_colours(fresh_course):
    """The stamp removed (a lock changed since): three set-ups at once, each under Python's development
    mode with warnings as errors, their output in pipes. One runs every step (the packages are there
    already, so it is quick), the other two wait for it, then find it done."""
    course, env, status, _ = fresh_course
    assert status == 0
    (course / ".venv" / ".course-installed").unlink()
    command = ["python3", "-X", "dev", "-W", "error", "course", "setup", "student"]
    processes = [
        subprocess.Popen(command, cwd=course, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(3)
    ]
    results = [(process.communicate(timeout=1800), process.returncode) for process in processes]
    for (out, err), code in results:
        assert code == 0, err
        assert out == READY + "\n"
        assert ESCAPE not in out + err
        assert "Warning" not in err and "Traceback" not in err, err
    installers = [err for (_, err), _ in results if "step 1/3" in err]
    waiters = [err for (_, err), _ in results if "step 1/3" not in err]
    assert len(installers) == 1 and len(waiters) == 2, [err for (_, err), _ in results]
    [installer] = installers
    steps = re.findall(r"^\[course\] step (\d)/3: installing ", installer, re.M)
    assert steps == ["1", "2", "3"]
    assert "Collecting" not in installer  # pip quiet in a log: the announcements are the progress
    assert re.search(r"^\[course\] set up the student set in (\d+ min )?\d+ s: ", installer, re.M)
    for err in waiters:
        assert err == f"[course] another ./course is setting up {course / '.venv'}: waiting for it\n"


def test_no_color_keeps_a_terminal_free_of_escape_codes(fresh_course):
    course, env, status, _ = fresh_course
    assert status == 0
    status, output = run_in_a_terminal(["./course", "setup", "student"], course, env | {"NO_COLOR": "1"})
    assert status == 0
    assert output == READY + "\n"
    (course / ".venv" / ".course-installed").write_text("stale student\n")
    status, output = run_in_a_terminal(["./course", "setup", "student"], course, env | {"NO_COLOR": "1"})
    assert status == 0, output[-3000:]
    assert ESCAPE not in output.replace(f"{ESCAPE}?25l", "").replace(f"{ESCAPE}?25h", "")
    assert "[course] step 3/3: " in output and output.endswith(READY + "\n")


def test_uv_on_path_installs_the_same_versions_as_pip(fresh_course, tmp_path):
    """uv (from the dev set) on PATH beside python3: a fresh venv, the student lock with every hash
    checked, from PyPI (uv reads no pip configuration); every package at the version pip installed."""
    course, env, status, _ = fresh_course
    assert status == 0
    uv = Path(sys.executable).parent / "uv"
    if not uv.is_file():
        pytest.skip("uv is not installed beside this Python")
    (Path(env["PATH"]) / "uv").symlink_to(uv)
    venv = tmp_path / "uv-venv"
    result = subprocess.run(
        ["./course", "setup", "student"],
        cwd=course,
        env=env | {"COURSE_VENV": str(venv)},
        capture_output=True,
        text=True,
        timeout=1800,
    )
    (Path(env["PATH"]) / "uv").unlink()
    assert result.returncode == 0, result.stderr[-5000:]
    assert f"[course] step 1/3: installing the student set with uv: {PACKAGES} packages" in result.stderr
    assert result.stdout == READY + "\n"

    def versions(python: Path) -> dict:
        listing = subprocess.run(
            [python, "-m", "pip", "list", "--format=freeze", "--disable-pip-version-check"],
            capture_output=True,
            text=True,
            check=True,
        )
        return dict(line.split("==") for line in listing.stdout.splitlines() if "==" in line)

    by_uv, by_pip = versions(venv / "bin" / "python"), versions(course / ".venv" / "bin" / "python")
    assert by_uv == by_pip
    assert len(by_uv) >= 136
    assert {"torch", "attention-transformers-course", "attention-transformers-grader"} <= set(by_uv)
