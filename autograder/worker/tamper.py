"""Notice tampering, and put the instructor's grading metadata back: two steps of the pipeline.

``restore_grading_metadata`` runs first: a cell that claims a kind or points it does not
have loses the claim. Then, before sanitizing (``sanitize``), ``inspect`` compares the submission with the released
notebook and lists what a student should not have done, each a flag for the
class report: graded cells edited, deleted, duplicated or moved, and code that
replaces functions of torch, numpy, the builtins or the grading helpers. The
flags cost no points by themselves: tampering gains nothing because edited
cells are restored, and the checks run and are judged outside the notebook.
"""

from __future__ import annotations

import ast
import functools
import math
from dataclasses import dataclass, field

from IPython.core.inputtransformer2 import TransformerManager

from course_checks import compat

from ..cells import nbgrader_of, tracked_id
from ..flags import (
    CELL_DELETED,
    CELL_DUPLICATED,
    CELL_EDITED,
    CELLS_REORDERED,
    FORGED_METADATA,
    SUSPICIOUS_CODE,
)
from ..records import GradebookView

# Modules whose attributes a notebook has no business replacing.
# the grader and its kernel side: what no submission has a reason to touch
GRADING_PACKAGES = ("autograder", "course_checks")
WATCHED_MODULES = {"torch", "numpy", "math", "builtins", *GRADING_PACKAGES, "sys", "IPython", "nbgrader"}
# ... except these, which honest notebooks do set.
ALLOWED_PREFIXES = ("torch.backends.", "numpy.set_printoptions", "sys.setrecursionlimit")


# ---------------------------------------------------------------- tamper flags


@dataclass
class Inspection:
    flags: list[str] = field(default_factory=list)  # short ids for the report
    details: list[str] = field(default_factory=list)  # what exactly, for the instructor
    # Code that changes the grading helpers themselves (the check, the wire, the
    # detector): every verdict the kernel sends may be forged, so no check counts.
    forged: list[str] = field(default_factory=list)

    def add(self, flag: str, detail: str) -> None:
        if flag not in self.flags:
            self.flags.append(flag)
        self.details.append(detail)


def _python(source: str) -> str:
    """Cell source as plain Python (IPython magics turned into calls)."""
    # The released cells come again in every notebook of an assignment: a worker transforms each once
    # (IPython's tokenizer was most of a notebook's inspection). Long cells are not kept.
    return _python_kept(source) if len(source) <= KEPT_SOURCE else _transformed(source)


KEPT_SOURCE = 8_192  # characters; at most 1024 cells kept (8 M characters, and their transforms)


def _transformed(source: str) -> str:
    try:
        return TransformerManager().transform_cell(source)
    except Exception:
        return source


_python_kept = functools.lru_cache(maxsize=1024)(_transformed)


def _dotted(node) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


_FUNCTION_INNARDS = {
    "__code__",
    "__globals__",
    "__defaults__",
    "__kwdefaults__",
    "__closure__",
    "__dict__",
    "__class__",
    "__bases__",
}
# Reads that reach what a function or a running call holds (its globals, closure cells, code, a
# caller's variables): how an answer finds the checker's objects, or learns that it is being checked.
_INNARDS_READ = ("__globals__", "__closure__", "__code__", "cell_contents", "__builtins__")
_FRAME_ATTRIBUTES = ("f_back", "f_locals", "f_globals", "tb_frame", "gi_frame", "cr_frame", "ag_frame")
_FRAME_CALLS = {
    "sys._getframe": "sys._getframe",
    "sys._current_frames": "sys._current_frames",
    "sys.settrace": "sys.settrace",
    "sys.setprofile": "sys.setprofile",
    "sys.gettrace": "sys.gettrace",
    "sys.getprofile": "sys.getprofile",
    "threading.settrace": "threading.settrace",
    "threading.setprofile": "threading.setprofile",
    "inspect.currentframe": "inspect.currentframe",
    "inspect.stack": "inspect.stack",
    "inspect.trace": "inspect.trace",
    "inspect.getouterframes": "inspect.getouterframes",
    "inspect.getinnerframes": "inspect.getinnerframes",
}
# The shell's ways of running code around a student's cells: hooks on its events, rewriting what a
# cell says before it runs, and writing into the namespace behind the notebook's back.
_SHELL_HOOKS = {
    "input_transformers_post": "adds an input transformer",
    "input_transformers_cleanup": "adds an input transformer",
    "input_transformer_manager": "adds an input transformer",
    "ast_transformers": "adds an AST transformer",
    "user_ns": "reaches into IPython's user_ns",
    "user_global_ns": "reaches into IPython's user_ns",
}
# What a cell runs through and how its error is shown: replacing one can make a failed cell report success
# (the session's ``send`` aside: honest code names its own methods so; the kernel's detector watches it).
SHELL_METHODS = tuple(name for names in compat.SHELL_METHODS.values() for name in names if name != "send")
# Findings that mean the grading helpers themselves may have been changed.
_FORGING = (*GRADING_PACKAGES, "sys.modules", "a function's", "computed object", "the shell's")


