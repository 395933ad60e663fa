"""The command line of ``examples/train_mlp.py`` and its checks, kept here so that the training script
reads top to bottom without them.

Every check uses only the command line, the world size and the data set's length, which every rank
has, so every rank raises the same ``ValueError``; train_mlp.py prints it once, as ``error on ranks
0-7: ...`` (``minidist_tools.report.exit_with_error``, exit code 2, as argparse's own errors).
"""

from __future__ import annotations

import argparse

import numpy as np
from mpi4py import MPI

import minidist.distributed as dist
from minidist.data import load_dataset
from minidist.parallel import ProcessMesh
from minidist_tools.launch.env import resume_requested


class Parser(argparse.ArgumentParser):
    """argparse, adapted to many ranks: ``--help`` printed by rank 0 only, and a bad flag raised as a
    ``ValueError`` (printed once for all ranks by train_mlp.py) instead of a usage message per rank."""

    def print_help(self, file=None) -> None:  # noqa: ANN001  (argparse's signature)
        if MPI.COMM_WORLD.Get_rank() == 0:  # before dist.init(): MPI itself knows the rank
            super().print_help(file)

    def error(self, message: str) -> None:
        raise ValueError(f"{message} (see {self.prog} --help)")


class HelpFormatter(argparse.HelpFormatter):
    """Appends ``(default: X)`` to an option's help once: not to a help text that already states its
    default (one computed from other flags), nor for ``None`` or ``False`` (flags without a value)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        # By identity: `0 in (None, False)` is True, which hid the default 0 of --seed and --zero.
        if "(default" in text or any(action.default is d for d in (None, False, argparse.SUPPRESS)):
            return text
        return text + " (default: %(default)s)"


def parse_args(argv: list[str] | None = None, description: str | None = None) -> argparse.Namespace:
    """The command line, checked: ``ValueError`` for any bad flag or combination that the flags alone
    show (the checks below need the world size or the data)."""
    p = Parser(description=description, formatter_class=HelpFormatter)
    p.add_argument("--epochs", type=int, default=30, help="passes over the training set")
    p.add_argument("--batch-size", type=int, default=128, help="GLOBAL batch size, split across all ranks")
    p.add_argument("--lr", type=float, default=0.1, help="SGD learning rate")
    p.add_argument("--momentum", type=float, default=0.9, help="SGD momentum")
    p.add_argument("--hidden", type=int, nargs="+", default=[256, 256], help="hidden layer widths")
    p.add_argument("--seed", type=int, default=0, help="seed for weights and shuffling")
    p.add_argument("--dataset", choices=["digits", "mnist"], default="digits", help="bundled digits or MNIST")
    p.add_argument("--data-dir", default=None, help="folder with the MNIST IDX files (for --dataset mnist)")
    # --- the process mesh: world size = dp * tp * pp
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel ranks per layer (Megatron-LM)")
    p.add_argument("--pp", type=int, default=1, help="pipeline stages (layers cut into consecutive runs)")
    p.add_argument("--dp", type=int, default=None, help="data-parallel replicas (default: world/(tp*pp))")
    # (None = not given: with --pp 1 there is no pipeline, so giving these is an error, not ignored)
    p.add_argument("--microbatches", type=int, default=None, help="with --pp: per replica (default: 4)")
    p.add_argument(
        "--schedule", choices=["1f1b", "gpipe", "interleaved"], help="with --pp: the schedule (default: 1f1b)"
    )
    p.add_argument(
        "--virtual-stages", type=int, default=None,
        help="with --schedule interleaved: model chunks per rank (default: 1); "
        "--microbatches must be a multiple of --pp",
    )  # fmt: skip
    # --- how DDP communicates (the result is the same for every choice, up to float rounding)
    p.add_argument("--bucket-cap-mb", type=float, default=25, help="gradient bucket size in MiB")
    p.add_argument("--no-overlap", action="store_true", help="all-reduce after backward, not during it")
    p.add_argument("--grad-accum", type=int, default=1, help="micro-batches per global batch (no_sync)")
    p.add_argument(
        "--comm-hook", choices=["none", "fp16", "bf16", "powersgd"], default=None,
        help="DDP communication hook: average the gradients in float16/bfloat16 (half the bytes) or as "
        "rank-R PowerSGD factors (minidist.parallel.comm_hooks); changes the result "
        '(benchmarks/README.md, "Gradient compression"). '
        "Given (none too): print the bytes sent per step (default: none)",
    )  # fmt: skip
    p.add_argument(
        "--powersgd-rank", type=int, default=None, metavar="R",
        help="with --comm-hook powersgd: rank of the approximation (default: 1)",
    )  # fmt: skip
    p.add_argument("--trace", default=None, metavar="OUT.json", help="write a Perfetto/Chrome timeline")
    p.add_argument(
        "--straggler-report", action="store_true",
        help="watch for a slow rank (a StragglerWarning during training), print a per-rank report at the end",
    )  # fmt: skip
    p.add_argument("--straggler-every", type=int, default=10, help="steps per straggler-monitor window")
    p.add_argument(
        "--zero", type=int, choices=[0, 1, 2], default=0,
        help="ZeRO stage: 1 shards optimizer state, 2 also gradients (replaces DDP's gradient averaging)",
    )  # fmt: skip
    p.add_argument("--recompute", action="store_true", help="recompute hidden activations in backward")
    # --- checkpoints (minidist.checkpoint): sharded, atomic, loadable on another mesh
    p.add_argument("--checkpoint-dir", default=None, help="save checkpoints here (and at the end of the run)")
    p.add_argument(
        "--checkpoint-every", type=int, default=0, metavar="N", help="save every N steps (0: at the end)"
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue from the newest checkpoint in --checkpoint-dir (implied after a restart by "
        "minidist launch)",
    )
    p.add_argument(
        "--max-steps", type=int, default=None, help="stop after this many steps in all (resume later)"
    )
    p.add_argument(
        "--async-checkpoint", action="store_true",
        help="save in the background: training waits only for a copy of the state in memory",
    )  # fmt: skip
    p.add_argument("--memory", action="store_true", help="print each rank's memory table at the end (peaks)")
    p.add_argument(
        "--metrics", default=None, metavar="FILE",
        help="append the run's record here as JSON lines: a header (layout, modes, flags), then each "
        "epoch's loss, test accuracy, samples/s and memory (minidist plot FILE draws it; default: no record)",
    )  # fmt: skip
    p.add_argument(
        "--memory-budget", default=None, metavar="SIZE",
        help="per-rank budget, e.g. 64MiB: more is an out-of-memory error (or MINIDIST_MEMORY_BUDGET)",
    )  # fmt: skip
    args = p.parse_args(argv)
    if args.epochs < 1 or args.batch_size < 1 or args.lr <= 0 or min(args.hidden) < 1 or args.grad_accum < 1:
        p.error("--epochs, --batch-size, --hidden, --grad-accum must be >= 1 and --lr > 0")
    if args.bucket_cap_mb <= 0:
        p.error("--bucket-cap-mb must be > 0")
    args.report_bytes, args.comm_hook = args.comm_hook is not None, args.comm_hook or "none"
    if args.powersgd_rank is not None and args.comm_hook != "powersgd":
        p.error("--powersgd-rank only means something with --comm-hook powersgd: add that, or drop it")
    args.powersgd_rank = 1 if args.powersgd_rank is None else args.powersgd_rank
    if args.powersgd_rank < 1:
        p.error("--powersgd-rank must be >= 1")
    if args.zero and args.comm_hook != "none":
        p.error(f"--comm-hook {args.comm_hook} is a DDP hook, and --zero replaces DDP; drop one of them")
    if args.data_dir is not None and args.dataset != "mnist":
        p.error("--data-dir is only read with --dataset mnist (the digits are bundled); add --dataset mnist")
    pipeline_flags = {"--microbatches": args.microbatches, "--schedule": args.schedule,
                      "--virtual-stages": args.virtual_stages}  # fmt: skip
    if args.pp == 1 and any(v is not None for v in pipeline_flags.values()):
        given = ", ".join(name for name, v in pipeline_flags.items() if v is not None)
        p.error(f"{given} only mean something with pipeline stages: add --pp N (N >= 2) or drop them")
    args.microbatches = 4 if args.microbatches is None else args.microbatches
    args.schedule = args.schedule or "1f1b"
    args.virtual_stages = 1 if args.virtual_stages is None else args.virtual_stages
    if args.tp < 1 or args.pp < 1 or (args.dp is not None and args.dp < 1) or args.microbatches < 1:
        p.error("--tp, --pp, --dp and --microbatches must be >= 1")
    if args.checkpoint_every < 0 or (args.max_steps is not None and args.max_steps < 1):
        p.error("--checkpoint-every must be >= 0 and --max-steps >= 1")
    if (args.resume or args.checkpoint_every or args.async_checkpoint) and not args.checkpoint_dir:
        p.error("--resume, --checkpoint-every and --async-checkpoint need --checkpoint-dir DIR")
    # Restarted by `minidist launch` (MINIDIST_RESTART_COUNT > 0): resume as if --resume had
    # been given, so the script needs no change to survive a failure. A first run never resumes by itself.
    args.resume = resume_requested(args.resume, args.checkpoint_dir)
    return args


def load_data(args: argparse.Namespace) -> tuple[tuple[np.ndarray, np.ndarray], ...]:
    """((x_train, y_train), (x_test, y_test)) of --dataset, read on every rank (collective).

    The MNIST folder may be missing on one node only: then its ranks raise and the others would wait
    forever in the first collective. ``dist.raise_if_any`` makes every rank raise the error (each
    remembers whether it was its own, for the report that names the ranks)."""
    data, problem = None, None
    try:
        data = tuple(load_dataset(args.dataset, split, args.data_dir) for split in ("train", "test"))
    except (OSError, ValueError) as error:
        problem = error
    dist.raise_if_any(problem, label="world", kinds=(FileNotFoundError,))
    return data


def build_mesh(args: argparse.Namespace, world: dist.Communicator) -> ProcessMesh:
    """The dp x tp x pp mesh; dp defaults to world / (tp * pp). Same error on every rank if impossible."""
    dp = args.dp
    if dp is None:
        if world.size % (args.tp * args.pp):
            raise ValueError(
                f"--tp {args.tp} x --pp {args.pp} = {args.tp * args.pp} does not divide the {world.size} "
                f"ranks; launch a multiple of {args.tp * args.pp} ranks"
            )
        dp = world.size // (args.tp * args.pp)
    return ProcessMesh(dp=dp, tp=args.tp, pp=args.pp, comm=world)


def check_pipeline_args(args: argparse.Namespace, dp: int) -> None:
    """With --pp > 1: the flags that do not combine with a pipeline, and the batch split. The checks use
    only the command line, which every rank has, so every rank raises the same ValueError."""
    incompatible = [
        f"--{name} {value}" if value is not True else f"--{name}"
        for name, value, default in [
            ("zero", args.zero, 0),  # ZeRO would average gradients a second time, equally weighted
            ("grad-accum", args.grad_accum, 1),  # a pipeline already accumulates over its microbatches
            ("no-overlap", args.no_overlap, False),  # DDP options: a pipeline does not use DDP
            ("bucket-cap-mb", args.bucket_cap_mb, 25),
            ("comm-hook", args.comm_hook, "none"),
            # the stages run their layers themselves, so MLP's block-by-block recomputation never runs
            ("recompute", args.recompute, False),
        ]
        if value != default
    ]
    if incompatible:
        raise ValueError(
            f"--pp {args.pp} cannot be combined with {', '.join(incompatible)}: a pipeline accumulates "
            "gradients over --microbatches and averages them over its dp group itself, without DDP or "
            "ZeRO, and runs each stage's layers without recomputation; drop those flags (use "
            "--microbatches instead of --grad-accum)"
        )
    n_layers = 2 * len(args.hidden) + 1  # Linear, ReLU, ..., Linear
    if n_layers < args.pp:
        raise ValueError(
            f"--pp {args.pp} needs at least {args.pp} layers, but --hidden {' '.join(map(str, args.hidden))} "
            f"gives an MLP of {n_layers} (Linear/ReLU); use fewer stages or more hidden layers"
        )
    shares = [len(part) for part in np.array_split(np.arange(args.batch_size), dp)]
    if any(share % args.microbatches for share in shares):
        step = dp * args.microbatches
        raise ValueError(
            f"--batch-size {args.batch_size} on {dp} data-parallel replicas gives shares "
            f"{sorted(set(shares))}, not all divisible by --microbatches {args.microbatches}; use a "
            f"--batch-size that is a multiple of dp x microbatches = {step} (e.g. "
            f"{max(step, args.batch_size // step * step)}) or other --microbatches"
        )


def check_batch_args(args: argparse.Namespace, n_train: int, dp_size: int) -> None:
    """The global batch against the training set and --grad-accum against each replica's share (the
    same ValueError on every rank)."""
    if args.batch_size > n_train:
        raise ValueError(
            f"--batch-size {args.batch_size} is larger than the training set ({n_train} samples), "
            "so an epoch would have no full batch; use a smaller global batch"
        )
    if args.grad_accum > args.batch_size // dp_size:
        raise ValueError(
            f"--grad-accum {args.grad_accum} needs that many samples per rank in each global batch, but "
            f"{args.batch_size} samples on {dp_size} replicas give some rank {args.batch_size // dp_size}"
        )
