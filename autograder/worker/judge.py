"""The trusted half of every hidden check, outside the sandbox.

A grading worker keeps one ``Judge`` per assignment: the reference module,
built from the reference cells the grader handed in (``reference.from_cells``),
the seeded cases and probes of each exercise, the reference's outputs on them
and the mistakes' outputs, all computed once and reused for every notebook.

While one notebook runs, a ``VerdictServer`` listens on the Unix socket its
kernel's ``check`` talks to (``course_checks.verdict.Link``). It answers ``begin``
with what the check observes with (``Judge.shipment``: the learner's object to
run, the cases and the probes, the notebook's set-up cells, and descriptions of
the substitutes for the reference's answers), compares the outputs of ``result``
with the reference, and records one verdict per check. No reference answer goes
into the kernel: the cases and probes carry the reference's objects as
descriptions (``referee.ReferenceCodec``), which become substitutes there, and
the substitutes' calls come back here and are answered by the worker's
``referee.Referee`` (the reference computed in a bounded process of its own).

It accepts a check only while the grade cell that holds it runs, the first
time: student code cannot replay a check with other functions, in another
cell, or after the fact. It answers a substitute only while the check that
handed it over runs, in its own cell, and only for an exercise whose own check
has finished.

A check counts only when its invocation ran to completion (``Invocation``). Its
``begin`` opens a connection of its own, which the server (one connection at a
time) serves alone until it closes: the invocation's substitute calls, its
``result`` and its ``end`` come on it, each carrying the token ``begin`` handed
out and the next number in order. A verdict is recorded at ``end`` only. A
check that is stopped (its connection closes or its cell ends first), a
message out of order or with another token, and a ``result`` on any other
connection earn nothing; the last two are noted as interference
(``interference``, a flag for review). A check that a fresh kernel runs again
(the notebook replayed after a crash) earns what the replayed run verifies,
and never more than an earlier run of it that failed.
"""

from __future__ import annotations

import ast
import hashlib
import io
import json
import os
import pickle
import secrets
import socket
import socketserver
import threading
import types
from dataclasses import dataclass, field

from course_checks import verdict

from .. import compare, messages, reference
from ..exercises import module_for
from ..messages import mistake_of
from . import phases
from .referee import ReferenceCodec, describe_answer


@dataclass
class Verdict:
    assignment: str
    exercise: str
    message: str | None = None  # None: passed
    finished: bool = False  # its invocation ran to its end (else the check did not finish)
    tampered: list = field(default_factory=list)
    reported: bool = False  # its result (or "missing") arrived; ``message`` waits for the end
    review: list = field(default_factory=list)  # what its properties ask a human to look at (no points lost)

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


