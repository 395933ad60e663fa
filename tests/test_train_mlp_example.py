"""The README's example with every option: examples/train_mlp.py on real MPI ranks.

The checkpoint tests at the end stop a run with ``--max-steps`` (or SIGKILL one rank through
``tests/workers/training/train_mlp_killed.py``), resume it with ``--resume``, and compare the parameters of
the final checkpoint, read here with safetensors independently of ``minidist.checkpoint.load``.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from mpi_utils import REPO, mpi_env, run_mpi
from safetensors.numpy import load_file

EXAMPLE = REPO / "examples" / "train_mlp.py"


def run_one_process(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """The example as a plain ``python`` process (world size 1), output captured."""
    return subprocess.run(
        [sys.executable, str(EXAMPLE), *args], capture_output=True, text=True, env=mpi_env(env), timeout=60
    )


def final_accuracy(output: str, label: str = "final test accuracy") -> float:
    match = re.search(rf"^{label}: (\d\.\d{{4}})$", output, re.MULTILINE)
    assert match, f"no '{label}' line in:\n{output}"
    return float(match.group(1))


@pytest.mark.mpi
def test_default_run_on_8_ranks_reaches_95_percent():
    result = run_mpi(8, EXAMPLE, timeout=300)
    assert final_accuracy(result.stdout) >= 0.95
    # The final line of rank 0's output is the accuracy line, after the progress bar's last update.
    assert result.stdout.strip().splitlines()[-1].startswith("final test accuracy: ")


# The short run that several tests compare against; run once per module (not once per test).
SHORT_ARGS = ("--epochs", "4", "--hidden", "32")


@pytest.fixture(scope="module")
def short_dp4_output() -> str:
    """Rank 0's output of ``SHORT_ARGS`` on 4 ranks (dp=4, tp=1): the world-size and the tp tests'
    common reference."""
    return run_mpi(4, EXAMPLE, *SHORT_ARGS, timeout=180).stdout


@pytest.mark.mpi
def test_any_world_size_gives_the_same_accuracy(short_dp4_output):
    # 3, 5 and 7 do not divide the global batch of 128: the sampler splits it 43+43+42 etc.
    accuracies = {n: final_accuracy(run_mpi(n, EXAMPLE, *SHORT_ARGS, timeout=180).stdout) for n in (1, 3, 7)}
    accuracies[4] = final_accuracy(short_dp4_output)
    assert len(set(accuracies.values())) == 1, accuracies


@pytest.mark.mpi
def test_global_batch_smaller_than_world_is_an_error_on_every_rank():
    result = run_mpi(4, EXAMPLE, "--batch-size", "3", timeout=60, check=False)
    assert result.returncode == 2
    assert result.stderr.startswith("error on ranks 0-3: global batch_size=3 is smaller than num_replicas=4")
    assert result.stderr.count("global batch_size=3") == 1, result.stderr  # once for all ranks (issue 15)


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
    assert result.returncode == 2
    assert result.stderr.startswith("error on ranks 0-1: --batch-size 100000 is larger than the training set")


def test_bad_device_is_a_clean_error_not_a_traceback():
    result = run_one_process(env={"MINIDIST_DEVICE": "gpu"})
    assert result.returncode == 2
    assert result.stderr.startswith("error: MINIDIST_DEVICE='gpu' is not one of"), result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.mpi
def test_an_error_on_one_rank_only_ends_the_whole_job(tmp_path):
    # Ranks 0-1 are fine; rank 2 points at a missing MNIST folder (as if the data were missing on one
    # node). The ranks agree on the error right after loading (dist.raise_if_any), so the healthy ranks
    # do not wait forever in DDP's first broadcast, and rank 0 prints it once, naming rank 2.
    from mpi_utils import mpiexec_path

    good = [sys.executable, str(EXAMPLE), "--epochs", "1"]
    bad = [*good, "--dataset", "mnist", "--data-dir", str(tmp_path / "missing")]
    result = subprocess.run(
        [mpiexec_path(), "-n", "2", *good, ":", "-n", "1", *bad],
        capture_output=True, text=True, env=mpi_env(), timeout=60,
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.startswith("error on rank 2: MNIST folder"), result.stderr
    assert result.stderr.count("MNIST folder") == 1, result.stderr


@pytest.mark.mpi
def test_zero_stages_train_the_same_model_as_ddp():
    args = ("--epochs", "3", "--hidden", "32")
    accuracies = {
        zero: final_accuracy(run_mpi(3, EXAMPLE, *args, "--zero", str(zero), timeout=180).stdout)
        for zero in (0, 1, 2)
    }
    assert len(set(accuracies.values())) == 1, accuracies


@pytest.mark.mpi
def test_tensor_parallel_trains_the_same_model_as_data_parallel(short_dp4_output):
    # 4 ranks as dp=4, dp=2 x tp=2 and tp=4: the same global batches and initial weights, so the same
    # model up to float32 rounding (tp changes the order of a matmul's sum), which leaves the accuracy.
    # tp=1 is the default: the dp=4 run of the fixture.
    accuracies = {
        tp: final_accuracy(run_mpi(4, EXAMPLE, *SHORT_ARGS, "--tp", str(tp), timeout=180).stdout)
        for tp in (2, 4)
    }
    accuracies[1] = final_accuracy(short_dp4_output)
    assert len(set(accuracies.values())) == 1, accuracies


@pytest.mark.mpi
def test_hidden_size_not_divisible_by_tp_is_an_error_on_every_rank():
    result = run_mpi(4, EXAMPLE, "--tp", "4", "--hidden", "30", timeout=60, check=False)
    assert result.returncode == 2
    assert result.stderr.startswith(
        "error on ranks 0-3: MLP: hidden size 30 (hidden layer 1 of [30]) is not divisible by tp=4"
    ), result.stderr


def epoch_lines(output: str) -> list[tuple[float, float]]:
    """(train loss, test accuracy) of every epoch line rank 0 printed."""
    found = re.findall(r"train loss (\d+\.\d{4})  test accuracy (\d\.\d{4})", output)
    assert found, f"no epoch lines in:\n{output}"
    return [(float(loss), float(acc)) for loss, acc in found]


@pytest.mark.mpi
def test_pipeline_and_3d_layouts_train_the_same_model_as_data_parallel(dp4_reference):
    # Same global batches and initial weights in every layout, so the same model up to float32
    # rounding (microbatches, stage boundaries and the tp all-reduce change summation orders; a relative
    # 1e-6 or so per step). The printed losses (4 decimals) may differ in the last digit at most, and the
    # accuracies not at all; a missing 1/m or a wrongly weighted dp share changes both by far more.
    args = ("--epochs", "3", "--hidden", "32", "32")
    layouts = {
        "dp2 x pp2, gpipe, m=2": (4, "--pp", "2", "--schedule", "gpipe", "--microbatches", "2"),
        "dp2 x tp2 x pp2, 1f1b, m=4": (8, "--dp", "2", "--tp", "2", "--pp", "2"),
        "dp1 x pp3, 1f1b, m=8": (3, "--pp", "3", "--microbatches", "8"),
        "dp1 x pp2, interleaved v=2, m=4": (
            2,
            "--pp",
            "2",
            "--schedule",
            "interleaved",
            "--virtual-stages",
            "2",
        ),
        # 128 samples on 3 replicas: shares 43 + 43 + 42, weighted exactly when combined over dp
        "dp3 x pp2 (uneven shares), m=1": (6, "--pp", "2", "--microbatches", "1"),
    }
    # The plain dp=4 run is the checkpoint tests' reference (CKPT_ARGS: these args, and checkpoints
    # every 4 steps, which read the model and never change it).
    assert CKPT_ARGS[: len(args)] == args
    plain = epoch_lines(dp4_reference[1])
    for name, (n, *flags) in layouts.items():
        got = epoch_lines(run_mpi(n, EXAMPLE, *args, *flags, timeout=180).stdout)
        assert [acc for _, acc in got] == [acc for _, acc in plain], (name, got, plain)
        assert [loss for loss, _ in got] == pytest.approx([loss for loss, _ in plain], abs=1.5e-4), name


@pytest.mark.mpi
def test_pipeline_with_incompatible_flags_is_an_error_on_every_rank():
    flags = ("--pp", "2", "--zero", "1", "--grad-accum", "2", "--no-overlap", "--bucket-cap-mb", "1")
    result = run_mpi(2, EXAMPLE, *flags, timeout=60, check=False)
    assert result.returncode == 2
    assert result.stderr.startswith(
        "error on ranks 0-1: --pp 2 cannot be combined with --zero 1, --grad-accum 2, --no-overlap, "
        "--bucket-cap-mb 1.0: a pipeline accumulates"
    ), result.stderr


@pytest.mark.mpi
def test_pipeline_flags_without_pp_are_an_error_not_ignored():
    flags = ("--schedule", "interleaved", "--virtual-stages", "2")
    # Raised before any collective, where the ranks may arrive seconds apart on a loaded machine: a
    # generous MINIDIST_ERROR_WAIT (free when every rank fails) keeps the report to one line.
    result = run_mpi(2, EXAMPLE, *flags, timeout=60, check=False, env={"MINIDIST_ERROR_WAIT": "60"})
    assert result.returncode != 0
    message = "--schedule, --virtual-stages only mean something with pipeline stages: add --pp N"
    assert result.stderr.startswith("error on ranks 0-1: " + message), result.stderr  # once, for both ranks
    assert result.stderr.count(message) == 1, result.stderr


def test_data_dir_with_the_bundled_digits_is_an_error_not_ignored(tmp_path):
    result = run_one_process("--data-dir", str(tmp_path))
    assert result.returncode == 2 and "--data-dir is only read with --dataset mnist" in result.stderr


@pytest.mark.mpi
def test_fewer_layers_than_stages_is_an_error_on_every_rank():
    result = run_mpi(4, EXAMPLE, "--pp", "4", "--hidden", "32", timeout=60, check=False)
    assert result.returncode == 2
    assert result.stderr.startswith(
        "error on ranks 0-3: --pp 4 needs at least 4 layers, but --hidden 32 gives an MLP of 3"
    ), result.stderr


@pytest.mark.mpi
def test_shares_not_divisible_by_microbatches_is_an_error_naming_the_numbers():
    result = run_mpi(2, EXAMPLE, "--pp", "2", "--microbatches", "3", timeout=60, check=False)
    assert result.returncode == 2
    assert result.stderr.startswith(
        "error on ranks 0-1: --batch-size 128 on 1 data-parallel replicas gives shares [128], not all "
        "divisible by --microbatches 3; use a --batch-size that is a multiple of dp x microbatches = 3 "
        "(e.g. 126)"
    ), result.stderr


# --- checkpoints and --resume -------------------------------------------------------------------------
# 3 epochs of 11 steps (1500 digits, global batch 128); --max-steps 15 stops 4 batches into epoch 2.
CKPT_ARGS = ("--epochs", "3", "--hidden", "32", "32", "--checkpoint-every", "4")


def train(n: int, ckpt: Path, *flags: str) -> subprocess.CompletedProcess:
    return run_mpi(n, EXAMPLE, *CKPT_ARGS, "--checkpoint-dir", str(ckpt), *flags, timeout=120)


def final_checkpoint(root: Path) -> tuple[int, dict[str, np.ndarray]]:
    """(step, {"model/<name>" or "optim/<name>/<state>": global array}) of the checkpoint ``latest`` names:
    each tensor's tp shards concatenated along its tp_dim, straight from the files and the manifest."""
    folder = root / (root / "latest").read_text().strip()
    manifest = json.loads((folder / "manifest.json").read_text())
    files: dict[str, dict[str, np.ndarray]] = {}
    tensors = {}
    for key, t in manifest["tensors"].items():
        pieces = [files.setdefault(s["file"], load_file(folder / s["file"]))[key] for s in t["shards"]]
        tensors[key] = pieces[0] if t["tp_dim"] is None else np.concatenate(pieces, axis=t["tp_dim"])
    return manifest["step"], tensors


