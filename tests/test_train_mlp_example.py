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


def epoch_lines(output: str) -> list[tuple[float, float]]:
    """(train loss, test accuracy) of every epoch line rank 0 printed."""
    found = re.findall(r"train loss (\d+\.\d{4})  test accuracy (\d\.\d{4})", output)
    assert found, f"no epoch lines in:\n{output}"
    return [(float(loss), float(acc)) for loss, acc in found]


@pytest.mark.mpi
def test_pipeline_and_3d_layouts_train_the_same_model_as_data_parallel():
    # Same global batches and initial weights in every layout, so the same model up to float32
    # rounding (microbatches, stage boundaries and the tp all-reduce change summation orders; a relative
    # 1e-6 or so per step). The printed losses (4 decimals) may differ in the last digit at most, and the
    # accuracies not at all; a missing 1/m or a wrongly weighted dp share changes both by far more.
    args = ("--epochs", "3", "--hidden", "32", "32")
    layouts = {
        "dp2 x pp2, gpipe, m=2": (4, "--pp", "2", "--schedule", "gpipe", "--microbatches", "2"),
        "dp2 x tp2 x pp2, 1f1b, m=4": (8, "--dp", "2", "--tp", "2", "--pp", "2"),
        "dp1 x pp3, 1f1b, m=8": (3, "--pp", "3", "--microbatches", "8"),
        # 128 samples on 3 replicas: shares 43 + 43 + 42, weighted exactly when combined over dp
        "dp3 x pp2 (uneven shares), m=1": (6, "--pp", "2", "--microbatches", "1"),
    }
    plain = epoch_lines(run_mpi(4, EXAMPLE, *args, timeout=180).stdout)
    for name, (n, *flags) in layouts.items():
        got = epoch_lines(run_mpi(n, EXAMPLE, *args, *flags, timeout=180).stdout)
        assert [acc for _, acc in got] == [acc for _, acc in plain], (name, got, plain)
        assert [loss for loss, _ in got] == pytest.approx([loss for loss, _ in plain], abs=1.5e-4), name


@pytest.mark.mpi
def test_pipeline_with_incompatible_flags_is_an_error_on_every_rank():
    flags = ("--pp", "2", "--zero", "1", "--grad-accum", "2", "--no-overlap", "--bucket-cap-mb", "1")
    result = run_mpi(2, EXAMPLE, *flags, timeout=60, check=False)
    assert result.returncode != 0
    for rank in range(2):
        assert (
            f"[rank {rank}] error: --pp 2 cannot be combined with --zero 1, --grad-accum 2, --no-overlap, "
            "--bucket-cap-mb 1.0: a pipeline accumulates" in result.stderr
        ), result.stderr


@pytest.mark.mpi
def test_fewer_layers_than_stages_is_an_error_on_every_rank():
    result = run_mpi(4, EXAMPLE, "--pp", "4", "--hidden", "32", timeout=60, check=False)
    assert result.returncode != 0
    for rank in range(4):
        assert (
            f"[rank {rank}] error: --pp 4 needs at least 4 layers, but --hidden 32 gives an MLP of 3"
            in result.stderr
        ), result.stderr


@pytest.mark.mpi
def test_shares_not_divisible_by_microbatches_is_an_error_naming_the_numbers():
    result = run_mpi(2, EXAMPLE, "--pp", "2", "--microbatches", "3", timeout=60, check=False)
    assert result.returncode != 0
    for rank in range(2):
        assert (
            f"[rank {rank}] error: --batch-size 128 on 1 data-parallel replicas gives shares [128], not all "
            "divisible by --microbatches 3; use a --batch-size that is a multiple of dp x microbatches = 3 "
            "(e.g. 126)" in result.stderr
        ), result.stderr