class Judge:
    """The reference side of one assignment's checks, kept for a worker's lifetime."""

    def __init__(self, assignment: str, cells: list[tuple[str, str]]):
        self.assignment = assignment
        self.cells = [tuple(cell) for cell in cells]
        self.ref = reference.from_cells(assignment, self.cells)
        self.exercises = module_for(assignment).EXERCISES
        self.setup_ids = {gid for gid, _ in self.cells if gid.startswith("setup")}
        self.defines = {gid: _defined_names(source) for gid, source in self.cells}
        # the names the answer cells define: never in a kernel, only substitutes for them
        self.answers = frozenset(
            name for gid, names in self.defines.items() if gid not in self.setup_ids for name in names
        )
        self.key = f"{assignment}-" + hashlib.sha256(json.dumps(self.cells).encode()).hexdigest()[:16]
        self._cases: dict[str, list] = {}
        self._probes: dict[str, list] = {}
        self._shipped: dict[str, tuple[str, str, set]] = {}
        self._expected: dict[str, list] = {}
        self._predicted: dict = {}
        self._described: dict | None = None
        self.lock = threading.Lock()

    # ------------------------------------------------------------ cases
    def cases(self, name: str) -> list:
        if name not in self._cases:
            self._cases[name] = list(self.exercises[name].cases(self.ref))
        return self._cases[name]

    def probes(self, name: str) -> list:
        if name not in self._probes:
            self._probes[name] = [prop.made(self.ref) for prop in self.exercises[name].properties]
        return self._probes[name]

    def _pickled(self, objects) -> tuple[str, set[str]]:
        """``objects`` pickled for the sandbox, and the answers of the reference they carry, by name.

        Every object of the reference module in them (a class, a model, a config) is pickled as
        its description (``ReferenceCodec``): the kernel makes a substitute of it, or, for the
        set-up code's, an object of the set-up code it runs itself. No reference code goes in.
        """
        codec = ReferenceCodec(self.ref, self.answers)
        module_name = self.ref.__name__

        class Describing(pickle.Pickler):
            def persistent_id(self, obj):
                if isinstance(obj, (type, types.FunctionType)):
                    return verdict.encode(obj, codec=codec) if codec.classify(obj) else None
                if type(obj).__module__ == module_name:
                    described = verdict.encode(obj, codec=codec)
                    if "object" in described:
                        raise TypeError(f"a {type(obj).__name__} of the reference cannot go into a kernel")
                    return described
                return None

        buffer = io.BytesIO()
        Describing(buffer, protocol=4).dump(objects)
        used = {ref.partition(":")[2] for ref in codec.used if ref.startswith("answer:")}
        return verdict.b64encode(buffer.getvalue()), used

    def _pickle_cases(self, name: str) -> tuple[str, str, set[str]]:
        """The cases and the probes as shipped, and the answers of the reference they carry, by name."""
        if name not in self._shipped:
            cases, used = self._pickled(self.cases(name))
            probes, used_too = self._pickled(self.probes(name))
            self._shipped[name] = (cases, probes, used | used_too)
        return self._shipped[name]

    def described(self) -> dict:
        """What a kernel needs to know of each answer to make its substitute (no code: kinds, names)."""
        if self._described is None:
            self._described = {
                name: describe_answer(getattr(self.ref, name))
                for name in sorted(self.answers)
                if isinstance(getattr(self.ref, name, None), (type, types.FunctionType))
            }
        return self._described

    def shipment(self, name: str, checked: set[str], graded: set[str]) -> dict:
        """What ``begin`` answers: the cases, the probes, the set-up cells and the substitutes' descriptions.

        ``checked``: exercises whose checks already ran in this kernel;
        ``graded``: exercises this notebook has a check for. An answer the check needs (a
        dependency, or one its cases carry) is handed over, as a substitute, only once its own
        check has run; the check's own exercise never. ``grant`` (kept by the server, not sent)
        lists the answers whose substitutes this check may call.
        """
        exercise = self.exercises[name]
        own = {name, exercise.target or name}  # what this check grades: never handed over
        cases, probes, used = self._pickle_cases(name)
        needed = (set(exercise.depends_on) | set(exercise.reference_uses) | used) & self.answers
        if needed & own:
            return {
                "message": f"`{name}` cannot be checked in the sandbox: its cases carry its "
                "own reference (a grader bug; please tell the instructor)."
            }
        early = sorted((needed & graded) - checked)
        if early:
            return {
                "message": f"`{name}` is checked before `{early[0]}`, which it builds on: "
                "keep the notebook's cells in their original order."
            }
        counted = self.counted_calls(name)
        return {
            "setup": [(gid, source) for gid, source in self.cells if gid in self.setup_ids],
            "answers": {
                **{key: value for key, value in self.described().items() if key not in own},
                **{key: describe_answer(getattr(self.ref, key)) for key in counted},
            },
            "target": exercise.target or name,
            "depends_on": [*exercise.depends_on, *(key for key in counted if key not in exercise.depends_on)],
            "probes": probes,
            "cases": cases,
            "grant": sorted(needed | set(counted)),
        }

    def counted_calls(self, name: str | None = None) -> list[str]:
        """The set-up functions whose calls the referee answers and counts for the check of ``name``
        (``Exercise.counted_calls``), or for any check of this assignment: only functions of the
        set-up code (the released notebook's), never an answer."""
        wanted = (
            self.exercises[name].counted_calls
            if name is not None
            else [call for exercise in self.exercises.values() for call in exercise.counted_calls]
        )
        return sorted(
            key
            for key in set(wanted) - self.answers
            if any(key in self.defines.get(gid, ()) for gid in self.setup_ids)
            and isinstance(getattr(self.ref, key, None), types.FunctionType)
        )

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

    def verdict(self, name: str, problem, outputs, tampered, observations=(), counted=None, notes=None) -> str | None:
        """The learner-facing message for this check, or None when it passed.

        ``counted``: what the referee counted of the work of the check's substitutes (outside the
        kernel, where the notebook cannot forge it); a property that reads a count (``Property.counted``)
        gets it beside what its probe saw. ``notes`` gets what the properties ask a human to review."""
        if tampered:
            return messages.tampering_message([str(t) for t in tampered])
        exercise = self.exercises[name]
        target = exercise.target or name  # the learner's object the messages are about
        probes = self.probes(name)
        try:
            budget = [verdict.MAX_ITEMS]  # shared by everything one check reports
            seen = [verdict.decode(item, budget=budget) for item in list(observations)[: len(probes)]]
        except (verdict.ProtocolError, ValueError, TypeError) as error:
            return f"`{target}`: what its check saw could not be read ({error})."
        if len(seen) < len(probes) and not problem:
            return f"`{target}`: the check did not report what it saw of the whole `{target}`."
        if counted is not None:
            seen = [
                {"kernel": observation, "outside": _counted(counted, prop.counted)} if prop.counted else observation
                for prop, observation in zip(exercise.properties, seen)
            ]
        with self.lock:
            found = compare.property_problem(exercise, probes, seen, self.ref, notes)
        if found:
            return messages.finish(target, found)
        if problem:
            return messages.finish(target, str(problem)[:4000])
        cases = self.cases(name)
        try:
            values = [verdict.decode(output, budget=budget) for output in outputs[: len(cases) + 1]]
        except (verdict.ProtocolError, ValueError, TypeError) as error:
            return f"`{target}`: its outputs could not be checked ({error})."
        if len(values) != len(cases):
            return f"`{target}`: the check did not receive an output for every case."
        with self.lock:
            problem = compare.disagreement(exercise, cases, values, self.expected(name), self.ref, self._predict(name))
            return messages.finish(target, problem)


