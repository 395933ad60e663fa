"""benchmarks/gpu_check.py without a GPU: the dry run writes its summary, the GPU-less machine
gets exit status 77 and one line, and the GPU-vs-CPU comparison catches a run that differs."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from mpi_utils import REPO, mpi_env

sys.path.insert(0, str(REPO / "benchmarks"))
from gpu_check import gpu_present  # noqa: E402
from gpu_check_compare import GPT_FLOAT32, MLP_FLOAT64, compare_runs  # noqa: E402
from gpu_check_report import render_markdown  # noqa: E402

SCRIPT = REPO / "benchmarks" / "gpu_check.py"


def run_script(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=mpi_env(), timeout=timeout
    )


def test_without_a_gpu_the_script_says_so_and_exits_77(tmp_path):
    if gpu_present():
        pytest.skip("a GPU is present")
    result = run_script("--out", str(tmp_path))
    assert result.returncode == 77, result.stdout + result.stderr
    assert result.stdout.startswith("no CUDA GPU / CuPy: nothing to check")
    assert list(tmp_path.iterdir()) == []  # nothing ran, nothing written


@pytest.mark.mpi
def test_the_dry_run_trains_compares_measures_and_writes_the_summary(tmp_path):
    # The slow steps (pytest collection, the GPT example, torch's GPT step) are left out to keep this test
    # fast; what runs covers the runner, the 1-rank training comparison and the 2-rank all-reduce timing.
    result = run_script("--dry-run", "--out", str(tmp_path), "--ranks", "1", "--skip", "tests", "gpt", "step")
    assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["dry_run"] and summary["passed"]
    assert [c["name"] for c in summary["checks"]] == ["mlp-1rank", "all-reduce"]
    assert all(c["status"] == "pass" for c in summary["checks"])
    # two runs of the same float64 training on the CPU: identical (the comparison ran on real arrays)
    mlp = summary["checks"][0]
    assert set(mlp["worst"]) == {"losses", "0.weight", "0.bias", "2.weight", "2.bias"}
    assert max(mlp["worst"].values()) == 0.0
    comm = summary["figures"]["all-reduce"]
    assert comm["ranks"] == 2 and [r["bytes"] for r in comm["rows"]] == [4096, 65536]
    assert all(r["staged_s"] > 0 and r["host_s"] > 0 for r in comm["rows"])
    assert comm["cuda_aware"] is False and comm["cuda_aware_reason"]
    assert summary["environment"]["mpi4py"] and "mpi_cuda_aware" in summary["environment"]
    markdown = (tmp_path / "summary.md").read_text()
    assert markdown.startswith("# gpu_check: ALL CHECKS PASSED") and "| mlp-1rank | pass |" in markdown
    assert "staged through host" in markdown and (tmp_path / "log.txt").stat().st_size > 0


def test_steps_the_budget_cannot_fit_are_failures_and_the_exit_status_is_1(tmp_path):
    result = run_script(
        "--dry-run", "--out", str(tmp_path), "--budget", "1", "--skip", "tests", "gpt", "step"
    )
    assert result.returncode == 1, result.stdout + result.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert not summary["passed"] and "not started" in summary["environment"]["error"]
    assert [(c["name"], c["status"]) for c in summary["checks"]] == [
        ("mlp-1rank", "fail"),
        ("mlp-2rank", "fail"),
        ("all-reduce", "fail"),
    ]
    assert all("time budget is spent" in c["detail"] for c in summary["checks"])
    assert (tmp_path / "summary.md").read_text().startswith("# gpu_check: A CHECK FAILED")


def gpt_run(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "losses": 4.0 - np.linspace(0, 1, 50),
        "val_loss": np.array(2.6),
        "h.0.attn.c_attn.bias": rng.normal(0, 0.02, 3 * 16),
        "h.0.mlp.c_fc.weight": rng.normal(0, 0.02, (64, 16)),
    }


def test_the_comparison_accepts_rounding_and_catches_a_different_run():
    ref = gpt_run()
    same = {k: v + 1e-6 for k, v in ref.items()}  # float32 reordering noise: within the tolerances
    assert compare_runs(same, ref, GPT_FLOAT32)["ok"]
    noisy_key_bias = {k: v.copy() for k, v in ref.items()}
    noisy_key_bias["h.0.attn.c_attn.bias"][16:32] += 5e-4  # the key bias is rounding noise: allowed
    assert compare_runs(noisy_key_bias, ref, GPT_FLOAT32)["ok"]

    def problems(change) -> list[str]:  # the problems found after ``change(run)`` (there must be some)
        got = {k: v.copy() for k, v in ref.items()}
        change(got)
        result = compare_runs(got, ref, GPT_FLOAT32)
        assert not result["ok"]
        return result["problems"]

    # one weight moved by a tenth of a step of lr = 2e-3 (what a wrong gradient does), named with its index
    def nudge(name: str, index: int | tuple, by: float):  # a change that adds ``by`` to one value
        return lambda run: run[name].__setitem__(index, run[name][index] + by)

    (message,) = problems(nudge("h.0.mlp.c_fc.weight", (3, 5), 2e-4))
    assert message.startswith("h.0.mlp.c_fc.weight: 1 of 1024 values") and "flat index 53" in message
    # the query bias is not noise: the same 5e-4 there is caught
    assert problems(nudge("h.0.attn.c_attn.bias", 3, 5e-4))
    assert "val_loss" in problems(lambda g: g.__setitem__("val_loss", g["val_loss"] + 2e-3))[0]
    assert "not finite" in problems(lambda g: g["losses"].__setitem__(7, np.nan))[0]
    assert "names differ" in problems(lambda g: g.pop("h.0.mlp.c_fc.weight"))[0]
    assert "shape" in problems(lambda g: g.__setitem__("val_loss", np.array([2.6, 2.6])))[0]
    # the float64 MLP's tolerance is far tighter: a float32-sized difference fails there
    mlp = {"losses": np.ones(5), "0.weight": np.full((16, 8), 0.1)}
    assert not compare_runs({k: v + 1e-7 for k, v in mlp.items()}, mlp, MLP_FLOAT64)["ok"]


def test_a_failed_check_makes_the_summary_say_so():
    summary = {
        "date_utc": "2026-12-02 14:00", "dry_run": False, "seconds": 1.0, "environment": {"gpu": "X"},
        "checks": [{"name": "gpt-1rank", "status": "fail", "seconds": 2.0, "detail": "h.0.x: |a|b"}],
        "figures": {}, "passed": False,
    }  # fmt: skip
    markdown = render_markdown(summary)
    assert markdown.startswith("# gpu_check: A CHECK FAILED")
    assert "| gpt-1rank | fail | 2.0 | h.0.x: /a/b |" in markdown  # a | in a detail cannot break the table
