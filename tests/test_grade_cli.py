"""The grade command's own process (autograder/grade.py): what it imports."""

import subprocess
import sys


def test_the_grade_commands_own_process_does_not_import_torch():
    """The command's one process only collects and commits; torch (hundreds of MB, a second to
    import) belongs to the workers and their sandboxes."""
    code = "import sys, autograder.grade, autograder.engine.runners; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.stdout.strip() == "False", result.stderr
