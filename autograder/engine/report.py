"""The grades CSV, the class report and the summary the grading command prints.

All three read the gradebook for points (so they agree with it by
construction) and the grading ledger for what the grader found: flags,
faults, the misconception behind each failed check.

- CSV: one row per student, assignment and exercise: points, max points, the
  submission's flags and the catalogued mistake, if any; a late submission's penalty is a row
  of its own (``LATE_PENALTY``), as negative points;
- report (one HTML file, plots inline): score distribution per assignment, pass
  rate per exercise, the most common misconceptions with their counts, the
  submissions flagged for review and those that could not be graded. Its charts are data
  (``Chart``) until drawn, so the grade command's pool processes, idle once the class is
  graded, draw them beside the command (``LocalPool.map``).
"""

from __future__ import annotations

import base64
import csv
import html
import io
import statistics
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

from course_checks.files import write_atomically

from ..flags import FAULT_PREFIX, for_review, is_fault


@dataclass
class Row:
    student: str
    assignment: str
    notebook: str
    exercise: str
    cell: str
    points: float
    max_points: float
    flags: list
    mistake: str | None


# A late submission's penalty is a row of its own, as negative points (no cell, no maximum): a
# student's points add up to nbgrader's score after the penalty, as ``nbgrader export`` gives it.
LATE_PENALTY = "late penalty"


def exercise_name(cell: str) -> str:
    return cell[len("test_") :] if cell.startswith("test_") else cell


def gradebook_rows(course, summaries: dict) -> list[Row]:
    """Every grade in the gradebook, and each late penalty after its notebook's grades: by assignment,
    student, notebook, grade cell. Two queries of the columns the rows need, whatever the class's
    size (walking nbgrader's objects loads each notebook's and grade's computed scores one by one)."""
    from nbgrader.api import (  # here: the report's own, imported as the run ends
        Assignment,
        BaseCell,
        Grade,
        Gradebook,
        Notebook,
        SubmittedAssignment,
        SubmittedNotebook,
    )

    def submitted(query):
        return (
            query.join(Notebook, SubmittedNotebook.notebook_id == Notebook.id)
            .join(SubmittedAssignment, SubmittedNotebook.assignment_id == SubmittedAssignment.id)
            .join(Assignment, SubmittedAssignment.assignment_id == Assignment.id)
        )

    names = (Assignment.name, SubmittedAssignment.student_id, Notebook.name)
    penalty = SubmittedNotebook.late_submission_penalty
    with Gradebook(course.db_url) as gradebook:
        grades = submitted(
            gradebook.db.query(*names, BaseCell.name, Grade.score, Grade.max_score)
            .select_from(Grade)
            .join(BaseCell, Grade.cell_id == BaseCell.id)
            .join(SubmittedNotebook, Grade.notebook_id == SubmittedNotebook.id)
        ).all()
        penalties = submitted(gradebook.db.query(*names, penalty).filter(penalty.isnot(None), penalty != 0)).all()
    # sorted as the rows are listed: a notebook's grades by cell name, then its penalty
    listed = [((a, s, n, 0, cell), (cell, score, top)) for a, s, n, cell, score, top in grades]
    listed += [((a, s, n, 1, ""), ("", -penalty, None)) for a, s, n, penalty in penalties]
    rows, mistakes = [], {}
    for (assignment, student, notebook, late, _), (cell, score, top) in sorted(listed, key=lambda item: item[0]):
        summary = summaries.get((student, assignment, notebook), {})
        flags = list(summary.get("flags", []))
        if late:  # nbgrader's, kept within the notebook's score
            rows.append(Row(student, assignment, notebook, LATE_PENALTY, "", float(score), 0.0, flags, None))
            continue
        key = (student, assignment, notebook)
        if key not in mistakes:
            mistakes[key] = {c["cell"]: c.get("mistake") for c in summary.get("checks", []) if not c.get("passed")}
        rows.append(
            Row(
                student,
                assignment,
                notebook,
                exercise_name(cell),
                cell,
                float(score or 0.0),
                float(top),
                flags,
                mistakes[key].get(cell),
            )
        )
    return rows


