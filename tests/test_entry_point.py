"""./course, the entry point, on each system: where a venv keeps its programs, which Pythons it
tries and what it says when none is new enough, the lock that lets one set-up run at a time, how
a command takes the entry point's place, when the output has colours; and the entry point under
old Pythons (macOS's own python3 is 3.9) and under ``python -X dev -W error``.

The per-system functions take the system as an argument (``sys.platform``'s values: linux, darwin,
win32) and are checked for all three here. What runs for real is this machine's (Linux): a Mac or a
Windows machine is not available, so Windows' own lock (msvcrt) and the py launcher are not run.
The old Pythons are pyenv's, where this machine has them (skipped elsewhere).
"""

import ast
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from course_setup import COURSE_SCRIPT, REPOSITORY, entry_point, require_course_setup

entry = entry_point()
SYSTEMS = ("linux", "darwin", "win32")
PYENV = Path.home() / ".pyenv" / "versions"


def old_python(version: str) -> Path:
    """A real interpreter of that (too old) version, or a skip."""
    found = sorted(PYENV.glob(f"{version}.*/bin/python{version}"))
    if not found:
        pytest.skip(f"no Python {version} on this machine")
    return found[-1]


def bin_folder(folder: Path, **programs: Path) -> Path:
    """A folder holding only the named programs (links), to be a whole PATH."""
    folder.mkdir()
    for name, target in programs.items():
        (folder / name).symlink_to(target)
    return folder


def run_course(*arguments, python=None, env=None, timeout=120, **extra):
    command = ([str(python)] if python else []) + [str(COURSE_SCRIPT), *arguments]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env, **extra)


# --- the venv's layout ---


@pytest.mark.parametrize("system", SYSTEMS)
def test_a_venvs_programs_are_in_bin_or_in_scripts_on_windows(system, tmp_path):
    course = entry.Course(REPOSITORY, tmp_path / "venv", system=system)
    if system == "win32":
        assert course.python == tmp_path / "venv" / "Scripts" / "python.exe"
        assert course.executable("jupyter") == tmp_path / "venv" / "Scripts" / "jupyter.exe"
    else:
        assert course.python == tmp_path / "venv" / "bin" / "python"
        assert course.executable("jupyter") == tmp_path / "venv" / "bin" / "jupyter"
    assert course.stamp == tmp_path / "venv" / ".course-installed"


def test_the_venv_is_the_folders_own_unless_course_venv_names_another(tmp_path):
    assert entry.default_venv(REPOSITORY, {}) == REPOSITORY / ".venv"
    assert entry.default_venv(REPOSITORY, {"COURSE_VENV": str(tmp_path / "v")}) == tmp_path / "v"


# --- finding a Python ---


@pytest.mark.parametrize("system", SYSTEMS)
def test_the_pythons_tried_on_each_system(system):
    tried = entry.python_candidates(system, {"PYTHON": "/opt/python3.12/bin/python3"})
    assert tried[0] == ["/opt/python3.12/bin/python3"]  # PYTHON first
    assert tried[-1] == ["uv", "python", "find", ">=3.11"]  # a Python uv installed, last
    if system == "win32":  # the py launcher, which python.org's installer puts on PATH
        assert tried[1:-1] == [
            ["py", "-3.11"],
            ["py", "-3.12"],
            ["py", "-3.13"],
            ["py", "-3.14"],
            ["py", "-3"],
            ["python"],
        ]
    else:
        assert tried[1:-1] == [["python3.11"], ["python3.12"], ["python3.13"], ["python3.14"], ["python3"]]
    assert entry.python_candidates(system, {})[0] != ["/opt/python3.12/bin/python3"]


def test_the_first_suitable_python_is_taken_and_older_ones_are_named(tmp_path, monkeypatch):
    """Real interpreters: python3 is 3.9 (as on a Mac), python3.11 is this one; PYTHON names 3.9 too."""
    too_old = old_python("3.9")
    path = bin_folder(tmp_path / "bin", python3=too_old, **{"python3.11": Path(sys.executable)})
    monkeypatch.setenv("PATH", str(path))
    found, older = entry.find_python("linux", {"PYTHON": str(too_old)})
    assert found == (str(path / "python3.11"), ".".join(map(str, sys.version_info[:3])))
    [(command, version)] = older  # PYTHON, tried first
    assert command == str(too_old) and version.startswith("3.9.")


def test_no_suitable_python_found_names_what_was_found(tmp_path, monkeypatch):
    too_old = old_python("3.9")
    monkeypatch.setenv("PATH", str(bin_folder(tmp_path / "bin", python3=too_old)))
    found, older = entry.find_python("darwin", {})
    assert found is None
    [(command, version)] = older
    assert command == "python3" and version.startswith("3.9.")


