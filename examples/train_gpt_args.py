"""The command line of ``examples/train_gpt.py`` (nanoGPT's flag names) and its checks, kept here so that
the training script reads top to bottom without them.

Every check uses only the command line and the world size, which every rank has, so every rank exits
the same way (argparse's code 2; only rank 0 prints, train_gpt.py silences the others).
"""

from __future__ import annotations

import argparse
import os

from train_gpt_layout import add_layout_arguments, is_data_parallel

from minidist_tools.launch.env import resume_requested


def positive(text: str) -> int:
    """An argparse type: an int >= 1 (an interval of 0 would divide by zero in the middle of training)."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {value}")
    return value


def non_negative(text: str) -> int:
    """An argparse type: an int >= 0 (checked at the start, not after a whole run of training)."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {value}")
    return value


class HelpFormatter(argparse.HelpFormatter):
    """argparse's ``(default: X)``, appended once: not to a help text that already states its default (a
    default computed from other flags, such as --dp's), nor for None or False (a flag without a value)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        # By identity: `0 in (None, False)` is True, and --zero's default 0 is worth showing.
        if "(default" in text or any(action.default is d for d in (None, False, argparse.SUPPRESS)):
            return text
        return text + " (default: %(default)s)"


parser = argparse.ArgumentParser(
    description="Train a character-level GPT data-parallel (flags follow nanoGPT's names).",
    formatter_class=HelpFormatter,
)
parser.add_argument("--data", default=None, help="a UTF-8 text file (default: the bundled Shakespeare)")
parser.add_argument("--max-iters", type=non_negative, default=1000, help="optimizer steps")
parser.add_argument("--eval-interval", type=positive, default=250, help="estimate train/val loss every N")
parser.add_argument("--eval-iters", type=positive, default=20, help="batches per loss estimate")
parser.add_argument("--log-interval", type=positive, default=50, help="log step, loss, tokens/s, MFU every N")
parser.add_argument("--batch-size", type=int, default=32, help="GLOBAL windows per step (split over ranks)")
parser.add_argument("--block-size", type=int, default=64, help="context length, characters")
parser.add_argument("--n-layer", type=int, default=4, help="transformer blocks")
parser.add_argument("--n-head", type=int, default=4, help="attention heads per block")
parser.add_argument("--n-embd", type=int, default=128, help="width of the residual stream")
parser.add_argument("--dropout", type=float, default=0.0, help="dropout probability")
parser.add_argument("--bias", action=argparse.BooleanOptionalAction, default=True, help="biases in Linear/LN")
parser.add_argument("--lr", type=float, default=2e-3, help="peak learning rate (AdamW)")
parser.add_argument("--min-lr", type=float, default=2e-4, help="learning rate at the end of the cosine")
parser.add_argument("--warmup-iters", type=int, default=100, help="linear warmup steps")
parser.add_argument("--weight-decay", type=float, default=0.1, help="AdamW decay (matrices only)")
parser.add_argument("--beta2", type=float, default=0.99, help="AdamW beta2 (0.99: few tokens per step)")
parser.add_argument("--grad-clip", type=float, default=1.0, help="clip the global gradient norm (0: off)")
parser.add_argument("--grad-accum", type=int, default=1, help="micro-batches per step")
parser.add_argument("--zero", type=int, default=0, choices=[0, 1, 2], help="ZeRO stage instead of DDP")
parser.add_argument("--fsdp", action="store_true", help="fully sharded (ZeRO-3) per block instead of DDP")
HOOKS = ["none", "fp16", "bf16", "powersgd"]  # DDP gradient compression (minidist.parallel.comm_hooks)
parser.add_argument(
    "--comm-hook", choices=HOOKS, help="compress DDP's gradients, print bytes/step (default: none)"
)
parser.add_argument("--powersgd-rank", type=positive, default=1, help="with --comm-hook powersgd: rank R")
parser.add_argument("--seed", type=int, default=1337, help="weights, data windows and dropout")
parser.add_argument(
    "--dtype", default="float32", choices=["float32", "float64", "bfloat16", "float16"],
    help="float32/float64: the parameters' dtype; bfloat16/float16: mixed precision (autocast) with float32 "
    "master weights, float16 with dynamic loss scaling",
)  # fmt: skip
parser.add_argument("--checkpoint-dir", default=None, help="save here at every evaluation and at the end")
parser.add_argument(
    "--resume",
    action="store_true",
    help="continue from the newest checkpoint there (implied after a launcher restart)",
)
parser.add_argument("--async-checkpoint", action="store_true", help="save in the background (async_save)")
parser.add_argument("--sample-tokens", type=non_negative, default=300, help="characters to sample at the end")
parser.add_argument("--out", default=None, help="(tests) save losses and final weights to this .npz")
parser.add_argument(
    "--metrics", default=None, metavar="FILE",
    help="append the run's record here as JSON lines: a header (layout, modes, flags), then loss, val loss, "
    "lr, tokens/s and memory per log line (minidist plot FILE draws it; default: no record)",
)  # fmt: skip
parser.add_argument("--memory", action="store_true", help="print each rank's memory table at the end (peaks)")
parser.add_argument(
    "--memory-budget",
    default=None,
    metavar="SIZE",
    help="per-rank budget, e.g. 64MiB: more raises OutOfMemoryError (MINIDIST_MEMORY_BUDGET)",
)
add_layout_arguments(parser)  # --dp --tp --pp --cp --sequence-parallel --microbatches --schedule ...


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    """The flags (``sys.argv`` by default); a bad value or combination exits with argparse's code 2."""
    args = parser.parse_args(argv)
    args.report_bytes, args.comm_hook = args.comm_hook is not None, args.comm_hook or "none"
    if args.comm_hook != "none" and (args.zero or args.pp > 1):  # (no DDP: nothing to hook into)
        parser.error(f"--comm-hook {args.comm_hook} is a DDP hook; --zero and --pp > 1 average without DDP")
    if args.fsdp and args.zero:
        parser.error("--fsdp shards the parameters, gradients and AdamW state itself: drop --zero")
    if args.fsdp and args.comm_hook != "none":
        parser.error(f"--comm-hook {args.comm_hook} is a DDP hook; --fsdp reduce-scatters without DDP")
    # Mixed precision: products in bfloat16/float16 under md.autocast, float32 parameters (master weights).
    args.autocast = args.dtype if args.dtype in ("bfloat16", "float16") else None
    args.param_dtype = "float64" if args.dtype == "float64" else "float32"
    if args.autocast and not is_data_parallel(args):
        parser.error(
            f"--dtype {args.dtype} runs with DDP, --zero or --fsdp; "
            "the --tp/--pp/--cp layers have no autocast yet"
        )
    if args.resume and not args.checkpoint_dir:
        parser.error("--resume needs --checkpoint-dir (the folder to resume from)")
    if args.async_checkpoint and not args.checkpoint_dir:
        parser.error("--async-checkpoint needs --checkpoint-dir (the folder to save in)")
    if args.checkpoint_dir and os.path.exists(args.checkpoint_dir) and not os.path.isdir(args.checkpoint_dir):
        # (else the first save, after --eval-interval steps of training, would be the first to notice)
        parser.error(f"--checkpoint-dir {args.checkpoint_dir} is a file; pass a folder (made if missing)")
    # Restarted by `minidist launch` (MINIDIST_RESTART_COUNT > 0): resume as if --resume was given.
    args.resume = resume_requested(args.resume, args.checkpoint_dir)
    return args