def export_csv(course, ledger, path: Path) -> list[Row]:
    rows = gradebook_rows(course, ledger.summaries())
    path.parent.mkdir(parents=True, exist_ok=True)
    buffer = io.StringIO()
    out = csv.writer(buffer)
    out.writerow(["student", "assignment", "exercise", "points", "max_points", "flags", "mistake"])
    for row in rows:
        out.writerow(
            [
                row.student,
                row.assignment,
                row.exercise,
                f"{row.points:g}",
                f"{row.max_points:g}",
                ";".join(row.flags),
                row.mistake or "",
            ]
        )
    write_atomically(path, buffer.getvalue())
    return rows


# ---------------------------------------------------------------- report


@dataclass(frozen=True)
class Chart:
    """One figure of the report, as data: it is drawn wherever a processor is free (``draw``)."""

    kind: str  # "assignment": scores and pass rates; "misconceptions": the most common ones
    values: tuple  # the scores, or the counts
    labels: tuple = ()  # the exercises, or the misconceptions
    rates: tuple = ()  # per exercise: the share of submissions with full points
    top: float = 0.0  # the assignment's maximum points


def warm_charts() -> None:
    """What ``draw`` uses, imported ahead: in this process, or in a worker that has nothing left to grade
    (the grade command and the pool processes start without it)."""
    import matplotlib.backends.backend_agg  # noqa: F401
    import matplotlib.figure  # noqa: F401


