"""The licences: MIT for the code, CC BY 4.0 for the course text, in the repository, in the
README, and in what a package build makes of it (the wheel and the sdist carry both files
and the licence expression in their metadata).

The packages are built as pip builds them, through setuptools' PEP 517 hooks, with the
setuptools of the dev lock (no build isolation: no index is asked, so a setuptools release
cannot change the result).
"""

from __future__ import annotations

import email
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parent.parent
LICENCES = {"LICENSE": "MIT", "LICENSE-CC-BY-4.0": "CC-BY-4.0"}
EXPRESSION = "MIT AND CC-BY-4.0"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The sdist and the wheel, built from the repository."""
    out = tmp_path_factory.mktemp("dist")
    for hook in ("build_sdist", "build_wheel"):  # each in a process of its own, as a build frontend calls them
        call = f"import sys, setuptools.build_meta as hooks; hooks.{hook}(sys.argv[1])"
        result = subprocess.run(
            [sys.executable, "-c", call, str(out)], cwd=REPOSITORY, capture_output=True, text=True, timeout=600
        )
        assert result.returncode == 0, result.stderr[-3000:]
    [sdist] = out.glob("*.tar.gz")
    [wheel] = out.glob("*.whl")
    return sdist, wheel


def test_the_licence_files_hold_the_licences_they_are_named_for():
    mit = (REPOSITORY / "LICENSE").read_text()
    assert mit.startswith("MIT License\n\nCopyright (c) ")
    assert "Permission is hereby granted, free of charge, to any person obtaining a copy" in mit
    cc = (REPOSITORY / "LICENSE-CC-BY-4.0").read_text()
    assert cc.startswith("Attribution 4.0 International\n")
    assert "Creative Commons Attribution 4.0 International Public License" in cc
    assert cc.rstrip().endswith("Creative Commons may be contacted at creativecommons.org.")


def test_pyproject_declares_both_licences():
    project = tomllib.loads((REPOSITORY / "pyproject.toml").read_text())["project"]
    assert project["license"] == EXPRESSION
    assert sorted(project["license-files"]) == sorted(LICENCES)


def test_the_readme_says_which_licence_covers_what():
    readme = (REPOSITORY / "README.md").read_text()
    section = readme.split("\n## Licence\n", 1)[1].split("\n## ", 1)[0]
    for file_name, name in (("LICENSE", "MIT"), ("LICENSE-CC-BY-4.0", "CC BY 4.0")):
        assert f"`{file_name}`" in section and name in section
    for covered in ("autograder/", "course_widgets/", "solutions/", "notebooks/", "assets/"):
        assert covered in section, f"the README's Licence section does not say what covers {covered}"


def test_the_wheel_carries_both_licences_and_the_expression(built):
    _, wheel = built
    with zipfile.ZipFile(wheel) as archive:
        [metadata] = [name for name in archive.namelist() if name.endswith(".dist-info/METADATA")]
        dist_info = metadata.rsplit("/", 1)[0]
        fields = email.message_from_bytes(archive.read(metadata))
        for file_name in LICENCES:
            carried = archive.read(f"{dist_info}/licenses/{file_name}")
            assert carried == (REPOSITORY / file_name).read_bytes(), file_name
    assert fields["License-Expression"] == EXPRESSION
    assert sorted(fields.get_all("License-File")) == sorted(LICENCES)


def test_the_sdist_carries_both_licences_and_the_expression(built):
    sdist, _ = built
    with tarfile.open(sdist) as archive:
        top = sdist.name.removesuffix(".tar.gz")
        for file_name in LICENCES:
            carried = archive.extractfile(f"{top}/{file_name}").read()
            assert carried == (REPOSITORY / file_name).read_bytes(), file_name
        fields = email.message_from_bytes(archive.extractfile(f"{top}/PKG-INFO").read())
    assert fields["License-Expression"] == EXPRESSION
    assert sorted(fields.get_all("License-File")) == sorted(LICENCES)


def test_the_graders_wheel_carries_the_code_licence(tmp_path):
    """The grader's own distribution (autograder/pyproject.toml) is code only: MIT, its file carried."""
    call = "import sys, setuptools.build_meta as hooks; hooks.build_wheel(sys.argv[1])"
    result = subprocess.run(
        [sys.executable, "-c", call, str(tmp_path)],
        cwd=REPOSITORY / "autograder",
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    [wheel] = tmp_path.glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        [metadata] = [name for name in archive.namelist() if name.endswith(".dist-info/METADATA")]
        fields = email.message_from_bytes(archive.read(metadata))
        carried = archive.read(f"{metadata.rsplit('/', 1)[0]}/licenses/LICENSE")
    assert carried == (REPOSITORY / "LICENSE").read_bytes()
    assert fields["License-Expression"] == "MIT"
