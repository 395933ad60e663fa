"""``grade``: run an assignment's tests against a student's minidist and score them per task.

The tests run in a child ``python -m pytest`` whose ``PYTHONPATH`` starts with the submission, from an
empty working directory, so ``import minidist`` finds the student's package, not this one (checked:
the grader refuses to go on if the child imports minidist from anywhere else). A small pytest plugin
(``lessons/assignments/conftest.py``) appends one JSON line per test event to a report file while the
run goes on. The grader watches that file: a test that runs longer than the assignment's ``timeout``
is a hang; the grader kills the child's whole process group (MPI ranks included), scores that test 0
with "timed out", and starts a fresh child for the tests that had not run yet. So a deadlock costs the
points of one test and ``timeout`` seconds, never the grader.
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from minidist.assignments import layout, tasks
from minidist.assignments.tasks import Task, TestSpec

STARTUP_LIMIT_S = 120.0  # from starting the child to its first test: imports and collection


@dataclass
class TestResult:
    """One test's outcome: passed or not, and why not in plain words."""

    spec: TestSpec
    passed: bool
    message: str = ""  # the failure in plain words, "" when passed
    seconds: float = 0.0

    @property
    def hint(self) -> str:
        """The task file's hint, for a wrong answer only: not for code not written yet, nor a broken rule."""
        unhelpful = self.message.startswith("not implemented yet") or "'Not allowed'" in self.message
        return "" if self.passed or unhelpful else self.spec.hint


@dataclass
class TaskResult:
    """A task's tests and their outcomes; its points are the passed tests' points."""

    task: Task
    results: list[TestResult]

    @property
    def points(self) -> float:
        """Points earned: the sum over passed tests."""
        return sum(r.spec.points for r in self.results if r.passed)

    @property
    def max_points(self) -> float:
        """Points available: the sum over all of the task's tests."""
        return sum(r.spec.points for r in self.results)

    @property
    def feedback(self) -> str:
        """The first failure, explained, with its hint; "all tests pass" otherwise."""
        for r in self.results:
            if not r.passed:
                hint = f" Hint: {r.hint}" if r.hint else ""
                return f"{r.spec.label}: {r.message}{hint}"
        return "all tests pass"


@dataclass
class GradeReport:
    """The grade of one submission: per-task results, the table, Gradescope's results.json."""

    assignment: tasks.Assignment
    path: Path
    tasks: list[TaskResult]
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def score(self) -> float:
        """Points earned over all tasks."""
        return sum(t.points for t in self.tasks)

    @property
    def max_score(self) -> float:
        """Points available over all tasks."""
        return sum(t.max_points for t in self.tasks)

    def points_of(self, task_id: str) -> float:
        """Points earned in task ``task_id`` (e.g. ``"A2.1"``); StopIteration if there is none."""
        return next(t.points for t in self.tasks if t.task.id == task_id)

    def feedback_of(self, task_id: str) -> str:
        """The plain-word feedback of task ``task_id`` (its first failure; "" when all passed)."""
        return next(t.feedback for t in self.tasks if t.task.id == task_id)

    def table(self) -> str:
        """The per-task table printed by ``python -m minidist.assignments grade``."""
        width = max([len(t.task.name) for t in self.tasks] + [4])
        lines = [f"{self.assignment.title}  (code at {self.path})", ""]
        lines.append(f"{'task':<6} {'name':<{width}} {'points':>9}  feedback")
        for t in self.tasks:
            score = f"{_num(t.points)}/{_num(t.max_points)}"
            lines.append(f"{t.task.id:<6} {t.task.name:<{width}} {score:>9}  {t.feedback}")
        total = f"{_num(self.score)}/{_num(self.max_score)}"
        lines.append(f"{'total':<6} {'':<{width}} {total:>9}  ({self.seconds:.0f} s)")
        return "\n".join(lines + [f"note: {n}" for n in self.notes])

    def gradescope(self) -> dict[str, Any]:
        """Gradescope's results.json: one entry per test, hidden ones visible after publishing."""
        entries = []
        for t in self.tasks:
            for r in t.results:
                output = "passed" if r.passed else r.message + (f"\nHint: {r.hint}" if r.hint else "")
                entries.append(
                    {
                        "name": f"{t.task.id} {t.task.name}: {r.spec.label}",
                        "number": t.task.id,
                        "score": r.spec.points if r.passed else 0,
                        "max_score": r.spec.points,
                        "output": output,
                        "visibility": "after_published" if r.spec.hidden else "visible",
                    }
                )
        return {
            "score": self.score,
            "output": self.table(),
            "execution_time": round(self.seconds, 1),
            "stdout_visibility": "hidden",
            "tests": entries,
        }

    def write_results(self, path: Path | str) -> None:
        """Write :meth:`gradescope` as JSON to ``path`` (Gradescope reads ``results/results.json``)."""
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(self.gradescope(), indent=2) + "\n")


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:.1f}"


