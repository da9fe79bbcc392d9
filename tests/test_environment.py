"""The set-up: the package sets and their locks agree with each other, Binder builds the
environment CI tests (the Python it runs, the students' lock, torch as ./course installs
it), and the entry point's set-up is a no-op when nothing changed."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import course_setup
import pytest
import yaml
from course_setup import COURSE_SCRIPT, require_course_setup, stamped_files
from packaging.requirements import Requirement

REPOSITORY = Path(__file__).resolve().parent.parent
REQUIREMENTS = REPOSITORY / "requirements"
SETS = ("student", "grader", "dev")  # each holds the one before it
# what ./course installs beside a lock: torch, on its own (tools/torch_source.py)
NOT_IN_LOCKS = {"torch"}
CUDA_PACKAGE = re.compile(r"^(nvidia-|cuda-|triton$)")


def course_version() -> str:
    """The course's version: the package metadata's, which the grader's, the site and course-grade share."""
    import tomllib

    return tomllib.loads((REPOSITORY / "pyproject.toml").read_text())["project"]["version"]


def pins(set_name: str) -> dict:
    """The top-level pins of a set (requirements/<set>.in and the files it includes), pip names."""
    found = {}
    for line in (REQUIREMENTS / f"{set_name}.in").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line.startswith("-r "):
            found |= pins(line.removeprefix("-r ").removesuffix(".in").strip())
        elif line:
            name, _, version = line.partition("==")
            assert version, f"{set_name}.in: {line!r} is not pinned with =="
            found[name.strip().lower()] = version.strip()
    return found


def lock(set_name: str) -> list[Requirement]:
    """Every requirement of requirements/<set>.txt, with its marker (hash lines left out)."""
    text = (REQUIREMENTS / f"{set_name}.txt").read_text()
    return [Requirement(line.rstrip(" \\")) for line in text.splitlines() if re.match(r"[A-Za-z0-9]", line)]


def locked_versions(set_name: str, environment: dict | None = None) -> dict:
    """name -> version for the lock's lines that apply to a machine (default: this one)."""
    versions = {}
    for requirement in lock(set_name):
        if requirement.marker is None or requirement.marker.evaluate(environment):
            assert requirement.name.lower() not in versions, f"{set_name}.txt: {requirement.name} twice"
            [specifier] = requirement.specifier
            versions[requirement.name.lower()] = specifier.version
    return versions


def conda_environment() -> dict:
    return yaml.safe_load((REPOSITORY / "environment.yml").read_text())


def ci_python() -> str:
    """The Python CI runs: the one `./course` looks for first, and the one `./course lock` locks for."""
    entry = course_setup.entry_point()
    [first] = entry.python_candidates("linux", {})[0]
    assert first == f"python{entry.LOCKED_FOR}", f"./course prefers {first} but locks for {entry.LOCKED_FOR}"
    return entry.LOCKED_FOR


def binder_pip_section() -> list[str]:
    [section] = [item["pip"] for item in conda_environment()["dependencies"] if isinstance(item, dict)]
    return section


def test_binder_environment_is_the_python_ci_runs_and_the_student_lock():
    """conda-forge gives the interpreter (CI's version, written literally: repo2docker reads
    `python=3.11`, and takes another version for a range) and pip; every Python package comes from
    the students' lock, with its hashes, so Binder gets the versions the suite tested."""
    environment = conda_environment()
    assert environment["channels"] == ["conda-forge"]  # no defaults channel (nor its licence terms)
    conda_packages = [item for item in environment["dependencies"] if isinstance(item, str)]
    assert conda_packages == [f"python={ci_python()}", "pip"]
    assert binder_pip_section() == ["-r requirements/student.txt"]