def _counted(counted: dict, name: str):
    """What the referee counted under ``name`` (``Property.counted``): a number, or for a family of
    counts (``"calls/attention"``) {what follows the name: its count}."""
    if "/" not in name:
        return counted.get(name, 0)
    prefix = name + "/"
    return {key[len(prefix) :]: value for key, value in counted.items() if key.startswith(prefix)}


# Distinct counts one check keeps (shapes of calls); past them a family's new keys add up under
# "<family>/overflow", which a reading cannot place (``multi_head_attention`` then asks for a review).
MAX_COUNTS = 10_000


class _Handler(socketserver.StreamRequestHandler):
    """One connection: a single request (a substitute's call after its check, a refusal), or a
    check's whole invocation, message after message, until its end (``VerdictServer.answer``)."""

    def handle(self):
        server: VerdictServer = self.server.verdicts  # type: ignore[attr-defined]
        self.connection.settimeout(server.seconds + 60)  # a connection that sends nothing is dropped
        server.serving(self.connection)
        invocation = None
        try:
            while True:
                line = self.rfile.readline(verdict.MAX_MESSAGE + 1)
                if not line:
                    return
                server.idle.clear()
                mark = phases.begin(server.phases)
                try:
                    try:
                        reply, invocation, more = server.answer_on(invocation, verdict.parse_line(line), line)
                    except Exception as error:  # a hostile or broken kernel: answer, never crash
                        reply, more = {"message": f"The hidden checks could not run ({type(error).__name__})."}, False
                        if invocation is not None:  # into a check's own connection
                            server.interfered(invocation, f"sent what a check does not send ({type(error).__name__})")
                    if isinstance(reply, bytes):  # the referee's answer, as it wrote it
                        self.wfile.write(reply + b"\n")
                        self.wfile.flush()
                    else:
                        verdict.write_line(self.wfile, reply)
                finally:
                    server.idle.set()
                    phases.end(server.phases, "judge", mark)
                    if invocation is not None and not invocation.opened:  # its check runs in the kernel from here
                        invocation.opened = phases.begin(server.phases)
                if not more:
                    return
        except OSError:
            pass
        finally:
            server.serving(None)
            server.closed(invocation)


