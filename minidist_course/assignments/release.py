"""``release``: write a student copy of minidist in which an assignment's solutions are stubs.

Rule (documented in ``lessons/assignments/INSTRUCTORS.md``): releasing assignment Ak blanks every region
of Ak *and of every later assignment* (A(k+1), ...), so a student of A2 cannot read the DDP solution of
A3, and keeps the regions of earlier assignments (A1 for an A2 release) as working reference code,
because later assignments build on them (A3's DDP needs a working all-reduce).

The copy holds: the ``minidist`` package (without ``__pycache__``: compiled bytecode would carry the
solutions) and the packages around it that installing and grading need (``layout.PACKAGES``), the
assignment's handout, task file, public tests and workers, the shared test support of
``lessons/assignments`` and the project files needed to ``pip install -e`` it. Never the ``hidden/``
tests, never other assignments' folders.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

from minidist_course.assignments import layout
from minidist_course.assignments.environment import GRADE_EXTRA
from minidist_course.assignments.markers import assignment_number, blank, regions_in

_IGNORE_NAMES = ("__pycache__", "*.pyc", "*.egg-info", ".pytest_cache", ".hypothesis")
# Shared test support in lessons/assignments (rules.py: the workers enforce the handouts' rules with it)
_SUPPORT_FILES = ("conftest.py", "gradelib.py", "pytest.ini", "rules.py")
_PROJECT_FILES = ("pyproject.toml", "LICENSE")  # README.md: written from the handout, see release()
RELEASE_MARK = ".minidist-release"  # written into every release: --force replaces only such folders


@dataclass
class ReleaseReport:
    """Where a release was written and how many solution regions of each task it stubbed."""

    out: Path
    blanked: dict[str, int] = field(default_factory=dict)  # task -> regions replaced

    def summary(self) -> str:
        """One line for the command line: the folder and the tasks stubbed."""
        tasks = ", ".join(f"{t} ({n})" if n > 1 else t for t, n in sorted(self.blanked.items()))
        return f"wrote {self.out}; replaced {sum(self.blanked.values())} solution regions: {tasks}"


def release(assignment: str, out: Path | str, root: Path | None = None, force: bool = False) -> ReleaseReport:
    """Write the student copy of ``assignment`` (e.g. ``"A2"``) into ``out``.

    Args:
        assignment: ``"A<n>"``; must have a folder ``lessons/assignments/A<n>`` with a ``tasks.toml``.
        out: the folder to create; it must not exist or be empty, or hold an earlier release and
            ``force`` be set (then it is replaced).
        root: the reference repository (default: the one this package lives in).

    Raises:
        ValueError: unknown assignment, an assignment without solution regions, a non-empty ``out``
            that is not an earlier release or without ``force``, ``out`` that is a file, is inside the
            reference package or contains the reference tree, or malformed markers.
    """
    root = Path(root) if root is not None else layout.REPO_ROOT
    number = assignment_number(assignment)
    source = layout.assignment_dir(assignment, root)  # raises ValueError listing the assignments
    package = root / "minidist"
    regions = regions_in(layout.marked_files(package), root)
    if not any(r.assignment == assignment for r in regions):
        raise ValueError(
            f"{assignment} has no solution regions in {package}: mark them with "
            f"'# BEGIN SOLUTION {assignment}.1: <what to implement>' ... '# END SOLUTION'"
        )
    out = Path(out).resolve()
    _check_out(out, root.resolve(), force)  # everything is checked before anything is deleted
    if out.exists():
        shutil.rmtree(out)

    report = ReleaseReport(out)
    for name in layout.PACKAGES:
        shutil.copytree(root / name, out / name, ignore=shutil.ignore_patterns(*_IGNORE_NAMES))
    for path in sorted({r.path for r in regions}):
        target = out / path
        text, _ = blank(target.read_text(), lambda r: r.number >= number, path)
        target.write_text(text)
    for r in regions:
        if r.number >= number:
            report.blanked[r.task] = report.blanked.get(r.task, 0) + 1

    lessons = out / "lessons" / "assignments"
    lessons.mkdir(parents=True)
    for name in _SUPPORT_FILES:
        shutil.copy2(source.parent / name, lessons / name)
    shutil.copytree(source, lessons / assignment, ignore=shutil.ignore_patterns("hidden", *_IGNORE_NAMES))
    for name in _PROJECT_FILES:
        if (root / name).exists():
            shutil.copy2(root / name, out / name)
    # The project's README points at tests/ and examples/, which a release leaves out; students get a
    # README that says what this folder is and then the handout (pyproject.toml needs a README.md).
    handout = (source / "README.md").read_text() if (source / "README.md").exists() else ""
    (out / "README.md").write_text(_readme_head(assignment) + handout)
    _check_no_solutions_left(out, number)
    (out / RELEASE_MARK).write_text(f"student release of {assignment}; --force may replace this folder\n")
    return report


def _readme_head(assignment: str) -> str:
    """The release README's first lines, visible (not a comment): the ONE install command grading needs.

    ``pip install -e .`` alone leaves out pytest and hypothesis, and grading then cannot run: the
    ``grade`` extra of pyproject.toml adds them (``environment.GRADE_EXTRA``).
    """
    return (
        f"# minidist starter code for {assignment}\n\n"
        "Install it once, from this folder, in a fresh virtual environment\n"
        "(`python3 -m venv .venv && . .venv/bin/activate`); this one command installs minidist and\n"
        "everything grading needs (`pip install -e .` alone leaves out pytest):\n\n"
        f'    pip install -e ".[{GRADE_EXTRA}]"\n\n'
        "Then grade your work (public tests) from this folder:\n\n"
        f"    minidist assignments grade {assignment}\n\n"
        "---\n\n"
    )


def _check_out(out: Path, root: Path, force: bool) -> None:
    """Refuse an ``--out`` whose replacement could destroy work; raises ``ValueError`` saying why.

    ``--force`` replaces only a folder that an earlier release wrote (it holds :data:`RELEASE_MARK`):
    never the reference tree, a folder that contains it (``--out ~`` would otherwise delete the home
    folder), or any other non-empty folder.
    """
    if out == root or root.is_relative_to(out) or out.is_relative_to(root / "minidist"):
        raise ValueError(
            f"refusing to release into {out}: it is the reference tree {root}, contains it, or is inside "
            "its minidist package; choose a new folder, e.g. --out ../a2-starter"
        )
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file, not a folder; choose a folder name that does not exist")
    if out.exists() and any(out.iterdir()):
        if not (out / RELEASE_MARK).exists():
            raise ValueError(
                f"{out} exists, is not empty and is not an earlier release (no {RELEASE_MARK} in it); "
                "refusing to delete it even with --force: choose a new folder or remove it yourself"
            )
        if not force:
            raise ValueError(f"{out} holds an earlier release; pass --force to replace it")


def _check_no_solutions_left(out: Path, number: int) -> None:
    """A last guard: no region of this or a later assignment survives anywhere in the copy."""
    left = [r for r in regions_in(layout.marked_files(out / "minidist"), out) if r.number >= number]
    if left:
        raise RuntimeError(f"release left solution regions in place: {left[:3]} (a bug in release.py)")
