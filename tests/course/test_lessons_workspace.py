"""A student's own copy of the lessons, and a repository that survives a student working in it.

Students work through the lessons in a folder of their own (``python lessons/copy_lessons.py DIR``):
the copy holds what the notebooks need and never the reference answers or the exercise checks (the
notebooks import those from minidist), and it never overwrites their work. Someone who runs and saves
a notebook in ``lessons/`` anyway is not punished for it: build.py leaves such a notebook alone, and
its advice keeps the work. (That the notebooks also *run* from a copy
is checked by ``tests/course/test_lessons.py``, which executes every notebook in one.)

Everything here runs the commands as a user does, in a subprocess; about 3 s in all on 2 cores.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from mpi_utils import REPO

LESSONS = REPO / "lessons"


def _run(script: Path, *args, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(script), *map(str, args)], capture_output=True, text=True, timeout=120, cwd=cwd
    )


def _copy(*args) -> subprocess.CompletedProcess:
    return _run(LESSONS / "copy_lessons.py", *args)


def _files(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()}


def test_copy_holds_what_the_notebooks_need_and_never_the_solutions(tmp_path):
    dest = tmp_path / "my-lessons"
    proc = _copy(dest)
    assert proc.returncode == 0, proc.stderr
    notebooks = {p.name for p in LESSONS.glob("[0-9][0-9]_*.ipynb")}
    scripts = {f"scripts/{p.name}" for p in (LESSONS / "scripts").glob("*.py")}
    assert (
        len(notebooks) == len(list((LESSONS / "src").glob("[0-9][0-9]_*.py"))) and scripts
    )  # one per source
    # No checks.py either: its code computes every expected value, and it would sit beside the notebooks
    # in Jupyter's file browser. The notebooks import the checks from the installed minidist.
    assert _files(dest) == notebooks | scripts
    assert not [n for n in _files(dest) if n.endswith("checks.py")]
    for name in _files(dest):
        assert (dest / name).read_bytes() == (LESSONS / name).read_bytes(), name
    assert not any("# %% [solution" in (dest / name).read_text() for name in _files(dest))
    assert f"jupyter lab {dest}" in proc.stdout, proc.stdout


def test_the_printed_jupyter_command_allows_root_only_as_root(tmp_path):
    """JupyterLab refuses to start as root without --allow-root; lessons 12 and 13 need root for their
    cluster parts, so a student there must be given the command that starts."""
    import importlib.util
    import os

    spec = importlib.util.spec_from_file_location("copy_lessons", LESSONS / "copy_lessons.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    folder = Path("~/my lessons")
    assert module.jupyter_command(folder, as_root=True) == "jupyter lab '~/my lessons' --allow-root"
    assert module.jupyter_command(folder, as_root=False) == "jupyter lab '~/my lessons'"
    assert "network namespaces" in module.root_note(True) and "simulate" in module.root_note(False)
    proc = _copy(tmp_path / "copy")
    as_root = os.geteuid() == 0
    assert ("--allow-root" in proc.stdout) == as_root, proc.stdout
    for readme in (LESSONS / "README.md", REPO / "docs" / "lessons" / "index.md"):
        text = " ".join(readme.read_text().split())
        assert "--allow-root" in text and "network namespaces" in text, readme


def test_solutions_are_not_beside_the_lessons_in_jupyters_file_browser():
    """Jupyter's browser hides dot-folders (ContentsManager.allow_hidden is off by default)."""
    visible = [
        p for p in LESSONS.rglob("*") if not any(s.startswith(".") for s in p.relative_to(LESSONS).parts)
    ]
    assert not [p for p in visible if "solution" in p.name], "reference answers visible in lessons/"
    assert (LESSONS / ".solutions" / "01_autograd.py").exists()


