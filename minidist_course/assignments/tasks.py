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

A test may be graded by property instead of all or nothing: its ``[[test.part]]`` entries (``name``,
``points``, ``hint``) score separately, and the test's points are their sum (a ``points`` field, if
given, must equal it). The test marks each property with ``gradelib.parts()`` (``with part("dx"):
...``); a part scores when it was checked and never failed, and the hint shown is the failed part's::

    [[test]]
    task = "A8.1"
    file = "public/test_a8_transformer.py"
    name = "test_layer_norm_backward"
    hint = "..."                       # shown when the test fails outside every part (a crash)
    [[test.part]]
    name = "dx"
    points = 2
    hint = "does your dx follow all three paths from x to y?"
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
class PartSpec:
    """One property of a test that scores on its own: its name (as the test marks it), points, hint."""

    name: str
    points: float
    hint: str


@dataclass(frozen=True)
class TestSpec:
    """One graded test: its task, file, pytest name, points, whether it is hidden, and the parts that
    score separately (empty: all or nothing)."""

    task: str
    file: str  # relative to the assignment folder
    name: str
    points: float
    hint: str
    hidden: bool
    parts: tuple[PartSpec, ...] = ()

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
                parts = tuple(
                    PartSpec(p["name"], float(p["points"]), p.get("hint", "")) for p in entry.get("part", [])
                )
                total = sum(p.points for p in parts)
                points = float(entry["points"]) if "points" in entry or not parts else total
                spec = TestSpec(
                    entry["task"], entry["file"], entry["name"], points, entry.get("hint", ""), hidden, parts
                )
            except KeyError as e:
                raise ValueError(f"{path}: a [[test]] or [[test.part]] lacks the field {e}") from None
            if parts and abs(points - total) > 1e-9:
                raise ValueError(
                    f"{path}: test {spec.name} has points = {points:g} but its parts add up to {total:g}"
                )
            if len({p.name for p in parts}) != len(parts):
                raise ValueError(f"{path}: test {spec.name} names a part twice")
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
