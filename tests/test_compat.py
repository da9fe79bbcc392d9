"""Each compat module (the one door of its package to other packages' private parts) was written
for exact versions; an upgrade that moves any of them must send a maintainer to read it again."""

from __future__ import annotations

from importlib.metadata import version

import pytest
from test_environment import locked_versions

import autograder.compat
import course_checks.compat
import course_widgets.compat

DOORS = [autograder.compat, course_checks.compat, course_widgets.compat]


@pytest.mark.parametrize("door", DOORS, ids=[door.__name__ for door in DOORS])
def test_installed_versions_are_those_each_compat_module_was_written_for(door):
    locked = locked_versions("dev")
    for package, written_for in door.WRITTEN_FOR.items():
        installed = version(package).split("+")[0]
        assert installed == written_for, (
            f"{package} {installed} is installed, but {door.__name__} was written for {written_for}: read "
            f"{door.__file__} again against {package} {installed}'s code (each function there names the private "
            "part it uses), then set WRITTEN_FOR"
        )
        if package != "torch":  # the locks leave torch to tools/torch_source.py
            assert locked[package] == written_for, f"requirements/dev.txt pins {package} {locked[package]}"
