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

Then grade on submit (docs/feedback-on-submit.md): the page's watcher runs as the instructor while
the students submit and poll with ``nbgrader fetch_feedback`` as themselves until their page comes
(the diagnosis, a fixed resubmission, a broken notebook, the watcher killed while grading and
started again, a second watcher refused, the due date passing), printing the submit-to-feedback
times; and a real JupyterHub (PyPI's, with npm's configurable-http-proxy, installed into this
checkout's venv on first use) runs the page's service snippet, starting the watcher as the instructor.

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
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
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


# ---------------------------------------------------------------- grade on submit (docs/feedback-on-submit.md)

WATCH_PAGE = REPOSITORY / "docs" / "feedback-on-submit.md"
SWAPPED = "def dot_scores(q, k):\n    return k @ q.transpose(-2, -1)\n"  # a mistake the catalogue names
DIAGNOSIS = "CheckFailed: `dot_scores`: the table is transposed: keys against queries."


def page_blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", WATCH_PAGE.read_text(), flags=re.DOTALL)


def watcher_block() -> str:
    [block] = [b for b in page_blocks("bash") if b.startswith("# instructor: in the course folder")]
    return block


def spawn_as_user(user: str, script: str, env_bin: Path, log: Path) -> subprocess.Popen:
    """``script`` in bash as ``user`` in the background, in a process group of its own (so that a
    kill reaches the watcher and every process it started), its output into ``log``."""
    home = Path(pwd.getpwnam(user).pw_dir)
    environment = [f"PATH={env_bin}:/usr/local/bin:/usr/bin:/bin", f"HOME={home}", f"USER={user}", f"LOGNAME={user}",
                   "LANG=C.UTF-8"]  # fmt: skip
    with open(log, "ab") as sink:
        return subprocess.Popen(
            ["runuser", "-u", user, "--", "env", "-i", *environment, "bash", "-e", "-c", script],
            cwd=home, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip


def kill_group(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait(timeout=60)


class Student:
    """A student of the hub: answers in their copy of the notebook, submits and fetches feedback as
    themselves, through nbgrader's commands."""

    def __init__(self, hub, role: str):
        self.hub, self.role, self.user = hub, role, USERS[role]
        self.home = hub["homes"][role]
        self.bin = hub["envs"]["students"] / "bin"

    def submit(self, answers: dict | None = None, text: str | None = None) -> float:
        """Write the notebook (reference answers with ``answers``, or ``text`` as it is), submit it;
        the time the submission is in the exchange."""
        path = self.home / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"
        if text is None:
            notebook = nbformat.read(REPOSITORY / "notebooks" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb", as_version=4)
            chosen = {**reference_answers(ASSIGNMENT), **(answers or {})}
            for grade_id, cell in answer_cells(notebook).items():
                cell.source = chosen[grade_id]
            nbformat.write(notebook, path)
        else:
            path.write_text(text)
        shutil.chown(path, self.user, self.user)
        as_user(self.user, f"nbgrader submit {ASSIGNMENT}", self.bin)
        return time.monotonic()

    def pages(self) -> dict:
        return {p.parent.name: p for p in (self.home / ASSIGNMENT / "feedback").glob(f"*/{ASSIGNMENT}.html")}

    def wait_for_page(self, before: dict, submitted: float, timeout: float = 180) -> tuple[str, float]:
        """``nbgrader fetch_feedback`` as the student until a page for a submission not in ``before``
        arrives; (its text, seconds from ``submitted``)."""
        return self._wait(lambda pages: [p for stamp, p in pages.items() if stamp not in before], submitted, timeout)

    def wait_for_new_version(self, before: dict, since: float, timeout: float = 180) -> tuple[str, float]:
        """The same, until the page of the latest submission differs from its version in ``before``."""

        def changed(pages):
            latest = max(pages)
            return [pages[latest]] if pages[latest].read_text(encoding="utf-8") != before.get(latest) else []

        return self._wait(changed, since, timeout)

    def _wait(self, new_pages, since: float, timeout: float) -> tuple[str, float]:
        while time.monotonic() - since < timeout:
            as_user(self.user, f"nbgrader fetch_feedback {ASSIGNMENT}", self.bin, check=False)
            found = new_pages(self.pages())
            if found:
                text = found[0].read_text(encoding="utf-8")
                return html.unescape(re.sub(r"<[^>]+>", "", text)), time.monotonic() - since
            time.sleep(1)
        raise AssertionError(f"no new feedback for {self.user} within {timeout} s")

    def texts(self) -> dict:
        return {stamp: page.read_text(encoding="utf-8") for stamp, page in self.pages().items()}


def watcher_script(*extra: str) -> str:
    return watcher_block().replace("course-grade --watch", " ".join(["course-grade --watch", *extra]))


@pytest.fixture(scope="module")
def watched(hub):
    """The guide's watcher, started as the instructor, through a class's submissions (see the tests)."""
    base, instructor = hub["base"], USERS["instructor"]
    log = base / "watcher.log"
    grading_bin = hub["envs"]["instructor"] / "bin"
    course = hub["homes"]["instructor"] / "course"
    alice, bob = Student(hub, "alice"), Student(hub, "bob")
    # the instructor gives the assignment a due date far ahead: the default setting hands back the diagnosis
    set_due_date(hub, "2099-01-01 00:00:00 UTC")
    watcher = spawn_as_user(instructor, watcher_script(), grading_bin, log)
    found: dict = {"times": [], "course": course, "log": log}
    try:
        # alice submits a notebook with a mistake the catalogue names
        before = alice.texts()
        text, seconds = alice.wait_for_page(before, alice.submit({"dot_scores": SWAPPED}))
        found["times"].append(seconds)
        found["alice diagnosis"] = text
        # a second watcher refuses, naming the first
        found["second"] = as_user(instructor, watcher_script(), grading_bin, check=False)
        # bob resubmits a fixed notebook
        before = bob.texts()
        found["bob first"] = fetched_feedback(bob.home)
        text, seconds = bob.wait_for_page(before, bob.submit())
        found["times"].append(seconds)
        found["bob fixed"] = text
        # a broken notebook gets its page
        before = alice.texts()
        text, seconds = alice.wait_for_page(before, alice.submit(text='{"cells": [ this is not JSON'))
        found["times"].append(seconds)
        found["alice broken"] = text
        # the watcher is killed while it grades bob's next submission, then started again
        before = bob.texts()
        submitted = bob.submit({"dot_scores": SWAPPED})
        found["bob submitted"] = time.time()
        stamp = course / "coursework" / "submitted" / USERS["bob"] / ASSIGNMENT / "timestamp.txt"
        old = stamp.read_text()
        while stamp.read_text() == old and time.monotonic() - submitted < 120:
            time.sleep(0.2)
        time.sleep(1.0)  # collected: now grading
        kill_group(watcher)
        found["graded when killed"] = ledger_graded_at(course, USERS["bob"])
        watcher = spawn_as_user(instructor, watcher_script(), grading_bin, log)
        text, _ = bob.wait_for_page(before, submitted)
        found["bob after restart"] = text
        # the due date passes: every student gets the full page, with points, at the next pass
        before = bob.texts()
        set_due_date(hub, "2000-01-01 00:00:00 UTC")
        found["bob after due"], _ = bob.wait_for_new_version(before, time.monotonic())
    finally:
        kill_group(watcher)
        print(log.read_text(errors="replace")[-6000:])
    times = sorted(found["times"])
    print(f"submit to feedback (s), as the students saw it: {', '.join(f'{t:.1f}' for t in found['times'])}; "
          f"median {statistics.median(times):.1f} s (load {os.getloadavg()[0]:.1f})")  # fmt: skip
    yield found


def set_due_date(hub, when: str) -> None:
    """nbgrader's own command, as the instructor: the assignment's due date in the gradebook."""
    command = f'cd ~/course && nbgrader db assignment add {ASSIGNMENT} --duedate="{when}"'
    as_user(USERS["instructor"], command, hub["envs"]["instructor"] / "bin")


def ledger_graded_at(course: Path, student: str) -> float | None:
    import sqlite3

    db = sqlite3.connect(course / "coursework" / ".work" / "grading.sqlite")
    try:
        row = db.execute("SELECT graded_at FROM graded WHERE student = ?", (student,)).fetchone()
        return row[0] if row else None
    finally:
        db.close()


def test_a_submission_gets_its_diagnosis_without_points_within_a_minute(watched):
    assert DIAGNOSIS in watched["alice diagnosis"], watched["alice diagnosis"][-3000:]
    assert "Score:" not in watched["alice diagnosis"]
    assert "points after the due date, 2099-01-01 00:00 UTC" in watched["alice diagnosis"]
    assert "BEGIN HIDDEN TESTS" not in watched["alice diagnosis"]
    assert statistics.median(watched["times"]) < 60


def test_a_fixed_resubmission_gets_a_new_page_and_replaces_the_grade(watched):
    assert "CheckFailed" not in watched["bob fixed"] and "dot_scores: the visible checks pass." in watched["bob fixed"]
    assert re.search(r"Score:\s*0(\.0)?\s*/\s*2", watched["bob first"])  # his graded first submission
    assert "Score:" not in watched["bob fixed"]  # the diagnosis: no points before the due date


def test_a_broken_notebook_gets_its_page(watched):
    assert "This submission could not be graded" in watched["alice broken"], watched["alice broken"][-2000:]


def test_a_second_watcher_refuses_naming_the_first(watched):
    result = watched["second"]
    assert result.returncode == 2
    assert "another watcher is working on this course (process" in result.stderr


def test_a_watcher_killed_while_grading_loses_nothing(watched):
    assert watched["graded when killed"] < watched["bob submitted"]  # killed before his submission was committed
    assert DIAGNOSIS in watched["bob after restart"]


def test_after_the_due_date_everyone_gets_the_full_page_with_points(watched):
    points = released()["test_dot_scores"]
    assert re.search(rf"Score:\s*0(\.0)?\s*/\s*{points}", watched["bob after due"]), watched["bob after due"][:2000]
    assert DIAGNOSIS in watched["bob after due"]


# ---------------------------------------------------------------- a real JupyterHub, the watcher its managed service

PROXY_VERSION = "5.3.0"  # configurable-http-proxy, from npm


def configurable_http_proxy() -> Path:
    """npm's configurable-http-proxy, installed once into this checkout's venv (``node/``)."""
    folder = Path(sys.prefix) / "node"
    command = folder / "node_modules" / ".bin" / "configurable-http-proxy"
    if command.exists():
        return command
    if not shutil.which("npm"):
        pytest.skip("no npm here to install configurable-http-proxy (JupyterHub's proxy)")
    package = f"configurable-http-proxy@{PROXY_VERSION}"
    result = subprocess.run(
        ["npm", "install", "--prefix", str(folder), "--no-audit", "--no-fund", package],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    if result.returncode != 0:
        pytest.skip(f"npm could not install configurable-http-proxy: {result.stderr[-500:]}")
    return command


def free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def service_snippet(hub) -> str:
    """The guide's service configuration, with this test's paths and instructor."""
    [snippet] = [block for block in page_blocks("python") if "c.JupyterHub.services" in block]
    for old in ("/opt/grading/bin/course-grade", "/home/teacher/course", '"teacher"'):
        assert old in snippet, f"the guide's service snippet no longer says {old} (the test replaces it)"
    return (
        snippet.replace("/opt/grading/bin/course-grade", str(hub["envs"]["instructor"] / "bin" / "course-grade"))
        .replace("/home/teacher/course", str(hub["homes"]["instructor"] / "course"))
        .replace('"teacher"', f'"{USERS["instructor"]}"')
    )


def test_a_real_jupyterhub_starts_the_watcher_as_the_instructor_and_it_hands_back_feedback(hub):
    """JupyterHub (PyPI) with configurable-http-proxy (npm), bound to 127.0.0.1, its configuration the
    guide's service snippet: the hub starts the watcher as the instructor's Unix user, and a
    submission that arrives in the exchange comes back to the student as feedback."""
    proxy = configurable_http_proxy()
    run_dir = hub["base"] / "jupyterhub"
    run_dir.mkdir()
    ports = [free_port() for _ in range(3)]
    (run_dir / "jupyterhub_config.py").write_text(
        "c = get_config()  # noqa\n"
        + service_snippet(hub)
        + textwrap.dedent(f"""
            # the test's own: everything on 127.0.0.1, the hub's files in this folder
            c.JupyterHub.bind_url = "http://127.0.0.1:{ports[0]}"
            c.JupyterHub.hub_bind_url = "http://127.0.0.1:{ports[1]}"
            c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{ports[2]}"
            c.ConfigurableHTTPProxy.command = [{str(proxy)!r}]
            c.JupyterHub.db_url = "sqlite:///{run_dir / "jupyterhub.sqlite"}"
            c.JupyterHub.cookie_secret_file = {str(run_dir / "cookie_secret")!r}
            """)
    )
    log = run_dir / "hub.log"
    with open(log, "wb") as sink:
        jupyterhub = subprocess.Popen(
            [str(Path(sys.executable).parent / "jupyterhub"), "-f", str(run_dir / "jupyterhub_config.py")],
            cwd=run_dir, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    course = hub["homes"]["instructor"] / "course"
    lock = course / "coursework" / ".work" / "watch.lock"
    try:
        watcher = None  # the process holding the course's watcher lock (it writes its pid there)
        deadline = time.monotonic() + 180
        while watcher is None and time.monotonic() < deadline:
            assert jupyterhub.poll() is None, log.read_text(errors="replace")[-4000:]
            try:
                holder = json.loads(lock.read_text()) if lock.is_file() else {}
            except ValueError:  # being rewritten
                holder = {}
            process = Path(f"/proc/{holder.get('pid', 0)}")
            if holder and process.is_dir() and b"--watch" in (process / "cmdline").read_bytes():
                watcher = process
            time.sleep(0.5)
        assert watcher is not None, log.read_text(errors="replace")[-4000:]
        assert watcher.stat().st_uid == pwd.getpwnam(USERS["instructor"]).pw_uid  # the hub started it as the instructor
        assert b"course-grade" in (watcher / "cmdline").read_bytes()
        alice = Student(hub, "alice")
        before = alice.texts()
        text, seconds = alice.wait_for_page(before, alice.submit({"dot_scores": SWAPPED}))
        print(f"under JupyterHub: submit to feedback {seconds:.1f} s")
        assert DIAGNOSIS in text
        assert "Starting service 'course-grade'" in log.read_text(errors="replace")
    finally:
        jupyterhub.send_signal(signal.SIGTERM)
        try:
            jupyterhub.wait(timeout=60)
        except subprocess.TimeoutExpired:
            kill_group(jupyterhub)
        print(log.read_text(errors="replace")[-3000:])