def forges_helpers(finding: str) -> bool:
    """Whether a ``suspicious_code`` finding touches the grading helpers (the check, the wire)."""
    return any(word in finding for word in _FORGING) and not finding.startswith(
        tuple(f"imports {package}" for package in GRADING_PACKAGES)
    )


def suspicious_code(sources: list[str], aliases: dict[str, str] | None = None) -> list[str]:
    """What in these (student) cells replaces watched functions, in words."""
    aliases = dict(aliases or {})
    parsed = [(source, found) for source in sources if (found := _imports_of(source)) is not None]
    for _, imports in parsed:  # imports first: a later cell may use an alias made earlier
        for _, name, full in imports:
            aliases[name] = full
    aliases.setdefault("__builtins__", "builtins")
    names = tuple(sorted(aliases.items()))
    return list(dict.fromkeys(finding for source, _ in parsed for finding in _findings_of(source, names)))


def _imports(source: str) -> tuple | None:
    """The names a cell's imports bind, as ``ast.walk`` meets them: ("import" or "from", the name,
    what it names); None when the cell is not Python."""
    try:
        tree = ast.parse(_python(source))
    except SyntaxError:
        return None
    bound = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                top = alias.name.split(".")[0]
                bound.append(("import", alias.asname or top, alias.name if alias.asname else top))
        elif isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                bound.append(("from", alias.asname or alias.name, f"{node.module}.{alias.name}"))
    return tuple(bound)


def _findings(source: str, names: tuple) -> tuple[str, ...]:
    """What ``suspicious_code`` finds in one cell that parses, the notebook's imports being ``names``
    ((name, what it names) pairs)."""
    tree = ast.parse(_python(source))
    aliases = dict(names)

    def resolve(dotted: str | None) -> str | None:
        if not dotted:
            return None
        head, _, rest = dotted.partition(".")
        full = aliases.get(head)
        if full is None:
            return None
        return f"{full}.{rest}" if rest else full

    def watched(full: str | None) -> bool:
        return bool(full) and full.split(".")[0] in WATCHED_MODULES and not full.startswith(ALLOWED_PREFIXES)

    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            for package in GRADING_PACKAGES:
                if package in node.value or package == "autograder" and "AUTOGRADER_" in node.value:
                    found.append(f"names the grading package {package} in a string (an indirect route to it)")
            for name in (*_INNARDS_READ, *_FRAME_ATTRIBUTES, "_getframe"):
                if name in node.value:
                    found.append(f"names {name} in a string (an indirect route to what a call holds)")
        found.extend(_introspection(node, resolve))
        if (
            isinstance(node, ast.Attribute)
            and node.attr in _FUNCTION_INNARDS
            and isinstance(node.ctx, (ast.Store, ast.Del))
        ):
            found.append(f"replaces a function's {node.attr}")
        if isinstance(node, ast.Attribute) and node.attr == "modules" and resolve(_dotted(node)) == "sys.modules":
            found.append("reaches into sys.modules")
        if (
            isinstance(node, ast.Call)
            and _dotted(node.func) in ("setattr", "delattr")
            and node.args
            and (not isinstance(node.args[0], (ast.Name, ast.Attribute)))
        ):
            found.append(f"calls {_dotted(node.func)} on a computed object")
        targets = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif isinstance(node, ast.Delete):
            targets = node.targets
        for target in targets:
            if isinstance(target, ast.Attribute):
                full = resolve(_dotted(target))
                if watched(full):
                    found.append(f"replaces {full}")
            elif isinstance(target, ast.Subscript):
                full = resolve(_dotted(target.value))
                if full in ("sys.modules", "builtins.__dict__") or (full or "").endswith(".__dict__") and watched(full):
                    found.append(f"replaces an entry of {full}")
        if isinstance(node, ast.Call):
            name = _dotted(node.func)
            if name in ("setattr", "delattr") and node.args:
                full = resolve(_dotted(node.args[0]))
                if watched(full):
                    found.append(f"calls {name} on {full}")
            if isinstance(node.func, ast.Attribute) and node.func.attr == "set_custom_exc":
                found.append("installs a handler that hides errors (set_custom_exc)")
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            modules = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            for module in modules:
                if module.split(".")[0] in (*GRADING_PACKAGES, "ctypes", "nbgrader", "importlib", "gc"):
                    found.append(f"imports {module}")
    return tuple(found)


