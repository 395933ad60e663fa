"""Where things live: the reference repository, the assignment folders, the files that carry markers."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]  # .../minidist_course/assignments/layout.py
PACKAGE_DIR = REPO_ROOT / "minidist"  # the framework: the package whose files hold the solution regions
# What a student copy holds to install and grade: the framework, and the tools, course and command
# around it (the grader is `minidist assignments grade`; none of these three holds a solution region).
PACKAGES = ("minidist", "minidist_tools", "minidist_course", "minidist_cli")


def assignments_dir(root: Path | None = None) -> Path:
    """``<root>/lessons/assignments``: handouts, task files and tests."""
    return (root if root is not None else REPO_ROOT) / "lessons" / "assignments"


def available(root: Path | None = None) -> list[str]:
    """The assignments that have a task file, in order (``["A1", "A2", ...]``)."""
    base = assignments_dir(root)
    names = [p.parent.name for p in base.glob("A*/tasks.toml") if re.fullmatch(r"A\d+", p.parent.name)]
    return sorted(names, key=lambda a: int(a[1:]))


def assignment_dir(assignment: str, root: Path | None = None) -> Path:
    """The folder of ``assignment``; raises ``ValueError`` listing the known ones if there is none."""
    path = assignments_dir(root) / assignment
    if not (path / "tasks.toml").exists():
        known = ", ".join(available(root)) or "none"
        raise ValueError(f"no assignment {assignment!r} in {assignments_dir(root)} (available: {known})")
    return path


def marked_files(package: Path) -> Iterator[Path]:
    """Every ``.py`` file of ``package`` (the framework's folder), each of which may hold solution markers."""
    for path in package.rglob("*.py"):
        if "__pycache__" not in path.parts:
            yield path


def package_root(path: Path | str) -> Path:
    """The folder to put on ``PYTHONPATH`` for a submission at ``path``.

    ``path`` may be the folder that contains ``minidist/`` (a repository or a released copy) or the
    ``minidist`` package folder itself. Raises ``ValueError`` if neither holds a ``minidist`` package.
    """
    path = Path(path).resolve()
    if (path / "minidist" / "__init__.py").exists():
        return path
    if path.name == "minidist" and (path / "__init__.py").exists():
        return path.parent
    raise ValueError(
        f"no minidist package at {path}: pass the folder that contains minidist/ (e.g. a released copy)"
    )
