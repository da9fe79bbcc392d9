"""The trusted half of every hidden check, outside the sandbox.

A grading worker keeps one ``Judge`` per assignment: the reference module,
built from the reference cells the grader handed in (``reference.from_cells``),
the seeded cases of each exercise, the reference's outputs on them and the
mistakes' outputs, all computed once and reused for every notebook.

While one notebook runs, a ``VerdictServer`` listens on the Unix socket its
kernel's ``check`` talks to (``verdict.Link``). It answers ``begin`` with what the
check observes with (``course_checks.cases.Shipment``: the learner's object to
run, the cases, the properties) and with the reference cells the check may see
(those of the exercise's dependencies, once their own checks have run in this
kernel), compares the
outputs of ``result`` with the reference, and records one verdict per check.
It accepts a check only while the grade cell that holds it runs, the first
time: student code cannot replay a check with other functions, in another
cell, or after the fact.
"""

from __future__ import annotations

import ast
import base64
import io
import os
import pickle
import socketserver
import threading
from dataclasses import dataclass, field

from course_checks import verdict

from .. import compare, messages, reference
from ..exercises import module_for
from ..messages import mistake_of


@dataclass
class Verdict:
    assignment: str
    exercise: str
    message: str | None = None  # None: passed
    finished: bool = False  # a result arrived (else the check did not finish)
    tampered: list = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.finished and self.message is None

    @property
    def mistake(self) -> str | None:
        return mistake_of(self.message)


def _defined_names(source: str) -> set[str]:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
    return names


def _used_names(source: str) -> set[str]:
    try:
        return {n.id for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Name)}
    except SyntaxError:
        return set()


