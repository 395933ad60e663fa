"""What grading one submission produced: per-task points, the printed table, Gradescope's results.json.

A report has a ``status``: ``"graded"`` (the tests ran: points and feedback per task), ``"setup
problem"`` (the grading environment lacks something, e.g. pytest: nothing was graded and no algorithm
hint is given, because none would help) or ``"not graded"`` (the submission could not be placed, e.g. an
uploaded file whose name is not one of the assignment's files). The exit codes of
``minidist assignments grade`` follow from it (:meth:`GradeReport.exit_code`).

Gradescope's format (Autograder Specifications, gradescope-autograders.readthedocs.io/en/latest/specs/,
"Output format" and "Controlling Test Case Visibility"): a test's ``visibility`` is ``visible``,
``after_published``, ``after_due_date`` or ``hidden``; a top-level ``visibility`` applies to every test
that sets none; "if test cases are hidden, students will not be able to see their total score"; the
top-level ``output`` is shown to students and has no visibility of its own, so it may hold only what
students may always see; ``stdout_visibility`` (default hidden) controls the grader's printed output.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from minidist_course.assignments import tasks
from minidist_course.assignments.tasks import Task, TestSpec

GRADED, SETUP_PROBLEM, NOT_GRADED = "graded", "setup problem", "not graded"
# Exit codes of `grade` (documented in INSTRUCTORS.md and --help). pytest's habit: 0 all passed, 1 some
# failed; 2 is argparse's (and our) usage error; 3 and 4 say that nothing was graded, and why.
EXIT_FULL_MARKS, EXIT_POINTS_LOST, EXIT_USAGE, EXIT_SETUP, EXIT_NOT_GRADED = 0, 1, 2, 3, 4
HIDDEN_NOTE = "Hidden tests are graded too; their results appear when your instructor publishes the grades."


@dataclass
class TestResult:
    """One test's outcome: passed or not, and why not in plain words. A test graded by property
    (``spec.parts``) that failed still earns the points of its parts that passed (``partial``), and its
    hint is the first failed part's (``part_hint``)."""

    spec: TestSpec
    passed: bool
    message: str = ""  # the failure in plain words, "" when passed
    seconds: float = 0.0
    partial: float = 0.0  # points of the parts that passed, when the test as a whole did not
    part_hint: str = ""  # the hint of the part that failed first ("": the test's own hint)

    @property
    def earned(self) -> float:
        """Points earned: all of them when the test passed, else those of its passing parts."""
        return self.spec.points if self.passed else self.partial

    @property
    def hint(self) -> str:
        """The task file's hint (the failed part's, for a test graded by property), for a wrong answer
        only: not for code not written yet, a broken rule, or a file that does not compile (the algorithm
        is not what went wrong)."""
        unhelpful = (
            self.message.startswith("not implemented yet")
            or "'Not allowed'" in self.message
            or "the file does not compile" in self.message
        )
        return "" if self.passed or unhelpful else (self.part_hint or self.spec.hint)


@dataclass
class TaskResult:
    """A task's tests and their outcomes; its points are the passed tests' points."""

    task: Task
    results: list[TestResult]

    def only(self, public: bool) -> TaskResult:
        """This task restricted to its public tests (``public=True``) or to all of them."""
        return TaskResult(self.task, [r for r in self.results if not (public and r.spec.hidden)])

    @property
    def points(self) -> float:
        """Points earned: the sum over tests (a test graded by property earns its passing parts' points)."""
        return sum(r.earned for r in self.results)

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
    status: str = GRADED
    problem: str = ""  # for SETUP_PROBLEM / NOT_GRADED: what was wrong and what to do

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

    @property
    def exit_code(self) -> int:
        """0 full marks, 1 graded with points lost, 3 setup problem, 4 submission not graded."""
        if self.status == SETUP_PROBLEM:
            return EXIT_SETUP
        if self.status == NOT_GRADED:
            return EXIT_NOT_GRADED
        return EXIT_FULL_MARKS if self.score == self.max_score else EXIT_POINTS_LOST

    def table(self, public_only: bool = False) -> str:
        """The per-task table printed by ``grade``; ``public_only``: what students may see before
        grades are published (public tests' points and feedback, no hidden name, input or hint)."""
        lines = [f"{self.assignment.title}  (code at {self.path})", ""]
        if self.status != GRADED:
            return "\n".join(lines + [f"{self.status}: {self.problem}"])
        shown = [t.only(public_only) for t in self.tasks]
        width = max([len(t.task.name) for t in shown] + [4])
        lines.append(f"{'task':<6} {'name':<{width}} {'points':>9}  feedback")
        for t in shown:
            score = f"{_num(t.points)}/{_num(t.max_points)}"
            lines.append(f"{t.task.id:<6} {t.task.name:<{width}} {score:>9}  {t.feedback}")
        total = f"{_num(sum(t.points for t in shown))}/{_num(sum(t.max_points for t in shown))}"
        label = "public" if public_only else "total"
        lines.append(f"{label:<6} {'':<{width}} {total:>9}  ({self.seconds:.0f} s)")
        if public_only and any(r.spec.hidden for t in self.tasks for r in t.results):
            lines.append(HIDDEN_NOTE)
        return "\n".join(lines + [f"note: {n}" for n in self.notes])

    def gradescope(self) -> dict[str, Any]:
        """Gradescope's results.json; nothing about a hidden test is visible before publication.

        Public tests are ``visible``, hidden ones ``after_published``; when there are hidden tests the
        top-level ``visibility`` is ``after_published`` too (a test without its own setting stays
        hidden), and the top-level ``output`` is always the public-only table (or the setup problem).
        ``score`` is the total with hidden tests, which Gradescope does not show students while any
        test is hidden; the grader's stdout (the full table) is for instructors (``stdout_visibility:
        hidden``). ``extra_data`` carries the status for the class summary (``summary`` command).
        """
        entries = []
        for t in self.tasks:
            for r in t.results:
                output = "passed" if r.passed else r.message + (f"\nHint: {r.hint}" if r.hint else "")
                entries.append(
                    {
                        "name": f"{t.task.id} {t.task.name}: {r.spec.label}",
                        "number": t.task.id,
                        "score": r.earned,
                        "max_score": r.spec.points,
                        "output": output,
                        "visibility": "after_published" if r.spec.hidden else "visible",
                    }
                )
        any_hidden = any(e["visibility"] != "visible" for e in entries)
        return {
            "score": self.score,
            "output": self.table(public_only=True),
            "visibility": "after_published" if any_hidden else "visible",
            "stdout_visibility": "hidden",
            "execution_time": round(self.seconds, 1),
            "extra_data": {"assignment": self.assignment.name, "status": self.status},
            "tests": entries,
        }

    def write_results(self, path: Path | str) -> None:
        """Write :meth:`gradescope` as JSON to ``path`` (Gradescope reads ``results/results.json``)."""
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(self.gradescope(), indent=2) + "\n")


def ungraded(assignment: tasks.Assignment, path: Path, status: str, problem: str) -> GradeReport:
    """A report for a submission that was not graded (``status`` SETUP_PROBLEM or NOT_GRADED)."""
    return GradeReport(assignment, path, [], status=status, problem=problem)


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:.1f}"
