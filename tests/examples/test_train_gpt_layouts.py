"""examples/train_gpt.py on 4-D layouts: tensor (+ sequence), pipeline, context
and data parallelism composed train the model of one process; checkpoints move between layouts.

Every run goes through the example with a tiny float64 model for 4 steps (test_train_gpt_example.py's
``TINY``, with 8 windows per step so that 8 data-parallel ranks get one each, and 4 heads so that tp 4
splits them) and saves its losses and the final weights, gathered into one GPT (``gather_gpt``), with
``--out``. One launch per layout, cached for the module; each resumed run starts from another run's
step-2 checkpoint and must end where the uninterrupted one-process run ends.

Coverage (each axis at least once): dp 2 x tp 2 x pp 2 (the tied token table across the stages, this tp
rank's vocabulary shard: 63 characters over tp 2 is 32 + 31 rows), dp 2 x tp 2 x cp 2 with sequence
parallelism (ring attention and the balanced split), tp 4 with sequence parallelism, cp 4, and dp 4 (the
plain data-parallel path, and another dp size than the saver's 2) resuming a pipeline's checkpoint;
dp 2 x tp 2 with sequence parallelism under FSDP, whose checkpoint resumes on a pipeline, and
tp 2 x cp 2 under FSDP resuming a pipeline's. Interleaved schedules of the GPT pipeline are tested on
their own in test_pipeline_gpt.py.

Tolerance: 1e-10 relative (float64). Only the order of floating-point sums differs from one process: the
row-parallel partial products summed over tp, the loss's sums over vocabulary slices, the ring's online
softmax, the gradients summed over dp x cp, the tied copy's two halves; each is exact to a few ulps
(~1e-16), and 4 AdamW steps keep a relative error relative (m / sqrt(v) is scale-free). 1e-10 is far
above that and far below a real mistake (a wrong slice or a missing sum moves a step's update by ~lr =
2e-3). ``atol = 1e-13`` covers the attention's key bias, whose exact gradient is 0: its computed one is
rounding noise that AdamW turns into weights of ~1e-15 (test_train_gpt_example.py's docstring).
"""

from __future__ import annotations

import re

import gpt_example
import numpy as np
import pytest
from gpt_example import cached_runs, checkpoint_at_step_2, load_example

LAYOUT_TINY = (
    "--n-layer", "1", "--n-embd", "16", "--n-head", "4", "--block-size", "16", "--batch-size", "8",
    "--max-iters", "4", "--eval-interval", "2", "--eval-iters", "1", "--sample-tokens", "5",
    "--dtype", "float64", "--grad-clip", "0.1",
)  # fmt: skip
RTOL, ATOL = 1e-10, 1e-13  # see the module docstring


def launch(n: int, *args: str, check: bool = True):
    """The example with ``LAYOUT_TINY`` on ``n`` ranks (``n == 1``: a plain ``python`` process)."""
    return gpt_example.launch(n, *LAYOUT_TINY, *args, timeout=240, check=check)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """``trained(n, *flags)``: ``(stdout, {losses, val_loss, weights...}, checkpoint folder)``, run once."""
    return cached_runs(tmp_path_factory, launch, "layout")


def assert_same_training(got: dict, expected: dict) -> None:
    # GPT's parameter names, every one gathered
    gpt_example.assert_same_training(got, expected, RTOL, ATOL)


PIPELINE = ("--dp", "2", "--tp", "2", "--pp", "2")  # 8 ranks; --microbatches: the default, 2 pp = 4
CONTEXT = ("--dp", "2", "--tp", "2", "--cp", "2", "--sequence-parallel")  # 8 ranks
FSDP_TP = ("--dp", "2", "--tp", "2", "--sequence-parallel", "--fsdp")  # 4 ranks: FSDP's shards of tp pieces


@pytest.mark.mpi
@pytest.mark.parametrize("flags", [PIPELINE, CONTEXT], ids=["dp2-tp2-pp2", "dp2-tp2-cp2-sp"])
def test_a_4d_layout_trains_the_model_of_one_process(trained, flags):
    """The same losses at every step, validation loss and final weights as one process."""
    _, reference, _ = trained(1)
    stdout, result, _ = trained(8, *flags)
    assert_same_training(result, reference)
    assert len(result["losses"]) == 4 and np.all(np.diff(result["losses"]) != 0)  # 4 real steps
    layout = "dp 2 x tp 2 x pp 2 x cp 1, 1f1b with 4 microbatches" if "--pp" in flags else "cp 2, sequence"
    assert "8 ranks (" in stdout and layout in stdout, stdout
    match = re.search(r"^val loss: (\d+\.\d{4})\n", stdout, re.MULTILINE)
    assert match and float(match.group(1)) == pytest.approx(float(result["val_loss"]), abs=5e-5), stdout
    assert len(stdout[match.end() :]) == 1 + 5 + 1  # the sample from the gathered model: prompt, 5, newline