class Judge:
    """The reference side of one assignment's checks, kept for a worker's lifetime."""

    def __init__(self, assignment: str, cells: list[tuple[str, str]]):
        self.assignment = assignment
        self.cells = [tuple(cell) for cell in cells]
        self.ref = reference.from_cells(assignment, self.cells)
        self.exercises = module_for(assignment).EXERCISES
        self.setup_ids = {gid for gid, _ in self.cells if gid.startswith("setup")}
        self.defines = {gid: _defined_names(source) for gid, source in self.cells}
        self.uses = {gid: _used_names(source) for gid, source in self.cells}
        self._cases: dict[str, list] = {}
        self._shipped: dict[str, tuple[str, str, set]] = {}
        self._expected: dict[str, list] = {}
        self._predicted: dict = {}
        self.lock = threading.Lock()

    # ------------------------------------------------------------ cases
    def cases(self, name: str) -> list:
        if name not in self._cases:
            self._cases[name] = list(self.exercises[name].cases(self.ref))
        return self._cases[name]

    def _pickled(self, objects) -> tuple[str, set[str]]:
        """``objects`` pickled for the sandbox, and the names of the reference objects they carry."""
        module_name = self.ref.__name__
        used: set[str] = set()

        class Recorder(pickle.Pickler):
            def reducer_override(self, obj):
                if isinstance(obj, type) or callable(obj) and hasattr(obj, "__qualname__"):
                    if getattr(obj, "__module__", None) == module_name:
                        used.add(obj.__qualname__.split(".")[0])
                return NotImplemented

        buffer = io.BytesIO()
        Recorder(buffer, protocol=4).dump(objects)
        return base64.b64encode(buffer.getvalue()).decode("ascii"), used

    def _pickle_cases(self, name: str) -> tuple[str, str, set[str]]:
        """The cases and the properties as shipped, and the reference objects they carry, by name."""
        if name not in self._shipped:
            cases, used = self._pickled(self.cases(name))
            properties, used_too = self._pickled(list(self.exercises[name].properties))
            self._shipped[name] = (cases, properties, used | used_too)
        return self._shipped[name]

    def _cells_for(self, names: set[str]) -> list[str]:
        """Grade ids of the reference cells defining ``names`` and what they use, in order."""
        wanted = set(self.setup_ids)
        frontier = set(names)
        seen: set[str] = set()
        while frontier:
            name = frontier.pop()
            seen.add(name)
            for gid, defined in self.defines.items():
                if name in defined and gid not in wanted:
                    wanted.add(gid)
                    frontier |= {
                        n
                        for n in self.uses[gid]
                        if n not in seen and any(n in d for g, d in self.defines.items() if g != gid)
                    }
        return [gid for gid, _ in self.cells if gid in wanted]

    def shipment(self, name: str, checked: set[str], graded: set[str]) -> dict:
        """What ``begin`` answers: the cases, and the reference cells the check may see.

        ``checked``: exercises whose checks already ran in this kernel;
        ``graded``: exercises this notebook has a check for. A dependency that is
        itself graded here is revealed only once its own check has run.
        """
        exercise = self.exercises[name]
        own = {name, exercise.target or name}  # what this check grades: its reference stays here
        cases, properties, used = self._pickle_cases(name)
        needed = set(exercise.depends_on) | set(exercise.reference_uses) | used
        cell_ids = self._cells_for(needed) if needed else []
        for gid in cell_ids:
            if gid in self.setup_ids:
                continue
            revealed = self.defines[gid] & (graded | own)
            if revealed & own:
                return {
                    "message": f"`{name}` cannot be checked in the sandbox: its cases carry its "
                    "own reference (a grader bug; please tell the instructor)."
                }
            early = sorted(revealed - checked)
            if early:
                return {
                    "message": f"`{name}` is checked before `{early[0]}`, which it builds on: "
                    "keep the notebook's cells in their original order."
                }
        source = dict(self.cells)
        return {
            "cells": [(gid, source[gid]) for gid in cell_ids],
            "target": exercise.target or name,
            "depends_on": list(exercise.depends_on),
            "properties": properties,
            "cases": cases,
        }

    def mistake_name(self, name: str, mistake_id: str | None) -> str | None:
        """The learner-facing name of a catalogued mistake (for the class report)."""
        if mistake_id == "tampering":
            return "replaced functions the checks rely on, or the grading helpers"
        for mistake in getattr(self.exercises.get(name), "mistakes", ()):
            if mistake.id == mistake_id:
                return " ".join(mistake.name.split())
        return None

    # ------------------------------------------------------------ comparing
    def expected(self, name: str) -> list:
        if name not in self._expected:
            exercise = self.exercises[name]
            self._expected[name] = compare.reference_outputs(
                exercise, getattr(self.ref, exercise.target or name), self.cases(name)
            )
        return self._expected[name]

    def _predict(self, name: str):
        def predict(mistake, index, case):
            key = (name, mistake.id, id(mistake), index)
            if key not in self._predicted:
                try:
                    mutant = mistake.mutant(self.ref)
                    self._predicted[key] = compare.run_case(mutant, case)
                except Exception as error:
                    self._predicted[key] = (None, error)
            return self._predicted[key]

        return predict

    def verdict(self, name: str, problem, outputs, tampered) -> str | None:
        """The learner-facing message for this check, or None when it passed."""
        if tampered:
            return messages.tampering_message([str(t) for t in tampered])
        exercise = self.exercises[name]
        target = exercise.target or name  # the learner's object the messages are about
        if problem:
            return messages.finish(target, str(problem)[:4000])
        cases = self.cases(name)
        try:
            budget = [verdict.MAX_ITEMS]  # shared by all the outputs of one check
            values = [verdict.decode(output, budget=budget) for output in outputs[: len(cases) + 1]]
        except (verdict.ProtocolError, ValueError, TypeError) as error:
            return f"`{target}`: its outputs could not be checked ({error})."
        if len(values) != len(cases):
            return f"`{target}`: the check did not receive an output for every case."
        with self.lock:
            problem = compare.disagreement(exercise, cases, values, self.expected(name), self.ref, self._predict(name))
            return messages.finish(target, problem)


class _Handler(socketserver.StreamRequestHandler):
    timeout = 120  # a connection that sends nothing is dropped; meanwhile only its own notebook waits

    def handle(self):
        server: VerdictServer = self.server.verdicts  # type: ignore[attr-defined]
        try:
            request = verdict.read_line(self.rfile)
            reply = server.answer(request)
        except Exception as error:  # a hostile or broken kernel: answer, never crash
            reply = {"message": f"The hidden checks could not run ({type(error).__name__})."}
        try:
            verdict.write_line(self.wfile, reply)
        except OSError:
            pass


