"""The grader as students and instructors meet it, through the command line.

* Gradescope's results.json shows nothing of a hidden test before the grades are published;
* a release says, visibly, the one install command grading needs, and a grading environment without
  pytest is a "setup problem" (exit 3, no algorithm hint), not a wrong answer;
* INSTRUCTORS.md's class workflow, run as written: a folder and a single-file submission, an unknown
  file name, the results files, the summary CSV and the exit codes.

All use A1 (no MPI): about 12 s of CPU together (the class workflow grades A1 twice: 8 s).
"""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from minidist_course.assignments import layout, submission
from minidist_course.assignments.tasks import load

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

REPO = layout.REPO_ROOT
# A plausible A1.1 mistake that passes the public tests and fails a hidden one: only the LAST axis of
# the input is checked for length-1 stretching (the public cases stretch only the last axis).
STRETCH_OLD = "stretched = tuple(i for i, n in enumerate(shape) if n == 1 and grad.shape[i] != 1)"
STRETCH_NEW = STRETCH_OLD.replace("!= 1)", "!= 1 and i == len(shape) - 1)")


def _cli(*args: str, cwd: Path, python: str = sys.executable) -> subprocess.CompletedProcess:
    """``minidist assignments ARGS`` as a user types it, with this tree's minidist."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1"}
    cmd = [python, "-m", "minidist_course.assignments", *args]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def _copy_with(tmp: Path, old: str = "", new: str = "") -> Path:
    """A student's folder: a copy of this minidist, with ``old`` replaced by ``new`` in arithmetic.py."""
    copy = tmp / "minidist"
    shutil.copytree(REPO / "minidist", copy, ignore=shutil.ignore_patterns("__pycache__"))
    if old:
        target = copy / "ops" / "arithmetic.py"
        assert target.read_text().count(old) == 1
        target.write_text(target.read_text().replace(old, new))
    return tmp


