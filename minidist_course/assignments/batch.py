"""A class at once: grade every submission in a folder, and the class summary (a CSV of points per task).

``grade A2 --path submissions/ --batch --out results/`` grades each entry of ``submissions/``: one
folder per student, named after them, holding their copy of minidist or just the files they changed
(``submissions/alice/ring.py``: placed as ``submission.py`` says). It writes ``results/<student>.json``
(Gradescope's format), ``results/<student>.txt`` (the full table) and ``results/summary.csv``.
``summary results/`` rebuilds the CSV from any folder of results.json files (e.g. written one at a time).
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable
from pathlib import Path

from minidist_course.assignments.report import EXIT_SETUP, GradeReport

SUMMARY = "summary.csv"


def students(folder: Path) -> list[Path]:
    """The submissions in ``folder``: its sub-folders and files, hidden names (``.x``) left out, sorted.

    Raises ``ValueError`` if ``folder`` is not a folder or holds no submission.
    """
    if not folder.is_dir():
        raise ValueError(f"--batch needs --path to be a folder of submissions (one per student): {folder}")
    found = sorted(p for p in folder.iterdir() if not p.name.startswith((".", "__")))
    if not found:
        raise ValueError(f"{folder} holds no submission: put one folder or file per student in it")
    return found


def student_name(entry: Path) -> str:
    """``alice`` for ``submissions/alice/`` (a stray file ``submissions/x.py`` is student ``x``)."""
    return entry.stem if entry.is_file() else entry.name


def grade_all(
    folder: Path, out: Path, grade_one: Callable[[Path], GradeReport], echo: Callable[[str], None] = print
) -> int:
    """Grade every submission in ``folder`` with ``grade_one``; write its results into ``out``.

    Raises ``ValueError`` if ``out`` already holds results (``*.json``) of an earlier run.
    Stops at the first setup problem (the environment is shared: every later submission would fail the
    same way). Returns the largest exit code of the submissions graded (see ``report.exit_code``).
    """
    earlier = sorted(p.name for p in out.glob("*.json")) if out.is_dir() else []
    if earlier:  # the summary counts every *.json in out: an earlier run's students would be mixed in
        shown = ", ".join(earlier[:3]) + (", ..." if len(earlier) > 3 else "")
        raise ValueError(
            f"{out} already holds results of an earlier run ({shown}); pass a new --out folder "
            f"(or move the old one away) so that the summary counts this run's students only"
        )
    out.mkdir(parents=True, exist_ok=True)
    code = 0
    for entry in students(folder):
        name = student_name(entry)
        report = grade_one(entry)
        report.write_results(out / f"{name}.json")
        (out / f"{name}.txt").write_text(report.table() + "\n")
        echo(f"{name:<20} {_points(report)}")
        code = max(code, report.exit_code)
        if report.exit_code == EXIT_SETUP:
            echo(f"stopped: {report.problem}")
            break
    rows = write_summary(out, out / SUMMARY)
    echo(f"wrote {len(rows)} results and {out / SUMMARY}")
    return code


def write_summary(results: Path, csv_path: Path) -> list[dict[str, str]]:
    """Write the class summary of the ``*.json`` results in ``results`` to ``csv_path``; return its rows.

    One row per student (the file's name), one column per task (points earned, hidden tests included),
    then ``total``, ``max`` and ``status`` (``graded``, ``setup problem``, ``not graded``: those have no
    points; their ``max`` is that of the graded students of the same assignment, empty if there are
    none, never a maximum of 0 that a gradebook would divide by). Raises ``ValueError`` if ``results``
    holds no results.json files.
    """
    files = sorted(p for p in Path(results).glob("*.json"))
    if not files:
        raise ValueError(f"no results (*.json) in {results}: grade first, e.g. with --batch --out {results}")
    tasks: list[str] = []
    rows = []
    maxima: dict[str, str] = {}  # assignment -> the max of its graded students
    ungraded: list[tuple[dict[str, str], str]] = []
    for path in files:
        data = json.loads(path.read_text())
        points: dict[str, float] = {}
        for test in data.get("tests", []):
            points[test["number"]] = points.get(test["number"], 0.0) + float(test["score"])
            if test["number"] not in tasks:
                tasks.append(test["number"])
        status = data.get("extra_data", {}).get("status", "graded")
        total = sum(float(t["max_score"]) for t in data.get("tests", []))
        row = {"student": path.stem, **{t: _fmt(p) for t, p in points.items()}}
        row.update(total=_fmt(float(data.get("score", 0))), max=_fmt(total), status=status)
        rows.append(row)
        assignment = str(data.get("extra_data", {}).get("assignment", ""))
        if data.get("tests"):
            maxima[assignment] = row["max"]
        else:
            ungraded.append((row, assignment))
    for row, assignment in ungraded:
        row["max"] = maxima.get(assignment, "")
    tasks.sort(key=lambda t: [int(x) for x in t[1:].split(".")])
    with open(csv_path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["student", *tasks, "total", "max", "status"], restval="")
        writer.writeheader()
        writer.writerows(rows)
    return rows


def _points(report: GradeReport) -> str:
    if report.exit_code > 1:
        return f"{report.status}: {report.problem}"
    return f"{_fmt(report.score)}/{_fmt(report.max_score)}"


def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:.2f}"
