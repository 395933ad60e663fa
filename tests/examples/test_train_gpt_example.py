"""examples/train_gpt.py on real ranks: one process and data parallelism train the
same GPT; a resumed run is the uninterrupted one; bad flags end every rank with one message.

Every run goes through the example itself, with a tiny float64 model for a few steps (``TINY``), and
saves its losses and final weights with ``--out``. Runs are cached for the module (``trained``): the
2-rank run is the reference of the equivalence tests and also the run whose checkpoints are resumed.

Tolerances (float64, machine epsilon 1.1e-16). A layout changes only the order of sums: DDP and ZeRO add
the ranks' gradients, accumulation adds the micro-batches', in another order than one process's matmul
over the whole batch; each such sum is exact to a few ulps, ~1e-16 relative. Four AdamW steps keep that
(the update m / sqrt(v) is scale-free, so a relative error in the gradient stays a relative error in the
update), measured over all layouts below: <= 2.2e-16 relative on the losses, <= 4.3e-17 absolute on the
weights (|w| <= 1.01). One exception: the key bias (the middle third of ``attn.c_attn.bias``) has a
gradient that is exactly 0 in exact arithmetic (adding a constant to every key leaves the softmax
unchanged), so its computed gradient is pure rounding noise (~1e-18), and AdamW moves it by
lr * m / (sqrt(v) + eps) ~ lr * noise / eps (the noise is far below eps = 1e-8): the key bias ends as
noise of 1e-16..1e-15, differing between layouts by up to its own size (measured 1.3e-16; 5e-16 without
clipping). ``ATOL = 1e-14`` covers that
with a 20x margin and is still 1e11 times smaller than what a real mistake moves a weight by (a wrong
average or a wrong slice of the batch changes a step's update by ~lr = 2e-3).
"""

from __future__ import annotations

import re
import shutil
import subprocess

import gpt_example
import numpy as np
import pytest
from gpt_example import cached_runs, checkpoint_at_step_2, load_example
from launch_utils import final_checkpoint
from mpi_utils import REPO

# 12 windows per step: divisible by 1, 2, 3, 4 ranks and by ranks x accumulation for the combos below.
# --eval-interval 2 saves a checkpoint at steps 2 and 4 when --checkpoint-dir is given; evaluating has no
# effect on training (its own windows, no dropout, no graph), so every run uses it. --grad-clip 0.1: the
# gradient norm of this model is ~0.4, so clipping acts at every step (at the default 1.0 it never would).
TINY = (
    "--n-layer", "1", "--n-embd", "16", "--n-head", "2", "--block-size", "16", "--batch-size", "12",
    "--max-iters", "4", "--eval-interval", "2", "--eval-iters", "1", "--sample-tokens", "5",
    "--dtype", "float64", "--grad-clip", "0.1",
)  # fmt: skip
RTOL, ATOL = 1e-13, 1e-14  # see the module docstring