def grade(
    assignment: str,
    path: Path | str | None = None,
    only_tasks: list[str] | None = None,
    include_hidden: bool = True,
    timeout: float | None = None,
    root: Path | None = None,
) -> GradeReport:
    """Run ``assignment``'s tests against the minidist at ``path`` (default: this reference).

    Args:
        only_tasks: grade just these task ids (e.g. ``["A2.1"]``); default all.
        include_hidden: also run ``hidden/`` tests when this tree has them.
        timeout: seconds one test may run before it counts as a hang (default: the task file's).
        root: the tree whose ``lessons/assignments`` holds the tests (default: the grader's own).

    Raises ``ValueError`` for an unknown assignment or task id, or no minidist at ``path``;
    ``RuntimeError`` if the child process imports minidist from somewhere other than ``path``.
    """
    started = time.monotonic()
    folder = layout.assignment_dir(assignment, root)
    spec = tasks.load(folder, include_hidden)
    code = layout.package_root(path if path is not None else layout.REPO_ROOT)
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

    with tempfile.TemporaryDirectory(prefix="minidist-grade-") as tmp:
        env = _child_env(code, limit, Path(tmp))
        import_error = _check_import(code, env, Path(tmp))
        all_specs = [s for t in chosen for s in t.tests]
        if import_error:
            outcome = {
                s: TestResult(s, False, f"your minidist does not import: {import_error}") for s in all_specs
            }
        else:
            outcome = _run_tests(all_specs, folder, limit, env, Path(tmp))
    report = GradeReport(spec, code, [TaskResult(t, [outcome[s] for s in t.tests]) for t in chosen], notes)
    report.seconds = time.monotonic() - started
    return report


def _child_env(code: Path, limit: float, tmp: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(code), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.update(
        {
            "MINIDIST_GRADE_PATH": str(code),
            "MINIDIST_GRADE_TIMEOUT": str(limit),
            "OMP_NUM_THREADS": "1",
            "OPENBLAS_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
            "PYTHONDONTWRITEBYTECODE": "1",  # leave no __pycache__ in a student's folder
            "HYPOTHESIS_STORAGE_DIRECTORY": str(tmp / "hypothesis"),
        }
    )
    return env


def _check_import(code: Path, env: dict[str, str], cwd: Path) -> str:
    """ "" if the child imports minidist from ``code``; the error line if the import fails.

    Raises ``RuntimeError`` if it imports another minidist (e.g. an installed copy shadows it).
    """
    probe = "import minidist, sys; sys.stdout.write(minidist.__file__)"
    proc = subprocess.run(
        [sys.executable, "-c", probe],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=STARTUP_LIMIT_S,
    )
    if proc.returncode != 0:
        return last_error_line(proc.stderr) or proc.stderr.strip()[-300:]
    found = Path(proc.stdout.strip()).resolve()
    if not found.is_relative_to(code):
        raise RuntimeError(
            f"the grading process imports minidist from {found}, not from {code}: another copy shadows the "
            "submission (a .pth file or a PYTHONPATH entry?); fix the environment before grading"
        )
    return ""


def _run_tests(specs: list[TestSpec], folder: Path, limit: float, env: dict, tmp: Path) -> dict:
    """Run every spec's test; restart the child after a hang. Returns spec -> TestResult."""
    base = folder.parent  # the pytest rootdir: lessons/assignments
    key = {s: f"{folder.name}/{s.file}::{s.name}" for s in specs}
    records: dict[str, list[dict]] = {k: [] for k in key.values()}
    collect_errors: dict[str, str] = {}
    pending = list(dict.fromkeys(key.values()))
    round_no = 0
    fallback = ""
    while pending:
        round_no += 1
        report = tmp / f"report{round_no}.jsonl"
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", str(base / "pytest.ini")]
        cmd += ["--rootdir", str(base), "--import-mode=importlib", *(str(base / k) for k in pending)]
        events, hung, output = _watch(cmd, {**env, "MINIDIST_GRADE_REPORT": str(report)}, tmp, limit)
        for e in events:
            if e["event"] == "result":
                records.setdefault(e["nodeid"].split("[")[0], []).append(e)
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
    results = {}
    for s in specs:
        recs = records[key[s]]
        results[s] = _judge(s, recs, collect_errors.get(f"{folder.name}/{s.file}"), fallback)
    return results


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


_ERROR_LINE = re.compile(r"^(?:E\s+)?((?:[\w.]+\.)?\w*(?:Error|Exception|Interrupt)\b.*)$")


def last_error_line(text: str) -> str:
    """The last ``SomeError: message`` line of a traceback (``""`` if none)."""
    found = ""
    for line in text.splitlines():
        match = _ERROR_LINE.match(line.strip())
        if match:
            found = match.group(1)
    return found


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