@pytest.mark.parametrize("system", SYSTEMS)
def test_the_guidance_says_how_to_get_python_on_each_system(system):
    lines = entry.python_guidance([("python3", "3.9.6")], system)
    text = "\n".join(lines)
    assert len(lines) <= 5
    assert lines[0] == "Python 3.11 or newer is needed (here python3 is 3.9.6)."
    assert "uv python install 3.11" in text
    expected = {
        "darwin": ["https://www.python.org/downloads/macos/", "brew install python@3.11", "./course again"],
        "win32": ["https://www.python.org/downloads/windows/", "winget install Python.Python.3.11", "py course again"],
        "linux": ["sudo apt install python3.11 python3.11-venv", "sudo dnf install python3.11", "./course again"],
    }[system]
    for words in expected:
        assert words in text
    assert entry.python_guidance([], system)[0] == "Python 3.11 or newer is needed (none was found)."


def test_with_no_suitable_python_the_course_says_how_to_get_one_and_installs_nothing(tmp_path):
    """macOS's own python3 (3.9) alone on PATH, as a student's Mac has it: the entry point, run by
    it, finds nothing newer and prints the guidance; no venv is made."""
    too_old = old_python("3.9")
    path = bin_folder(tmp_path / "bin", python3=too_old)
    env = {"PATH": str(path), "HOME": str(tmp_path), "COURSE_VENV": str(tmp_path / "venv")}
    result = run_course("lab", python=path / "python3", env=env)
    assert result.returncode == 1
    lines = result.stderr.splitlines()
    assert lines[0].startswith("[course] Python 3.11 or newer is needed (here python3 is 3.9.")
    assert "[course] or with uv (https://docs.astral.sh/uv/): uv python install 3.11" in lines
    assert lines[-1] == "[course] then run ./course again (PYTHON=/path/to/python3.11 ./course names one)."
    assert "\033[" not in result.stderr  # not a terminal
    assert not (tmp_path / "venv").exists()


@pytest.mark.parametrize("version", ["3.6", "3.7", "3.9"])
def test_old_pythons_read_the_whole_entry_point_and_answer_help(version):
    result = run_course("--help", python=old_python(version))
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("The course's one entry point")


def test_the_entry_point_uses_no_syntax_newer_than_python_3_7():
    ast.parse(COURSE_SCRIPT.read_text(), feature_version=(3, 7))


def test_an_old_python_hands_the_command_to_the_venvs_python(tmp_path):
    """python3 is 3.9: ./course runs the same command with the venv's Python, which ./course set up."""
    require_course_setup()
    too_old = old_python("3.9")
    path = bin_folder(tmp_path / "bin", python3=too_old)
    env = os.environ | {"PATH": str(path)}
    result = run_course("setup", "student", python=path / "python3", env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "ready: ./course lab opens notebook 00\n"
    assert result.stderr == ""  # the set-up was current: nothing installed, nothing to say


# --- one set-up at a time ---


def test_a_second_set_up_waits_for_the_first_and_says_so(tmp_path):
    """Two processes: this one holds the lock (fcntl on Linux) as a set-up would; the other asks for
    it, says that it waits, and gets it as soon as this one lets go."""
    venv = tmp_path / "venv"
    waiter = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(REPOSITORY / "tests")!r})
        from course_setup import entry_point
        with entry_point().SetupLock({str(venv)!r}):
            print("got it", flush=True)
    """)
    with entry.SetupLock(venv, "linux"):
        process = subprocess.Popen([sys.executable, "-c", waiter], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert process.stderr.readline() == f"[course] another ./course is setting up {venv}: waiting for it\n".encode()
        with pytest.raises(subprocess.TimeoutExpired):
            process.wait(timeout=1)  # still waiting
    out, _ = process.communicate(timeout=60)
    assert out == b"got it\n"
    assert process.returncode == 0


class RecordingMsvcrt:
    """Windows' msvcrt as far as the lock uses it: locking(fd, mode, bytes). A stand-in (this machine
    has no msvcrt): it records the calls, and LK_NBLCK fails the first time, as when another set-up
    holds the lock; LK_LOCK fails once (its 10 s were up) before it succeeds."""

    LK_UNLCK, LK_LOCK, LK_NBLCK = 0, 1, 2

    def __init__(self):
        self.calls = []
        self.failures = {self.LK_NBLCK: 1, self.LK_LOCK: 1}

    def locking(self, fd, mode, nbytes):
        self.calls.append((mode, nbytes))
        if self.failures.get(mode):
            self.failures[mode] -= 1
            raise OSError(36, "Resource deadlock avoided")


def test_on_windows_the_lock_is_msvcrt_locking_on_the_lock_files_first_byte(tmp_path, monkeypatch, capsys):
    msvcrt = RecordingMsvcrt()
    monkeypatch.setitem(sys.modules, "msvcrt", msvcrt)
    with entry.SetupLock(tmp_path / "venv", "win32") as lock:
        assert lock.handle.tell() == 0
        held = list(msvcrt.calls)
    # tried once, said it waits, then waited through LK_LOCK's time-out until it had the lock
    assert held == [(msvcrt.LK_NBLCK, 1), (msvcrt.LK_LOCK, 1), (msvcrt.LK_LOCK, 1)]
    assert msvcrt.calls[-1] == (msvcrt.LK_UNLCK, 1)
    assert "waiting for it" in capsys.readouterr().err
    assert (tmp_path / "venv" / ".course-lock").is_file()


# --- handing over to the command ---


def hand_over_in_a_child(system: str) -> subprocess.CompletedProcess:
    code = textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {str(REPOSITORY / "tests")!r})
        from course_setup import entry_point
        print("entry", os.getpid(), flush=True)
        command = "import os; print('command', os.getpid()); raise SystemExit(3)"
        status = entry_point().hand_over([sys.executable, "-c", command], {system!r})
        print("back with", status, flush=True)
        raise SystemExit(status)
    """)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("system", ["linux", "darwin"])