@pytest.mark.mpi
@pytest.mark.parametrize(
    ("saved", "n", "flags"),
    [
        # a pipeline's pieces (tied copy not saved) -> plain DDP on 4 ranks: the pieces put together and
        # the data position carried from dp 2 to dp 4, as to dp 8 (which cost 25 s of CPU against ~10)
        ((8, PIPELINE), 4, ()),
        ((1, ()), 4, ("--tp", "4", "--sequence-parallel")),  # one process -> 63 rows cut 16+16+16+15
        ((8, CONTEXT), 4, ("--cp", "4")),  # dp x tp x cp -> cp 4 (the vocabulary pieces put back)
        ((8, PIPELINE), 4, ("--tp", "2", "--cp", "2", "--fsdp")),  # -> FSDP over cp of tp pieces
    ],
    ids=["dp2-tp2-pp2-to-dp4", "1-to-tp4-sp", "dp2-tp2-cp2-sp-to-cp4", "dp2-tp2-pp2-to-fsdp-tp2-cp2"],
)
def test_a_checkpoint_resumes_on_another_layout(trained, tmp_path, saved, n, flags):
    """Step 2 saved on one layout, resumed on another (resharded by GPT's names, AdamW's moments too),
    ends where the uninterrupted one-process run ends."""
    _, reference, _ = trained(1)
    _, _, ckpt = trained(*saved[:1], *saved[1])
    root = checkpoint_at_step_2(ckpt, tmp_path / "ckpt")
    out = tmp_path / "resumed.npz"
    result = launch(n, *flags, "--checkpoint-dir", str(root), "--resume", "--out", str(out))
    assert "at step 2" in result.stdout
    with np.load(out) as resumed:
        assert_same_training(dict(resumed), reference)


@pytest.mark.mpi
def test_fsdp_with_tensor_parallelism_trains_the_model_of_one_process_and_resumes_on_a_pipeline(
    trained, tmp_path
):
    """dp 2 x tp 2 with sequence parallelism under FSDP (the LayerNorms' shard gradients summed over tp,
    the clip's norm over the dp shards and the tp pieces: --grad-clip 0.1 clips every step) ends where
    one process ends; its step-2 checkpoint, gathered from the shards,
    resumes on tp 1 x pp 2 (the vocabulary pieces put back, the tied copy filled) and ends there too."""
    _, reference, _ = trained(1)
    stdout, result, ckpt = trained(4, *FSDP_TP)
    assert_same_training(result, reference)
    assert "(dp 2 x tp 2 x pp 1 x cp 1, sequence parallel, FSDP over dp x cp)" in stdout, stdout
    root = checkpoint_at_step_2(ckpt, tmp_path / "ckpt")
    out = tmp_path / "resumed.npz"
    resumed = launch(2, "--pp", "2", "--checkpoint-dir", str(root), "--resume", "--out", str(out))
    assert "at step 2" in resumed.stdout
    with np.load(out) as got:
        assert_same_training(dict(got), reference)


@pytest.mark.mpi
def test_a_layout_that_does_not_fit_the_ranks_ends_every_rank_with_one_message():
    result = launch(2, "--tp", "4", check=False)
    assert result.returncode == 2
    assert result.stderr.startswith(
        "error on ranks 0-1: the layout does not fit the 2 ranks: tp x pp x cp = 4 x 1 x 1 = 4 does not "
        "divide them"
    ), result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr, result.stderr


@pytest.mark.parametrize(
    ("ranks", "flags", "message"),
    [
        (8, ["--dp", "2", "--tp", "2"], "dp x tp x pp x cp = 2 x 2 x 1 x 1 must equal the number of ranks"),
        (4, ["--tp", "4", "--n-head", "2"], "--n-head 2 must be divisible by --tp 4"),
        (4, ["--cp", "4", "--block-size", "12"], "--block-size 12 must be divisible by 2 x --cp = 8"),
        (
            4,
            ["--sequence-parallel"],
            "--sequence-parallel splits the sequence over the tensor-parallel group",
        ),
        (4, ["--tp", "4", "--sequence-parallel", "--block-size", "6"], "--block-size 6 / --cp 1 must be"),
        (2, ["--cp", "2", "--dropout", "0.1"], "--dropout with --cp > 1"),
        (2, ["--tp", "2", "--zero", "1"], "--zero works on the data-parallel path only"),
        (4, ["--tp", "2", "--pp", "2", "--fsdp"], "--fsdp composes with --tp, --cp and --sequence-parallel"),
        (4, ["--pp", "2", "--grad-accum", "2"], "--grad-accum with --pp > 1"),
        (
            4,
            ["--pp", "2", "--batch-size", "12", "--microbatches", "4"],
            "not a whole number of --microbatches",
        ),
    ],
    ids=[
        "product",
        "heads",
        "cp-block",
        "sp-tp1",
        "sp-block",
        "cp-dropout",
        "zero",
        "fsdp-pp",
        "pp-accum",
        "pp-batch",
    ],
)
def test_bad_layouts_are_value_errors_before_any_collective(ranks, flags, message):
    """In this process: the checks use only the flags and the world size, so every rank raises the
    same error, which the example prints once (the launch above shows it) and exits with code 2."""
    example = load_example()
    args = example.parse_arguments(flags)
    with pytest.raises(ValueError, match=re.escape(message)):
        example.check_layout(args, ranks)


def test_the_default_data_parallel_size_and_microbatches():
    example = load_example()
    args = example.parse_arguments(["--tp", "2", "--pp", "2"])
    example.check_layout(args, 8)
    assert (args.dp, args.microbatches) == (2, 4) and not example.is_data_parallel(args)
    args = example.parse_arguments([])
    example.check_layout(args, 8)
    assert (args.dp, args.microbatches) == (8, 2) and example.is_data_parallel(args)
