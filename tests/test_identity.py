"""Which grading code this is (autograder/engine/identity.py), and where code ends and the class's data begins."""

import shutil
import subprocess
import sys
import uuid
from pathlib import Path

from nbgrader.coursedir import CourseDirectory
from traitlets.config.loader import PyFileConfigLoader

from autograder.engine.identity import PACKAGES, code_files, package_folder

REPOSITORY = Path(__file__).resolve().parent.parent


def course_root():
    """nbgrader's course root as the repository's nbgrader_config.py sets it."""
    config = PyFileConfigLoader("nbgrader_config.py", path=str(REPOSITORY)).load_config()
    return Path(CourseDirectory(config=config).root).resolve()


def test_the_course_root_holds_data_and_lies_in_no_python_package():
    root = course_root()
    assert root == REPOSITORY / "coursework"
    for name in PACKAGES:
        folder = package_folder(name)
        assert not root.is_relative_to(folder) and not folder.is_relative_to(root), (name, folder)
    files = code_files()
    assert files and not [path for path in files if path.is_relative_to(root)]
    assert "coursework/" in (REPOSITORY / ".gitignore").read_text(encoding="utf-8").splitlines()


def test_no_student_file_changes_the_grading_codes_identity():
    """A submission may bring files of any kind (a helper .py too): the digest that Dask workers,
    which have no submissions, compare with the grade command's stays the same."""

    def digest() -> str:
        return subprocess.run(
            [sys.executable, "-c", "from autograder.engine.identity import code_digest; print(code_digest())"],
            cwd=REPOSITORY,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()

    before = digest()
    student = course_root() / "submitted" / f"test-student-{uuid.uuid4().hex[:8]}"
    folder = student / "01_attention"
    try:
        folder.mkdir(parents=True)
        (folder / "helpers.py").write_text("def softmax(x):\n    return x\n", encoding="utf-8")
        (folder / "__init__.py").write_text("", encoding="utf-8")
        (folder / "notes.txt").write_text("my notes", encoding="utf-8")
        assert digest() == before
    finally:
        shutil.rmtree(student, ignore_errors=True)