def assert_same_tensors(got: dict, expected: dict, **tolerance: float) -> None:
    assert sorted(got) == sorted(expected)
    for key in expected:
        if tolerance:
            np.testing.assert_allclose(got[key], expected[key], err_msg=key, **tolerance)
        else:
            assert np.array_equal(got[key], expected[key]), key


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> Callable[..., tuple[Path, str]]:
    """``uninterrupted(n, *flags)``: the checkpoint root and output of ``train(n, root, *flags)`` run to
    the end, trained once per module for each (n, flags) however many tests compare against it. A test
    that writes into the root (``--resume``) copies it first."""
    runs: dict[tuple, tuple[Path, str]] = {}

    def run(n: int, *flags: str) -> tuple[Path, str]:
        if (n, flags) not in runs:
            root = tmp_path_factory.mktemp(f"uninterrupted_{n}") / "ckpt"
            runs[n, flags] = root, train(n, root, *flags).stdout
        return runs[n, flags]

    return run


@pytest.fixture(scope="module")
def dp4_reference(uninterrupted) -> tuple[Path, str]:
    """An uninterrupted run on 4 ranks (dp=4): its checkpoint root and its output."""
    return uninterrupted(4)


@pytest.mark.mpi
@pytest.mark.parametrize(
    "n, flags",
    [(2, ()), (2, ("--zero", "2", "--grad-accum", "2")), (4, ("--pp", "2"))],
    ids=["dp2", "dp2-zero2-grad-accum2", "dp2xpp2"],
)
def test_resume_on_the_same_layout_continues_bit_exactly(tmp_path, uninterrupted, n, flags):
    full_dir, full_output = uninterrupted(n, *flags)
    stopped = train(n, tmp_path / "resumed", *flags, "--max-steps", "15")
    assert "stopped at step 15 of 33 (--max-steps); continue with --resume" in stopped.stdout
    resumed = train(n, tmp_path / "resumed", *flags, "--resume")

    # The same float operations in the same order: the final weights and momenta are identical.
    step, expected = final_checkpoint(full_dir)
    assert step == 33
    step, got = final_checkpoint(tmp_path / "resumed")
    assert step == 33
    assert_same_tensors(got, expected)
    assert final_accuracy(resumed.stdout) == final_accuracy(full_output)
    # It continues where it stopped: epoch 2 after its 4th batch, the bar at 15 of 33 steps, and it
    # prints epochs 2 and 3 only, the resumed epoch's loss over all its batches (carried in the
    # checkpoint), up to the order of the float64 sums.
    assert "step_000000015: step 15, epoch 2, batch 4 done" in resumed.stdout
    assert re.search(r"\| 15/33 ", resumed.stdout), resumed.stdout  # the bar shares stdout with the lines
    assert [acc for _, acc in epoch_lines(resumed.stdout)] == [acc for _, acc in epoch_lines(full_output)[1:]]
    got = [loss for loss, _ in epoch_lines(resumed.stdout)]
    assert got == pytest.approx([loss for loss, _ in epoch_lines(full_output)[1:]], abs=1e-4)
    # keep_last=3: the periodic checkpoints 28 and 32, and the one saved when the run ended.
    assert sorted(p.name for p in full_dir.glob("step_*")) == [
        "step_000000028", "step_000000032", "step_000000033"
    ]  # fmt: skip