def launch(n: int, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    """The example on ``n`` ranks (``n == 1``: a plain ``python`` process, no mpiexec start-up)."""
    return gpt_example.launch(n, *args, timeout=120, check=check)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """``trained(n, *flags)``: ``(stdout, {losses, val_loss, weights...}, checkpoint folder)`` of the
    example with ``TINY`` and ``flags`` on ``n`` ranks, run once per module."""
    return cached_runs(tmp_path_factory, lambda n, *flags: launch(n, *TINY, *flags), "gpt")


def assert_same_training(got: dict, expected: dict, exact: bool = False) -> None:
    gpt_example.assert_same_training(got, expected, RTOL, ATOL, exact=exact)


# ------------------------------------------------------------------------------------------ equivalence
@pytest.mark.mpi
@pytest.mark.parametrize(
    ("n", "flags"),
    [
        (1, ()),  # the whole batch at once on one process
        (1, ("--grad-accum", "4")),  # one process, 4 micro-batches of 3: what 4 ranks see
        (3, ("--grad-accum", "2")),  # DDP, accumulation with no_sync: 6 micro-batches of 2
        (4, ()),
        (2, ("--zero", "1", "--grad-accum", "3")),  # sharded AdamW state
        (3, ("--zero", "2", "--grad-accum", "4")),  # and sharded gradients, micro-batches of 1
    ],
    ids=["1", "1-accum4", "3-accum2", "4", "2-zero1-accum3", "3-zero2-accum4"],
)
def test_data_parallel_trains_the_model_of_one_process(trained, n, flags):
    """Each layout against DDP on 2 ranks: the same losses at every step and the same final weights."""
    _, reference, _ = trained(2)
    _, result, _ = trained(n, *flags)
    assert_same_training(result, reference)
    assert len(result["losses"]) == 4 and np.all(np.diff(result["losses"]) != 0)  # 4 real steps


@pytest.mark.mpi
def test_fsdp_trains_the_model_of_one_process(trained, tmp_path):
    """--fsdp: parameters, gradients and AdamW state sharded over 3 ranks, 2 micro-batches
    (the first under no_sync), clipping on the shards; the losses and weights of DDP on 2 ranks (and so
    of one process). Its own launch (3 ranks, --grad-accum 2). Its last checkpoint, gathered from the
    shards, holds exactly the final weights (test_fsdp_checkpoint.py reshards such checkpoints)."""
    _, reference, _ = trained(2)
    out, ckpt = tmp_path / "out.npz", tmp_path / "ckpt"
    launch(3, *TINY, "--fsdp", "--grad-accum", "2", "--out", str(out), "--checkpoint-dir", str(ckpt))
    with np.load(out) as saved:
        assert_same_training(dict(saved), reference)
        step, tensors = final_checkpoint(ckpt)
        assert step == 4
        for name in (k for k in saved if k not in ("losses", "val_loss", "train_loss", "skipped_steps")):
            np.testing.assert_array_equal(tensors[f"model/{name}"], saved[name], err_msg=name)


@pytest.mark.mpi
def test_dropout_masks_differ_per_rank_so_layouts_differ_only_with_dropout(trained):
    """With dropout each rank draws its own masks (seed + rank, nanoGPT's rule): 2 ranks then do not
    draw the masks 1 process draws, and no layout can match another. So equivalence is tested at
    dropout 0 (above); with dropout, resume is still bit-exact on the same layout (below)."""
    _, no_dropout, _ = trained(2)
    _, dropped, _ = trained(2, "--dropout", "0.2")
    assert not np.allclose(dropped["losses"][1:], no_dropout["losses"][1:], rtol=1e-6)


# ---------------------------------------------------------------------------------------------- resume
@pytest.mark.mpi
def test_resume_is_bit_exact_on_the_same_layout_with_dropout(trained, tmp_path):
    """2 steps, checkpoint, 2 more == 4 uninterrupted, to the last bit: the weights, AdamW's moments,
    the data position, the scheduler and each rank's dropout stream all come back. The resumed run
    saves in the background (--async-checkpoint): its step-4 shards are the very bytes the
    uninterrupted run's synchronous save wrote."""
    flags = ("--dropout", "0.2")
    _, full, ckpt = trained(2, *flags)
    root = checkpoint_at_step_2(ckpt, tmp_path / "ckpt")
    out = tmp_path / "resumed.npz"
    result = launch(2, *TINY, *flags, "--checkpoint-dir", str(root), "--resume", "--out", str(out),
                    "--async-checkpoint")  # fmt: skip
    assert "at step 2" in result.stdout
    with np.load(out) as resumed:
        assert_same_training(dict(resumed), full, exact=True)
    shards = sorted(p.name for p in (ckpt / "step_000000004").glob("*.safetensors"))
    assert shards and shards == sorted(p.name for p in (root / "step_000000004").glob("*.safetensors"))
    for name in shards:
        assert (root / "step_000000004" / name).read_bytes() == (ckpt / "step_000000004" / name).read_bytes()


@pytest.mark.mpi
@pytest.mark.parametrize(("n", "flags"), [(1, ()), (4, ("--zero", "2"))], ids=["1", "4-zero2"])
def test_resume_on_another_layout(trained, tmp_path, n, flags):
    """The 2-rank DDP checkpoint of step 2 resumed on 1 process, or on 4 ranks with ZeRO-2 (AdamW's
    state resharded), ends where the uninterrupted 2-rank run ends (same tolerances as above)."""
    _, full, ckpt = trained(2)
    root = checkpoint_at_step_2(ckpt, tmp_path / "ckpt")
    out = tmp_path / "resumed.npz"
    result = launch(n, *TINY, *flags, "--checkpoint-dir", str(root), "--resume", "--out", str(out))
    # The line says the checkpoint came from another layout, as the MLP example's does.
    assert (
        f"{root / 'step_000000002'} (saved on dp=2 x tp=1 x pp=1 x cp=1, resharded) at step 2"
        in result.stdout
    )
    with np.load(out) as resumed:
        assert_same_training(dict(resumed), full)


def test_a_resumed_run_with_more_steps_decays_over_the_new_length(trained, tmp_path):
    """The 4-step run resumed with --max-iters 6 decays its cosine over 6 steps and ends at --min-lr
    (2e-4), as a 6-step run does. (The saved scheduler of the 4-step run, restored, had ended its cosine
    at step 4 and climbed back to the peak 2e-3 by step 6: the cosine is periodic past its end.)"""
    import json  # noqa: PLC0415

    _, _, ckpt = trained(2)
    root = tmp_path / "ckpt"
    shutil.copytree(ckpt / "step_000000004", root / "step_000000004")
    result = launch(1, *TINY, "--max-iters", "6", "--checkpoint-dir", str(root), "--resume")
    assert "at step 4" in result.stdout
    manifest = json.loads((root / "step_000000006" / "manifest.json").read_text())
    assert [group["lr"] for group in manifest["optimizer"]["param_groups"]] == pytest.approx([2e-4, 2e-4])


@pytest.mark.mpi
def test_checkpoint_carries_the_vocabulary_and_the_schedule(trained):
    import json  # noqa: PLC0415

    _, _, ckpt = trained(2)
    extra = json.loads((ckpt / "step_000000002" / "manifest.json").read_text())["extra"]
    text = (REPO / "minidist" / "data" / "shakespeare.txt").read_text()
    assert extra["tokenizer"] == {"kind": "char", "chars": "".join(sorted(set(text)))}
    assert extra["scheduler"]["last_epoch"] == 2 and len(extra["losses"]) == 2


# ------------------------------------------------------------------------------- the example's output
@pytest.mark.mpi
def test_prints_the_validation_loss_then_a_sample(trained):
    stdout, result, _ = trained(2)
    match = re.search(r"^val loss: (\d+\.\d{4})\n", stdout, re.MULTILINE)
    assert match, stdout
    assert float(match.group(1)) == pytest.approx(float(result["val_loss"]), abs=5e-5)
    sample = stdout[match.end() :]
    # The prompt (a newline) and --sample-tokens 5 characters, then print's newline: nothing after it.
    assert len(sample) == 1 + 5 + 1 and sample[0] == "\n" and sample[-1] == "\n", repr(sample)
    assert re.search(r"^step +4: train loss \d+\.\d{4}, val loss \d+\.\d{4}$", stdout, re.MULTILINE)
    assert re.search(r"^step +4: loss \d+\.\d{4}, [\d,]+ tokens/s, MFU \d+\.\d%$", stdout, re.MULTILINE)


def test_trains_on_a_given_text_file_and_resumes_only_with_its_vocabulary(tmp_path):
    text = "to be or not to be, that is the question.\n" * 20
    own = tmp_path / "own.txt"
    own.write_text(text)
    ckpt = tmp_path / "ckpt"
    result = launch(1, *TINY, "--data", str(own), "--checkpoint-dir", str(ckpt))
    assert f"{len(set(text))} characters" in result.stdout and "val loss: " in result.stdout
    # Same length and number of characters, another character: the ids would mean other characters.
    other = tmp_path / "other.txt"
    other.write_text(text.replace("q", "z"))
    result = launch(1, *TINY, "--data", str(other), "--checkpoint-dir", str(ckpt), "--resume", check=False)
    assert result.returncode == 2
    assert result.stderr.startswith(
        "error: the checkpoint was trained on another vocabulary (this text lacks 'q' and has 'z' instead)"
    ), result.stderr


def test_a_text_without_a_newline_is_sampled_from_its_first_character(tmp_path):
    """The sample's prompt is a newline only where the text has one (encoding it raised ValueError,
    after the whole run, on rank 0 alone)."""
    one_line = tmp_path / "one_line.txt"
    one_line.write_text("to be or not to be, that is the question. " * 20)
    result = launch(1, *TINY, "--max-iters", "1", "--data", str(one_line))
    sample = result.stdout[result.stdout.index("val loss: ") :].split("\n", 1)[1]
    assert sample.startswith("t") and len(sample) == 1 + 5 + 1, repr(sample)


# ---------------------------------------------------------------------------------------------- errors
@pytest.mark.mpi
@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--grad-accum", "5"), "error on ranks 0-1: batch_size=12 does not divide by world_size * "),
        (("--n-embd", "15"), "error on ranks 0-1: GPTConfig: n_embd=15 must be divisible by n_head=2"),
        (("--data", "missing.txt"), "error on ranks 0-1: text file 'missing.txt' does not exist"),
        (("--data", "LATIN1"), "error on ranks 0-1: text file '{}' is not valid UTF-8 (byte 0xe9"),
        (("--data", "SHORT"), "error on ranks 0-1: the text's validation part (last 10 %) has 3 characters"),
        # NaN passes every "lr <= 0" test; AdamW refuses it as torch's does, on every rank.
        (("--lr", "nan", "--max-iters", "1"), "error on ranks 0-1: Invalid learning rate: nan"),
    ],
    ids=["batch", "heads", "missing-file", "not-utf8", "short-validation", "nan-lr"],
)
def test_bad_flags_end_every_rank_with_one_message(tmp_path, flags, message):
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("café au lait\n".encode("latin-1"))
    short = tmp_path / "short.txt"  # 30 characters: 27 for training, 3 for validation (block size 16)
    short.write_text("abcdefghijklmnopqrstuvwxyz01\n\n")
    flags = tuple({"LATIN1": str(latin1), "SHORT": str(short)}.get(f, f) for f in flags)
    result = launch(2, *TINY, *flags, check=False)
    assert result.returncode == 2
    assert result.stderr.startswith(message.format(latin1)), result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr, result.stderr