def test_binder_pip_step_installs_exactly_the_student_lock(tmp_path):
    """What conda (and mamba, which repo2docker runs) does with environment.yml's pip: section: its
    lines go into a temporary requirements file beside environment.yml, and that folder's pip runs
    `pip install -r <file>` (so `-r requirements/student.txt` is read relative to the repository).
    Here in a fresh venv, as a dry run: pip checks every file against the lock's hashes and
    resolves to exactly the lock's versions for this machine, torch left to postBuild."""
    course = tmp_path / "course"
    course.mkdir()
    shutil.copy2(REPOSITORY / "environment.yml", course)
    shutil.copytree(REQUIREMENTS, course / "requirements")
    (course / "mambaf-pip-section").write_text("\n".join(binder_pip_section()) + "\n")
    subprocess.run([sys.executable, "-m", "venv", str(tmp_path / "venv")], check=True)
    report = tmp_path / "report.json"
    result = subprocess.run(
        [str(tmp_path / "venv" / "bin" / "python"), "-m", "pip", "install", "-r", "mambaf-pip-section", "--no-input",
         "--quiet", "--dry-run", "--ignore-installed", "--report", str(report)],
        cwd=course,
        capture_output=True,
        text=True,
        timeout=1200,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    resolved = {
        item["metadata"]["name"].lower().replace("_", "-"): item["metadata"]["version"]
        for item in json.loads(report.read_text())["install"]
    }
    assert resolved == {name.replace("_", "-"): version for name, version in locked_versions("student").items()}
    assert "torch" not in resolved


def test_sets_are_nested_and_the_grading_and_test_tools_stay_out_of_the_student_set():
    student, grader, dev = (pins(name) for name in SETS)
    assert student.items() <= grader.items() <= dev.items()
    for tool in ("dask", "distributed", "pytest", "playwright", "jupyter-repo2docker", "uv"):
        assert tool not in student
        assert tool not in locked_versions("student"), f"{tool} reaches the student lock through a dependency"


@pytest.mark.parametrize("set_name", SETS)
def test_every_top_level_pin_is_in_its_lock_at_the_same_version(set_name):
    locked = locked_versions(set_name)
    for name, version in pins(set_name).items():
        if name in NOT_IN_LOCKS:
            assert name not in locked
        else:
            assert locked.get(name) == version, f"{set_name}: pinned {name}=={version}, locked {locked.get(name)}"


@pytest.mark.parametrize("set_name", SETS)
def test_every_lock_line_is_an_exact_version_with_hashes(set_name):
    text = (REQUIREMENTS / f"{set_name}.txt").read_text()
    entries = re.split(r"\n(?=[A-Za-z0-9])", text.split("\n", 2)[2])  # after uv's two header lines
    assert len(entries) > 100
    for entry in entries:
        head = entry.splitlines()[0]
        assert re.match(r"[A-Za-z0-9._-]+==[^ ;]+( ; .*)? \\$", head), head
        assert "--hash=sha256:" in entry, f"{set_name}.txt: {head} has no hash"


def test_smaller_sets_install_the_versions_the_dev_set_tested():
    """CI runs the dev set: a student or a grading worker gets the same version of every package they share."""
    everything = {
        (requirement.name.lower(), str(requirement.specifier), str(requirement.marker)) for requirement in lock("dev")
    }
    for set_name in ("student", "grader"):
        for requirement in lock(set_name):
            versions = {spec for name, spec, _ in everything if name == requirement.name.lower()}
            assert str(requirement.specifier) in versions, f"{set_name}.txt: {requirement} differs from dev.txt"


@pytest.mark.parametrize("set_name", SETS)
def test_locks_hold_torchs_pure_python_dependencies_and_none_of_its_cuda_libraries(set_name):
    from importlib.metadata import requires

    locked = locked_versions(set_name)
    for name in locked:
        assert not CUDA_PACKAGE.match(name), f"{set_name}.txt holds {name}: update requirements/torch-overrides.txt"
    needed = [Requirement(line) for line in requires("torch") or []]
    needed = [r for r in needed if r.marker is None or r.marker.evaluate({"extra": ""})]
    assert {r.name.lower() for r in needed} >= {"sympy", "networkx", "jinja2", "filelock"}
    for requirement in needed:
        assert requirement.specifier.contains(locked[requirement.name.lower()]), (
            f"torch needs {requirement}, {set_name}.txt locks {locked[requirement.name.lower()]}"
        )


def test_binder_installs_torch_as_course_does_after_the_lock():
    """postBuild installs the student set's torch pin with tools/torch_source.py (on Binder's Linux, the
    CPU build from PyTorch's CPU index: tests/test_torch_source.py), then the course's two packages
    (self-study on Binder uses the grader's in-kernel judge), or its one package in a class's students'
    copy, which has no autograder/ (./course export-class).
    environment.yml holds no torch (test_binder_environment_is_the_python_ci_runs_and_the_student_lock)."""
    assert pins("student")["torch"] == "2.13.0"
    steps = [
        line.strip()
        for line in (REPOSITORY / "postBuild").read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    assert steps[1:5] == [
        "python tools/torch_source.py install",
        "packages=(-e .)",
        "if [ -d autograder ]; then packages+=(-e ./autograder); fi",
        'python -m pip install --no-deps "${packages[@]}"',
    ], steps


def test_installed_packages_are_the_locked_versions():
    from importlib.metadata import version

    locked = locked_versions("dev") | pins("dev")
    for name, pinned in locked.items():
        installed = version(name)
        assert installed.split("+")[0] == pinned, f"{name}: installed {installed}, locked {pinned}"


def test_binder_post_build_keeps_only_validate():
    """postBuild disables every nbgrader lab plugin and server extension except Validate."""
    import nbgrader

    script = (REPOSITORY / "postBuild").read_text()
    assert os.access(REPOSITORY / "postBuild", os.X_OK)
    assert "set -euo pipefail" in script
    labextension = Path(nbgrader.__file__).parent / "labextension" / "static"
    shipped = set(re.findall(r"@jupyter/nbgrader:([a-z-]+)", "".join(p.read_text() for p in labextension.glob("*.js"))))
    assert "validate-assignment" in shipped
    disabled = set(re.search(r"instructor_plugins=\(@jupyter/nbgrader:\{([a-z,-]+)\}\)", script).group(1).split(","))
    assert disabled == shipped - {"validate-assignment"}
    server_config = REPOSITORY / ".venv" / "etc" / "jupyter" / "jupyter_server_config.d" / "nbgrader.json"
    if server_config.exists():
        extensions = {
            name.rsplit(".", 1)[1] for name in json.loads(server_config.read_text())["ServerApp"]["jpserver_extensions"]
        }
        disabled = set(
            re.search(r"instructor_extensions=\(nbgrader\.server_extensions\.\{([a-z_,]+)\}\)", script)
            .group(1)
            .split(",")
        )
        assert disabled == extensions - {"validate_assignment"}


def test_ci_runs_the_readme_test_command_and_nothing_else():
    lines = [
        line for line in (REPOSITORY / ".ci" / "run").read_text().splitlines() if line and not line.startswith("#")
    ]
    assert lines[-1] == "exec ./course test"
    assert "./course test" in (REPOSITORY / "README.md").read_text()
    assert "./course lab" in (REPOSITORY / "README.md").read_text()


def test_setup_is_a_no_op_when_nothing_changed():
    require_course_setup()
    result = subprocess.run([str(REPOSITORY / "course"), "setup"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "installing" not in result.stderr


def test_repo2docker_builds_python_3_11_and_the_lock_from_environment_yml_then_runs_post_build_and_nothing_else():
    """What Binder does with this repository, read from repo2docker's Dockerfile (no docker needed)."""
    command = Path(sys.executable).parent / "jupyter-repo2docker"
    result = subprocess.run([str(command), "--no-build", str(REPOSITORY)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert f"Building conda environment for python={ci_python()}" in result.stderr
    dockerfile = result.stdout
    # its base environment is repo2docker's own for that Python
    assert f"environment-2epy-2d{ci_python().replace('.', '-2e')}-2dlinux-2d64-2elock" in dockerfile
    # the whole repository first (the pip: section reads requirements/student.txt from it), then
    # environment.yml is installed into the notebook environment, then postBuild runs
    assert re.findall(r"^COPY .*\bsrc/(\S*)", dockerfile, re.M) == [""]
    steps = [
        dockerfile.index(step)
        for step in (
            "src/ ${REPO_DIR}/",
            'env update -p ${NB_PYTHON_PREFIX} --file "environment.yml"',
            "RUN ./postBuild",
        )
    ]
    assert steps == sorted(steps)
    assert re.findall(r"^RUN .*postBuild.*$", dockerfile, re.M) == ["RUN chmod +x postBuild", "RUN ./postBuild"]
    # nothing else is picked up: pip's files are ignored beside environment.yml, no apt.txt, start, ...
    for ignored in (
        "requirements.txt",
        "pyproject.toml",
        "setup.py",
        "apt.txt",
        "runtime.txt",
        "REPO_DIR}/start",
        "install.R",
        "Project.toml",
        "Pipfile",
        "pip install",
    ):
        assert ignored not in dockerfile, f"repo2docker uses {ignored}"


def test_readme_binder_badge_opens_jupyterlab_on_notebook_00():
    from urllib.parse import parse_qs, urlparse

    readme = (REPOSITORY / "README.md").read_text()
    [link] = re.findall(r"\[!\[Binder\]\([^)]*\)\]\(([^)]+)\)", readme)
    url = urlparse(link)
    assert (url.scheme, url.netloc) == ("https", "mybinder.org")
    assert re.fullmatch(r"/v2/gh/[\w.-]+/[\w.-]+/HEAD", url.path), url.path
    [target] = parse_qs(url.query)["urlpath"]
    assert target == "lab/tree/notebooks/00_start_here/00_start_here.ipynb"
    assert (REPOSITORY / target.removeprefix("lab/tree/")).is_file()


def test_readme_pictures_are_in_the_repository():
    for picture in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", (REPOSITORY / "README.md").read_text()):
        if not picture.startswith("http"):
            assert (REPOSITORY / picture).is_file(), f"README.md shows {picture}, which is missing"


def test_lock_command_reproduces_the_committed_locks(tmp_path):
    """`./course lock` on an unchanged tree writes the committed locks again, byte for byte: nobody
    edited a lock by hand, and every .in change was locked. uv asks PyPI only (no PyTorch index)."""
    require_course_setup("dev")
    venv = course_setup.venv()
    copy = tmp_path / "course"
    (copy / "autograder").mkdir(parents=True)
    for path in [COURSE_SCRIPT, *stamped_files()]:
        if path.parent != REQUIREMENTS:  # the requirements folder is copied whole below
            shutil.copy2(path, copy / path.relative_to(REPOSITORY))
    shutil.copytree(REQUIREMENTS, copy / "requirements")
    result = subprocess.run(
        [str(copy / "course"), "lock"],
        capture_output=True,
        text=True,
        timeout=300,
        env=os.environ | {"COURSE_VENV": str(venv)},
    )
    assert result.returncode == 0, result.stderr
    assert "installing" not in result.stderr  # the copy's set-up was current: the lock ran on the same venv
    for lock_file in REQUIREMENTS.glob("*.txt"):
        assert (copy / "requirements" / lock_file.name).read_text() == lock_file.read_text(), (
            f"{lock_file.name} is stale"
        )


def distribution_pins(name: str) -> dict:
    """The pins of what `pip install` takes for the set `name`: the course distribution's
    dependencies for `student` (`pip install .`), the grader distribution's for `grader`
    (`pip install ./autograder .`), with the course distribution's where it names it."""
    import tomllib

    project = tomllib.loads((REPOSITORY / "pyproject.toml").read_text())["project"]
    grader = tomllib.loads((REPOSITORY / "autograder" / "pyproject.toml").read_text())["project"]
    lines = grader["dependencies"] if name == "grader" else project["dependencies"]
    found = {}
    for line in lines:
        requirement = Requirement(line)
        if requirement.name == project["name"]:
            assert str(requirement.specifier) == f"=={project['version']}", line
            found |= distribution_pins("student")
            continue
        [specifier] = requirement.specifier
        assert specifier.operator == "==" and not requirement.marker, f"{name}: {line} is not an exact pin"
        found[requirement.name.lower()] = specifier.version
    return found


@pytest.mark.parametrize("set_name", ("student", "grader"))
def test_the_distributions_dependencies_are_the_requirement_sets_pin_for_pin(set_name):
    """`pip install .` (a student's image) and `pip install ./autograder .` (a JupyterHub's grading
    environment) get what `./course` installs, torch at the same version."""
    assert distribution_pins(set_name) == pins(set_name)


def test_the_postgres_driver_is_in_the_grader_set_only():
    assert {"psycopg", "psycopg-binary"} <= pins("grader").keys()
    assert "psycopg" not in locked_versions("student")


def test_course_lab_student_config_turns_off_what_post_build_turns_off():
    """./course lab's student configuration (tools/lab-config/student) and Binder's postBuild
    leave a student the same parts of nbgrader: every lab plugin and server extension but Validate."""
    script = (REPOSITORY / "postBuild").read_text()
    student = REPOSITORY / "tools" / "lab-config" / "student"
    page_config = json.loads((student / "labconfig" / "page_config.json").read_text())
    plugins = {
        f"@jupyter/nbgrader:{name}"
        for name in re.search(r"instructor_plugins=\(@jupyter/nbgrader:\{([a-z,-]+)\}\)", script).group(1).split(",")
    }
    assert page_config["disabledExtensions"] == dict.fromkeys(plugins, True)
    assert page_config["lockedExtensions"] == dict.fromkeys(plugins, True)
    [server_config] = (student / "jupyter_server_config.d").glob("*.json")
    extensions = {
        f"nbgrader.server_extensions.{name}"
        for name in re.search(r"instructor_extensions=\(nbgrader\.server_extensions\.\{([a-z_,]+)\}\)", script)
        .group(1)
        .split(",")
    }
    assert json.loads(server_config.read_text())["ServerApp"]["jpserver_extensions"] == dict.fromkeys(extensions, False)
    news = json.loads(
        (REPOSITORY / "tools" / "lab-config" / "course" / "labconfig" / "default_setting_overrides.json").read_text()
    )
    assert news["@jupyterlab/apputils-extension:notification"]["fetchNews"] == "false"


def test_the_stamp_covers_every_file_the_set_up_installs_from():
    """./course's stamp (read by tests/course_setup.py from the script) digests the locks, the
    student pins and both distributions' pyproject files: a change to any of them sets up again."""
    wanted = {*REQUIREMENTS.glob("*.txt"), REQUIREMENTS / "student.in"}
    wanted |= {REPOSITORY / "pyproject.toml", REPOSITORY / "autograder" / "pyproject.toml"}
    assert set(stamped_files()) == wanted
