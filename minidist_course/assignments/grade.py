"""``grade``: run an assignment's tests against a student's minidist and score them per task.

The submission is placed first (``submission.py``: a copy of minidist, or files uploaded on their own
and put into a fresh release) and the environment is probed (``environment.py``: a missing pytest is a
setup problem, not a wrong answer). The tests run in a child ``python -m pytest`` whose ``PYTHONPATH``
starts with the submission, from an empty working directory, so ``import minidist`` finds the
student's package, not this one (checked: the grader refuses to go on if the child imports minidist
from anywhere else). A small pytest plugin (``lessons/assignments/conftest.py``) appends one JSON line
per test event to a report file while the run goes on. The grader watches that file: a test that runs
longer than the assignment's ``timeout`` is a hang; the grader kills the child's whole process group
(MPI ranks included), scores that test 0 with "timed out", and starts a fresh child for the tests that
had not run yet. So a deadlock costs the points of one test and ``timeout`` seconds, never the grader.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from minidist_course.assignments import environment, instructor, layout, submission, tasks
from minidist_course.assignments.environment import STARTUP_LIMIT_S, SetupProblem, last_error_line
from minidist_course.assignments.report import (
    NOT_GRADED,
    SETUP_PROBLEM,
    GradeReport,
    TaskResult,
    TestResult,
    ungraded,
)
from minidist_course.assignments.tasks import TestSpec

__all__ = ["GradeReport", "TaskResult", "TestResult", "grade", "last_error_line", "plain"]


def grade(
    assignment: str,
    path: Path | str | None = None,
    only_tasks: list[str] | None = None,
    include_hidden: bool = True,
    timeout: float | None = None,
    root: Path | None = None,
    hidden: Path | str | None = None,
) -> GradeReport:
    """Run ``assignment``'s tests against the submission at ``path`` (default: this reference).

    Args:
        path: a folder containing ``minidist/`` (or that package folder), one ``.py`` file of the
            assignment (e.g. ``ring.py``), or a folder of such files (see ``submission.py``).
        only_tasks: grade just these task ids (e.g. ``["A2.1"]``); default all.
        include_hidden: also run ``hidden/`` tests when this tree has them.
        timeout: seconds one test may run before it counts as a hang (default: the task file's).
        root: the tree whose ``lessons/assignments`` holds the tests (default: the grader's own).
        hidden: the instructor's own hidden tests, a folder laid out as ``A2/hidden/`` (kept outside
            any repository students can read): graded instead of the repository's hidden tests.

    Returns a report whose ``status`` is ``"graded"``, ``"setup problem"`` (the environment lacks e.g.
    pytest: nothing graded, the message names the install command) or ``"not graded"`` (files that
    cannot be placed, no minidist at ``path``).

    Raises ``ValueError`` for an unknown assignment or task id; ``RuntimeError`` if the child process
    imports minidist from somewhere other than the submission.
    """
    if hidden is not None:  # the tests, with the instructor's hidden ones, in a copy of their own
        with tempfile.TemporaryDirectory(prefix="minidist-tests-") as tests:
            folder = instructor.with_hidden(
                layout.assignment_dir(assignment, root), Path(hidden), Path(tests)
            )
            return _grade(assignment, folder, path, only_tasks, include_hidden, timeout, root)
    return _grade(
        assignment, layout.assignment_dir(assignment, root), path, only_tasks, include_hidden, timeout, root
    )


def _grade(
    assignment: str,
    folder: Path,
    path: Path | str | None,
    only_tasks: list[str] | None,
    include_hidden: bool,
    timeout: float | None,
    root: Path | None,
) -> GradeReport:
    started = time.monotonic()
    spec = tasks.load(folder, include_hidden)
    chosen = spec.tasks
    if only_tasks:
        unknown = sorted(set(only_tasks) - {t.id for t in spec.tasks})
        if unknown:
            raise ValueError(
                f"unknown task(s) {unknown} for {assignment}: choose from {[t.id for t in spec.tasks]}"
            )
        chosen = [t for t in spec.tasks if t.id in only_tasks]
    limit = float(timeout if timeout is not None else spec.timeout)
    notes = []
    if not include_hidden or not spec.hidden_available:
        notes.append("public tests only (hidden tests are not in this copy, or were not asked for)")
    shown = Path(path if path is not None else layout.REPO_ROOT).resolve()

    with tempfile.TemporaryDirectory(prefix="minidist-grade-") as tmp:
        try:
            placed = submission.place(assignment, shown, Path(tmp), root)
        except submission.NotPlaceable as e:
            return ungraded(spec, shown, NOT_GRADED, str(e))
        notes += [placed.note] if placed.note else []
        env = environment.child_env(placed.code, limit, Path(tmp))
        all_specs = [s for t in chosen for s in t.tests]
        try:
            import_error = environment.check(placed.code, env, Path(tmp), (folder / "workers").is_dir())
            if import_error:
                message = f"your minidist does not import: {import_error}"
                outcome = {s: TestResult(s, False, message) for s in all_specs}
            else:
                outcome = _run_tests(all_specs, folder, limit, env, Path(tmp))
        except SetupProblem as e:
            return ungraded(spec, shown, SETUP_PROBLEM, str(e))
    report = GradeReport(spec, shown, [TaskResult(t, [outcome[s] for s in t.tests]) for t in chosen], notes)
    report.seconds = time.monotonic() - started
    return report


def _run_tests(specs: list[TestSpec], folder: Path, limit: float, env: dict, tmp: Path) -> dict:
    """Run every spec's test; restart the child after a hang. Returns spec -> TestResult."""
    base = folder.parent  # the pytest rootdir: lessons/assignments
    key = {s: f"{folder.name}/{s.file}::{s.name}" for s in specs}
    records: dict[str, list[dict]] = {k: [] for k in key.values()}
    collect_errors: dict[str, str] = {}
    parts: dict[str, list[dict]] = {}  # nodeid -> the part events of a test graded by property
    pending = list(dict.fromkeys(key.values()))
    round_no = 0
    fallback = ""
    while pending:
        round_no += 1
        report = tmp / f"report{round_no}.jsonl"
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", str(base / "pytest.ini")]
        cmd += [arg for plugin in environment.CHILD_PLUGINS for arg in ("-p", plugin)]
        cmd += ["--rootdir", str(base), "--import-mode=importlib", *(str(base / k) for k in pending)]
        events, hung, output = _watch(cmd, {**env, "MINIDIST_GRADE_REPORT": str(report)}, tmp, limit)
        for e in events:
            if e["event"] == "result":
                records.setdefault(e["nodeid"].split("[")[0], []).append(e)
            elif e["event"] == "part":
                parts.setdefault(e["nodeid"].split("[")[0], []).append(e)
            elif e["event"] == "collect_error":
                collect_errors[e["nodeid"]] = e["message"]
        started = {e["nodeid"].split("[")[0] for e in events if e["event"] == "start"}
        if hung is not None:
            records[hung.split("[")[0]].append(
                {
                    "outcome": "failed",
                    "message": f"timed out: still running after {limit:.0f} s (a hang, e.g. "
                    "a deadlock where ranks wait for each other, or an endless loop)",
                }  # fmt: skip
            )
            pending = [k for k in pending if k not in started]
            continue
        fallback = last_error_line(output) or output.strip()[-300:]
        break
    if not any(r.get("when") == "call" for recs in records.values() for r in recs):
        # Nothing ran: a missing module of the environment, or pytest itself failing, is a setup
        # problem (no student wrote it); a student's module that fails to import stays a failure.
        problem = environment.problem_in("\n".join([*collect_errors.values(), output]))
        if problem:
            raise SetupProblem(problem)
    results = {}
    for s in specs:
        recs = records[key[s]]
        results[s] = _judge(s, recs, collect_errors.get(f"{folder.name}/{s.file}"), fallback)
        if s.parts and not results[s].passed:
            results[s] = _by_part(results[s], parts.get(key[s], []))
    return results


def _by_part(result: TestResult, events: list[dict]) -> TestResult:
    """A failed test graded by property: each part that was checked (in every parametrization and
    example) and never failed earns its points; the message and hint are those of the part the test
    found wrong first (tests check the telling properties before the values)."""
    failed: dict[str, str] = {}  # part -> its first failure, in the order the test found them
    for e in events:
        if not e["passed"]:
            failed.setdefault(e["part"], e["message"])
    checked = {e["part"] for e in events}
    passing = [p for p in result.spec.parts if p.name in checked and p.name not in failed]
    result.partial = sum(p.points for p in passing)
    by_name = {p.name: p for p in result.spec.parts}
    first = next((by_name[name] for name in failed if name in by_name), None)
    if first is not None:
        result.part_hint = first.hint
        kept = f" (passing: {', '.join(p.name for p in passing)})" if passing else ""
        result.message = f"{first.name}: {plain(failed[first.name])}{kept}"
    return result


def _judge(spec: TestSpec, recs: list[dict], collect_error: str | None, fallback: str) -> TestResult:
    seconds = sum(r.get("seconds", 0.0) for r in recs)
    failed = [r for r in recs if r["outcome"] != "passed"]
    if failed:
        r = failed[0]
        prefix = "skipped: " if r["outcome"] == "skipped" else ""
        return TestResult(spec, False, prefix + plain(r["message"]), seconds)
    if any(r.get("when") == "call" for r in recs):
        return TestResult(spec, True, "", seconds)
    why = collect_error or fallback or "the test did not run"
    return TestResult(spec, False, "could not run the test: " + plain(why), seconds)


def _watch(cmd: list[str], env: dict, cwd: Path, limit: float) -> tuple[list[dict], str | None, str]:
    """Run ``cmd``; kill it when one test exceeds ``limit`` s. Returns (events, hung nodeid, output)."""
    report = Path(env["MINIDIST_GRADE_REPORT"])
    log = cwd / (report.stem + ".log")
    with open(log, "w") as out:
        proc = subprocess.Popen(
            cmd, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        t0 = time.monotonic()
        current, since, hung = None, t0, None
        while proc.poll() is None:
            time.sleep(0.05)
            events = _read_events(report)
            running = _running(events)
            if running != current:
                current, since = running, time.monotonic()
            too_long = limit if current is not None else STARTUP_LIMIT_S
            if time.monotonic() - since > too_long:
                hung = current or "startup"
                _kill(proc)
                break
    return _read_events(report), (hung if hung != "startup" else None), log.read_text()


def _running(events: list[dict]) -> str | None:
    """The nodeid of the test that has started and not finished (None between tests)."""
    current = None
    for e in events:
        if e["event"] == "start":
            current = e["nodeid"]
        elif e["event"] == "finish" and e["nodeid"] == current:
            current = None
    return current


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # its own session: the MPI ranks it started go too
    except ProcessLookupError:
        pass
    proc.wait()


def _read_events(path: Path) -> list[dict]:
    if not path.exists():
        return []
    events = []
    for line in path.read_text().splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:  # a line being written right now
            break
    return events


def plain(message: str, limit: int = 500) -> str:
    """A failure message trimmed to what a student needs: no pytest assertion rewriting, no traceback."""
    keep = []
    for line in message.strip().splitlines():
        if line.lstrip().startswith(("assert ", "+  where", "+    where", "where ")):
            break
        keep.append(line.rstrip())
    text = " ".join(s.strip() for s in keep if s.strip())
    text = re.sub(r"^AssertionError: ", "", text)
    return text if len(text) <= limit else text[: limit - 3] + "..."
