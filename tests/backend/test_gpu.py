"""GPU backend (CuPy): the same training on the GPU equals the CPU. Skipped without CuPy and a GPU."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from mpi_utils import WORKERS, mpi_env

from minidist.backend import _try_import_cupy

pytestmark = pytest.mark.gpu
needs_gpu = pytest.mark.skipif(_try_import_cupy() is None, reason="needs CuPy and a CUDA GPU")


def train_on(device: str, out) -> np.lib.npyio.NpzFile:
    env = mpi_env({"MINIDIST_DEVICE": device})
    subprocess.run(
        [sys.executable, str(WORKERS / "training" / "gpu_train.py"), str(out)],
        check=True,
        env=env,
        timeout=300,
    )
    return np.load(out)


def run_worker_expecting_failure(device: str, tmp_path) -> subprocess.CompletedProcess:
    env = mpi_env({"MINIDIST_DEVICE": device})
    return subprocess.run(
        [sys.executable, str(WORKERS / "training" / "gpu_train.py"), str(tmp_path / "x.npz")],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip


@needs_gpu
def test_training_on_gpu_equals_cpu(tmp_path):
    cpu, gpu = train_on("cpu", tmp_path / "cpu.npz"), train_on("cuda", tmp_path / "gpu.npz")
    assert str(gpu["device"]).startswith("cuda")
    for name in cpu.files:
        if name != "device":
            # float64 on both devices; only the order of floating-point sums inside BLAS differs.
            np.testing.assert_allclose(gpu[name], cpu[name], rtol=1e-9, atol=1e-12, err_msg=name)


def test_cuda_request_without_gpu_is_a_clear_error(tmp_path):
    if _try_import_cupy() is not None:
        pytest.skip("a GPU is present")
    result = run_worker_expecting_failure("cuda", tmp_path)
    assert result.returncode != 0
    assert "MINIDIST_DEVICE=cuda but CuPy with a visible GPU is not available" in result.stderr


def test_unknown_device_name_lists_the_valid_ones(tmp_path):
    result = run_worker_expecting_failure("tpu", tmp_path)
    assert result.returncode != 0
    assert "MINIDIST_DEVICE='tpu' is not one of ('cpu', 'cuda', 'auto')" in result.stderr
