"""The 4-D layouts of ``examples/train_gpt.py``: data, tensor (+ sequence), pipeline and context parallelism.

train_gpt.py keeps its data-parallel path (``GPT`` + DDP, ZeRO or FSDP over the world) whenever
``--tp``, ``--pp`` and ``--cp`` are 1 and ``--sequence-parallel`` is off: :func:`is_data_parallel`. Every
other layout runs through :class:`MeshTraining`, kept here so the script still reads top to bottom.
What it does, in the order of one step (Megatron-LM's, Narayanan et al. 2021):

* a ``ProcessMesh(dp, tp, pp, cp)`` (rank order tp fastest, then cp, dp, pp);
* the model: the one-process ``GPT`` train_gpt.py built from ``--seed``, cut by ``ParallelGPT.from_gpt``
  (vocabulary-parallel ``wte`` and head, heads and MLP split over tp, +- sequence parallelism), so every
  layout starts from the identical model;
* data: every rank draws the same global batch; dp rank d takes its rows (``RandomWindows`` with
  ``rank = dp_rank, world_size = dp``), cp rank c its tokens of the balanced causal split
  (``split_for_context_parallel``), the tp ranks the same thing;
* forward and backward: without pipeline, ``DistributedDataParallel`` over ``mesh.dp_cp_group`` (cp
  ranks hold the same weights, so they average gradients like dp ranks), or with ``--fsdp``
  ``FullyShardedDataParallel`` over the same ``mesh.dp_cp_group``, one unit per ``ParallelBlock`` (each
  rank's flat shards hold pieces of its tp rank's parameters; not with pp: :func:`check_layout`); with
  pp > 1,
  ``PipelineParallel`` over ``mesh.pp_group`` with ``dp_group = mesh.dp_cp_group`` (it keeps the tied
  ``wte`` of the first and last stage equal: the last stage's copy is this tp rank's vocabulary shard);
  the loss is the vocabulary-parallel cross-entropy (the logits are never gathered);
* sequence-parallel gradients (LayerNorms, ``wpe``, row-parallel biases) summed over tp;
* ``clip_grad_norm_`` over the model-parallel groups: sharded pieces summed over tp, replicated ones
  counted once, stages summed over pp, the tied copy counted once (under FSDP also the dp x cp shards
  summed: ``parallel/fsdp/tp_clip.py``);
* checkpoints with ``mesh=``: GPT's names, so a checkpoint of one layout resumes on any other;
* at the end ``gather_gpt`` puts the pieces back into a one-process ``GPT`` on rank 0, for the sample
  (and ``--out``).

Every check in :func:`check_layout` uses only the flags and the world size, which every rank has: every
rank raises the same ``ValueError``, printed once by train_gpt.py (exit code 2).
"""

from __future__ import annotations

import argparse
import contextlib

import numpy as np

import minidist as md
import minidist.distributed as dist
from minidist.data import RandomWindows
from minidist.models import GPT, ParallelGPT, gather_gpt
from minidist.nn import Parameter
from minidist.parallel import (
    DistributedDataParallel,
    FullyShardedDataParallel,
    PipelineParallel,
    ProcessMesh,
    clip_grad_norm_,
)
from minidist.parallel.context_parallel import split_for_context_parallel
from minidist.parallel.fsdp import sequence_parallel as fsdp_sequence_parallel
from minidist.parallel.fsdp import tp_clip
from minidist.parallel.tensor_parallel import (
    ParallelBlock,
    allreduce_sequence_parallel_grads,
    model_parallel_manual_seed,
)


def add_layout_arguments(parser: argparse.ArgumentParser) -> None:
    """The layout flags (parsed with train_gpt.py's own)."""
    layout = parser.add_argument_group("layout (ranks = dp x tp x pp x cp)")
    layout.add_argument("--dp", type=int, default=None, help="data-parallel size (default: ranks/(tp pp cp))")
    layout.add_argument("--tp", type=int, default=1, help="tensor-parallel size (heads, MLP, vocabulary)")
    layout.add_argument("--pp", type=int, default=1, help="pipeline stages")
    layout.add_argument("--cp", type=int, default=1, help="context-parallel size (ring attention)")
    layout.add_argument("--sequence-parallel", action="store_true", help="LayerNorm/dropout on T/tp (tp > 1)")
    layout.add_argument(
        "--microbatches", type=int, default=None, help="pipeline microbatches (default: 2 pp)"
    )
    schedules = ["1f1b", "gpipe", "interleaved"]
    layout.add_argument("--schedule", default="1f1b", choices=schedules, help="pipeline schedule")
    layout.add_argument("--virtual-stages", type=int, default=1, help="model chunks per rank (interleaved)")