def test_on_linux_and_macos_the_command_takes_the_entry_points_process(system):
    """exec: the same process id (signals and a kill of its process group reach the command), the
    command's exit status, and nothing of the entry point runs after it."""
    result = hand_over_in_a_child(system)
    lines = result.stdout.split()
    assert result.returncode == 3
    assert lines[:4] == ["entry", lines[1], "command", lines[1]]
    assert "back" not in result.stdout


def test_on_windows_the_command_runs_as_a_child_and_its_status_is_passed_on():
    """Windows' branch, run here: a child process, waited for; its exit status is the entry point's."""
    result = hand_over_in_a_child("win32")
    words = result.stdout.split()
    assert result.returncode == 3
    assert words[0] == "entry" and words[2] == "command" and words[1] != words[3]
    assert words[4:] == ["back", "with", "3"]


# --- what the user reads ---


@pytest.mark.parametrize("system", SYSTEMS)
def test_colours_only_on_a_terminal_never_with_no_color_nor_on_windows(system):
    import pty

    leader, follower = pty.openpty()
    with open(follower, "w") as terminal, open(os.devnull, "w") as not_a_terminal:
        on_posix = system != "win32"
        assert entry.uses_colour(terminal, {}, system) is on_posix
        assert entry.uses_colour(terminal, {"TERM": "xterm-256color"}, system) is on_posix
        assert entry.uses_colour(terminal, {"NO_COLOR": "1"}, system) is False
        assert entry.uses_colour(terminal, {"TERM": "dumb"}, system) is False
        assert entry.uses_colour(not_a_terminal, {}, system) is False
    os.close(leader)


@pytest.mark.parametrize("system", SYSTEMS)
def test_the_torch_step_says_which_build_and_its_size_on_each_system(system):
    step = entry.torch_step(REPOSITORY, system)
    assert step.startswith("installing torch==2.13.0 alone, ")
    assert "tools/torch_source.py says where from" in step
    expected = {
        "linux": "the CPU build (about 190 MB to download, 750 MB installed;",
        "darwin": "PyPI's wheel (about 111 MB to download;",
        "win32": "PyPI's wheel (about 122 MB to download;",
    }[system]
    assert expected in step


@pytest.mark.parametrize("system", SYSTEMS)
def test_commands_to_run_by_hand_are_quoted_for_the_systems_shell(system):
    words = ["C:/Program Files/Python311/python.exe" if system == "win32" else "/opt/my python/bin/python", "-m", "pip"]
    line = entry.as_command(words, system)
    assert line.startswith('"C:/Program Files/' if system == "win32" else "'/opt/my python/bin/python'")
    assert entry.course_command(system) == ("py course" if system == "win32" else "./course")


def test_help_answers_at_once_without_a_venv(tmp_path):
    """./course --help and an unknown command set nothing up (the command list comes from the script)."""
    env = os.environ | {"COURSE_VENV": str(tmp_path / "venv")}
    result = run_course("--help", env=env)
    assert result.returncode == 0
    assert "./course lab" in result.stdout and "py course COMMAND on Windows" in result.stdout
    unknown = run_course("labb", env=env)
    assert unknown.returncode == 2
    assert unknown.stderr.startswith("[course] unknown command 'labb'\nThe course's one entry point")
    assert not (tmp_path / "venv").exists()