def test_copy_refuses_a_folder_in_use_and_never_loses_a_students_work(tmp_path):
    dest = tmp_path / "my-lessons"
    dest.mkdir()
    (dest / "notes.txt").write_text("mine")
    proc = _copy(dest)
    assert proc.returncode == 2 and "--force" in proc.stderr, proc.stderr
    assert _files(dest) == {"notes.txt"}, "a refused copy must write nothing"

    assert _copy(dest, "--force").returncode == 0
    assert (dest / "notes.txt").read_text() == "mine"
    work = dest / "01_autograd.ipynb"
    for k in (1, 2):  # refresh twice: each version of the student's work is kept
        work.write_text(f"answer {k}")
        proc = _copy(dest, "--force")
        assert proc.returncode == 0, proc.stderr
        assert f"01_autograd.old-{k}.ipynb" in proc.stdout, proc.stdout
        assert work.read_bytes() == (LESSONS / work.name).read_bytes()
    assert [(dest / f"01_autograd.old-{k}.ipynb").read_text() for k in (1, 2)] == ["answer 1", "answer 2"]

    inside = LESSONS / "mine"
    proc = _copy(inside)
    assert proc.returncode == 2 and "outside" in proc.stderr and not inside.exists(), proc.stderr
    proc = _copy(dest / "notes.txt", "--force")
    assert proc.returncode == 2 and "is a file" in proc.stderr, proc.stderr


@pytest.mark.skipif(not (REPO / ".git").exists() or not shutil.which("git"), reason="not a git checkout")
def test_jupyter_checkpoint_folders_are_not_changes():
    for path in ("lessons/.ipynb_checkpoints/01_autograd-checkpoint.ipynb", ".ipynb_checkpoints/x.ipynb"):
        proc = subprocess.run(["git", "-C", str(REPO), "check-ignore", "-q", path], timeout=30)
        assert proc.returncode == 0, f"{path} would show up in `git status`"


def _save_like_jupyterlab(path: Path) -> None:
    """What a student's save in JupyterLab writes: the kernel's language_info, execution counts, outputs,
    and an answer typed into the first exercise cell."""
    nb = json.loads(path.read_text())
    nb["metadata"]["language_info"] = {"name": "python", "version": "3.12.3", "mimetype": "text/x-python"}
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    for n, cell in enumerate(code, 1):
        cell["execution_count"] = n
        cell["outputs"] = [{"name": "stdout", "output_type": "stream", "text": ["ran\n"]}]
    exercise = next(c for c in code if "exercise" in c["metadata"].get("tags", []))
    exercise["source"] = "MY ANSWER = 42"
    path.write_text(json.dumps(nb, indent=1))
    (path.parent / ".ipynb_checkpoints").mkdir(exist_ok=True)
    (path.parent / ".ipynb_checkpoints" / f"{path.stem}-checkpoint.ipynb").write_text(json.dumps(nb))


def test_build_never_overwrites_a_notebook_saved_in_lessons_and_its_advice_keeps_the_work(tmp_path):
    pytest.importorskip("nbformat", reason='needs the notebook tools: pip install -e ".[lessons]"')
    lessons = tmp_path / "lessons"  # a stand-in for lessons/, so the checkout is never touched
    shutil.copytree(LESSONS, lessons, ignore=shutil.ignore_patterns("assignments", ".ipynb_checkpoints"))
    saved = lessons / "01_autograd.ipynb"
    _save_like_jupyterlab(saved)
    work = saved.read_bytes()

    for args in (["--check"], []):
        proc = _run(lessons / "build.py", *args)
        assert proc.returncode == 1, (args, proc.stdout, proc.stderr)
        assert saved.read_bytes() == work, f"build.py {args} overwrote a student's saved notebook"
        advice = proc.stderr
        assert "python lessons/copy_lessons.py ~/my-lessons" in advice, advice
        assert "git checkout -- lessons/01_autograd.ipynb" in advice, advice
        assert "out of date" not in advice, "the rebuild advice would wipe the work: " + advice

    # Following the advice keeps the work: the copy carries the saved notebook, answer included.
    proc = _run(lessons / "copy_lessons.py", tmp_path / "my-lessons")
    assert proc.returncode == 0, proc.stderr
    assert "MY ANSWER = 42" in (tmp_path / "my-lessons" / "01_autograd.ipynb").read_text()

    # A notebook nobody ran, out of date after a source edit, is still rebuilt as before.
    source = lessons / "src" / "02_mpi.py"
    source.write_text(source.read_text() + "\n# %% [markdown]\n# A new closing note.\n")
    proc = _run(lessons / "build.py", "--check")
    assert "out of date: 02_mpi.ipynb; run `python lessons/build.py`" in proc.stderr, proc.stderr
    proc = _run(lessons / "build.py")
    assert (
        "wrote lessons/02_mpi.ipynb" in proc.stdout
        and "A new closing note." in (lessons / "02_mpi.ipynb").read_text()
    ), proc.stdout + proc.stderr
