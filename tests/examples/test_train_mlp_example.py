"""The example with every option (docs/training.md): examples/train_mlp.py on real MPI ranks.

The checkpoint tests at the end stop a run with ``--max-steps`` (or SIGKILL one rank through
``tests/workers/training/train_mlp_killed.py``), resume it with ``--resume``, and compare the parameters of
the final checkpoint, read here with safetensors independently of ``minidist.checkpoint.load``.

Starting N Python ranks costs about as much as one of these short trainings, so every run that ends
normally is listed in ``RUNS`` and made by the module fixture ``runs``: one launch per world size
(``tests/workers/training/train_mlp_runs.py`` calls the example's ``main`` once per run), made when a
test first asks for a run of that size. The tests then check each run's output and checkpoints.
Runs that must fail (bad flags, a killed rank) keep a launch of their own: the exit code is checked.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from launch_utils import checkpoint_tensors
from mpi_utils import REPO, mpi_env, run_mpi

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


# The short run of the world-size and tp tests; LAYOUT_ARGS: the pipeline layouts' and zero's runs.
SHORT_ARGS = ("--epochs", "4", "--hidden", "32")
LAYOUT_ARGS = ("--epochs", "3", "--hidden", "32", "32")
# 3 epochs of 11 steps (1500 digits, global batch 128); --max-steps 15 stops 4 batches into epoch 2.
CKPT_ARGS = ("--epochs", "3", "--hidden", "32", "32", "--checkpoint-every", "4")


def ckpt(folder: str, *flags: str) -> tuple[str, ...]:
    """CKPT_ARGS with checkpoints in ``folder`` (under the fixture's temporary folder), then ``flags``."""
    return (*CKPT_ARGS, "--checkpoint-dir", f"{{tmp}}/{folder}", *flags)


SAME_LAYOUTS = {"dp2": (2, ()), "dp2-zero2-grad-accum2": (2, ("--zero", "2", "--grad-accum", "2")),
                "dp2xpp2": (4, ("--pp", "2")), "dp2-async": (2, ("--async-checkpoint",))}  # fmt: skip
PIPELINE_LAYOUTS = {
    "dp2 x pp2, gpipe, m=2": (4, "--pp", "2", "--schedule", "gpipe", "--microbatches", "2"),
    "dp2 x tp2 x pp2, 1f1b, m=4": (8, "--dp", "2", "--tp", "2", "--pp", "2"),
    "dp1 x pp3, 1f1b, m=8": (3, "--pp", "3", "--microbatches", "8"),
    "dp1 x pp2, interleaved v=2, m=4": (2, "--pp", "2", "--schedule", "interleaved", "--virtual-stages", "2"),
    # 128 samples on 3 replicas: shares 43 + 43 + 42, weighted exactly when combined over dp
    "dp3 x pp2 (uneven shares), m=1": (6, "--pp", "2", "--microbatches", "1"),
}
RECOMPUTE = {"dp2": (2, ("--grad-accum", "2")), "dp2xtp2": (4, ("--tp", "2"))}
COPY = "copy"  # RUNS value (n, (COPY, source, destination)): copy a checkpoint folder between two runs

# Every run that ends normally, by name: (ranks, arguments), "{tmp}" standing for the fixture's folder.
# In a launch the runs follow this order, so a run may resume from one listed before it.
# "default" is docs/training.md's first command exactly (8 ranks, its defaults): what a new user runs
# first, so it is tested as written, although 8 ranks on 2 cores cost ~24 s of CPU where 2 would show
# the same accuracy.
WORLD_SIZES = (1, 3, 4, 6)  # 3 and 6 do not divide the global batch of 128; 6 shares the launch of dp3 x pp2
RUNS: dict[str, tuple[int, tuple[str, ...]]] = {
    "default": (8, ()),
    **{f"short on {n}": (n, SHORT_ARGS) for n in WORLD_SIZES},
    **{f"short tp={tp}": (4, (*SHORT_ARGS, "--tp", str(tp))) for tp in (2, 4)},
    **{f"zero {z}": (3, (*LAYOUT_ARGS, "--zero", str(z))) for z in (0, 1, 2)},
    **{name: (n, (*LAYOUT_ARGS, *flags)) for name, (n, *flags) in PIPELINE_LAYOUTS.items()},
}
for _name, (_n, _flags) in SAME_LAYOUTS.items():  # uninterrupted; stopped at step 15 and resumed
    RUNS[f"{_name} uninterrupted"] = (_n, ckpt(f"{_name}-full", *_flags))
    RUNS[f"{_name} stopped"] = (_n, ckpt(_name, *_flags, "--max-steps", "15"))
    RUNS[f"{_name} resumed"] = (_n, ckpt(_name, *_flags, "--resume"))
RUNS |= {
    "dp4 uninterrupted": (4, ckpt("dp4-full")),
    # stopped after epoch 1's last batch and resumed; a finished run (a copy of dp2's) resumed
    "boundary stopped": (2, ckpt("boundary", "--max-steps", "11")),
    "boundary resumed": (2, ckpt("boundary", "--resume")),
    "copy dp2": (2, (COPY, "{tmp}/dp2-full", "{tmp}/finished")),
    "finished resumed": (2, ckpt("finished", "--resume")),
    # saved by dp=4 at step 15, resumed as dp2 x tp2 and dp2 x pp2
    "dp4 stopped": (4, ckpt("tp", "--max-steps", "15")),
    "copy dp4": (4, (COPY, "{tmp}/tp", "{tmp}/pp")),
    "resumed as tp": (4, ckpt("tp", "--tp", "2", "--resume")),
    "resumed as pp": (4, ckpt("pp", "--pp", "2", "--resume")),
    **{f"recompute {name}{r}": (n, ckpt(f"recompute-{name}{r.strip()}", *flags, *r.split(),
                                        "--max-steps", "5"))
       for name, (n, flags) in RECOMPUTE.items() for r in ("", " --recompute")},
}  # fmt: skip


class Runs:
    """The runs of ``RUNS``, made on first use: one launch for all the runs of a world size."""

    def __init__(self, tmp: Path) -> None:
        self.tmp, self.launched = tmp, set()
        fresh = [a for _, a in RUNS.values() if "--checkpoint-dir" in a and "--resume" not in a]
        written = [argv[argv.index("--checkpoint-dir") + 1] for argv in fresh]
        assert len(written) == len(set(written)), "two runs start in the same checkpoint folder"

    def launch(self, n: int) -> None:
        steps = []
        for name, (size, argv) in RUNS.items():
            argv = [a.replace("{tmp}", str(self.tmp)) for a in argv]
            if size == n:
                steps.append(
                    {"copy": argv[1:]}
                    if argv[0:1] == [COPY]
                    else {"argv": argv, "stdout": str(self.tmp / name)}
                )
        (self.tmp / f"steps{n}.json").write_text(json.dumps(steps))
        # A generous timeout (60 s a run, as in separate launches), but a hang still fails the tests.
        run_mpi(n, "training/train_mlp_runs.py", self.tmp / f"steps{n}.json", timeout=120 + 60 * len(steps))
        self.launched.add(n)

    def stdout(self, name: str) -> str:
        """What the run printed: rank 0's stdout, then the other ranks' (which print nothing)."""
        n = RUNS[name][0]
        if n not in self.launched:
            self.launch(n)
        return "".join((self.tmp / f"{name}.rank{r}").read_text() for r in range(n))

    def folder(self, name: str) -> Path:
        """The --checkpoint-dir of the run ``name`` (after the run)."""
        self.stdout(name)
        return self.tmp / RUNS[name][1][RUNS[name][1].index("--checkpoint-dir") + 1].removeprefix("{tmp}/")


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Runs:
    return Runs(tmp_path_factory.mktemp("runs"))


@pytest.mark.mpi
def test_default_run_on_8_ranks_reaches_95_percent(runs):
    output = runs.stdout("default")
    assert final_accuracy(output) >= 0.95
    # The final line of rank 0's output is the accuracy line, after the progress bar's last update.
    assert output.strip().splitlines()[-1].startswith("final test accuracy: ")


@pytest.mark.mpi
def test_any_world_size_gives_the_same_accuracy(runs):
    # 3 and 6 do not divide the global batch of 128: the sampler splits it 43+43+42, 22+22+21+21+21+21.
    accuracies = {n: final_accuracy(runs.stdout(f"short on {n}")) for n in WORLD_SIZES}
    assert len(set(accuracies.values())) == 1, accuracies


@pytest.mark.mpi
def test_global_batch_smaller_than_world_is_an_error_on_every_rank():
    result = run_mpi(4, EXAMPLE, "--batch-size", "3", timeout=60, check=False)
    assert result.returncode == 2
    assert result.stderr.startswith("error on ranks 0-3: global batch_size=3 is smaller than num_replicas=4")
    assert result.stderr.count("global batch_size=3") == 1, result.stderr  # once for all ranks


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
        [sys.executable, "-m", "minidist_cli", "info"],
        capture_output=True,
        text=True,
        env=mpi_env(),
        timeout=60,
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


@pytest.mark.mpi
@pytest.mark.parametrize("flags", [(), ("--pp", "2")], ids=["ddp", "pipeline"])
def test_a_nan_learning_rate_is_one_error_on_every_rank(flags):
    # NaN passes the "--lr > 0" test of the command line (every comparison with NaN is False); SGD
    # refuses it with torch's message, on every rank, before any step.
    result = run_mpi(2, EXAMPLE, "--lr", "nan", "--max-steps", "1", *flags, timeout=60, check=False)
    assert result.returncode == 2
    assert result.stderr == "error on ranks 0-1: Invalid learning rate: nan\n", result.stderr


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
def test_zero_stages_train_the_same_model_as_ddp(runs):
    accuracies = {zero: final_accuracy(runs.stdout(f"zero {zero}")) for zero in (0, 1, 2)}
    assert len(set(accuracies.values())) == 1, accuracies


@pytest.mark.mpi
def test_tensor_parallel_trains_the_same_model_as_data_parallel(runs):
    # 4 ranks as dp=4, dp=2 x tp=2 and tp=4: the same global batches and initial weights, so the same
    # model up to float32 rounding (tp changes the order of a matmul's sum), which leaves the accuracy.
    # tp=1 is the default: the plain run on 4 ranks.
    accuracies = {tp: final_accuracy(runs.stdout(f"short tp={tp}")) for tp in (2, 4)}
    accuracies[1] = final_accuracy(runs.stdout("short on 4"))
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
def test_pipeline_and_3d_layouts_train_the_same_model_as_data_parallel(runs):
    # Same global batches and initial weights in every layout, so the same model up to float32
    # rounding (microbatches, stage boundaries and the tp all-reduce change summation orders; a relative
    # 1e-6 or so per step). The printed losses (4 decimals) may differ in the last digit at most, and the
    # accuracies not at all; a missing 1/m or a wrongly weighted dp share changes both by far more.
    # The plain dp=4 run is the checkpoint tests' reference (CKPT_ARGS: these args, and checkpoints
    # every 4 steps, which read the model and never change it).
    assert CKPT_ARGS[: len(LAYOUT_ARGS)] == LAYOUT_ARGS
    plain = epoch_lines(runs.stdout("dp4 uninterrupted"))
    for name in PIPELINE_LAYOUTS:
        got = epoch_lines(runs.stdout(name))
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
def train(n: int, ckpt: Path, *flags: str) -> subprocess.CompletedProcess:
    return run_mpi(n, EXAMPLE, *CKPT_ARGS, "--checkpoint-dir", str(ckpt), *flags, timeout=120)


def final_checkpoint(root: Path) -> tuple[int, dict[str, np.ndarray]]:
    """(step, {"model/<name>" or "optim/<name>/<state>": global array}) of the checkpoint ``latest`` names:
    each tensor's tp shards concatenated along its tp_dim, straight from the files and the manifest."""
    return checkpoint_tensors(root / (root / "latest").read_text().strip())


def assert_same_tensors(got: dict, expected: dict, **tolerance: float) -> None:
    assert sorted(got) == sorted(expected)
    for key in expected:
        if tolerance:
            np.testing.assert_allclose(got[key], expected[key], err_msg=key, **tolerance)
        else:
            assert np.array_equal(got[key], expected[key]), key


@pytest.mark.mpi
@pytest.mark.parametrize("layout", SAME_LAYOUTS)
def test_resume_on_the_same_layout_continues_bit_exactly(runs, layout):
    full_dir, full_output = runs.folder(f"{layout} uninterrupted"), runs.stdout(f"{layout} uninterrupted")
    stopped, resumed = runs.stdout(f"{layout} stopped"), runs.stdout(f"{layout} resumed")
    assert "stopped at step 15 of 33 (--max-steps); continue with --resume" in stopped

    # The same float operations in the same order: the final weights and momenta are identical.
    step, expected = final_checkpoint(full_dir)
    assert step == 33
    step, got = final_checkpoint(runs.folder(f"{layout} resumed"))
    assert step == 33
    assert_same_tensors(got, expected)
    assert final_accuracy(resumed) == final_accuracy(full_output)
    # It continues where it stopped: epoch 2 after its 4th batch, the progress counting on from 15 of
    # 33 steps (stdout is a pipe here, so plain lines every 33 // 10 = 3 steps: 18 is the first), and
    # it prints epochs 2 and 3 only, the resumed epoch's loss over all its batches (carried in the
    # checkpoint), up to the order of the float64 sums.
    assert "step_000000015: step 15, epoch 2, batch 4 done" in resumed
    assert re.findall(r"train: step (\d+)/33", resumed)[0] == "18", resumed
    assert [acc for _, acc in epoch_lines(resumed)] == [acc for _, acc in epoch_lines(full_output)[1:]]
    got = [loss for loss, _ in epoch_lines(resumed)]
    assert got == pytest.approx([loss for loss, _ in epoch_lines(full_output)[1:]], abs=1e-4)
    # keep_last=3: the periodic checkpoints 28 and 32, and the one saved when the run ended.
    assert sorted(p.name for p in full_dir.glob("step_*")) == [
        "step_000000028", "step_000000032", "step_000000033"
    ]  # fmt: skip


@pytest.mark.mpi
def test_async_checkpoints_hold_the_same_files_as_sync_ones(runs):
    """--async-checkpoint: the background save writes the bytes a synchronous one writes (the
    manifest differs only in its creation time) and training computes the same (equal accuracy)."""
    sync, background = runs.folder("dp2 uninterrupted"), runs.folder("dp2-async uninterrupted")
    folders = sorted(p.name for p in sync.glob("step_*"))
    assert folders == sorted(p.name for p in background.glob("step_*")) and folders
    for name in folders:
        for file in sorted((sync / name).iterdir()):
            a, b = file.read_bytes(), (background / name / file.name).read_bytes()
            if file.name == "manifest.json":
                a, b = ({k: v for k, v in json.loads(x).items() if k != "created"} for x in (a, b))
            assert a == b, (name, file.name)
    assert final_accuracy(runs.stdout("dp2-async uninterrupted")) == final_accuracy(
        runs.stdout("dp2 uninterrupted")
    )


@pytest.mark.mpi
def test_resume_at_an_epoch_boundary_and_of_a_finished_run(runs):
    """The example's ordinary loop (no position bookkeeping): stopped right after epoch 1's last batch,
    it resumes with epoch 2's first; resuming a finished run trains nothing and reports no epoch."""
    full_output = runs.stdout("dp2 uninterrupted")
    resumed = runs.stdout("boundary resumed")
    assert "step_000000011: step 11, epoch 1, batch 11 done" in resumed
    assert epoch_lines(resumed) == epoch_lines(full_output)[1:]
    full = runs.folder("dp2 uninterrupted")
    assert_same_tensors(final_checkpoint(runs.folder("boundary resumed"))[1], final_checkpoint(full)[1])
    again = runs.stdout("finished resumed")  # resumed in a copy: the shared run stays as it was
    assert "step 33, epoch 3, batch 11 done" in again and "train loss" not in again
    assert final_accuracy(again) == final_accuracy(full_output)


@pytest.mark.mpi
def test_resume_on_another_mesh_matches_the_uninterrupted_run(runs):
    reference, reference_output = runs.folder("dp4 uninterrupted"), runs.stdout("dp4 uninterrupted")
    _, expected = final_checkpoint(reference)
    for name in ("tp", "pp"):  # saved by dp=4 ("dp4 stopped") and resumed as dp2 x tp2 / x pp2
        resumed = runs.stdout(f"resumed as {name}")
        saved_on = "(saved on dp=4 x tp=1 x pp=1, resharded): step 15, epoch 2, batch 4 done"
        assert saved_on in resumed, resumed  # (it printed the manifest's raw dict)
        # The same model and global batches, but tp splits each row-parallel matmul's sum in two and pp
        # cuts the batch into microbatches: float32 sums in another order, about 1e-7 relative per step.
        # Over the 18 resumed SGD steps the weights (|w| < ~1) differ by ~1e-7 (measured up to 1.2e-7);
        # atol 1e-6 leaves a margin of 8, while a wrong resharding (a swapped shard, a lost momentum)
        # changes weights by 1e-3 or more. The accuracy (counts of 297 argmaxes) is then the same.
        step, got = final_checkpoint(runs.folder(f"resumed as {name}"))
        assert step == 33
        assert_same_tensors(got, expected, rtol=1e-5, atol=1e-6)
        assert final_accuracy(resumed) == final_accuracy(reference_output), name


@pytest.mark.mpi
def test_a_killed_rank_then_resume_gives_the_uninterrupted_result(tmp_path, runs):
    # On 2 ranks (it was 4, against the dp4 run): a rank dies and the other is left waiting all the same,
    # for 3.6 s of CPU instead of 10.8.
    reference, reference_output = runs.folder("dp2 uninterrupted"), runs.stdout("dp2 uninterrupted")
    ckpt = tmp_path / "ckpt"
    # Rank 1 SIGKILLs itself in step 15 (checkpoints were saved after steps 4, 8 and 12): the job fails.
    killed = run_mpi(
        2,
        "training/train_mlp_killed.py",
        "1:14",
        *CKPT_ARGS,
        "--checkpoint-dir",
        str(ckpt),
        timeout=120,
        check=False,
    )
    assert killed.returncode != 0
    assert (ckpt / "latest").read_text().strip() == "step_000000012"
    resumed = train(2, ckpt, "--resume")
    assert "step_000000012: step 12, epoch 2, batch 1 done" in resumed.stdout  # epoch 1 is 11 steps
    step, got = final_checkpoint(ckpt)
    assert step == 33
    assert_same_tensors(got, final_checkpoint(reference)[1])  # steps 13-14 redone, identically
    assert final_accuracy(resumed.stdout) == final_accuracy(reference_output)


@pytest.mark.mpi
def test_recompute_gives_bit_identical_training(runs):
    # Recomputation replays the same float operations on the same inputs, so gradients, weights and
    # accuracy are identical, with DDP (here with no_sync micro-batches) and with tensor parallelism.
    for name in RECOMPUTE:
        plain, recomputed = f"recompute {name}", f"recompute {name} --recompute"
        plain_ckpt, recomputed_ckpt = (
            final_checkpoint(runs.folder(plain)),
            final_checkpoint(runs.folder(recomputed)),
        )
        assert plain_ckpt[0] == recomputed_ckpt[0] == 5
        assert_same_tensors(recomputed_ckpt[1], plain_ckpt[1])
        label = "test accuracy after 5 steps"  # --max-steps: not the final model, and it says so
        assert final_accuracy(runs.stdout(plain), label) == final_accuracy(runs.stdout(recomputed), label), (
            name
        )


def test_resume_without_a_checkpoint_starts_from_scratch(tmp_path):
    args = ("--epochs", "1", "--hidden", "8", "--max-steps", "2", "--checkpoint-dir", str(tmp_path))
    result = run_one_process(*args, "--resume")
    assert result.returncode == 0, result.stderr
    assert f"no checkpoint in {tmp_path}: starting from scratch" in result.stdout
    assert (tmp_path / "latest").read_text().strip() == "step_000000002"
    assert run_one_process("--resume").returncode == 2  # --resume needs --checkpoint-dir