def draw(chart: Chart) -> str:
    """The chart as an inline PNG ``<img>``.

    The axes are placed by hand, around the widest tick label as the renderer measures it: a
    layout engine (``constrained_layout``, ``bbox_inches="tight"``) would draw the whole figure
    once more to find the same margins, half of a chart's time."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # here: only the processes that draw
    from matplotlib.figure import Figure  # here: only the processes that draw

    labels = list(chart.labels)[::-1]
    if chart.kind == "assignment":
        figure = Figure(figsize=(10, 3.2), dpi=110)
        canvas = FigureCanvasAgg(figure)
        # the histogram in the left 40% of the width; the bars on the right, after their labels
        start = min(0.75, 0.47 + (_widest(canvas, labels) + 0.1) / 10)
        left = figure.add_axes((0.07, 0.16, 0.34, 0.72))
        right = figure.add_axes((start, 0.16, 0.97 - start, 0.72))
        top = chart.top
        left.hist(chart.values, bins=min(20, max(5, int(top) + 1)), range=(0, max(top, 1)), color="#4c72b0")
        left.set_title("score distribution", y=1.0)
        left.set_xlabel("points")
        left.set_ylabel("students")
        right.barh(labels, list(chart.rates)[::-1], color="#55a868")
        right.set_xlim(0, 1)
        right.set_title("pass rate per exercise", y=1.0)
        right.set_xlabel("share of submissions with full points")
    else:
        height = 0.35 * len(chart.values) + 1
        figure = Figure(figsize=(8, height), dpi=110)
        canvas = FigureCanvasAgg(figure)
        start = min(0.6, (_widest(canvas, labels) + 0.15) / 8)
        axis = figure.add_axes((start, 0.55 / height, 0.97 - start, 1 - 0.7 / height))
        axis.barh(labels, list(chart.values)[::-1], color="#c44e52")
        axis.set_xlabel("submissions")
    buffer = io.BytesIO()
    canvas.print_png(buffer)
    return '<img alt="" src="data:image/png;base64,' + base64.b64encode(buffer.getvalue()).decode() + '">'


def _widest(canvas, labels) -> float:
    """The widest of ``labels`` as a tick label, in inches."""
    from matplotlib import rcParams
    from matplotlib.font_manager import FontProperties

    renderer = canvas.get_renderer()
    font = FontProperties(size=rcParams["ytick.labelsize"])
    widths = [renderer.get_text_width_height_descent(str(label), font, ismath=False)[0] for label in labels]
    return max(widths, default=0.0) / canvas.figure.dpi


def draw_here(function, charts) -> list:
    return [function(chart) for chart in charts]


def _mistake_names(summaries: dict) -> dict:
    """Mistake id -> the name students read, as the graders recorded it."""
    names = {}
    for summary in summaries.values():
        for check in summary.get("checks", []):
            if check.get("mistake") and check.get("mistake_name"):
                names.setdefault(check["mistake"], check["mistake_name"])
    return names


def _table(header, body) -> str:
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in header)
    rows = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in body)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>"


def write_report(course, ledger, rows: list[Row], path: Path, map_charts=draw_here) -> None:
    """The class report. ``map_charts(draw, charts)``: the charts drawn, in order (a runner's ``map``
    has its idle workers draw them); drawn here if it fails."""
    summaries = ledger.summaries()
    names = _mistake_names(summaries)
    by_assignment: dict[str, list[Row]] = defaultdict(list)
    for row in rows:
        by_assignment[row.assignment].append(row)
    parts = [
        f"<h1>Class report: {html.escape(course.coursedir.course_id or 'course')}</h1>",
        f"<p>Generated {time.strftime('%Y-%m-%d %H:%M')} from the gradebook "
        f"<code>{html.escape(str(course.db_url).split('@')[-1])}</code>.</p>",
    ]
    for assignment, assignment_rows in sorted(by_assignment.items()):
        totals: dict[str, float] = defaultdict(float)
        maximum = defaultdict(float)
        for row in assignment_rows:
            totals[row.student] += row.points
            maximum[row.student] += row.max_points
        top = max(maximum.values()) if maximum else 0
        scores = list(totals.values())
        parts.append(f"<h2>{html.escape(assignment)}</h2>")
        parts.append("<h3>Score distribution and pass rate per exercise</h3>")
        parts.append(
            f"<p>{len(scores)} submissions; mean {statistics.fmean(scores):.2f} / {top:g}, "
            f"median {statistics.median(scores):.2f}.</p>"
            if scores
            else "<p>No submissions.</p>"
        )
        graded = [r for r in assignment_rows if r.cell]  # the exercises (a penalty is not one)
        cells = sorted({r.cell for r in graded}, key=lambda c: [r.cell for r in graded].index(c))
        rates = []
        for cell in cells:
            these = [r for r in graded if r.cell == cell]
            rates.append(sum(r.points >= r.max_points for r in these) / len(these))
        parts.append(Chart("assignment", tuple(scores), tuple(exercise_name(c) for c in cells), tuple(rates), top))
    mistakes = Counter()
    for row in rows:
        if row.mistake and row.mistake != "tampering":  # that one is a flag, not a misconception
            mistakes[(row.mistake, row.assignment, row.exercise)] += 1
    parts.append("<h2>Most common misconceptions</h2>")
    if mistakes:
        common = mistakes.most_common(15)
        labels = tuple(f"{m} ({e})" for (m, _, e), _ in common)
        parts.append(Chart("misconceptions", tuple(n for _, n in common), labels))
        parts.append(
            _table(
                ["count", "misconception", "id", "assignment", "exercise"],
                [(n, names.get(m, m), m, a, e) for (m, a, e), n in common],
            )
        )
    else:
        parts.append("<p>None recorded.</p>")
    flagged, faults, rejected = [], [], []
    for (student, assignment, _notebook), summary in sorted(summaries.items()):
        review = for_review(summary.get("flags", []))
        if review:
            flagged.append((student, assignment, ", ".join(review), "; ".join(summary.get("messages", []))[:600]))
        fault = [f for f in summary.get("flags", []) if is_fault(f)]
        if fault:
            faults.append(
                (
                    student,
                    assignment,
                    ", ".join(fault),
                    "; ".join(m for m in summary.get("messages", []) if m.startswith("cell "))[:600],
                )
            )
        if not summary.get("graded", True):
            rejected.append((student, assignment, "; ".join(summary.get("messages", []))[:600]))
    parts.append(f"<h2>Flagged for review ({len(flagged)})</h2>")
    parts.append(_table(["student", "assignment", "flags", "details"], flagged) if flagged else "<p>None.</p>")
    parts.append(f"<h2>Could not be graded ({len(rejected)})</h2>")
    parts.append(_table(["student", "assignment", "why"], rejected) if rejected else "<p>None.</p>")
    parts.append(f"<h2>Cells that hung, crashed or printed too much ({len(faults)})</h2>")
    parts.append(_table(["student", "assignment", "what", "where"], faults) if faults else "<p>None.</p>")
    charts = [part for part in parts if isinstance(part, Chart)]
    try:
        images = list(map_charts(draw, charts))
    except Exception:  # the workers are gone: nothing lost but their help
        images = []
    if len(images) != len(charts):
        images = draw_here(draw, charts)
    drawn = iter(images)
    parts = [next(drawn) if isinstance(part, Chart) else part for part in parts]
    style = (
        "body{font-family:sans-serif;max-width:1100px;margin:2em auto;color:#222}"
        "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:3px 8px;"
        "text-align:left;vertical-align:top;font-size:90%}th{background:#f3f3f3}img{max-width:100%}"
    )
    document = (
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>Class report</title>"
        f"<style>{style}</style></head><body>{''.join(parts)}</body></html>"
    )
    write_atomically(path, document)


# ---------------------------------------------------------------- summary


def summary(
    course,
    rows: list[Row],
    ledger_summaries: dict,
    graded_now: list,
    skipped: int,
    problems: list,
    seconds: float,
    csv_path: Path,
    report_path: Path,
) -> str:
    lines = []
    rejected = sum(1 for r in graded_now if not r.graded)
    lines.append(
        f"Graded {len(graded_now)} notebook(s) in {seconds:.1f} s"
        + (f" (their cells ran {sum(r.cell_seconds for r in graded_now):.1f} s in all)" if graded_now else "")
        + f"; {skipped} unchanged; {rejected} could not be graded."
    )
    by_assignment: dict[str, list[Row]] = defaultdict(list)
    for row in rows:
        by_assignment[row.assignment].append(row)
    lines.append(f"{'assignment':<20}{'students':>9}{'mean':>8}{'max':>6}{'flagged':>9}{'faults':>8}")
    for assignment, assignment_rows in sorted(by_assignment.items()):
        totals: dict[str, float] = defaultdict(float)
        top = defaultdict(float)
        for row in assignment_rows:
            totals[row.student] += row.points
            top[row.student] += row.max_points
        flagged = sum(
            1 for (s, a, _), x in ledger_summaries.items() if a == assignment and for_review(x.get("flags", []))
        )
        faulty = sum(
            1
            for (s, a, _), x in ledger_summaries.items()
            if a == assignment and any(f.startswith(FAULT_PREFIX) for f in x.get("flags", []))
        )
        lines.append(
            f"{assignment:<20}{len(totals):>9}{statistics.fmean(totals.values()):>8.2f}"
            f"{max(top.values()):>6g}{flagged:>9}{faulty:>8}"
        )
    mistakes = Counter(row.mistake for row in rows if row.mistake and row.mistake != "tampering")
    if mistakes:
        lines.append("Most common misconceptions: " + ", ".join(f"{m} ({n})" for m, n in mistakes.most_common(5)))
    flagged = [(s, a, for_review(x.get("flags", []))) for (s, a, _), x in sorted(ledger_summaries.items())]
    flagged = [f for f in flagged if f[2]]
    if flagged:
        shown = "; ".join(f"{s}/{a}: {', '.join(f)}" for s, a, f in flagged[:6])
        lines.append(f"Flagged for review ({len(flagged)}): {shown}" + (" ..." if len(flagged) > 6 else ""))
    for problem in problems[:8]:
        lines.append(f"! {problem}")
    if len(problems) > 8:
        lines.append(f"! ... and {len(problems) - 8} more")
    lines.append(f"Grades: {csv_path}")
    lines.append(f"Report: {report_path}")
    lines.append(
        f"Feedback: {Path(course.coursedir.root) / course.coursedir.feedback_directory}/<student>/<assignment>/"
    )
    return "\n".join(lines)