# The released cells come again in every notebook of an assignment, and their imports with them: a
# worker reads each cell's imports once, and its findings once for each set of the notebook's imports.
_imports_kept = functools.lru_cache(maxsize=1024)(_imports)
_findings_kept = functools.lru_cache(maxsize=1024)(_findings)


def _imports_of(source: str) -> tuple | None:
    return _imports_kept(source) if len(source) <= KEPT_SOURCE else _imports(source)


def _findings_of(source: str, names: tuple) -> tuple[str, ...]:
    return _findings_kept(source, names) if len(source) <= KEPT_SOURCE else _findings(source, names)


def _introspection(node, resolve) -> list[str]:
    """What ``node`` reads of a function's or a running call's innards, or how it hooks into the shell."""
    found = []
    if isinstance(node, ast.Attribute):
        stored = isinstance(node.ctx, (ast.Store, ast.Del))
        if node.attr in _INNARDS_READ and not stored:
            found.append(f"reads function innards ({node.attr})")
        if node.attr in _FRAME_ATTRIBUTES:
            found.append(f"inspects the call stack ({node.attr})")
        full = resolve(_dotted(node))
        if full in _FRAME_CALLS:
            found.append(f"inspects the call stack ({_FRAME_CALLS[full]})")
        if node.attr in _SHELL_HOOKS:
            found.append(_SHELL_HOOKS[node.attr])
        if (
            node.attr in ("register", "callbacks")
            and isinstance(node.value, ast.Attribute)
            and node.value.attr == "events"
        ):
            found.append("registers an IPython event hook")
        if node.attr in SHELL_METHODS and stored:
            found.append(f"replaces the shell's {node.attr}")
    if isinstance(node, ast.Call) and _dotted(node.func) == "compile":
        filename = (
            node.args[1] if len(node.args) > 1 else next((k.value for k in node.keywords if k.arg == "filename"), None)
        )
        if not (isinstance(filename, ast.Constant) and str(filename.value).startswith("<")):
            found.append("compiles code under a file name of its choosing (a library's, to hide a loop from a probe)")
    if isinstance(node, ast.Name) and resolve(node.id) in _FRAME_CALLS:  # from inspect import stack
        found.append(f"inspects the call stack ({resolve(node.id)})")
    if isinstance(node, ast.Call) and _dotted(node.func) in ("setattr", "delattr") and len(node.args) > 1:
        name = node.args[1]
        if isinstance(name, ast.Constant) and name.value in SHELL_METHODS:
            found.append(f"replaces the shell's {name.value}")
    if isinstance(node, ast.Call) and _dotted(node.func) == "getattr" and len(node.args) > 1:
        name = node.args[1]
        if isinstance(name, ast.Constant) and name.value in (*_INNARDS_READ, *_FRAME_ATTRIBUTES):
            found.append(f"reads function innards ({name.value})")
    return found


