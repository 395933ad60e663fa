"""The README's first command: examples/train_mlp.py on real MPI ranks."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from mpi_utils import REPO, mpi_env, run_mpi

EXAMPLE = REPO / "examples" / "train_mlp.py"


def run_one_process(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """The example as a plain ``python`` process (world size 1), output captured."""
    return subprocess.run(
        [sys.executable, str(EXAMPLE), *args], capture_output=True, text=True, env=mpi_env(env), timeout=60
    )


def final_accuracy(output: str) -> float:
    match = re.search(r"^final test accuracy: (\d\.\d{4})$", output, re.MULTILINE)
    assert match, f"no 'final test accuracy' line in:\n{output}"
    return float(match.group(1))


@pytest.mark.mpi
def test_default_run_on_8_ranks_reaches_95_percent():
    result = run_mpi(8, EXAMPLE, timeout=300)
    assert final_accuracy(result.stdout) >= 0.95
    # The final line of rank 0's output is the accuracy line (the progress bar goes to stderr).
    assert result.stdout.strip().splitlines()[-1].startswith("final test accuracy: ")


@pytest.mark.mpi
def test_any_world_size_gives_the_same_accuracy():
    # 3, 5 and 7 do not divide the global batch of 128: the sampler splits it 43+43+42 etc.
    args = ("--epochs", "4", "--hidden", "32")
    accuracies = {n: final_accuracy(run_mpi(n, EXAMPLE, *args, timeout=180).stdout) for n in (1, 3, 4, 7)}
    assert len(set(accuracies.values())) == 1, accuracies


@pytest.mark.mpi
def test_global_batch_smaller_than_world_is_an_error_on_every_rank():
    result = run_mpi(4, EXAMPLE, "--batch-size", "3", timeout=60, check=False)
    assert result.returncode != 0
    for rank in range(4):
        assert f"[rank {rank}] error: global batch_size=3 is smaller than num_replicas=4" in result.stderr


def test_unknown_dataset_lists_the_valid_ones():
    result = run_one_process("--dataset", "cifar")
    assert result.returncode == 2
    assert "invalid choice: 'cifar'" in result.stderr and "'digits', 'mnist'" in result.stderr


def test_mnist_without_files_names_the_missing_files(tmp_path):
    result = run_one_process("--dataset", "mnist", "--data-dir", str(tmp_path))
    assert result.returncode == 2
    assert "train-images-idx3-ubyte" in result.stderr


def test_info_command_reports_mpi_and_backend():
    result = subprocess.run(
        [sys.executable, "-m", "minidist", "info"], capture_output=True, text=True, env=mpi_env(), timeout=60
    )
    assert result.returncode == 0, result.stderr
    for field in (
        "minidist",
        "numpy",
        "mpi4py",
        "MPI library",
        "MPICH",
        "backend",
        "numpy on cpu",
        "CUDA-aware",
    ):
        assert field in result.stdout, result.stdout


@pytest.mark.mpi
def test_global_batch_larger_than_the_data_set_is_an_error_on_every_rank():
    result = run_mpi(2, EXAMPLE, "--batch-size", "100000", timeout=60, check=False)
    assert result.returncode != 0
    for rank in range(2):
        assert f"[rank {rank}] error: --batch-size 100000 is larger than the training set" in result.stderr


def test_bad_device_is_a_clean_error_not_a_traceback():
    result = run_one_process(env={"MINIDIST_DEVICE": "gpu"})
    assert result.returncode == 2
    assert "[rank 0] error: MINIDIST_DEVICE='gpu' is not one of" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.mpi
def test_an_error_on_one_rank_only_ends_the_whole_job(tmp_path):
    # Ranks 0-1 are fine; rank 2 points at a missing MNIST folder (as if the data were missing on one
    # node). Without dist.abort the healthy ranks would wait forever in DDP's first broadcast.
    from mpi_utils import mpiexec_path

    good = [sys.executable, str(EXAMPLE), "--epochs", "1"]
    bad = [*good, "--dataset", "mnist", "--data-dir", str(tmp_path / "missing")]
    result = subprocess.run(
        [mpiexec_path(), "-n", "2", *good, ":", "-n", "1", *bad],
        capture_output=True, text=True, env=mpi_env(), timeout=60,
    )  # fmt: skip
    assert result.returncode != 0
    assert "[rank 2] error: MNIST folder" in result.stderr


@pytest.mark.mpi
def test_zero_stages_train_the_same_model_as_ddp():
    args = ("--epochs", "3", "--hidden", "32")
    accuracies = {
        zero: final_accuracy(run_mpi(3, EXAMPLE, *args, "--zero", str(zero), timeout=180).stdout)
        for zero in (0, 1, 2)
    }
    assert len(set(accuracies.values())) == 1, accuracies


@pytest.mark.mpi
def test_tensor_parallel_trains_the_same_model_as_data_parallel():
    # 4 ranks as dp=4, dp=2 x tp=2 and tp=4: the same global batches and initial weights, so the same
    # model up to float32 rounding (tp changes the order of a matmul's sum), which leaves the accuracy.
    args = ("--epochs", "4", "--hidden", "32")
    accuracies = {
        tp: final_accuracy(run_mpi(4, EXAMPLE, *args, "--tp", str(tp), timeout=180).stdout)
        for tp in (1, 2, 4)
    }
    assert len(set(accuracies.values())) == 1, accuracies


@pytest.mark.mpi
def test_hidden_size_not_divisible_by_tp_is_an_error_on_every_rank():
    result = run_mpi(4, EXAMPLE, "--tp", "4", "--hidden", "30", timeout=60, check=False)
    assert result.returncode != 0
    for rank in range(4):
        assert (
            f"[rank {rank}] error: MLP: hidden size 30 (hidden layer 1 of [30]) is not divisible by tp=4"
            in (result.stderr)
        )


def test_pipeline_parallelism_is_a_clear_error_until_it_exists():
    result = run_one_process("--pp", "2")
    assert result.returncode == 2
    assert "--pp 2: pipeline parallelism is not available yet" in result.stderr