@pytest.mark.mpi
def test_resume_at_an_epoch_boundary_and_of_a_finished_run(tmp_path, uninterrupted):
    """The example's ordinary loop (no position bookkeeping): stopped right after epoch 1's last batch,
    it resumes with epoch 2's first; resuming a finished run trains nothing and reports no epoch."""
    full_dir, full_output = uninterrupted(2)
    shutil.copytree(full_dir, tmp_path / "full")  # resumed below: the shared run stays as it was
    train(2, tmp_path / "resumed", "--max-steps", "11")  # epoch 1 is 11 steps
    resumed = train(2, tmp_path / "resumed", "--resume")
    assert "step_000000011: step 11, epoch 1, batch 11 done" in resumed.stdout
    assert epoch_lines(resumed.stdout) == epoch_lines(full_output)[1:]
    assert_same_tensors(final_checkpoint(tmp_path / "resumed")[1], final_checkpoint(tmp_path / "full")[1])
    again = train(2, tmp_path / "full", "--resume")
    assert "step 33, epoch 3, batch 11 done" in again.stdout and "train loss" not in again.stdout
    assert final_accuracy(again.stdout) == final_accuracy(full_output)


@pytest.mark.mpi
def test_resume_on_another_mesh_matches_the_uninterrupted_run(tmp_path, dp4_reference):
    reference, reference_output = dp4_reference
    train(4, tmp_path / "tp", "--max-steps", "15")  # saved by dp=4 ...
    shutil.copytree(tmp_path / "tp", tmp_path / "pp")
    _, expected = final_checkpoint(reference)
    for name, flags in {"tp": ("--tp", "2"), "pp": ("--pp", "2")}.items():  # ... resumed as dp2 x tp2 / x pp2
        resumed = train(4, tmp_path / name, *flags, "--resume")
        saved_on = "(saved on dp=4 x tp=1 x pp=1, resharded): step 15, epoch 2, batch 4 done"
        assert saved_on in resumed.stdout, resumed.stdout  # (it printed the manifest's raw dict)
        # The same model and global batches, but tp splits each row-parallel matmul's sum in two and pp
        # cuts the batch into microbatches: float32 sums in another order, about 1e-7 relative per step.
        # Over the 18 resumed SGD steps the weights (|w| < ~1) differ by ~1e-7 (measured up to 1.2e-7);
        # atol 1e-6 leaves a margin of 8, while a wrong resharding (a swapped shard, a lost momentum)
        # changes weights by 1e-3 or more. The accuracy (counts of 297 argmaxes) is then the same.
        step, got = final_checkpoint(tmp_path / name)
        assert step == 33
        assert_same_tensors(got, expected, rtol=1e-5, atol=1e-6)
        assert final_accuracy(resumed.stdout) == final_accuracy(reference_output), name