def test_resume_with_another_seed_is_one_message_naming_the_flag(tmp_path):
    """Before: each checkpoint was reported as "skipping a checkpoint that does not load" (its sampler has
    another seed), as if the files were damaged, then "no checkpoint loads"."""
    root = tmp_path / "ckpt"
    launch(1, *TINY, "--checkpoint-dir", str(root), "--sample-tokens", "0")  # steps 2 and 4 saved
    result = launch(1, *TINY, "--checkpoint-dir", str(root), "--resume", "--seed", "7", check=False)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "skipping" not in result.stdout + result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr, result.stderr
    assert (
        f"the checkpoints in {root} were trained with --seed 1337, and this run has --seed 7" in result.stderr
    )


def test_help_states_each_default_once():
    """argparse's ArgumentDefaultsHelpFormatter appended "(default: None)" to help texts that state their
    own default (--dp: ranks/(tp pp cp)), and a second one to --microbatches's."""
    help_text = load_example().parser.format_help()
    options = re.split(r"\n  (?=-)", help_text.split("options:", 1)[1])
    doubled = [option for option in options if option.count("(default") > 1]
    assert not doubled, doubled
    assert "(default: None)" not in help_text and "(default: False)" not in help_text
    assert "--dp DP" in help_text and "(default: ranks/(tp pp cp))" in help_text


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--eval-interval", "0"], "argument --eval-interval: must be an integer >= 1, got 0"),
        (["--log-interval", "-1"], "argument --log-interval: must be an integer >= 1, got -1"),
        (["--sample-tokens", "-1"], "argument --sample-tokens: must be an integer >= 0, got -1"),
        (["--max-iters", "-1"], "argument --max-iters: must be an integer >= 0, got -1"),
        (["--resume"], "--resume needs --checkpoint-dir"),
        (["--async-checkpoint"], "--async-checkpoint needs --checkpoint-dir"),
        (["--checkpoint-dir", __file__], f"--checkpoint-dir {__file__} is a file; pass a folder"),
        (
            ["--fsdp", "--zero", "1"],
            "--fsdp shards the parameters, gradients and AdamW state itself: drop --zero",
        ),
        (
            ["--fsdp", "--comm-hook", "bf16"],
            "--comm-hook bf16 is a DDP hook; --fsdp reduce-scatters without DDP",
        ),
        (["--dtype", "bfloat16", "--tp", "2"], "--dtype bfloat16 runs with DDP, --zero or --fsdp"),  # (21)
    ],
)
def test_bad_flag_values_are_argparse_errors(capsys, flags, message):
    """In this process: the example's own checks, before any MPI (an interval of 0 would divide by zero
    in the middle of training)."""
    example = load_example()  # defines the parser and functions; main() runs only as a script
    with pytest.raises(SystemExit) as exit_info:
        example.parse_arguments(flags)
    assert exit_info.value.code == 2 and message in capsys.readouterr().err
