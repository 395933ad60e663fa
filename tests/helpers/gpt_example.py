"""Running ``examples/train_gpt.py`` from the tests: one launcher, one run cache, one comparison, shared
by tests/examples/test_train_gpt_example.py (data parallelism) and tests/examples/test_train_gpt_layouts.py
(4-D layouts)."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
from mpi_utils import REPO, mpi_env, run_mpi

EXAMPLE = REPO / "examples" / "train_gpt.py"


def launch(n: int, *args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
    """The example on ``n`` ranks (``n == 1``: a plain ``python`` process, no mpiexec start-up).

    ``timeout`` bounds an mpiexec launch (a single process gets 120 s)."""
    if n > 1:
        return run_mpi(n, EXAMPLE, *args, timeout=timeout, check=check)
    result = subprocess.run(
        [sys.executable, str(EXAMPLE), *args], capture_output=True, text=True, env=mpi_env(), timeout=120
    )
    if check:
        assert result.returncode == 0, result.stdout + result.stderr
    return result


def cached_runs(tmp_path_factory, run_example: Callable[..., subprocess.CompletedProcess], name: str):
    """``run(n, *flags)``: ``(stdout, {losses, val_loss, weights...}, checkpoint folder)`` of
    ``run_example(n, *flags, --checkpoint-dir, --out)``, each ``(n, flags)`` run once (a module fixture's)."""
    runs: dict[tuple, tuple] = {}

    def run(n: int, *flags: str) -> tuple[str, dict[str, np.ndarray], Path]:
        if (n, flags) not in runs:
            folder = tmp_path_factory.mktemp(f"{name}{n}")
            out, ckpt = folder / "out.npz", folder / "ckpt"
            result = run_example(n, *flags, "--checkpoint-dir", str(ckpt), "--out", str(out))
            with np.load(out) as saved:
                runs[n, flags] = (result.stdout, dict(saved), ckpt)
        return runs[n, flags]

    return run


def assert_same_training(got: dict, expected: dict, rtol: float, atol: float, exact: bool = False) -> None:
    """The same saved names (losses, val_loss, GPT's parameter names) and values (allclose, or equal)."""
    assert got.keys() == expected.keys()
    for name, value in expected.items():
        if exact:
            np.testing.assert_array_equal(got[name], value, err_msg=name)
        else:
            np.testing.assert_allclose(got[name], value, rtol=rtol, atol=atol, err_msg=name)


def checkpoint_at_step_2(ckpt: Path, into: Path) -> Path:
    """A checkpoint root holding only the step-2 checkpoint of ``ckpt`` (as if the run had stopped after
    saving it); ``load_latest`` resumes from its only committed step."""
    shutil.copytree(ckpt / "step_000000002", into / "step_000000002")
    return into


def load_example():
    """examples/train_gpt.py as a module (its parser and checks; main() runs only as a script; it puts
    examples/ on sys.path for train_gpt_layout.py)."""
    spec = importlib.util.spec_from_file_location("train_gpt", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    return example
