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
from mpi_utils import REPO

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


def test_autograd_is_a_package_of_short_files_each_saying_what_it_holds():
    # Students read every line: one concept per file, under ~300 lines (docs/design.md, style).
    package = LIBRARY / "autograd"
    assert package.is_dir(), "minidist/autograd should be a package (grad_mode, tensor, function, graph)"
    for path in sorted(package.glob("*.py")):
        text = path.read_text()
        lines = text.count("\n")
        assert lines <= 300, f"{path.relative_to(REPO)} has {lines} lines; split it (limit ~300)"
        assert text.startswith('"""'), f"{path.relative_to(REPO)} needs a module docstring"


def test_autograd_state_lives_in_one_module_and_old_names_still_work():
    import minidist as md
    from minidist import autograd
    from minidist.autograd import grad_mode

    definitions = [
        str(p.relative_to(REPO))
        for p in (LIBRARY / "autograd").glob("*.py")
        if "\n_grad_enabled = " in p.read_text() or "\n_in_backward = " in p.read_text()
    ]
    assert definitions == ["minidist/autograd/grad_mode.py"], definitions
    names = "Tensor Function tensor no_grad enable_grad is_grad_enabled queue_callback backward_pass_count"
    names += " run_backward bump_version DEFAULT_DTYPE _lift _asarray_like"
    for name in names.split():
        assert hasattr(autograd, name), name
    with md.no_grad():  # a copied flag would still say True here
        assert autograd._grad_enabled is False and grad_mode._grad_enabled is False
    assert autograd._grad_enabled is True