class _UnixServer(socketserver.UnixStreamServer):
    """One request at a time: a notebook flooding the socket cannot spawn threads here."""


class VerdictServer:
    """Answers one notebook's checks; ``cell`` is the grade cell running now (set by the executor)."""

    def __init__(self, path: str, judges: dict[str, Judge], expected: dict[str, list[tuple[str, str]]]):
        self.path = path
        self.judges = judges
        self.expected = expected  # grade cell id -> [(assignment, exercise)]
        self.graded = {name for calls in expected.values() for _, name in calls}
        self.cell: str | None = None
        self.verdicts: dict[str, list[Verdict]] = {}
        self.checked: set[str] = set()
        self.lock = threading.Lock()
        if os.path.exists(path):
            os.unlink(path)
        self.server = _UnixServer(path, _Handler)
        self.server.verdicts = self  # type: ignore[attr-defined]
        os.chmod(path, 0o666)
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        try:
            os.unlink(self.path)
        except OSError:
            pass

    # ------------------------------------------------------------ kernel lifecycle
    def new_kernel(self, skipped_cells=()) -> None:
        """A fresh kernel replays the notebook: its checks run again from scratch.

        The checks of ``skipped_cells`` (grade cells left out after they hung or
        killed the kernel) count as run, so the exercises after them still get
        their dependencies.
        """
        with self.lock:
            self.checked = {name for cell in skipped_cells for _, name in self.expected.get(cell, [])}
            self.cell = None

    def start_cell(self, grade_id: str | None) -> None:
        with self.lock:
            self.cell = grade_id
            if grade_id in self.expected:
                self.verdicts[grade_id] = []

    def end_cell(self) -> None:
        with self.lock:
            self.cell = None

    # ------------------------------------------------------------ requests
    def _slot(self, request: dict) -> tuple[str, Verdict | None, str | None]:
        """(cell, the verdict record to fill or None, refusal message or None)."""
        assignment, name = str(request.get("assignment")), str(request.get("name"))
        cell = self.cell
        if cell is None or (assignment, name) not in self.expected.get(cell, []):
            return (
                "",
                None,
                (
                    "This check does not belong to the cell running now, so it does not count "
                    "(hidden checks count only in their own graded cell)."
                ),
            )
        return cell, next((v for v in self.verdicts[cell] if v.exercise == name), None), None

    def answer(self, request: dict) -> dict:
        op = request.get("op")
        assignment, name = str(request.get("assignment")), str(request.get("name"))
        tampered = (
            [str(t)[:200] for t in request.get("tampered", [])][:50]
            if isinstance(request.get("tampered"), list)
            else []
        )
        with self.lock:
            cell, record, refusal = self._slot(request)
            if refusal:
                return {"message": refusal}
            checked = set(self.checked)
            if op == "begin":
                if record is not None:
                    return {"message": "This check already ran in this cell; it counts once."}
                record = Verdict(assignment, name, tampered=tampered)
                self.verdicts[cell].append(record)
                checked = set(self.checked)
                self.checked.add(name)  # from now on its dependants may see its reference
                if tampered:
                    record.finished, record.message = True, messages.tampering_message(tampered)
                    return {"message": record.message}
        judge = self.judges[assignment]
        if op == "begin":
            reply = judge.shipment(name, checked, self.graded)
            if "message" in reply:
                with self.lock:
                    record.finished, record.message = True, reply["message"]
            return reply
        if op in ("result", "missing"):
            if record is None and op == "missing":
                record = Verdict(assignment, name)
                with self.lock:
                    self.verdicts[cell].append(record)
            if record is None or record.finished:
                return {"message": "This check already ran in this cell; it counts once."}
            outputs = request.get("outputs", [])
            message = judge.verdict(
                name, request.get("problem"), outputs if isinstance(outputs, list) else [], tampered
            )
            with self.lock:
                record.finished, record.message = True, message
                record.tampered = record.tampered or tampered
                self.checked.add(name)
            return {"message": message}
        return {"message": "Unknown request."}

    def cell_verdicts(self, grade_id: str) -> list[Verdict]:
        with self.lock:
            return list(self.verdicts.get(grade_id, []))
