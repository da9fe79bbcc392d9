"""Sanitize a submission with nbgrader's own preprocessors, and notice tampering.

nbgrader's sanitizing steps (``ClearOutput``, ``DeduplicateIds``,
``OverwriteKernelspec``, ``OverwriteCells`` with missing cells added back,
``CheckCellMetadata``) need the gradebook only to read the assignment's source
cells. ``GradebookView`` holds those, read once by the grader, so a worker (or
a machine without the database) can sanitize a notebook: the sanitizing is
nbgrader's, the data comes from the snapshot.

Before sanitizing, ``inspect`` compares the submission with the released
notebook and lists what a student should not have done, each a flag for the
class report: graded cells edited, deleted, duplicated or moved, and code that
replaces functions of torch, numpy, the builtins or the grading helpers. The
flags cost no points by themselves: tampering gains nothing because edited
cells are restored, and the checks run and are judged outside the notebook.
"""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass, field

from nbgrader.api import MissingEntry
from nbgrader.preprocessors import (
    CheckCellMetadata,
    ClearOutput,
    DeduplicateIds,
    NbGraderPreprocessor,
    OverwriteCells,
    OverwriteKernelspec,
)
from traitlets import Any

from .cells import tracked_id

# Modules whose attributes a notebook has no business replacing.
# the grader and its kernel side: what no submission has a reason to touch
GRADING_PACKAGES = ("autograder", "course_checks")
WATCHED_MODULES = {"torch", "numpy", "math", "builtins", *GRADING_PACKAGES, "sys", "IPython", "nbgrader"}
# ... except these, which honest notebooks do set.
ALLOWED_PREFIXES = ("torch.backends.", "numpy.set_printoptions", "sys.setrecursionlimit")


@dataclass
class CellRecord:
    """One of the assignment's source cells, as the gradebook holds it."""

    name: str
    cell_type: str
    locked: bool
    checksum: str | None
    source: str
    max_score: float | None = None  # grade cells only
    solution: bool = False
    task: bool = False


@dataclass
class NotebookRecord:
    name: str
    kernelspec: str | None
    source_cells: list[CellRecord]

    @property
    def grade_cells(self):
        return [c for c in self.source_cells if c.max_score is not None and not c.task]

    @property
    def solution_cells(self):
        return [c for c in self.source_cells if c.solution]

    @property
    def task_cells(self):
        return [c for c in self.source_cells if c.task]


@dataclass
class GradebookView:
    """The part of the gradebook that sanitizing reads, for one notebook; picklable."""

    assignment: str
    notebook: NotebookRecord

    @classmethod
    def read(cls, gradebook, assignment: str, notebook: str, order: list[str]) -> GradebookView:
        """From an open ``nbgrader.api.Gradebook``; cells in ``order`` (the release's)."""
        record = gradebook.find_notebook(notebook, assignment)
        points = {c.name: float(c.max_score) for c in [*record.grade_cells, *record.task_cells]}
        solutions = {c.name for c in record.solution_cells}
        tasks = {c.name for c in record.task_cells}
        position = {name: i for i, name in enumerate(order)}
        cells = sorted(record.source_cells, key=lambda c: (position.get(c.name, len(position)), c.name))
        return cls(
            assignment,
            NotebookRecord(
                notebook,
                record.kernelspec,
                [
                    CellRecord(
                        c.name,
                        c.cell_type,
                        bool(c.locked),
                        c.checksum,
                        c.source,
                        points.get(c.name),
                        c.name in solutions,
                        c.name in tasks,
                    )
                    for c in cells
                ],
            ),
        )

    # the Gradebook methods nbgrader's sanitizing preprocessors call
    def find_notebook(self, notebook: str, assignment: str) -> NotebookRecord:
        return self.notebook

    def find_source_cell(self, name: str, notebook: str, assignment: str) -> CellRecord:
        for cell in self.notebook.source_cells:
            if cell.name == name:
                return cell
        raise MissingEntry()

    def find_graded_cell(self, name: str, notebook: str, assignment: str) -> CellRecord:
        cell = self.find_source_cell(name, notebook, assignment)
        if cell.max_score is None:
            raise MissingEntry()
        return cell

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class ViewOverwriteCells(OverwriteCells):
    """nbgrader's OverwriteCells, reading a ``GradebookView`` instead of the database."""

    view = Any()

    def preprocess(self, nb, resources):
        self.notebook_id = resources["nbgrader"]["notebook"]
        self.assignment_id = resources["nbgrader"]["assignment"]
        self.gradebook = self.view
        nb, resources = NbGraderPreprocessor.preprocess(self, nb, resources)
        if self.add_missing_cells:
            nb, resources = self.add_missing_grade_cells(nb, resources)
            nb, resources = self.add_missing_task_cells(nb, resources)
        return nb, resources


