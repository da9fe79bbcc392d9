"""The site's JupyterHub guide (docs/jupyterhub.md), run as written, with an instructor and two students as
separate Unix users.

The guide is read here: its shell blocks, each headed by its role (``# admin``,
``# instructor``, ``# student``), run in order with ``bash -e``, as root for the admin and
through ``runuser`` as each user otherwise, in their homes (mode 0700, as ``useradd`` makes them
on Debian), with only the environment's ``bin/`` and the system's on their PATH. What the test
changes, each a literal substitution that must be in the guide: the exchange
(``/srv/nbgrader/exchange``) and the system-wide configuration (``/etc/jupyter``, here each
environment's own ``etc/jupyter``) live in a temporary folder, and the clone's URL is a local
repository made from this checkout's course files. Between fetch and submit each student
"answers in JupyterLab" (alice right, bob with a wrong ``dot_scores``: the notebook written
here).

The environments are the guide's two (tests/installed_course.py): the students' holds the course
wheel alone, the instructor's the grader wheel too; both take their other dependencies from this
checkout's venv (the locks' versions). The install lines themselves are resolved by pip with a
dry run against the locks, with a local folder standing in for PyTorch's CPU index.

Needs root (``useradd``, ``runuser``) and a sandbox the instructor can start. The environments are
made by this Python (the version CI runs; Debian's 3.11.2 is too old for the lock's soupsieve):
where it lives in a folder other users cannot pass through (pyenv's in root's home, here), the
test lets them pass (search permission only) while it runs, and puts the folder's mode back.
"""

from __future__ import annotations

import html
import json
import os
import pwd
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import nbformat
import pytest
from grading_harness import answer_cells, grade_cells, reference_answers, sandbox_works
from installed_course import COURSE, GRADER, REPOSITORY, SOURCES, build_wheels, environment

ASSIGNMENT = "00_start_here"
COURSE_ID = "attention-transformers"
USERS = {"instructor": "hub-teacher", "alice": "hub-alice", "bob": "hub-bob"}
WRONG = textwrap.dedent("""
    def dot_scores(q, k):
        return torch.zeros(*q.shape[:-1], k.shape[-2])
    """)
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
EXCHANGE, SYSTEM_CONFIG = "/srv/nbgrader/exchange", "/etc/jupyter"
CLONE_URL = "https://github.com/attention-transformers/course.git"


def hub_section() -> str:
    """The guide: its page on the site."""
    return (REPOSITORY / "docs" / "jupyterhub.md").read_text()


def blocks() -> list[tuple[str, str]]:
    """(role, shell text) of the hub section's shell blocks, in order."""
    found = []
    for block in re.findall(r"```bash\n(.*?)```", hub_section(), flags=re.DOTALL):
        first = block.splitlines()[0]
        role = "install" if "pip install" in block else re.match(r"# (\w+)", first).group(1)
        found.append((role, block))
    return found


def test_the_guide_reads_as_the_cycle():
    roles = [role for role, _ in blocks()]
    assert roles == ["install", "admin", "instructor", "instructor", "student", "student", "instructor", "student"]
    for text in (EXCHANGE, SYSTEM_CONFIG, CLONE_URL, CPU_INDEX):
        assert text in hub_section(), f"the hub guide no longer says {text} (the test replaces it)"


# ---------------------------------------------------------------- the install lines, resolved


def local_cpu_torch() -> Path | None:
    """A local copy of PyTorch's CPU wheel of the pinned version, from pip's configured wheel folders."""
    from test_environment import pins

    configured = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
    folders = os.environ.get("PIP_FIND_LINKS", "").split() + re.findall(r"find-links='([^']*)'", configured)
    for folder in folders:
        for wheel in Path(folder).glob(f"torch-{pins('student')['torch']}+cpu-*.whl") if Path(folder).is_dir() else ():
            return wheel
    return None