def inspect(nb, released, view: GradebookView) -> Inspection:
    """Flags for what the submission did to the graded cells and the functions the checks use."""
    result = Inspection()
    released_source = {}
    release_order = []
    for cell in released.cells:
        gid = tracked_id(cell)
        if gid:
            released_source[gid] = cell.source
            release_order.append(gid)
    seen: dict[str, int] = {}
    order = []
    for cell in nb.cells:
        gid = tracked_id(cell)
        if not gid:
            continue
        seen[gid] = seen.get(gid, 0) + 1
        if seen[gid] == 1:
            order.append(gid)
        record = next((c for c in view.notebook.source_cells if c.name == gid), None)
        if record is None:
            continue
        if (record.locked or record.max_score is not None and not record.solution) and gid in released_source:
            if cell.source.strip() != released_source[gid].strip() or cell.cell_type != record.cell_type:
                result.add(CELL_EDITED, f"edited the read-only cell {gid} (restored before grading)")
        meta = nbgrader_of(cell)
        if (
            record.max_score is not None
            and meta.get("points") is not None
            and float(meta["points"]) != record.max_score
        ):
            result.add(CELL_EDITED, f"changed the points of {gid} (restored before grading)")
    for gid, count in seen.items():
        if count > 1:
            result.add(CELL_DUPLICATED, f"has {count} copies of {gid} (only one is graded)")
    for cell in view.notebook.source_cells:
        if (cell.locked or cell.max_score is not None) and cell.name not in seen and cell.name in released_source:
            result.add(CELL_DELETED, f"deleted {cell.name} (added back before grading)")
    kept = [gid for gid in order if gid in release_order]
    if kept != [gid for gid in release_order if gid in kept]:
        result.add(CELLS_REORDERED, "moved graded cells out of their original order")
    aliases = {}
    student_sources = []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        meta = nbgrader_of(cell)
        if meta.get("locked") and not meta.get("solution"):
            continue
        student_sources.append(cell.source)
    for cell in released.cells:  # the released setup cells' imports (torch, math, ...)
        if cell.cell_type == "code" and nbgrader_of(cell).get("locked"):
            for kind, name, full in _imports_of(cell.source) or ():
                if kind == "import":
                    aliases[name] = full
    for finding in suspicious_code(student_sources, aliases):
        result.add(SUSPICIOUS_CODE, f"code that {finding}")
        if forges_helpers(finding):
            result.forged.append(finding)
    return result


# ---------------------------------------------------------------- the instructor's version of the rules

_KINDS = ("grade", "solution", "task")


def restore_grading_metadata(nb, view: GradebookView) -> Inspection:
    """Put the instructor's grading metadata back before anything else reads the notebook.

    A cell that claims to be graded under an id the assignment does not have
    (an added test cell, a copy under a new name) loses its claim and is graded
    as an ordinary cell; a cell of the assignment that claims another kind
    (``grade: true`` on an answer cell) or impossible points (negative, not a
    number, not finite) gets the release's kind and points back. Each is a
    ``grading-metadata-forged`` flag with the reason; the legitimate cells are
    then graded as usual. Changed but possible points are nbgrader's
    ``OverwriteCells``' to restore (``inspect`` flags them).
    """

    result = Inspection()
    records = {c.name: c for c in view.notebook.source_cells}
    for index, cell in enumerate(nb.cells, start=1):
        metadata = cell.get("metadata")
        if not isinstance(metadata, dict):
            cell["metadata"] = metadata = type(cell)()  # a cell without metadata is an ordinary cell
        if "nbgrader" not in metadata:
            continue
        meta = metadata["nbgrader"]
        if not isinstance(meta, dict):
            del metadata["nbgrader"]
            result.add(FORGED_METADATA, f"cell {index}: grading metadata that is not a mapping (ignored for scoring)")
            continue
        gid = meta.get("grade_id")
        record = records.get(gid) if isinstance(gid, str) else None
        if record is None:  # not a cell of the assignment: never graded, whatever it says
            claims = [k for k in (*_KINDS, "locked") if meta.get(k)]
            del metadata["nbgrader"]
            if claims or "points" in meta:
                result.add(
                    FORGED_METADATA,
                    f"cell {index} claims to be a {'/'.join(claims) or 'points'} cell "
                    f"{str(gid)[:60]!r} the assignment does not have (ignored for scoring)",
                )
            continue
        kind = {
            "grade": record.max_score is not None and not record.task,
            "solution": record.solution,
            "task": record.task,
        }
        changed = [k for k, v in kind.items() if bool(meta.get(k)) != v]
        for key, value in kind.items():
            meta[key] = value
        meta["locked"] = record.locked  # nbgrader's OverwriteCells restores a changed one; this, one of another type
        if changed:
            result.add(FORGED_METADATA, f"changed {gid}'s kind ({', '.join(changed)}; restored before grading)")
        if kind["grade"] or kind["task"]:
            points = meta.get("points")
            try:
                sane = (
                    points is not None
                    and not isinstance(points, bool)
                    and math.isfinite(float(points))
                    and float(points) >= 0
                )
            except (TypeError, ValueError, OverflowError):
                sane = False
            if not sane:
                meta["points"] = record.max_score
                result.add(
                    FORGED_METADATA, f"gave {gid} impossible points {str(points)[:30]!r} (restored before grading)"
                )
        elif "points" in meta:
            del meta["points"]
    return result