class ViewOverwriteKernelspec(OverwriteKernelspec):
    view = Any()

    def preprocess(self, nb, resources):
        kernelspec = self.view.notebook.kernelspec
        if kernelspec:
            nb.metadata["kernelspec"] = json.loads(kernelspec)
        return nb, resources


def sanitize(nb, view: GradebookView, resources: dict):
    """nbgrader's sanitizing preprocessors, in autograde's order; deleted graded cells come back.

    nbgrader's ``DeduplicateIds`` keeps the last copy of a duplicated cell; run
    on the reversed notebook it keeps the first, the one in its original place
    (a copy moved to the end would otherwise be checked after the exercises
    that build on it). The copies it demotes keep an empty ``nbgrader``
    metadata dict, which ``CheckCellMetadata`` rejects: those are removed.
    """
    nb, resources = ClearOutput().preprocess(nb, resources)
    nb.cells.reverse()
    nb, resources = DeduplicateIds().preprocess(nb, resources)
    nb.cells.reverse()
    for cell in nb.cells:
        if "nbgrader" in cell.metadata and not cell.metadata["nbgrader"]:
            del cell.metadata["nbgrader"]
    for step in (
        ViewOverwriteKernelspec(view=view),
        ViewOverwriteCells(view=view, add_missing_cells=True),
        CheckCellMetadata(),
    ):
        nb, resources = step.preprocess(nb, resources)
    return nb, resources


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
    try:
        from IPython.core.inputtransformer2 import TransformerManager

        return TransformerManager().transform_cell(source)
    except Exception:
        return source


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
# Findings that mean the grading helpers themselves may have been changed.
_FORGING = (*GRADING_PACKAGES, "sys.modules", "a function's", "computed object")


def forges_helpers(finding: str) -> bool:
    """Whether a ``suspicious_code`` finding touches the grading helpers (the check, the wire)."""
    return any(word in finding for word in _FORGING) and not finding.startswith(
        tuple(f"imports {package}" for package in GRADING_PACKAGES)
    )


def suspicious_code(sources: list[str], aliases: dict[str, str] | None = None) -> list[str]:
    """What in these (student) cells replaces watched functions, in words."""
    aliases = dict(aliases or {})
    trees = []
    for source in sources:
        try:
            trees.append(ast.parse(_python(source)))
        except SyntaxError:
            continue
    for tree in trees:  # imports first: a later cell may use an alias made earlier
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    aliases[alias.asname or alias.name.split(".")[0]] = (
                        alias.name if alias.asname else alias.name.split(".")[0]
                    )
            elif isinstance(node, ast.ImportFrom) and node.module:
                for alias in node.names:
                    aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    aliases.setdefault("__builtins__", "builtins")

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
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                for package in GRADING_PACKAGES:
                    if package in node.value or package == "autograder" and "AUTOGRADER_" in node.value:
                        found.append(f"names the grading package {package} in a string (an indirect route to it)")
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
                    if (
                        full in ("sys.modules", "builtins.__dict__")
                        or (full or "").endswith(".__dict__")
                        and watched(full)
                    ):
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
    return list(dict.fromkeys(found))


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
                result.add("graded-cell-edited", f"edited the read-only cell {gid} (restored before grading)")
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if (
            record.max_score is not None
            and meta.get("points") is not None
            and float(meta["points"]) != record.max_score
        ):
            result.add("graded-cell-edited", f"changed the points of {gid} (restored before grading)")
    for gid, count in seen.items():
        if count > 1:
            result.add("graded-cell-duplicated", f"has {count} copies of {gid} (only one is graded)")
    for cell in view.notebook.source_cells:
        if (cell.locked or cell.max_score is not None) and cell.name not in seen and cell.name in released_source:
            result.add("graded-cell-deleted", f"deleted {cell.name} (added back before grading)")
    kept = [gid for gid in order if gid in release_order]
    if kept != [gid for gid in release_order if gid in kept]:
        result.add("cells-reordered", "moved graded cells out of their original order")
    aliases = {}
    student_sources = []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if meta.get("locked") and not meta.get("solution"):
            continue
        student_sources.append(cell.source)
    for cell in released.cells:  # the released setup cells' imports (torch, math, ...)
        if cell.cell_type == "code" and cell.get("metadata", {}).get("nbgrader", {}).get("locked"):
            for node in ast.walk(ast.parse(_python(cell.source))) if _parses(cell.source) else []:
                if isinstance(node, ast.Import):
                    for alias in node.names:
                        aliases[alias.asname or alias.name.split(".")[0]] = (
                            alias.name if alias.asname else alias.name.split(".")[0]
                        )
    for finding in suspicious_code(student_sources, aliases):
        result.add("suspicious-code", f"code that {finding}")
        if forges_helpers(finding):
            result.forged.append(finding)
    return result


def _parses(source: str) -> bool:
    try:
        ast.parse(_python(source))
        return True
    except SyntaxError:
        return False


# ---------------------------------------------------------------- the instructor's version of the rules

FORGED_METADATA = "grading-metadata-forged"
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
    import math

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
