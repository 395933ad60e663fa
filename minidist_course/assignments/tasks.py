"""Task files: which tests belong to which task, and how many points each is worth.

``lessons/assignments/A2/tasks.toml`` lists the tasks and the public tests; ``A2/hidden/tasks.toml``
(instructors only, never released) lists the hidden tests in the same format::

    title = "A2: ring collectives"
    timeout = 40                      # seconds one test may run before it counts as a hang

    [[task]]
    id = "A2.1"
    name = "ring reduce-scatter"

    [[test]]
    task = "A2.1"
    file = "public/test_a2_ring.py"   # relative to the assignment folder
    name = "test_reduce_scatter"      # a test function (all its parametrizations must pass)
    points = 3
    hint = "which chunk does rank r hold after step s?"   # a question, shown with a wrong answer
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    try:
        import tomli as tomllib  # type: ignore[no-redef]
    except ModuleNotFoundError:
        tomllib = None  # type: ignore[assignment]


@dataclass(frozen=True)
class TestSpec:
    """One graded test: its task, file, pytest name, points and whether it is hidden."""

    task: str
    file: str  # relative to the assignment folder
    name: str
    points: float
    hint: str
    hidden: bool

    @property
    def label(self) -> str:
        """The test's name as the grade table shows it."""
        return f"{self.name}{' (hidden)' if self.hidden else ''}"


@dataclass
class Task:
    """A numbered task (``"A2.1"``) and the tests that grade it."""

    id: str
    name: str
    tests: list[TestSpec] = field(default_factory=list)

    @property
    def max_points(self) -> float:
        """Points available: the sum over the task's tests."""
        return sum(t.points for t in self.tests)


@dataclass
class Assignment:
    """An assignment read from its ``tasks.toml``: title, folder, per-test timeout (s) and tasks."""

    name: str  # "A2"
    title: str
    folder: Path
    timeout: float
    tasks: list[Task]
    hidden_available: bool


def _read(path: Path) -> dict:
    if tomllib is None:
        raise RuntimeError("reading task files needs Python >= 3.11 or `pip install tomli`")
    try:
        return tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"{path}: {e}") from None


def load(folder: Path, include_hidden: bool = True) -> Assignment:
    """Read ``folder/tasks.toml`` and, if present and wanted, ``folder/hidden/tasks.toml``.

    Raises ``ValueError`` naming the file for a test of an unknown task, a missing field, a test file
    that does not exist, or a task without any test.
    """
    main_file = folder / "tasks.toml"
    data = _read(main_file)
    tasks = {}
    for entry in data.get("task", []):
        try:
            tasks[entry["id"]] = Task(entry["id"], entry["name"])
        except KeyError as e:
            raise ValueError(f"{main_file}: a [[task]] lacks the field {e}") from None
    sources = [(main_file, data.get("test", []), False)]
    hidden_file = folder / "hidden" / "tasks.toml"
    if include_hidden and hidden_file.exists():
        sources.append((hidden_file, _read(hidden_file).get("test", []), True))
    for path, entries, hidden in sources:
        for entry in entries:
            try:
                spec = TestSpec(
                    entry["task"],
                    entry["file"],
                    entry["name"],
                    float(entry["points"]),
                    entry.get("hint", ""),
                    hidden,
                )
            except KeyError as e:
                raise ValueError(f"{path}: a [[test]] lacks the field {e}") from None
            if spec.task not in tasks:
                raise ValueError(
                    f"{path}: test {spec.name} names task {spec.task}, not listed in {main_file}"
                )
            if not (folder / spec.file).exists():
                raise ValueError(f"{path}: test file {spec.file} of {spec.name} does not exist in {folder}")
            tasks[spec.task].tests.append(spec)
    for task in tasks.values():
        if not task.tests:
            raise ValueError(f"{main_file}: task {task.id} has no test")
    return Assignment(
        folder.name,
        data.get("title", folder.name),
        folder,
        float(data.get("timeout", 60)),
        list(tasks.values()),
        hidden_file.exists(),
    )
