"""What every catalogue of mistakes must allow, checked without nbgrader: a notebook's grading test calls
these for each of its exercises (``autograder/exercises/<topic>.py``).

* each mutant differs from the reference on at least one case (else it could never be recognised), and
  mutants with different ids differ from each other on at least one case (else the judge could not tell
  them apart);
* the judge names each mutant's own mistake, not an earlier entry's.
"""

from __future__ import annotations

import itertools

from autograder import compare
from autograder.local_judge import judge_function


def assert_mutants_differ(exercise, ref) -> None:
    cases = list(exercise.cases(ref))

    def outputs(function):
        return [case.run(function) for case in cases]

    expected = outputs(getattr(ref, exercise.target or exercise.name))
    mutants = [(mistake, outputs(mistake.mutant(ref))) for mistake in exercise.mistakes]
    for mistake, got in mutants:
        assert any(compare.close(g, e, exercise.atol, exercise.rtol) for g, e in zip(got, expected)), mistake.name
    for (a, got_a), (b, got_b) in itertools.combinations(mutants, 2):
        if a.id != b.id:
            assert any(compare.close(x, y, exercise.atol, exercise.rtol) for x, y in zip(got_a, got_b)), (a.id, b.id)


def assert_mutants_recognised(exercise, ref) -> None:
    for mistake in exercise.mistakes:
        message = judge_function(exercise, mistake.mutant(ref), ref)
        assert message is not None and f"[mistake:{mistake.id}]" in message, (mistake.name, message)
