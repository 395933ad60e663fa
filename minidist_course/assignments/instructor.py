"""What an instructor keeps out of the repository: their own hidden tests, and the Gradescope autograder.

Everything in this repository is public, its hidden tests and reference solutions included: a student
can clone it. An instructor who wants tests students have not seen keeps them in a folder of their own,
outside any repository students can read, laid out as ``lessons/assignments/A2/hidden/`` is (a
``tasks.toml`` whose ``[[test]]`` entries name files ``hidden/test_*.py``, and those files), and passes
it to the grader: ``minidist assignments grade A2 --hidden DIR`` grades with DIR's tests *instead of*
the repository's hidden ones (which students may have read). ``minidist assignments release A2
--gradescope OUT [--hidden DIR]`` writes a Gradescope autograder (``setup.sh``, ``run_autograder`` and
the grader's tree, DIR's tests in place of the hidden ones); it holds the solutions, so it is uploaded to
Gradescope and never handed to students.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from minidist_course.assignments import layout

_IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", ".pytest_cache", ".hypothesis")
_SUPPORT_FILES = ("conftest.py", "gradelib.py", "pytest.ini", "rules.py")


def check_hidden_dir(hidden: Path) -> Path:
    """``hidden`` resolved; raises ``ValueError`` unless it is a folder holding a ``tasks.toml``."""
    hidden = Path(hidden).resolve()
    if not (hidden / "tasks.toml").is_file():
        raise ValueError(
            f"--hidden {hidden}: no tasks.toml there; lay the folder out as lessons/assignments/A2/hidden/ "
            "is (a tasks.toml whose tests name files hidden/test_*.py, and those files)"
        )
    return hidden


def with_hidden(folder: Path, hidden: Path, dest: Path) -> Path:
    """A copy of assignment ``folder`` (with the shared test support beside it) under ``dest``, whose
    ``hidden/`` is the instructor's folder ``hidden`` instead of the repository's; returns the copy's
    assignment folder (``dest/assignments/A2``)."""
    hidden = check_hidden_dir(hidden)
    base = dest / "assignments"
    base.mkdir(parents=True)
    for name in _SUPPORT_FILES:
        shutil.copy2(folder.parent / name, base / name)
    copy = base / folder.name
    shutil.copytree(folder, copy, ignore=shutil.ignore_patterns("hidden", "__pycache__", "*.pyc"))
    shutil.copytree(hidden, copy / "hidden", ignore=_IGNORE)
    return copy


SETUP_SH = """#!/usr/bin/env bash
# Gradescope runs this once when it builds the autograder image (Ubuntu): Python and the grader's tree.
# The mpich wheel that minidist depends on brings MPI itself, so no system MPI is needed.
set -euo pipefail
apt-get update && apt-get install -y python3 python3-pip python3-venv
python3 -m venv /autograder/venv
/autograder/venv/bin/pip install -e "/autograder/source/grader[grade]"
"""

RUN_AUTOGRADER = """#!/usr/bin/env bash
# Gradescope runs this for every submission: the student's files are in /autograder/submission (a copy
# of their folder, or just the files they changed), and the grade goes to
# /autograder/results/results.json. Hidden tests are after_published there: students see them once the
# grades are published. AUTOGRADER_ROOT and PYTHON let a test run it outside Gradescope.
ROOT="${{AUTOGRADER_ROOT:-/autograder}}"
PYTHON="${{PYTHON:-$ROOT/venv/bin/python}}"
export PYTHONPATH="$ROOT/source/grader${{PYTHONPATH:+:$PYTHONPATH}}"
cd "$ROOT/source/grader"  # python -m puts the working folder first: let it be the grader's own tree
mkdir -p "$ROOT/results"
# || true: every outcome writes results.json and says there what happened; Gradescope reads that file,
# not this script's exit code.
"$PYTHON" -m minidist_course.assignments grade {assignment} --path "$ROOT/submission" \\
    --results "$ROOT/results/results.json" || true
"""


def write_gradescope(assignment: str, out: Path, hidden: Path | None = None) -> list[Path]:
    """Write Gradescope's autograder for ``assignment`` into ``out`` (a new or empty folder): the
    scripts, and ``grader/``, this tree as the grader needs it (the framework with its solutions, which
    single-file uploads are placed into, the assignment's tests, hidden ones included, or ``hidden``'s
    tests in their place). Returns the files written at the top (zip ``out``'s contents and upload)."""
    out = Path(out).resolve()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"--gradescope {out}: give a new or empty folder")
    folder = layout.assignment_dir(assignment)
    root = layout.REPO_ROOT
    if out.is_relative_to(root):
        raise ValueError(f"--gradescope {out}: write the autograder outside the repository")
    grader = out / "grader"
    for name in layout.PACKAGES:
        shutil.copytree(root / name, grader / name, ignore=_IGNORE)
    for name in ("pyproject.toml", "LICENSE", "README.md"):
        if (root / name).exists():
            shutil.copy2(root / name, grader / name)
    base = grader / "lessons" / "assignments"
    base.mkdir(parents=True)
    for name in _SUPPORT_FILES:
        shutil.copy2(folder.parent / name, base / name)
    shutil.copytree(folder, base / assignment, ignore=_IGNORE)
    if hidden is not None:
        shutil.rmtree(base / assignment / "hidden", ignore_errors=True)
        shutil.copytree(check_hidden_dir(hidden), base / assignment / "hidden", ignore=_IGNORE)
    written = []
    for name, text in (
        ("setup.sh", SETUP_SH),
        ("run_autograder", RUN_AUTOGRADER.format(assignment=assignment)),
    ):
        (out / name).write_text(text)
        (out / name).chmod(0o755)
        written.append(out / name)
    return written