@pytest.mark.mpi
def test_a_killed_rank_then_resume_gives_the_uninterrupted_result(tmp_path, dp4_reference):
    reference, reference_output = dp4_reference
    ckpt = tmp_path / "ckpt"
    # Rank 2 SIGKILLs itself in step 15 (checkpoints were saved after steps 4, 8 and 12): the job fails.
    killed = run_mpi(
        4,
        "training/train_mlp_killed.py",
        "2:14",
        *CKPT_ARGS,
        "--checkpoint-dir",
        str(ckpt),
        timeout=120,
        check=False,
    )
    assert killed.returncode != 0
    assert (ckpt / "latest").read_text().strip() == "step_000000012"
    resumed = train(4, ckpt, "--resume")
    assert "step_000000012: step 12, epoch 2, batch 1 done" in resumed.stdout  # epoch 1 is 11 steps
    step, got = final_checkpoint(ckpt)
    assert step == 33
    assert_same_tensors(got, final_checkpoint(reference)[1])  # steps 13-14 redone, identically
    assert final_accuracy(resumed.stdout) == final_accuracy(reference_output)


@pytest.mark.mpi
def test_recompute_gives_bit_identical_training(tmp_path):
    # Recomputation replays the same float operations on the same inputs, so gradients, weights and
    # accuracy are identical, with DDP (here with no_sync micro-batches) and with tensor parallelism.
    for name, (n, flags) in {"dp2": (2, ("--grad-accum", "2")), "dp2xtp2": (4, ("--tp", "2"))}.items():
        output = {}
        for recompute in ("", "--recompute"):
            ckpt = tmp_path / (name + recompute)
            output[recompute] = train(n, ckpt, *flags, *recompute.split(), "--max-steps", "5").stdout
        plain, recomputed = (
            final_checkpoint(tmp_path / name),
            final_checkpoint(tmp_path / f"{name}--recompute"),
        )
        assert plain[0] == recomputed[0] == 5
        assert_same_tensors(recomputed[1], plain[1])
        label = "test accuracy after 5 steps"  # --max-steps: not the final model, and it says so
        assert final_accuracy(output[""], label) == final_accuracy(output["--recompute"], label), name


def test_resume_without_a_checkpoint_starts_from_scratch(tmp_path):
    args = ("--epochs", "1", "--hidden", "8", "--max-steps", "2", "--checkpoint-dir", str(tmp_path))
    result = run_one_process(*args, "--resume")
    assert result.returncode == 0, result.stderr
    assert f"no checkpoint in {tmp_path}: starting from scratch" in result.stdout
    assert (tmp_path / "latest").read_text().strip() == "step_000000002"
    assert run_one_process("--resume").returncode == 2  # --resume needs --checkpoint-dir
