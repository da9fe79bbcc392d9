"""What every graded kernel runs before any student code (``nbgrader_config.py``'s ``exec_lines``).

First the snapshot of torch, numpy and the builtins (``trusted``), then the grading helpers
the hidden tests call, which ``trusted.seal`` then records as they are: a notebook that
replaces any of them afterwards is caught (``trusted.replaced``).

Under ``./course grade`` that is all: the judge is outside. Elsewhere (stock nbgrader on the
instructor's machine, self-study) the grader package's in-kernel judge is loaded and sealed
too, when it is installed; a class student's environment has none, and needs none.
"""

# trusted takes its snapshot as it is imported: here, before any student code runs
from . import cases, checks, compat, course, modules, trusted, verdict

_sealed = [trusted, compat, verdict, cases, modules, course, checks]
if checks._LINK is None:
    try:
        from autograder import compare, local_judge, reference
        from autograder.exercises import catalogue
    except ImportError:  # no grader package here: nothing to judge with, nothing to seal
        pass
    else:
        _sealed += [compare, reference, catalogue, local_judge]
trusted.seal(*_sealed)
