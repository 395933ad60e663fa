"""Where a submission's code is: a whole copy, or files uploaded on their own and placed into a release.

Three shapes of submission, all graded the same way:

* a folder that contains ``minidist/`` (a student's released copy), possibly a few folders down (an
  uploaded starter folder), or the ``minidist`` folder itself;
* one file, e.g. ``ring.py`` for A2 (the usual Gradescope upload: ``/autograder/submission/ring.py``);
* a folder of such files without a ``minidist`` package.

Loose files are placed into a fresh copy of the assignment's release (``release.py``: this assignment's
and later solutions blanked, earlier ones kept), each at the place of the assignment's file with the
same name: ``ring.py`` replaces ``minidist/distributed/algorithms/ring.py``. Only files that hold the
assignment's solution regions can be placed (``minidist assignments list`` names them); a name that is
not one of them, or that two of them share, is :class:`NotPlaceable`, and the grader writes a
results.json that says so instead of a grade. Files other than ``.py`` (a README, notes) are ignored.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from minidist_course.assignments import layout
from minidist_course.assignments.markers import regions_in
from minidist_course.assignments.release import release


class NotPlaceable(ValueError):
    """The submission holds no minidist package and its files cannot be placed into a release."""


@dataclass
class Placed:
    """The folder to grade (it contains ``minidist/``) and, for loose files, where each one went."""

    code: Path
    note: str = ""


def place(assignment: str, path: Path | str, workdir: Path, root: Path | None = None) -> Placed:
    """The code to grade for the submission at ``path``; loose files go into a release in ``workdir``.

    Raises :class:`NotPlaceable` (a ``ValueError``) for a missing path, a folder without any ``.py``
    file, or a file whose name is not exactly one of the assignment's files.
    """
    path = Path(path).resolve()
    if not path.exists():
        raise NotPlaceable(f"the submission {path} does not exist")
    try:
        return Placed(layout.package_root(path))
    except ValueError:
        pass  # not a copy of minidist at the top: maybe one folder down (a zipped starter folder)
    nested = [p.parent.parent for p in path.rglob("minidist/__init__.py")] if path.is_dir() else []
    if len(nested) == 1:
        return Placed(nested[0], f"graded the copy of minidist found in {nested[0]}")
    if len(nested) > 1:
        raise NotPlaceable(f"{path} holds {len(nested)} copies of minidist/: keep only the one to grade")
    files = [path] if path.is_file() else sorted(path.rglob("*.py"))
    files = [p for p in files if "__pycache__" not in p.parts]
    if not files:
        raise NotPlaceable(
            f"{path} holds neither a minidist/ folder nor a .py file: upload your copy's folder or the "
            f"files you changed ({', '.join(_targets(assignment, root))})"
        )
    targets = _targets(assignment, root)
    moves = {f: _target_of(f, path, targets) for f in files}
    out = workdir / "release"
    release(assignment, out, root)
    for source, target in moves.items():
        shutil.copyfile(source, out / target)
    note = ", ".join(f"{s.name} -> {t}" for s, t in moves.items())
    return Placed(out, f"placed into a fresh copy of the {assignment} release: {note}")


def _targets(assignment: str, root: Path | None) -> list[str]:
    """The assignment's files (holding its solution regions), relative to the tree: where uploads go."""
    root = root if root is not None else layout.REPO_ROOT
    regions = regions_in(layout.marked_files(root / "minidist"), root)
    found = sorted({str(r.path) for r in regions if r.assignment == assignment})
    if not found:
        raise NotPlaceable(
            f"no file of {assignment} to place an upload into in {root}: single files are graded from "
            "the instructor's tree (the one with the solutions), not from a student release"
        )
    return found


def _target_of(file: Path, base: Path, targets: list[str]) -> str:
    """The one target whose path ends with ``file``'s path below ``base`` (its name, for a lone file)."""
    relative = file.name if file == base else str(file.relative_to(base))
    parts = Path(relative).parts
    matches = [t for t in targets if Path(t).parts[-len(parts) :] == parts]
    if not matches:  # an upload folder may nest the file differently from the package: by name alone
        matches = [t for t in targets if Path(t).name == file.name]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise NotPlaceable(
            f"{relative} is not one of this assignment's files ({', '.join(Path(t).name for t in targets)}); "
            "upload the file you changed under its own name, or your copy's whole folder"
        )
    raise NotPlaceable(
        f"{relative} could be any of {', '.join(matches)}: upload your copy's whole folder (or the file "
        "inside its folders, e.g. minidist/.../name.py) so that its place is clear"
    )