def is_data_parallel(args: argparse.Namespace) -> bool:
    """True for the plain data-parallel path (GPT + DDP/ZeRO/FSDP over the world, train_gpt.py's own)."""
    return args.tp == args.pp == args.cp == 1 and not args.sequence_parallel


def check_layout(args: argparse.Namespace, world_size: int) -> None:
    """Fill in ``args.dp`` and ``args.microbatches`` and check the layout; ``ValueError`` naming the fix."""
    for flag in ("tp", "pp", "cp", "virtual_stages"):
        if getattr(args, flag) < 1:
            raise ValueError(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
    model_parallel = args.tp * args.pp * args.cp
    if args.dp is None:
        args.dp = world_size // model_parallel if world_size % model_parallel == 0 else 0
    if args.dp == 0:  # (no --dp, and tp x pp x cp does not divide the world: no dp to name)
        raise ValueError(
            f"the layout does not fit the {world_size} ranks: tp x pp x cp = "
            f"{args.tp} x {args.pp} x {args.cp} = {model_parallel} does not "
            f"divide them; launch a multiple of {model_parallel} ranks (mpirun -n) or change the sizes"
        )
    if args.dp < 1 or args.dp * model_parallel != world_size:
        raise ValueError(
            f"the layout does not fit the {world_size} ranks: dp x tp x pp x cp = {args.dp} x "
            f"{args.tp} x {args.pp} x {args.cp} must equal the number of ranks; change the sizes or mpirun -n"
        )
    # 2 microbatches per stage: the 1F1B bubble is (p - 1) / (m + p - 1) of a step, 1/5 for pp = 2 (1/3 with
    # m = p), while a microbatch of the default batch (32 windows over dp = 2: 4 of 16 rows) stays large
    # enough that NumPy's fixed cost per op does not dominate.
    args.microbatches = args.microbatches or 2 * args.pp
    if is_data_parallel(args):
        return
    if args.sequence_parallel and args.tp == 1:
        raise ValueError(
            "--sequence-parallel splits the sequence over the tensor-parallel group, and --tp is 1: "
            "use --tp 2 or more, or drop --sequence-parallel"
        )
    if args.fsdp and args.pp > 1:
        # Built and tested: FSDP over dp x cp of a tp (+ sequence-parallel) model. With pp the pipeline would
        # have to gather the units of its stage per microbatch.
        raise ValueError(
            "--fsdp composes with --tp, --cp and --sequence-parallel (FSDP over the dp x cp ranks, tensor "
            "parallelism inside each unit), not with --pp: drop --pp, or train it without --fsdp"
        )
    if args.zero:
        raise ValueError(
            "--zero works on the data-parallel path only (--tp, --pp, --cp 1): its clip_grad_norm_ sums the "
            "norm over its own group and cannot count tensor-parallel shards; use DDP (no --zero) here"
        )
    if args.n_head % args.tp:
        raise ValueError(f"--n-head {args.n_head} must be divisible by --tp {args.tp} (heads are split)")
    if args.block_size % (2 * args.cp):
        raise ValueError(
            f"--block-size {args.block_size} must be divisible by 2 x --cp = {2 * args.cp} "
            "(the balanced split cuts the sequence into 2 cp chunks)"
        )
    if args.sequence_parallel and (args.block_size // args.cp) % args.tp:
        raise ValueError(
            f"--block-size {args.block_size} / --cp {args.cp} must be divisible by --tp {args.tp} under "
            "--sequence-parallel (each tp rank holds T / cp / tp positions)"
        )
    if args.cp > 1 and args.dropout > 0:
        raise ValueError("--dropout with --cp > 1: ring attention has no attention dropout; use --dropout 0")
    if args.pp > 1 and args.grad_accum != 1:
        raise ValueError("--grad-accum with --pp > 1: the pipeline's --microbatches accumulate; use those")
    rows = args.batch_size // args.dp if args.batch_size % args.dp == 0 else 0
    if args.pp > 1 and (rows == 0 or rows % args.microbatches):
        raise ValueError(
            f"--batch-size {args.batch_size} over --dp {args.dp} is not a whole number of "
            f"--microbatches {args.microbatches} per replica; make batch-size divisible by dp x microbatches"
        )


class MeshTraining:
    """A GPT trained on a ``ProcessMesh(dp, tp, pp, cp)`` (module docstring); train_gpt.py's data, step,
    clip, evaluation, checkpoint target (``wrapped``, ``mesh``) and final model for every layout but
    plain data parallelism. ``MeshTraining(args)`` makes the mesh (collective), ``build(gpt)`` the model.
    """

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.mesh = ProcessMesh(dp=args.dp, tp=args.tp, pp=args.pp, cp=args.cp)

    def describe(self) -> str:
        """The layout in words, for the first line the example prints."""
        a = self.args
        text = f"dp {a.dp} x tp {a.tp} x pp {a.pp} x cp {a.cp}"
        if a.sequence_parallel:
            text += ", sequence parallel"
        if a.fsdp:
            text += ", FSDP over dp x cp"
        if a.pp > 1:
            text += f", {a.schedule} with {a.microbatches} microbatches"
        return text

    def build(self, gpt: GPT) -> None:
        """Cut ``gpt`` (the same on every rank) into this rank's pieces and wrap them for training."""
        args, mesh = self.args, self.mesh
        self.config = gpt.config
        self.model = ParallelGPT.from_gpt(gpt, mesh, sequence_parallel=args.sequence_parallel)
        self.pipe = None
        if args.pp > 1:  # this rank keeps its stage's layers; checkpoints and the optimizer see those
            self.pipe = PipelineParallel(
                self.model.pipeline_layers(), group=mesh.pp_group, dp_group=mesh.dp_cp_group,
                microbatches=args.microbatches, schedule=args.schedule, virtual_stages=args.virtual_stages,
            )  # fmt: skip
            self.wrapped, self.params = self.pipe, list(self.pipe.parameters())
        elif args.fsdp:  # each ParallelBlock a unit; wte (tied head), wpe, ln_f in the root unit; cp ranks
            # hold the same weights, so FSDP shards over dp x cp like DDP averages over it
            self.params = list(self.model.parameters())  # (before sharding: train_gpt splits them by ndim)
            self.wrapped = FullyShardedDataParallel(self.model, group=mesh.dp_cp_group, wrap=(ParallelBlock,))
        else:  # cp ranks are data-parallel for the weights: average over dp x cp
            self.wrapped = DistributedDataParallel(self.model, group=mesh.dp_cp_group)
            self.params = list(self.model.parameters())

    def optimizer_groups(self, groups: list[dict]) -> list[dict]:
        """The optimizer's parameter groups from ``groups`` of ``self.params``: under FSDP the groups of
        their shard tensors (``shard_param_groups``), which the optimizer steps; else ``groups`` itself."""
        return self.wrapped.shard_param_groups(groups) if self.args.fsdp else groups

    def seed_dropout(self, seed: int) -> None:
        """Dropout streams: one per data-parallel replica (dp x cp), the same on its tp ranks (their
        replicated activations must drop the same units), plus the tracker's own stream per tp rank for
        the sharded activations (attention's heads)."""
        replica = self.mesh.dp_rank * self.args.cp + self.mesh.cp_rank
        model_parallel_manual_seed(seed + replica, self.mesh.tp_group)

    def windows(self, ids: np.ndarray) -> RandomWindows:
        """This dp rank's windows of ``ids``: rows of the global batch (the pipeline cuts its own
        microbatches, so it takes the rows as one)."""
        accumulation = 1 if self.args.pp > 1 else self.args.grad_accum
        return RandomWindows(
            ids, self.args.block_size, self.args.batch_size, seed=self.args.seed, rank=self.mesh.dp_rank,
            world_size=self.args.dp, accumulation_steps=accumulation,
        )  # fmt: skip

    def local(self, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """This cp rank's tokens (balanced split) of the ids and targets (b, T) -> (b, T / cp)."""
        cp, rank = self.mesh.cp, self.mesh.cp_rank
        return split_for_context_parallel(x, cp, rank), split_for_context_parallel(y, cp, rank)

    def forward_backward(self, batches: RandomWindows) -> float:
        """One step's gradients, combined over the mesh; returns this replica's mean loss (its rows and
        tokens; the same on its tp and pp ranks)."""
        if self.pipe:
            loss = self.pipe.train_step(*self.local(*batches.next()), self.model.loss)  # dp x cp combined
        else:
            loss = 0.0
            for k in range(self.args.grad_accum):
                x, y = self.local(*batches.next())
                loss_k = self.model.loss(self.wrapped(x), y) / self.args.grad_accum  # vocab-parallel loss
                last = k == self.args.grad_accum - 1
                with contextlib.nullcontext() if last else self.wrapped.no_sync():  # communicate once
                    loss_k.backward()
                loss += loss_k.item()
        if self.args.sequence_parallel and self.args.fsdp:  # (FSDP's shards: fsdp/sequence_parallel.py)
            fsdp_sequence_parallel.allreduce_sequence_parallel_grads_(self.wrapped, self.mesh.tp_group)
        elif self.args.sequence_parallel:  # the LayerNorms saw T / tp positions each: sum over tp
            allreduce_sequence_parallel_grads(self.params, self.mesh.tp_group)
        return loss

    def clip_grad_norm_(self, max_norm: float) -> float:
        """The norm of the whole model's gradient, as one process would compute it (clip_grad.py)."""
        if self.args.fsdp:  # the shards' gradients: summed over dp x cp, then over tp (replicated: once)
            return tp_clip.clip_grad_norm_(self.wrapped, max_norm, tp_group=self.mesh.tp_group)
        return clip_grad_norm_(self.params, max_norm, pp_group=self.mesh.pp_group if self.pipe else None)

    def estimate_loss(self, splits: dict[str, RandomWindows], eval_iters: int) -> dict[str, float]:
        """train_gpt.py's ``estimate_loss`` on this layout: the same windows, each replica its share."""
        self.model.eval()
        losses = {}
        with md.no_grad():
            for split, windows in splits.items():
                total = np.zeros(2)
                for x, y in windows.eval_batches(eval_iters):
                    x, y = self.local(x, y)
                    if self.pipe:
                        logits = md.tensor(self.pipe.predict(x))  # (b, T/cp, V_r)
                    else:  # (FSDP gathers each unit for its forward)
                        logits = self.wrapped(x) if self.args.fsdp else self.model(x)
                    total += (self.model.loss(logits, y).item(), 1)
                dist.all_reduce(total, op="sum", group=self.mesh.dp_cp_group)
                losses[split] = float(total[0] / total[1])
        self.model.train()
        return losses

    def gathered(self) -> GPT | None:
        """The trained one-process GPT on rank 0 (None elsewhere): ``gather_gpt`` of every rank's pieces."""
        if self.args.fsdp:  # the parameters hold no values between steps: gather the units (collective)
            full = self.wrapped.state_dict()
            pieces = [(n, _piece(full[n], p)) for n, p in self.model.named_parameters()]
        elif self.pipe:
            pieces = self.pipe.stage_module.named_parameters()
        else:
            pieces = self.model.named_parameters()
        return gather_gpt(self.config, pieces, self.mesh, root=0)


def _piece(array: np.ndarray, original: Parameter) -> Parameter:
    """A ``Parameter`` of ``array`` with the tensor-parallel split of ``original`` (for ``gather_gpt``)."""
    piece = Parameter(array.numpy() if hasattr(array, "numpy") else array)  # (a Tensor or an array)
    piece.tp_dim, piece.tp_stride = original.tp_dim, original.tp_stride
    return piece
