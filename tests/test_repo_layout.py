"""The repository's own tools see the whole library.

ruff's default ``exclude`` (and pytest's ``norecursedirs``, and the standard Python ``.gitignore``) skip any
folder called ``dist`` at any depth. The collectives package once lived in ``minidist/dist/`` and was never
linted; these tests make sure no library file can fall out of the lint again.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
LIBRARY = REPO / "minidist"
# Folder names that common tools treat as build output and skip (ruff's and pytest's defaults).
TOOL_SKIPPED_NAMES = {"dist", "build", "_build", "node_modules", "site-packages", "venv", ".venv"}


def library_files() -> set[str]:
    return {str(p.relative_to(REPO)) for p in LIBRARY.rglob("*.py") if "__pycache__" not in p.parts}


def test_no_library_folder_has_a_name_that_tools_skip():
    bad = [
        str(p.relative_to(REPO)) for p in LIBRARY.rglob("*") if p.is_dir() and p.name in TOOL_SKIPPED_NAMES
    ]
    assert not bad, f"rename these folders: ruff, pytest and .gitignore templates skip them: {bad}"


@pytest.mark.skipif(shutil.which("ruff") is None, reason="ruff is installed by the dev extra")
def test_ruff_lints_every_library_file():
    listed = subprocess.run(
        ["ruff", "check", "--show-files", "."], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout
    paths = [line.strip() for line in listed.splitlines() if line.strip()]
    seen = {str(Path(p).resolve().relative_to(REPO)) for p in paths}
    missing = sorted(library_files() - seen)
    assert library_files(), "found no library files: is REPO right?"
    assert not missing, f"ruff does not look at these library files (check [tool.ruff] exclude): {missing}"