@pytest.mark.parametrize("image", ["students", "instructor"])
def test_the_install_lines_take_pytorchs_cpu_build_and_the_locks_versions(image, tmp_path):
    """Each of the guide's two pip lines, as written, with PyTorch's CPU index replaced by a local
    folder holding the same wheel (the pinned +cpu build) and the lock as constraints, resolved by pip
    (a dry run, no configuration files, so only PyPI and that folder are asked): torch is the CPU
    build, no NVIDIA library comes, the course's distributions come from the clone, and every other
    package at the lock's version."""
    from test_environment import course_version, locked_versions, pins
    from test_grader_package import lock_as_constraints

    wheel = local_cpu_torch()
    if wheel is None:
        pytest.skip("no local copy of PyTorch's CPU wheel to stand in for its index")
    lines = [line for line in blocks()[0][1].splitlines() if line.startswith("pip install")]
    line = lines[0] if image == "students" else lines[1]
    words = shlex.split(line)
    assert words[:5] == ["pip", "install", "--extra-index-url", CPU_INDEX, f"torch=={pins('student')['torch']}+cpu"]
    assert words[5:] == (["."] if image == "students" else [".", "./autograder"])
    index = tmp_path / "simple" / "torch"
    index.mkdir(parents=True)
    os.symlink(wheel, index / wheel.name)
    (index / "index.html").write_text(f'<a href="{wheel.name}">{wheel.name}</a>\n')
    clone = tmp_path / "clone"  # the clone's course files (pip builds them in place)
    clone.mkdir()
    for name in SOURCES:
        if (REPOSITORY / name).is_dir():
            shutil.copytree(REPOSITORY / name, clone / name, ignore=shutil.ignore_patterns("__pycache__", "build"))
        else:
            shutil.copy2(REPOSITORY / name, clone)
    set_name = "student" if image == "students" else "grader"
    constraints = lock_as_constraints(set_name, tmp_path / "constraints.txt")
    report = tmp_path / "report.json"
    stand_in = [word.replace(CPU_INDEX, (tmp_path / "simple").as_uri()) for word in words[2:]]
    # no configuration file, no other wheel folder or index: PyPI and the stand-in only
    unset = ("PIP_FIND_LINKS", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_CONSTRAINT", "PIP_NO_INDEX")
    env = {key: value for key, value in os.environ.items() if key not in unset}
    result = subprocess.run(
        [sys.executable, "-m", "pip", "install", *stand_in, "--dry-run", "--ignore-installed", "--no-build-isolation",
         "--report", str(report), "-c", str(constraints), "--quiet"],
        cwd=clone, capture_output=True, text=True, timeout=1200, env=env | {"PIP_CONFIG_FILE": os.devnull},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    resolved = {
        item["metadata"]["name"].lower().replace("_", "-"): item["metadata"]["version"]
        for item in json.loads(report.read_text())["install"]
    }
    assert resolved.pop("torch") == f"{pins('student')['torch']}+cpu"
    assert resolved.pop(COURSE) == course_version()
    if image == "instructor":
        assert resolved.pop(GRADER) == course_version()
    assert not [name for name in resolved if re.match(r"nvidia-|cuda-|triton$", name)]
    assert resolved == {name.replace("_", "-"): version for name, version in locked_versions(set_name).items()}


# ---------------------------------------------------------------- the cycle, as separate users


def as_user(user: str, script: str, env_bin: Path, cwd: Path | None = None, check: bool = True):
    """``script`` in bash -e as ``user`` (root: as is), in their home, with only ``env_bin`` and the system on PATH."""
    home = Path(pwd.getpwnam(user).pw_dir)
    environment = [f"PATH={env_bin}:/usr/local/bin:/usr/bin:/bin", f"HOME={home}", f"USER={user}", f"LOGNAME={user}",
                   "LANG=C.UTF-8"]  # fmt: skip
    prefix = [] if user == "root" else ["runuser", "-u", user, "--"]
    result = subprocess.run(
        [*prefix, "env", "-i", *environment, "bash", "-e", "-o", "pipefail", "-c", script],
        cwd=cwd or home, capture_output=True, text=True, timeout=1500,
    )  # fmt: skip
    if check:
        assert result.returncode == 0, f"as {user}:\n{script}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


def add_user(name: str, homes: Path) -> Path:
    if subprocess.run(["id", "-u", name], capture_output=True).returncode == 0:
        subprocess.run(["userdel", name], check=True)  # left by a killed run
    home = homes / name
    subprocess.run(["useradd", "--no-create-home", "--home-dir", str(home), "--shell", "/bin/bash", name], check=True)
    home.mkdir(mode=0o700)
    shutil.chown(home, name, name)
    home.chmod(0o700)
    return home


def local_origin(folder: Path, owner: str) -> Path:
    """A git repository of this checkout's course files: what the guide's clone gets."""
    folder.mkdir()
    shutil.copy2(REPOSITORY / "nbgrader_config.py", folder)
    for name in ("solutions", "notebooks"):
        shutil.copytree(REPOSITORY / name, folder / name, ignore=shutil.ignore_patterns(".*", "*.pt", "__pycache__"))
    git = ("git", "-C", str(folder), "-c", "user.name=course", "-c", "user.email=course@localhost")
    for command in (("init", "--quiet"), ("add", "."), ("commit", "--quiet", "-m", "the course")):
        subprocess.run([*git, *command], check=True, capture_output=True)
    subprocess.run(["chown", "-R", f"{owner}:{owner}", str(folder)], check=True)
    return folder


@pytest.fixture(scope="module")
def hub():
    if os.geteuid() != 0 or not shutil.which("useradd"):
        pytest.skip("needs root, to add Unix users")
    base = Path(tempfile.mkdtemp(prefix="hub-", dir="/tmp"))
    base.chmod(0o755)
    python = Path(os.path.realpath(sys.executable))
    modes = traversable(python.parent)
    try:
        yield from _hub(base, str(python))
    finally:
        for folder, mode in modes.items():
            folder.chmod(mode)
        for name in USERS.values():
            subprocess.run(["userdel", name], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)


def traversable(path: Path) -> dict[Path, int]:
    """Let every user pass through the folders above ``path`` (this Python may live in root's home,
    as pyenv's does here: 0700); returns {folder: its mode before}, for putting back."""
    changed = {}
    for folder in reversed(path.parents):
        mode = folder.stat().st_mode & 0o7777
        if not mode & 0o001:
            changed[folder] = mode
            folder.chmod(mode | 0o001)  # search only: nothing in it becomes readable
    return changed


def _hub(base: Path, python: str):
    (base / "home").mkdir(mode=0o755)
    homes = {role: add_user(name, base / "home") for role, name in USERS.items()}
    (base / "dist").mkdir()
    wheels = build_wheels(base / "dist")
    envs = {"students": base / "opt" / "students", "instructor": base / "opt" / "grading"}
    (base / "opt").mkdir()
    environment(envs["students"], [wheels[COURSE]], python)
    environment(envs["instructor"], [wheels[COURSE], wheels[GRADER]], python)
    for env in envs.values():  # the dependencies (this checkout's venv) must be readable by the users
        probe = as_user(USERS["alice"], "python -c 'import torch, nbgrader'", env / "bin", check=False)
        if probe.returncode != 0:
            pytest.skip(f"this checkout's venv cannot be read by another user here: {probe.stderr[-300:]}")
    if not sandbox_works():
        pytest.skip("bubblewrap cannot start a sandbox here")

    exchange = base / "srv" / "nbgrader" / "exchange"
    origin = local_origin(base / "origin", USERS["instructor"])
    steps = iter(blocks()[1:])
    log = []

    def step(role: str, user_role: str | None = None, env: str = "students", cwd: Path | None = None, **extra):
        kind, script = next(steps)
        assert kind == role, (kind, role)
        for old, new in {EXCHANGE: str(exchange), CLONE_URL: str(origin), **extra}.items():
            script = script.replace(old, new)
        user = "root" if user_role is None else USERS[user_role]
        result = as_user(user, script, envs[env] / "bin", cwd=cwd)
        log.append(f"$ ({user}) {script.strip()}\n{result.stdout}{result.stderr}")
        return result

    # the admin: the exchange, and the configuration of every environment (here: each environment's own)
    kind, admin_script = next(steps)
    assert kind == "admin"
    for env in envs.values():
        script = admin_script.replace(EXCHANGE, str(exchange)).replace(SYSTEM_CONFIG, str(env / "etc" / "jupyter"))
        as_user("root", script, env / "bin")
    log.append(f"$ (root) {admin_script.strip()}")
    step("instructor", "instructor", env="instructor")  # git clone ... ~/course
    step("instructor", "instructor", env="instructor")  # generate_assignment, release_assignment
    answers = {"alice": reference_answers(ASSIGNMENT), "bob": {**reference_answers(ASSIGNMENT), "dot_scores": WRONG}}
    fetch = next(steps)
    submit = next(steps)
    for student in ("alice", "bob"):
        result = as_user(USERS[student], fetch[1], envs["students"] / "bin")
        log.append(f"$ ({USERS[student]}) {fetch[1].strip()}\n{result.stdout}{result.stderr}")
        path = homes[student] / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"
        notebook = nbformat.read(path, as_version=4)  # what the student does in JupyterLab
        for grade_id, cell in answer_cells(notebook).items():
            cell.source = answers[student][grade_id]
        nbformat.write(notebook, path)
        shutil.chown(path, USERS[student], USERS[student])
    for student in ("alice", "bob"):
        result = as_user(USERS[student], submit[1], envs["students"] / "bin")
        log.append(f"$ ({USERS[student]}) {submit[1].strip()}\n{result.stdout}{result.stderr}")
    graded = step("instructor", "instructor", env="instructor")  # collect, course-grade, release_feedback
    kind, feedback = next(steps)
    for student in ("alice", "bob"):
        result = as_user(USERS[student], feedback, envs["students"] / "bin")
        log.append(f"$ ({USERS[student]}) {feedback.strip()}\n{result.stdout}{result.stderr}")
    print("\n".join(log))
    yield {"base": base, "envs": envs, "homes": homes, "exchange": exchange, "graded": graded}


def gradebook_scores(course: Path, student: str) -> dict:
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{course / 'coursework' / 'gradebook.db'}") as gradebook:
        submission = gradebook.find_submission(ASSIGNMENT, student)
        return {grade.name: grade.score for notebook in submission.notebooks for grade in notebook.grades}


def fetched_feedback(home: Path) -> str:
    [page] = (home / ASSIGNMENT / "feedback").glob(f"*/{ASSIGNMENT}.html")
    return html.unescape(re.sub(r"<[^>]+>", "", page.read_text(encoding="utf-8")))


def released() -> dict:
    return grade_cells(nbformat.read(REPOSITORY / "notebooks" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb", as_version=4))


def test_collect_files_each_students_submission_in_the_instructors_course(hub):
    course = hub["homes"]["instructor"] / "course"
    for role in ("alice", "bob"):
        folder = course / "coursework" / "submitted" / USERS[role] / ASSIGNMENT
        assert (folder / f"{ASSIGNMENT}.ipynb").is_file()
        assert (folder / "timestamp.txt").is_file()  # the exchange's submission time
        assert folder.stat().st_uid == pwd.getpwnam(USERS["instructor"]).pw_uid


def test_the_installed_course_grade_grades_what_the_exchange_collected(hub):
    course = hub["homes"]["instructor"] / "course"
    assert "graded" in hub["graded"].stdout + hub["graded"].stderr
    full = released()
    assert gradebook_scores(course, USERS["alice"]) == full
    assert gradebook_scores(course, USERS["bob"]) == {**full, "test_dot_scores": 0.0}


def test_each_student_fetches_their_own_feedback(hub):
    alice, bob = fetched_feedback(hub["homes"]["alice"]), fetched_feedback(hub["homes"]["bob"])
    points = released()["test_dot_scores"]
    assert re.search(rf"Score:\s*{points}(\.0)?\s*/\s*{points}", alice), alice[:2000]
    assert re.search(rf"Score:\s*0(\.0)?\s*/\s*{points}", bob), bob[:2000]
    assert "BEGIN HIDDEN TESTS" not in alice + bob


def test_a_student_cannot_reach_another_students_work_or_the_gradebook(hub):
    course_exchange = hub["exchange"] / COURSE_ID
    bob_home, teacher_home = hub["homes"]["bob"], hub["homes"]["instructor"]
    [bob_submission] = (course_exchange / "inbound").glob(f"{USERS['bob']}+{ASSIGNMENT}+*")
    denied = {
        "list the exchange's inbound": f"ls {course_exchange / 'inbound'}",
        "list the exchange's feedback": f"ls {course_exchange / 'feedback'}",
        "read bob's notebook in his home": f"cat {bob_home / ASSIGNMENT / f'{ASSIGNMENT}.ipynb'}",
        "list bob's home": f"ls {bob_home}",
        "read the gradebook": f"cat {teacher_home / 'course' / 'coursework' / 'gradebook.db'}",
        "list the collected submissions": f"ls {teacher_home / 'course' / 'coursework' / 'submitted'}",
    }
    for what, command in denied.items():
        result = as_user(USERS["alice"], command, hub["envs"]["students"] / "bin", check=False)
        assert result.returncode != 0 and "Permission denied" in result.stderr, f"alice could {what}"
    # nbgrader's design: a submission's file name (student, time, a random part) is its only guard
    by_name = f"cat '{bob_submission / f'{ASSIGNMENT}.ipynb'}' > /dev/null"
    assert as_user(USERS["alice"], by_name, hub["envs"]["students"] / "bin", check=False).returncode == 0


def test_the_students_environment_holds_the_course_package_and_no_grader(hub):
    code = "import course_checks, course_widgets, importlib.util as u; print(u.find_spec('autograder'))"
    result = as_user(USERS["alice"], f'python -c "{code}"', hub["envs"]["students"] / "bin")
    assert result.stdout.strip() == "None"


def test_nbgrader_generate_feedback_after_manual_grading_rebuilds_the_pages(hub):
    """After a look in formgrader, nbgrader's own generate_feedback remakes the pages from what
    course-grade wrote (autograded/ and the gradebook), still without hidden tests."""
    course = hub["homes"]["instructor"] / "course"
    page = course / "coursework" / "feedback" / USERS["bob"] / ASSIGNMENT / f"{ASSIGNMENT}.html"
    page.unlink()
    as_user(USERS["instructor"], f"cd ~/course && nbgrader generate_feedback {ASSIGNMENT} --force",
            hub["envs"]["instructor"] / "bin")  # fmt: skip
    text = html.unescape(re.sub(r"<[^>]+>", "", page.read_text(encoding="utf-8")))
    assert "BEGIN HIDDEN TESTS" not in text and "dot_scores" in text
