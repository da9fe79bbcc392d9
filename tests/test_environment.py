"""The set-up: pip and conda pins agree, Binder's files say what they should,
and the entry point's set-up is a no-op when nothing changed."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPOSITORY = Path(__file__).resolve().parent.parent
# pip name -> conda-forge name, where they differ
CONDA_NAMES = {"torch": "pytorch-cpu", "jupyter-repo2docker": "repo2docker", "dask": "dask-core"}
PIP_NAMES = {conda: pip for pip, conda in CONDA_NAMES.items()}


def pip_pins() -> dict:
    pins = {}
    for line in (REPOSITORY / "requirements.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"requirements.txt: {line!r} is not pinned with =="
            pins[CONDA_NAMES.get(name.lower(), name.lower())] = version
    return pins


def conda_environment() -> dict:
    return yaml.safe_load((REPOSITORY / "environment.yml").read_text())


def conda_pins() -> dict:
    pins = {}
    for item in conda_environment()["dependencies"]:
        assert isinstance(item, str), "environment.yml: no pip: section (it makes Binder re-solve on every commit)"
        name, _, version = item.partition("==")
        if name in ("python=3.12", "pip"):
            continue
        assert version, f"environment.yml: {item!r} is not pinned with =="
        pins[name.lower()] = version
    return pins


def test_pip_and_conda_pin_the_same_packages_and_versions():
    assert pip_pins() == conda_pins()


def test_torch_is_the_pinned_cpu_build():
    assert pip_pins()["pytorch-cpu"] == "2.13.0"
    text = (REPOSITORY / "environment.yml").read_text().lower()
    assert "cuda" not in text and "pytorch-gpu" not in text


def test_conda_environment_is_conda_forge_with_python_3_12_literally():
    environment = conda_environment()
    assert environment["channels"] == ["conda-forge"]  # no defaults channel (nor its licence terms)
    # repo2docker reads a literal pin; `python>=3.12` silently falls back to 3.10
    assert "python=3.12" in environment["dependencies"]


def test_installed_packages_match_the_pins():
    from importlib.metadata import version

    for name, pinned in pip_pins().items():
        installed = version(PIP_NAMES.get(name, name))
        assert installed.split("+")[0] == pinned, f"{name}: installed {installed}, pinned {pinned}"


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
        extensions = {name.rsplit(".", 1)[1] for name in json.loads(server_config.read_text())["ServerApp"]["jpserver_extensions"]}
        disabled = set(re.search(r"instructor_extensions=\(nbgrader\.server_extensions\.\{([a-z_,]+)\}\)", script).group(1).split(","))
        assert disabled == extensions - {"validate_assignment"}


def test_ci_runs_the_readme_test_command_and_nothing_else():
    lines = [l for l in (REPOSITORY / ".ci" / "run").read_text().splitlines() if l and not l.startswith("#")]
    assert lines[-1] == "exec ./course test"
    assert "./course test" in (REPOSITORY / "README.md").read_text()
    assert "./course lab" in (REPOSITORY / "README.md").read_text()


def test_setup_is_a_no_op_when_nothing_changed():
    import hashlib

    venv = Path(os.environ.get("COURSE_VENV", REPOSITORY / ".venv"))
    stamp = venv / ".course-installed"
    wanted = hashlib.sha256((REPOSITORY / "requirements.txt").read_bytes() + (REPOSITORY / "pyproject.toml").read_bytes())
    if not stamp.exists() or stamp.read_text().strip() != wanted.hexdigest():
        pytest.skip("this test run did not come through ./course (the set-up is not current)")
    result = subprocess.run([str(REPOSITORY / "course"), "setup"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "installing" not in result.stderr


def test_repo2docker_builds_environment_yml_with_python_3_12_then_runs_post_build_and_nothing_else():
    """What Binder does with this repository, read from repo2docker's Dockerfile (no docker needed)."""
    command = Path(sys.executable).parent / "jupyter-repo2docker"
    result = subprocess.run([str(command), "--no-build", str(REPOSITORY)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "Building conda environment for python=3.12" in result.stderr
    dockerfile = result.stdout
    # from the repository: environment.yml first (its own cached layer), then everything
    assert re.findall(r"^COPY .*\bsrc/(\S*)", dockerfile, re.M) == ["environment.yml", ""]
    assert 'env update -p ${NB_PYTHON_PREFIX} --file "environment.yml"' in dockerfile
    assert re.findall(r"^RUN .*postBuild.*$", dockerfile, re.M) == ["RUN chmod +x postBuild", "RUN ./postBuild"]
    # nothing else is picked up: pip's files are ignored beside environment.yml, no apt.txt, start, ...
    for ignored in ("requirements.txt", "pyproject.toml", "setup.py", "apt.txt", "runtime.txt", "REPO_DIR}/start",
                    "install.R", "Project.toml", "Pipfile", "pip install"):
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
