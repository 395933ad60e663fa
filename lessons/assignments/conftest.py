"""Shared pytest setup for every assignment's tests (public and hidden).

* puts ``gradelib`` (this folder) on ``sys.path`` for the tests and their MPI workers;
* a deterministic hypothesis profile (the same examples for every student, no example database,
  no shrinking);
* refuses to run when the grader said which minidist to test (``MINIDIST_GRADE_PATH``) and another one
  was imported (an installed copy shadowing the submission would grade the wrong code);
* a test that fails on an untouched stub (``NotImplementedError("A2.1: ...")``) reports "not implemented
  yet" and the handout's task, and the grader then shows no hint (see ``_not_written``);
* when ``MINIDIST_GRADE_REPORT`` names a file, appends one JSON line per test event to it as the run
  goes, so the grader knows which test is running (to time out a hang) and what failed, even if it has
  to kill this process.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, settings

sys.path.insert(0, str(Path(__file__).parent))

settings.register_profile(
    "grade",
    max_examples=10,
    deadline=None,
    derandomize=True,
    database=None,
    # No shrinking: a failing example is reported as drawn. Shrinking re-runs the test many times, and
    # each run of an MPI test launches ranks: minutes for one failing student test.
    phases=(Phase.explicit, Phase.generate),
    suppress_health_check=list(HealthCheck),
)
settings.load_profile("grade")


def pytest_configure(config: pytest.Config) -> None:
    expected = os.environ.get("MINIDIST_GRADE_PATH")
    if expected:
        import minidist

        found = Path(minidist.__file__).resolve()
        if not found.is_relative_to(Path(expected).resolve()):
            raise pytest.UsageError(
                f"testing the minidist at {found}, but the grader asked for {expected}: fix PYTHONPATH"
            )


def _emit(event: dict) -> None:
    path = os.environ.get("MINIDIST_GRADE_REPORT")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(event) + "\n")


_NOT_WRITTEN = re.compile(r"NotImplementedError\W*(A\d+\.\d+)")


def _message(report: pytest.TestReport | pytest.CollectReport) -> str:
    if report.skipped and isinstance(report.longrepr, tuple):
        return str(report.longrepr[2])
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        return _not_written(crash.message)
    text = str(report.longrepr)
    errors = [
        line.lstrip("E ").strip() for line in text.splitlines() if "Error" in line or "Exception" in line
    ]
    return _not_written(errors[-1] if errors else text[-500:])


def _not_written(message: str) -> str:
    """An untouched stub's failure says so and points to the handout; the grader adds no algorithm hint.

    A student who has not started a task needs to know where to start, not how the algorithm works:
    hints are for wrong answers (the grader leaves them out for a message starting "not implemented").
    """
    found = _NOT_WRITTEN.search(message)
    if not found:
        return message
    task = found.group(1)
    return (
        f"not implemented yet ({message}). The handout (README.md, section 'Tasks', {task}) says what "
        "the code in that NotImplementedError region must do."
    )


def pytest_runtest_logstart(nodeid: str, location: tuple) -> None:
    _emit({"event": "start", "nodeid": nodeid, "time": time.time()})


def pytest_runtest_logfinish(nodeid: str, location: tuple) -> None:
    _emit({"event": "finish", "nodeid": nodeid, "time": time.time()})


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "call" or not report.passed:
        outcome = report.outcome
        message = "" if report.passed else _message(report)
        _emit(
            {
                "event": "result",
                "nodeid": report.nodeid,
                "when": report.when,
                "outcome": outcome,
                "message": message,
                "seconds": report.duration,
            }
        )


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if report.failed:
        _emit({"event": "collect_error", "nodeid": report.nodeid, "message": _message(report)})