def test_gradescope_results_show_no_hidden_test_before_publication(tmp_path):
    student = _copy_with(tmp_path / "student", STRETCH_OLD, STRETCH_NEW)
    results = tmp_path / "results.json"
    proc = _cli(
        "grade", "A1", "--path", str(student), "--task", "A1.1", "--results", str(results), cwd=tmp_path
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr  # graded, points lost
    data = json.loads(results.read_text())
    hidden = [t for t in data["tests"] if "(hidden)" in t["name"]]
    assert hidden and all(t["score"] == 0 for t in hidden), data  # the hidden test did fail
    assert all(t["score"] == t["max_score"] for t in data["tests"] if t not in hidden)  # public passed
    # What a student could read before publication: the top-level output and every visible test.
    shown = [data["output"]] + [v for t in data["tests"] if t["visibility"] == "visible" for v in t.values()]
    secrets = [s.name for s in load(layout.assignment_dir("A1")).tasks[0].tests if s.hidden]
    secrets += [s.hint for s in load(layout.assignment_dir("A1")).tasks[0].tests if s.hidden]
    secrets += [t["output"].splitlines()[0] for t in hidden]  # the failing input, e.g. its shapes
    for secret in secrets:
        assert all(secret not in str(v) for v in shown), f"{secret!r} is visible before publication"
    assert {t["visibility"] for t in hidden} == {"after_published"}
    assert data["visibility"] == "after_published"  # hides the total while hidden tests are hidden
    assert data["stdout_visibility"] == "hidden"  # stdout holds the full table: instructors only
    assert data["score"] == sum(t["score"] for t in data["tests"])
    assert "test_unbroadcast_any_shapes" in proc.stdout  # the instructor's table has everything


def test_release_says_visibly_the_one_install_command(tmp_path):
    proc = _cli("release", "A1", "--out", str(tmp_path / "a1"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    command = 'pip install -e ".[grade]"'
    assert command in proc.stdout
    readme = (tmp_path / "a1" / "README.md").read_text()
    head = readme[: readme.index("## Tasks")]  # before the handout's tasks: the first thing read
    assert command in head and "<!--" not in head
    extras = tomllib.loads((tmp_path / "a1" / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert {re.split("[<>=]", r)[0] for r in extras["grade"]} >= {"pytest", "hypothesis"}


def _venv_without_pytest(tmp: Path) -> str:
    """A Python as ``pip install -e .`` leaves it: minidist's dependencies, no pytest or hypothesis."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp / "venv")], check=True)
    site = next((tmp / "venv" / "lib").glob("python3*")) / "site-packages"
    drop = ("pytest", "_pytest", "py.py", "pluggy", "iniconfig", "hypothesis", "_hypothesis", "__editable")
    here = Path(next(p for p in sys.path if p.endswith("site-packages") and Path(p).is_dir()))
    for entry in here.iterdir():
        if not entry.name.startswith(drop) and "minidist" not in entry.name:
            (site / entry.name).symlink_to(entry)
    return str(tmp / "venv" / "bin" / "python")


def test_a_missing_pytest_is_a_setup_problem_not_a_wrong_answer(tmp_path):
    python = _venv_without_pytest(tmp_path)
    results = tmp_path / "results.json"
    proc = _cli("grade", "A1", "--task", "A1.1", "--results", str(results), cwd=tmp_path, python=python)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "setup problem" in proc.stdout and "'pytest'" in proc.stdout, proc.stdout
    assert 'install -e ".[grade]"' in proc.stdout
    hints = [s.hint for t in load(layout.assignment_dir("A1")).tasks for s in t.tests]
    assert "Hint" not in proc.stdout and not any(h in proc.stdout for h in hints)
    data = json.loads(results.read_text())
    assert data["score"] == 0 and data["extra_data"]["status"] == "setup problem"
    assert "setup problem" in data["output"] and "pytest" in data["output"]


def _commands(section: str) -> list[str]:
    """The commands of the first ```bash block under ``section`` in INSTRUCTORS.md, as written."""
    text = (REPO / "lessons" / "assignments" / "INSTRUCTORS.md").read_text()
    block = text[text.index(section) :].split("```bash\n", 1)[1].split("```", 1)[0]
    return [line for line in block.splitlines() if line.strip() and not line.startswith("#")]


def test_the_documented_class_workflow_runs_as_written(tmp_path):
    commands = _commands("### A class at once")
    assert commands[0].startswith("A=A2")
    script = "\n".join(["A=A1  # A1 instead of A2: no MPI, a few seconds", *commands[1:]])
    subs = tmp_path / "submissions"
    _copy_with(subs / "alice")  # her whole copy: the reference, full marks
    (subs / "bob").mkdir()  # just the file he changed, as Gradescope uploads it
    shutil.copy(REPO / "minidist" / "autograd" / "graph.py", subs / "bob" / "graph.py")
    (subs / "carol").mkdir()
    (subs / "carol" / "my_backward.py").write_text("x = 1\n")  # a name that is no A1 file
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1"}
    lines = script.splitlines()
    first = "\n".join(lines[:2] + ["echo EXIT=$?"])
    proc = subprocess.run(["bash", "-c", first], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert "EXIT=4" in proc.stdout, proc.stdout + proc.stderr  # the largest: carol's file was not graded
    last = subprocess.run(["bash", "-c", "\n".join(lines[2:])], cwd=tmp_path, env=env, capture_output=True)
    assert last.returncode == 0, last.stderr

    results = tmp_path / "results"
    alice = json.loads((results / "alice.json").read_text())
    full = sum(t.max_points for t in load(REPO / "lessons" / "assignments" / "A1").tasks)
    # The reference scores full marks, hidden tests included (test_assignments.py grades A2-A8 so).
    assert alice["score"] == full and alice["extra_data"]["status"] == "graded"
    bob = json.loads((results / "bob.json").read_text())
    assert bob["extra_data"]["status"] == "graded"
    assert "graph.py -> minidist/autograd/graph.py" in (results / "bob.txt").read_text()
    carol = json.loads((results / "carol.json").read_text())
    assert carol["extra_data"]["status"] == "not graded" and "my_backward.py" in carol["output"]
    assert "graph.py" in carol["output"]  # it says which names are allowed
    for name in ("summary.csv", "../class.csv"):
        rows = {r["student"]: r for r in csv.DictReader((results / name).read_text().splitlines())}
        assert set(rows) == {"alice", "bob", "carol"}
        assert rows["alice"]["A1.1"] == "4" and rows["alice"]["total"] == f"{full:g}" == rows["alice"]["max"]
        assert rows["bob"]["A1.5"] == "8" and rows["bob"]["A1.1"] == "0"  # only graph.py: the rest is stubs
        assert rows["carol"]["status"] == "not graded" and rows["carol"]["total"] == "0"
        assert rows["carol"]["max"] == f"{full:g}"  # the assignment's, not 0 (a gradebook divides by it)

    # One upload at a time, as Gradescope's run_autograder calls the grader: results.json and exit 4.
    alone = tmp_path / "alone.json"
    one = _cli(
        "grade", "A1", "--path", str(subs / "carol" / "my_backward.py"), "--results", str(alone), cwd=tmp_path
    )
    assert one.returncode == 4 and "not graded" in one.stdout, one.stdout + one.stderr
    assert json.loads(alone.read_text())["extra_data"]["status"] == "not graded"

    # The batch run again into the same results/: refused before grading (the summary counts every
    # *.json there, so an earlier run's students would be mixed in); a mistyped --path is a usage error.
    again = subprocess.run(["bash", "-c", first], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert "EXIT=2" in again.stdout and "already holds results of an earlier run" in again.stderr, again
    typo = _cli("grade", "A1", "--path", str(tmp_path / "no-such-folder"), cwd=tmp_path)
    assert typo.returncode == 2 and "does not exist" in typo.stderr, typo.stdout + typo.stderr


def test_where_an_upload_goes_is_never_a_guess(tmp_path):
    # A zipped starter folder: the copy of minidist one folder down is graded as it is.
    nested = tmp_path / "upload" / "a1-starter"
    (nested / "minidist").mkdir(parents=True)
    (nested / "minidist" / "__init__.py").write_text("")
    assert submission.place("A1", tmp_path / "upload", tmp_path / "work").code == nested.resolve()
    # Two files of the assignment share a name: a lone upload of that name is refused, not guessed.
    root = tmp_path / "tree"
    for sub in ("a", "b"):
        (root / "minidist" / sub).mkdir(parents=True)
        (root / "minidist" / sub / "x.py").write_text(
            "def f():\n    # BEGIN SOLUTION A1.1: f\n    return 1\n    # END SOLUTION\n"
        )
    (tmp_path / "x.py").write_text("def f():\n    return 1\n")
    with pytest.raises(submission.NotPlaceable, match="could be any of minidist/a/x.py, minidist/b/x.py"):
        submission.place("A1", tmp_path / "x.py", tmp_path / "work2", root)


def test_a_file_that_does_not_compile_is_named_with_its_line_and_no_hint(tmp_path, monkeypatch):
    """A SyntaxError is the student's (exit 1, not a setup problem), and the feedback says where it is
    instead of an algorithm hint: in-process (A1) and on MPI ranks, whose traceback is unprefixed
    because the import fails before minidist labels each rank's output."""
    student = _copy_with(tmp_path / "student", "def unbroadcast(", "def unbroadcast(:")
    proc = _cli("grade", "A1", "--path", str(student), "--task", "A1.1", "--public-only", cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "SyntaxError" in proc.stdout and "(at minidist/ops/arithmetic.py:" in proc.stdout, proc.stdout
    assert "does not compile" in proc.stdout and "Hint:" not in proc.stdout, proc.stdout

    monkeypatch.syspath_prepend(str(REPO / "lessons" / "assignments"))
    import gradelib  # noqa: PLC0415

    ring = REPO / "minidist" / "distributed" / "algorithms" / "ring.py"
    stderr = (
        "Traceback (most recent call last):\n"
        '  File "/x/A2/workers/ring_check.py", line 25, in <module>\n'
        "    from minidist.distributed import liveness, ring, tags\n"
        f'  File "{ring}", line 136\n'
        "    def ring_all_gather(:group):\n"
        "                        ^\n"
        "SyntaxError: invalid syntax\n"
    )
    assert gradelib.explain_crash(stderr) == (
        "SyntaxError: invalid syntax "
        "(at minidist/distributed/algorithms/ring.py:136: the file does not compile)"
    )