@pytest.mark.parametrize("command", ["grade", "test", "worker", "bench"])
def test_elsewhere_than_linux_the_grading_and_test_commands_say_in_one_line_that_they_need_linux(command, tmp_path):
    """The script run as on a Mac (sys.platform set to darwin before it is read)."""
    code = f"import runpy, sys; sys.platform = 'darwin'; sys.argv = ['course', {command!r}, 'x']; "
    code += f"runpy.run_path({str(COURSE_SCRIPT)!r}, run_name='__main__')"
    env = os.environ | {"COURSE_VENV": str(tmp_path / "venv")}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 2
    [line] = result.stderr.splitlines()
    assert line.startswith(f"[course] ./course {command} runs on Linux only (")
    assert line.endswith("); here: ./course lab")
    assert not (tmp_path / "venv").exists()


def test_grade_help_is_answered_before_the_grading_engine_is_imported():
    """./course grade --help parses its arguments first: nbgrader, Dask and torch stay unimported."""
    code = (
        "import sys\nimport autograder.grade as grade\ntry:\n    grade.main(['--help'])\nexcept SystemExit:\n    pass\n"
        "heavy = ('nbgrader', 'distributed', 'dask', 'torch', 'nbconvert')\n"
        "print(sorted(name for name in heavy if name in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "--cell-timeout" in result.stdout
    assert result.stdout.splitlines()[-1] == "[]"


# --- under Python's development mode, warnings as errors ---


@pytest.mark.parametrize(
    "arguments, status, output",
    [
        (["--help"], 0, "The course's one entry point"),
        (["setup", "student"], 0, "ready: ./course lab opens notebook 00"),
        (["setup", "everything"], 2, ""),
        (["nothing"], 2, ""),
    ],
)
def test_the_entry_point_runs_under_development_mode_with_warnings_as_errors(arguments, status, output):
    """Unclosed files, pipes and processes, deprecated calls: each would be an error here. (The whole
    set-up runs so in tests/test_student_setup.py.)"""
    require_course_setup()
    command = [sys.executable, "-X", "dev", "-W", "error", str(COURSE_SCRIPT), *arguments]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert (result.returncode, result.stdout[: len(output)]) == (status, output), result.stderr
    assert "Warning" not in result.stderr and "Traceback" not in result.stderr


# --- a step that fails ---


def test_a_failing_step_names_itself_its_reason_and_the_command_to_run_by_hand(tmp_path):
    """pip's only index a closed port on 127.0.0.1 (no configuration, no wheel folder): the lock's step
    fails at once, and the set-up says which step, why, and what to run by hand; nothing is stamped."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again when the block ends: nothing listens there
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PIP_", "UV_"))}
    env |= {
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_INDEX_URL": f"http://127.0.0.1:{port}/simple",
        "PIP_RETRIES": "0",
        "COURSE_INSTALLER": "pip",
        "COURSE_VENV": str(tmp_path / "venv"),
        "PYTHON": str(Path(sys.base_prefix) / "bin" / f"python{sys.version_info[0]}.{sys.version_info[1]}"),
    }
    result = run_course("setup", "student", env=env, timeout=600)
    assert result.returncode == 1
    lines = result.stderr.splitlines()
    assert lines[-2] == (
        "[course] set-up stopped at step 1/3: pip could not install the student set (its messages are above)"
    )
    python = tmp_path / "venv" / "bin" / "python"
    lock = REPOSITORY / "requirements" / "student.txt"
    assert lines[-1] == (
        f"[course] to run it by hand: {python} -m pip install --disable-pip-version-check --require-hashes -r {lock}"
    )
    assert "ERROR: No matching distribution found for " in result.stderr  # pip's own message, above
    assert result.stdout == ""  # no ready line
    assert python.is_file() and not (tmp_path / "venv" / ".course-installed").exists()


def test_the_quick_loop_keeps_the_unit_tests_and_one_notebooks_grading():
    """./course test --quick: what pytest collects with it, and its list of slow files names real files."""
    from conftest import QUICK_GRADING, SLOW_FILES

    assert all((REPOSITORY / "tests" / f"{stem}.py").is_file() for stem in SLOW_FILES | {QUICK_GRADING})
    files = ["tests/test_licence.py", "tests/test_grading_01_attention.py", "tests/test_grading_02_causal_masking.py"]
    files += ["tests/test_browser_rope.py", "tests/test_notebooks.py"]
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "--quick", "--collect-only", "-q", "-p", "no:cacheprovider", *files],
        cwd=REPOSITORY, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    kept = {line.split("::")[0] for line in result.stdout.splitlines() if "::" in line}
    assert kept == {"tests/test_licence.py", "tests/test_grading_01_attention.py"}
    assert re.search(r"\d+/\d+ tests collected \(\d+ deselected\)", result.stdout)