class _UnixServer(socketserver.UnixStreamServer):
    """One connection at a time: a notebook flooding the socket cannot spawn threads here, and
    while a check's invocation holds its connection no other connection is read."""


@dataclass
class Invocation:
    """One check run, from its ``begin`` to its ``end``: the connection it holds, the token it was
    handed and the number its next message must carry."""

    cell: str
    name: str
    record: Verdict
    token: str = field(default_factory=lambda: secrets.token_hex(16))
    next: int = 1
    message: str | None = None  # what its result earned, recorded at its end
    ended: bool = False
    counted: dict = field(default_factory=dict)  # what the referee counted of its substitutes' work
    opened: tuple = ()  # when its shipment had gone out (``phases.begin``): the kernel's side runs from there


PROXY_OPS = ("call", "forward", "construct", "method", "getattr", "setattr")


class VerdictServer:
    """Answers one notebook's checks; ``cell`` is the grade cell running now (set by the executor).

    ``referee`` answers the substitutes' calls (``referee.Referee``), each within ``seconds``.
    """

    def __init__(
        self,
        path: str,
        judges: dict[str, Judge],
        expected: dict[str, list[tuple[str, str]]],
        referee=None,
        seconds: float = 30.0,
    ):
        self.path = path
        self.judges = judges
        self.expected = expected  # grade cell id -> [(assignment, exercise)]
        self.graded = {name for calls in expected.values() for _, name in calls}
        self.referee = referee
        self.seconds = seconds
        self.session = secrets.token_hex(8)  # the referee's name for what it holds for this notebook
        self.cell: str | None = None
        self.verdicts: dict[str, list[Verdict]] = {}
        self.checked: set[str] = set()
        self.done: set[str] = set()  # exercises whose checks finished in this kernel
        self.grants: dict[tuple[str, str], set[str]] = {}  # (cell, check) -> answers its substitutes may call
        self.failed: dict[tuple[str, str], str] = {}  # (cell, check) -> its first failure, in any kernel
        self.interference: list[str] = []  # what the notebook sent that no check sends, in words
        self.asked = False  # the referee answered something in this cell
        self.lock = threading.Lock()
        self._connection = None  # the connection being served now
        self.idle = threading.Event()  # set unless a request is being answered
        self.idle.set()
        self.phases: dict = {}  # judge, substitutes, referee: seconds within the cells (``worker.phases``)
        self.checking = 0.0  # seconds the kernel's side of the checks took (probes, cases), within the cells
        if os.path.exists(path):
            os.unlink(path)
        self.server = _UnixServer(path, _Handler)
        self.server.verdicts = self  # type: ignore[attr-defined]
        os.chmod(path, 0o666)
        # ``close`` waits for the serving loop to look up (socketserver's shutdown): every 10 ms here,
        # so a notebook's grading does not wait out half of 0.1 s at its end.
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self._drop()
        self.server.shutdown()
        self.server.server_close()
        try:
            os.unlink(self.path)
        except OSError:
            pass
        self._let_go()

    # ------------------------------------------------------------ the connection served now
    def serving(self, connection) -> None:
        with self.lock:
            self._connection = connection

    def _drop(self) -> None:
        """End the connection being served (a check its cell stopped, a kernel replaced, a
        connection a notebook holds open between cells): what it began does not finish."""
        self.idle.wait(5)  # a reply being written (the referee's error for a call it stopped) goes out first
        with self.lock:
            connection = self._connection
        if connection is not None:
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    # ------------------------------------------------------------ kernel lifecycle
    def new_kernel(self, skipped_cells=()) -> None:
        """A fresh kernel replays the notebook: its checks run again from scratch.

        The checks of ``skipped_cells`` (grade cells left out after they hung or
        killed the kernel) count as run, so the exercises after them still get
        their dependencies. A check earns what its replayed run verifies, and
        never more than an earlier run of it that failed (``failed``).
        """
        self._drop()
        with self.lock:
            self.checked = {name for cell in skipped_cells for _, name in self.expected.get(cell, [])}
            self.done = set(self.checked)
            self.grants = {}
            self.cell = None

    def start_cell(self, grade_id: str | None) -> None:
        self._drop()  # a connection opened before this cell (a thread of an earlier one) ends
        with self.lock:
            self.cell = grade_id
            if grade_id in self.expected:
                self.verdicts[grade_id] = []

    def end_cell(self) -> None:
        with self.lock:
            # A check its cell stopped (a timeout, an interrupt) can no longer finish: it counts as
            # run, so the exercises built on it get their substitutes (its verdict: not finished).
            self.done.update(record.exercise for record in self.verdicts.get(self.cell, []))
            self.cell = None
            self.grants = {}
        stopped = self._let_go()
        self._drop()
        if stopped:  # between cells: its start-up counts against no learner's cell
            with phases.timed(self.phases, "referee"):
                self.referee.prepare(self.judges.values())

    def _let_go(self) -> bool:
        """The substitutes' calls of the cell that ended: one still running is stopped, and what
        the referee held for them let go. Whether the referee had to be stopped."""
        stopped = False
        if self.referee is not None and self.asked:
            stopped = self.referee.busy
            self.referee.abort()
            self.referee.forget(self.session)
            self.asked = False
        return stopped

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

    def _finish(self, cell: str, record: Verdict, message: str | None) -> str | None:
        """Record ``message`` as ``record``'s verdict: its check ran to its end. A check that failed
        in an earlier kernel keeps that failure (a replay cannot improve on it)."""
        key = (cell, record.exercise)
        if message is None:
            message = self.failed.get(key)
        else:
            self.failed.setdefault(key, message)
        record.finished, record.message = True, message
        self.done.add(record.exercise)
        return message

    def interfered(self, invocation: Invocation | None, why: str) -> None:
        """Note what the notebook sent that no check sends; the invocation it broke into (if any)
        ends with no points."""
        with self.lock:
            where = f"{invocation.cell}: " if invocation is not None else (f"{self.cell}: " if self.cell else "")
            if len(self.interference) < 20:
                self.interference.append(f"{where}{why}"[:300])
            if invocation is not None and not invocation.ended:
                invocation.ended = True
                record = invocation.record
                record.tampered = [*record.tampered, why[:200]]
                self._finish(invocation.cell, record, messages.interference_message(record.exercise, why))

    def closed(self, invocation: Invocation | None) -> None:
        """The connection of ``invocation`` closed: unless it reached its end, its check did not
        finish (a stopped check earns nothing)."""

    def answer_on(self, invocation: Invocation | None, request: dict, line: bytes) -> tuple:
        """(the reply, the invocation this connection now holds, whether to read another message)."""
        if invocation is None:
            if request.get("op") == "begin":
                reply, invocation = self._begin(request)
                return reply, invocation, invocation is not None
            return self.answer(request, line), None, False
        return self._continue(invocation, request, line)

    def answer(self, request: dict, line: bytes = b"") -> dict | bytes:
        """A request on a connection of its own: a substitute's call (after its check, in its cell)."""
        op = request.get("op")
        if op in PROXY_OPS:
            return self._substitute(request, line)
        if op in ("result", "missing", "end"):
            assignment, name = str(request.get("assignment")), str(request.get("name"))
            with self.lock:
                ours = self.cell is not None and (assignment, name) in self.expected.get(self.cell, [])
            if ours:  # a verdict for a check of this cell, from outside its invocation
                self.interfered(None, f"sent a `{op}` for the check of `{name[:60]}` outside that check")
            return {"message": "A check's result counts only from the check itself; this one does not count."}
        return {"message": "Unknown request."}

    @staticmethod
    def _tampered(request: dict) -> list[str]:
        tampered = request.get("tampered")
        return [str(t)[:200] for t in tampered][:50] if isinstance(tampered, list) else []

    def _begin(self, request: dict) -> tuple[dict, Invocation | None]:
        assignment, name = str(request.get("assignment")), str(request.get("name"))
        tampered = self._tampered(request)
        with self.lock:
            cell, record, refusal = self._slot(request)
            if refusal:
                return {"message": refusal}, None
            if record is not None:
                return {"message": "This check already ran in this cell; it counts once."}, None
            record = Verdict(assignment, name, tampered=tampered)
            self.verdicts[cell].append(record)
            checked = set(self.checked)
            self.checked.add(name)  # from now on its dependants may be checked
            if tampered:
                return {"message": self._finish(cell, record, messages.tampering_message(tampered))}, None
        reply = self.judges[assignment].shipment(name, checked, self.graded)
        with self.lock:
            if "message" in reply:
                return {"message": self._finish(cell, record, reply["message"])}, None
            self.grants[(cell, name)] = set(reply.pop("grant", ()))
            invocation = Invocation(cell, name, record)
        return {**reply, "invocation": invocation.token}, invocation

    def _continue(self, invocation: Invocation, request: dict, line: bytes) -> tuple:
        """The next message of a check's invocation: it must carry the invocation's token and the
        next number, and come in the order a check sends them (substitute calls, a result, the end)."""
        record, op = invocation.record, request.get("op")
        if invocation.ended or self.cell != invocation.cell:
            return {"message": "This check has ended."}, invocation, False
        if request.get("invocation") != invocation.token or request.get("seq") != invocation.next:
            self.interfered(invocation, "sent a message into a check that the check did not send")
            return {"message": "This check was interfered with; it does not count."}, invocation, False
        invocation.next += 1
        if op == "interfered":  # the kernel's side caught a call of the check's result from elsewhere
            self.interfered(invocation, f"reported its result from outside the check ({str(request.get('why'))[:120]})")
            return {"message": "This check was interfered with; it does not count."}, invocation, False
        if op in PROXY_OPS and not record.reported:
            return self._substitute(request, line, invocation), invocation, True
        if op in ("result", "missing") and not record.reported:
            self.checking += phases.since(self.phases, invocation.opened) if invocation.opened else 0.0
            tampered = self._tampered(request)
            if op == "missing":
                message = messages.tampering_message(tampered) if tampered else str(request.get("problem"))[:4000]
            else:
                outputs, observations = request.get("outputs", []), request.get("observations", [])
                message = self.judges[record.assignment].verdict(
                    record.exercise,
                    request.get("problem"),
                    outputs if isinstance(outputs, list) else [],
                    tampered,
                    observations if isinstance(observations, list) else [],
                    counted=invocation.counted,
                    notes=record.review,
                )
            with self.lock:
                record.reported, record.tampered = True, record.tampered or tampered
                invocation.message = message
                if message is None:
                    message = self.failed.get((invocation.cell, record.exercise))
            return {"message": message}, invocation, True
        if op == "end" and record.reported:
            tampered = self._tampered(request)
            message = invocation.message
            if tampered:
                message = messages.tampering_message(tampered)
            with self.lock:
                record.tampered = record.tampered or tampered
                invocation.ended = True
                self._finish(invocation.cell, record, message)
            return {"ended": True}, invocation, False
        self.interfered(invocation, f"sent `{str(op)[:40]}` where its check does not")
        return {"message": "This check was interfered with; it does not count."}, invocation, False

    def _substitute(self, request: dict, line: bytes, invocation: Invocation | None = None) -> dict | bytes:
        """A substitute's call, answered by the referee when the check that handed it over runs now."""
        name, target = str(request.get("name")), str(request.get("target"))
        with self.lock:
            cell, record, refusal = self._slot(request)
            if refusal:
                return {
                    "refused": f"`{target}` stands for the reference only while the check that handed it "
                    "over runs, in its own test cell."
                }
            if target not in self.grants.get((cell, name), ()):
                return {"refused": f"`{target}` is not part of the check of `{name}`."}
            if target in self.graded and target not in self.done:
                return {"refused": f"`{target}` stands for the reference only once its own check has run."}
            self.asked = True
        if self.referee is None:
            return {"refused": "The reference cannot be reached here."}
        with phases.timed(self.phases, "substitutes"):
            answer, counted = self.referee.ask(
                self.judges[str(request.get("assignment"))], self.session, line, self.seconds
            )
        if invocation is not None:  # what the referee counted of the work, for the check that asked
            for key, value in counted.items():
                if not isinstance(value, int) or isinstance(value, bool):
                    continue
                if key not in invocation.counted and len(invocation.counted) >= MAX_COUNTS and "/" in key:
                    key = key.rpartition("/")[0] + "/overflow"
                invocation.counted[key] = invocation.counted.get(key, 0) + value
        return answer

    def cell_verdicts(self, grade_id: str) -> list[Verdict]:
        with self.lock:
            return list(self.verdicts.get(grade_id, []))
