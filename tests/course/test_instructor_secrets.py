"""A course's secrets live outside the repository: the instructor's own hidden tests (``--hidden DIR``)
and the Gradescope autograder (``release --gradescope OUT``), run here in Gradescope's folder layout on
a half-right submission: partial credit, and nothing of a hidden test shown before publication."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from minidist_course.assignments import grade, layout

REPO = layout.REPO_ROOT
SECRET = "test_secret_layer_norm_of_wide_rows"  # a name no student has seen: it must not leak early

SECRET_TASKS = f"""# The instructor's own hidden tests of A8, kept outside the repository.
[[test]]
task = "A8.1"
file = "hidden/test_secret.py"
name = "{SECRET}"
points = 3
hint = "does your backward hold for rows of 64 values scaled by 1000?"
"""

SECRET_TEST = f"""import sys
from pathlib import Path

import numpy as np

from minidist.nn import functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # a8lib.py, beside hidden/
from a8lib import check_against_finite_differences  # noqa: E402


def {SECRET}():
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 64)) * 1000
    w, b, g = rng.standard_normal(64), rng.standard_normal(64), rng.standard_normal((2, 64))
    check_against_finite_differences(
        lambda x, w, b: F.layer_norm(x, (64,), w, b), [x, w, b], g, "LayerNorm (2, 64)", ["x", "w", "b"]
    )
"""


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    folder = tmp_path / "my-a8-hidden"  # outside the repository, as an instructor keeps it
    folder.mkdir()
    (folder / "tasks.toml").write_text(SECRET_TASKS)
    (folder / "test_secret.py").write_text(SECRET_TEST)
    return folder


def _half_right_layer_norm(folder: Path) -> Path:
    """The reference layer_norm.py with dgamma doubled: dx and dbeta right, dgamma off by a factor."""
    text = (REPO / "minidist" / "ops" / "layer_norm.py").read_text()
    old = "(ones @ dy_xhat).reshape(inputs[1].shape)"
    assert text.count(old) == 1
    folder.mkdir(parents=True)
    (folder / "layer_norm.py").write_text(
        text.replace(old, "(2 * (ones @ dy_xhat)).reshape(inputs[1].shape)")
    )
    return folder


def test_grade_with_hidden_dir_runs_the_instructors_tests_instead_of_the_repositorys(secret: Path):
    report = grade("A8", only_tasks=["A8.1"], hidden=secret)
    names = [r.spec.name for r in report.tasks[0].results if r.spec.hidden]
    assert names == [SECRET], report.table()
    assert report.score == report.max_score == 4 + 3, report.table()  # the public 4 and the secret 3
    assert not (REPO / "lessons" / "assignments" / "A8" / "hidden" / "test_secret.py").exists()


def test_hidden_dir_without_a_task_file_is_a_usage_error(tmp_path: Path):
    cmd = [sys.executable, "-m", "minidist_course.assignments", "grade", "A8", "--hidden", str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "no tasks.toml" in proc.stderr, proc.stderr


def test_gradescope_autograder_gives_partial_credit_and_hides_hidden_tests(tmp_path: Path, secret: Path):
    zipped = tmp_path / "autograder-a8"  # what the instructor zips and uploads
    cmd = [sys.executable, "-m", "minidist_course.assignments", "release", "A8", "--out"]
    cmd += [str(tmp_path / "starter"), "--gradescope", str(zipped), "--hidden", str(secret)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert (zipped / "setup.sh").exists() and os.access(zipped / "run_autograder", os.X_OK)
    assert not (tmp_path / "starter" / "lessons" / "assignments" / "A8" / "hidden").exists()
    bundled = zipped / "grader" / "lessons" / "assignments" / "A8" / "hidden"
    assert (bundled / "test_secret.py").exists() and not (bundled / "test_a8_hidden.py").exists()

    # Gradescope's layout: the zip's contents in source/, run_autograder beside it, the upload in
    # submission/, the grade expected in results/results.json.
    root = tmp_path / "autograder"
    shutil.copytree(zipped, root / "source")
    shutil.copy2(zipped / "run_autograder", root / "run_autograder")
    _half_right_layer_norm(root / "submission")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(AUTOGRADER_ROOT=str(root), PYTHON=sys.executable)
    proc = subprocess.run(
        ["bash", str(root / "run_autograder")], env=env, capture_output=True, text=True, timeout=600, cwd=REPO
    )  # fmt: skip  (from here, the grader must still be the zip's)
    results = json.loads((root / "results" / "results.json").read_text())
    assert results["extra_data"]["status"] == "graded", proc.stdout + proc.stderr
    tests = {t["name"]: t for t in results["tests"]}
    public_ln = next(t for name, t in tests.items() if name.endswith("test_layer_norm_backward"))
    assert (public_ln["score"], public_ln["max_score"]) == (3, 4), public_ln  # dx and dbeta, not dgamma
    assert public_ln["output"].startswith("dgamma:") and public_ln["visibility"] == "visible"
    secret_entry = next(t for name, t in tests.items() if SECRET in name)
    assert secret_entry["visibility"] == "after_published"
    hidden = [t for t in results["tests"] if "(hidden)" in t["name"]]
    assert hidden and all(t["visibility"] == "after_published" for t in hidden)
    assert results["visibility"] == "after_published"  # so the total stays hidden until publication
    assert SECRET not in results["output"] and "64 values" not in results["output"], results["output"]
    assert 0 < results["score"] < sum(t["max_score"] for t in results["tests"])
