"""Train an MLP data-parallel on handwritten digits: ``mpirun -n 8 python examples/train_mlp.py``.

Read it top to bottom: arguments (parsed and checked in train_mlp_args.py, next to this file) -> data ->
model -> resume -> training loop (checkpoints) -> evaluation.
Every rank runs this same file (SPMD). The ranks form a dp x tp x pp mesh (ProcessMesh; by default
dp = all ranks). Each global batch of ``--batch-size`` samples is split across the dp replicas;
DistributedDataParallel averages the gradients over them. With ``--tp N`` each replica's layers are
split over N ranks (Megatron-LM tensor parallelism), which see the same samples. With ``--pp N`` the
layers are cut into N pipeline stages that ``--microbatches`` flow through (GPipe, 1F1B or interleaved). Any
layout trains the same model as one process, from the same seed.

    mpirun -n 4 python examples/train_mlp.py --bucket-cap-mb 0.1 --trace trace.json   # open in Perfetto
    mpirun -n 4 python examples/train_mlp.py --grad-accum 4      # same result, 4 micro-batches per step
    mpirun -n 4 python examples/train_mlp.py --tp 2              # 2 replicas x 2 tensor-parallel shards
    mpirun -n 8 python examples/train_mlp.py --dp 2 --tp 2 --pp 2 --microbatches 4 --schedule 1f1b  # 3D
    mpirun -n 4 python examples/train_mlp.py --recompute         # recompute activations in backward
    MINIDIST_SLOW_RANK=2:0.05 mpirun -n 4 python examples/train_mlp.py --straggler-report  # find rank 2
    MINIDIST_FAULT=kill:rank=2:step=80 minidist launch -n 4 -- python examples/train_mlp.py --checkpoint-dir c

Checkpoints: ``--checkpoint-dir`` saves every ``--checkpoint-every`` steps and when the run ends;
``--resume`` continues from the newest checkpoint there (skipping a damaged one), at the same epoch
and batch, on the same mesh (bit-exact) or another one (resharded). ``--max-steps`` stops early, as
a job with a time limit would (a killed job resumes from its last periodic checkpoint)::

    mpirun -n 4 python examples/train_mlp.py --checkpoint-dir ckpt --checkpoint-every 50 --max-steps 120
    mpirun -n 4 python examples/train_mlp.py --checkpoint-dir ckpt --resume --tp 2  # steps 121-330

Under ``minidist launch -n 4 --max-restarts 3 -- python examples/train_mlp.py --checkpoint-dir
ckpt --checkpoint-every 40`` a failed rank or node restarts the job, which then resumes by itself (a
restart counts as ``--resume``: train_mlp_args.py).

``--async-checkpoint`` saves in the background (``checkpoint.save(..., async_save=True)``): the loop
waits only while the state is copied to memory; the files are the same.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import sys
import time
from collections.abc import Callable
from typing import Any

# One BLAS thread per rank, set before NumPy loads its BLAS: with 8 ranks on a 2-core machine, each
# rank's own BLAS threads would spin and fight the other ranks for cores (measured here: a 64x256
# matmul went from well under 1 ms to 17 ms). Set OMP_NUM_THREADS yourself to override.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402
from train_mlp_args import build_mesh, check_batch_args, check_pipeline_args, load_data, parse_args  # noqa: E402

import minidist as md  # noqa: E402
import minidist.distributed as dist  # noqa: E402
from minidist import backend, checkpoint, memory, nn, optim, trace  # noqa: E402
from minidist.data import DataLoader, DistributedSampler  # noqa: E402
from minidist.models import MLP  # noqa: E402
from minidist.parallel import DistributedDataParallel, ProcessMesh, ZeroRedundancyOptimizer  # noqa: E402
from minidist.parallel.comm_hooks import register_by_name  # noqa: E402
from minidist.parallel.pipeline import PipelineParallel  # noqa: E402
from minidist.parallel.tensor_parallel import model_parallel_manual_seed  # noqa: E402
from minidist_tools import timeline  # noqa: E402
from minidist_tools.checkpoint_info import seed_mismatch  # noqa: E402
from minidist_tools.fault import FaultPlan  # noqa: E402
from minidist_tools.header import header_lines, modes, plural  # noqa: E402
from minidist_tools.metrics import MetricsLog, max_rss_mib  # noqa: E402
from minidist_tools.progress import progress  # noqa: E402
from minidist_tools.report import exit_interrupted, exit_with_error  # noqa: E402
from minidist_tools.straggler import StragglerMonitor, align, clock_offsets, injected_delay, straggler_report  # noqa: E402


def predict_dense(model: nn.Module, x: np.ndarray) -> np.ndarray:
    """Logits of the whole model (or of this rank's tp shards, which all-reduce as they go)."""
    model.eval()
    with md.no_grad():
        logits = model(md.tensor(x)).numpy()
    model.train()
    return logits


def evaluate(predict: Callable[[np.ndarray], Any], x: np.ndarray, y: np.ndarray, mesh: ProcessMesh) -> float:
    """Accuracy on (x, y): each dp replica scores its share of the samples (the ranks of a tp group, and
    the stages of a pipeline, score the same share together), then an all-reduce over dp adds the counts."""
    mine = DistributedSampler(len(x), shuffle=False, num_replicas=mesh.dp, rank=mesh.dp_rank)
    mine = np.array(list(mine), dtype=np.int64)
    counts = np.zeros(2)  # [correct, seen]
    if len(mine):
        logits = backend.to_numpy(predict(x[mine]))
        counts[:] = [(logits.argmax(axis=1) == y[mine]).sum(), len(mine)]
    dist.all_reduce(counts, op="sum", group=mesh.dp_group)
    return float(counts[0] / counts[1])


def main(argv: list[str] | None = None) -> float:
    # Line-buffered: under mpirun stdout is a pipe, which Python would fill in 8 KiB blocks (a line
    # printed now would show at exit).
    sys.stdout.reconfigure(line_buffering=True)
    args = parse_args(argv, description=__doc__.splitlines()[0])  # parsing and checks: train_mlp_args.py
    world = dist.init()
    rank = world.rank
    mesh = build_mesh(args, world)
    # MINIDIST_FAULT=kill:rank=R:step=S: rank R fails on purpose after step S (a bad value: one error, now)
    faults = FaultPlan(world.rank)
    if mesh.pp > 1:
        check_pipeline_args(args, mesh.dp)
    dp_size = mesh.dp  # the batch is split over the dp replicas only: a tp group shares its samples

    # --- data: every rank reads the (small) data set; the sampler decides who uses which samples.
    (x_train, y_train), (x_test, y_test) = load_data(args)  # a folder missing on any rank: error on all
    # Global-batch mode: rank r gets its numpy.array_split piece of each global batch, so the
    # global batches are the same for any number of ranks (and the last partial one is dropped).
    sampler = DistributedSampler(
        len(x_train), shuffle=True, seed=args.seed, drop_last=True, batch_size=args.batch_size,
        num_replicas=mesh.dp, rank=mesh.dp_rank,
    )  # fmt: skip
    loader = DataLoader((x_train, y_train), batch_size=sampler.local_batch_size, sampler=sampler)
    check_batch_args(args, len(x_train), dp_size)

    # --- model: same seed on every rank; DDP broadcasts rank 0's weights anyway. With --tp, every rank
    # draws the full weights and keeps its slice, so tp=N starts from the same model as tp=1.
    model_parallel_manual_seed(args.seed, group=mesh.tp_group)  # md.manual_seed + per-tp-rank dropout stream
    n_classes = int(y_train.max()) + 1
    # Linear/ReLU, or column/row pairs; --recompute: keep only each hidden block's input (Chen et al. 2016)
    mlp = MLP(x_train.shape[1], args.hidden, n_classes, mesh=mesh, recompute=args.recompute)
    # The header names every mode that is on (ZeRO, hooks, recompute, layout, debug mode...:
    # minidist_tools/header.py); --metrics FILE records it, then each epoch's measurements, as JSON lines.
    active = modes(args, world.size)
    metrics = MetricsLog(args.metrics if rank == 0 else None)
    if rank == 0:
        sizes = "-".join(str(n) for n in (x_train.shape[1], *args.hidden, n_classes))
        print("\n".join(header_lines(
            f"MLP {sizes} on {args.dataset} ({plural(len(x_train), 'training sample')}), "
            f"{plural(world.size, 'rank')} (dp {mesh.dp} x tp {mesh.tp} x pp {mesh.pp})", active,
        )))  # fmt: skip
        metrics.header(
            "train_mlp.py", args, world.size, {"dp": mesh.dp, "tp": mesh.tp, "pp": mesh.pp}, active
        )
    if rank == 0 and (mesh.tp > 1 or mesh.pp > 1):
        print(mesh)  # the dp x tp grid of ranks, per pipeline stage
    if mesh.pp > 1:
        # Pipeline parallelism (GPipe, Huang et al. 2019; 1F1B, Narayanan et al. 2021): each rank keeps
        # its stage's consecutive layers. train_step cuts the replica's batch into microbatches, runs
        # the schedule, and after the LAST microbatch's backward combines the stage's gradients over
        # mesh.dp_group once (weighted by each replica's share): no DDP wrapper.
        model = PipelineParallel(
            mlp,
            mesh,
            microbatches=args.microbatches,
            schedule=args.schedule,
            virtual_stages=args.virtual_stages,
        )
        optimizer = optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    elif args.zero:
        # ZeRO (Rajbhandari et al. 2020): no DDP wrapper. The optimizer broadcasts rank 0's weights,
        # reduce-scatters (averages) the gradients in step(), updates only this rank's shard of the
        # parameters and all-gathers them, so the result equals DDP + SGD with 1/N of the optimizer state.
        model = mlp
        optimizer = ZeroRedundancyOptimizer(
            model.parameters(), optim.SGD, group=mesh.dp_group, stage=args.zero, lr=args.lr,
            momentum=args.momentum,
        )  # fmt: skip
    else:
        # Over the dp group only: each tp shard is averaged with the same shard of the other replicas.
        model = DistributedDataParallel(
            mlp, group=mesh.dp_group, bucket_cap_mb=args.bucket_cap_mb, overlap=not args.no_overlap
        )
        # --comm-hook: how each bucket is averaged (fp16/bf16 casts, PowerSGD's low-rank factors)
        register_by_name(model, args.comm_hook, powersgd_rank=args.powersgd_rank)
        optimizer = optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    # For evaluation. A pipeline's predict runs forward only, down the stages; every stage gets the logits.
    predict = model.predict if mesh.pp > 1 else functools.partial(predict_dense, model)
    if args.trace or args.straggler_report:
        world.barrier()  # every rank's timeline starts at (nearly) the same instant
        trace.enable(collectives=args.straggler_report)  # a span per collective: waits vs transfers
    # --straggler-report: StragglerWarning during training, a table at the end. Off: no monitor, no cost.
    # Compared within the dp group: its ranks do the same work (pipeline stages or tp shards need not).
    monitor = (
        StragglerMonitor(every=args.straggler_every, group=mesh.dp_group) if args.straggler_report else None
    )
    delay = injected_delay(world.rank)  # MINIDIST_SLOW_RANK=RANK:SECONDS makes that rank slow (teaching aid)

    # --- checkpoints: --resume restores the weights, the optimizer state and the sampler's epoch and
    # position (a mesh of another shape gets them resharded), so the loop below continues mid-epoch.
    step, loss_sum = resume(args, model, optimizer, mesh, sampler) if args.resume else (0, np.zeros(2))
    tracker = start_memory_tracker(args, model, optimizer, rank)  # --memory, --memory-budget: or None
    saved_at = step if args.resume else None  # the checkpoint we resumed from already holds this step

    # --- training loop
    total = args.epochs * len(loader)
    stop = min(total, args.max_steps or total)  # --max-steps: stop early, as a time-limited job would
    if step >= total and rank == 0:  # resumed a finished run: train nothing (as PyTorch Lightning does)
        print(f"the run is already complete ({step} of {total} steps); raise --epochs to train further")
    # One bar, on rank 0, on stdout with the epoch lines: mpirun forwards a rank's stdout and stderr
    # through separate pipes, so a bar on stderr (tqdm's default) would interleave with the lines in any
    # order. bar.write clears the bar, prints the line and redraws the bar: one stream, in order. In a log
    # file or a pipe (not a terminal) the bar is a plain line every tenth of the run: no \r frames.
    quiet = rank != 0 or step >= total
    bar = progress(total=total, initial=step, enabled=not quiet, desc="train")
    epoch_start, epoch_first_step = time.perf_counter(), step  # for the samples/s of the epoch record
    accuracy, evaluated_at = None, None
    for epoch in range(sampler.epoch, args.epochs):  # sampler.epoch: 0, or the epoch we resumed in
        if step >= stop:
            break
        # A new order each epoch. The epoch we resumed in keeps its position: the loader hands out
        # its remaining batches (none if it was finished), and the sampler counts them as they go,
        # so a checkpoint saved inside the loop records exactly the batches done.
        sampler.set_epoch(epoch)
        for xb, yb in loader:
            with monitor.step() if monitor else contextlib.nullcontext():  # a trace.STEP span
                if delay:
                    with trace.span("MINIDIST_SLOW_RANK sleep", "injected"):
                        time.sleep(delay)
                optimizer.zero_grad()
                loss_sum += train_step(model, xb, yb, args, mesh)  # [sum of per-sample losses, samples]
                with trace.span("optimizer step", "optimizer"):
                    optimizer.step()
            step += 1
            bar.update()
            if args.checkpoint_every and step % args.checkpoint_every == 0:
                saved_at = save_checkpoint(args, model, optimizer, mesh, sampler, step, loss_sum)
            faults.at_step(step)
            if step == stop:
                break
        if sampler.position < len(sampler):
            break  # stopped inside the epoch by --max-steps: no epoch summary
        # No batches left on this rank. If another rank still had one, both would raise a clear error
        # here instead of waiting forever for each other (DistributedDataParallel.join).
        if isinstance(model, DistributedDataParallel):  # ZeRO and pipelines communicate in every step
            model.join()
        dist.all_reduce(loss_sum, op="sum", group=mesh.dp_group)  # tp ranks hold the same losses
        if loss_sum[1] == 0:
            continue  # resumed after an epoch that was already summarised (saved when the run ended)
        accuracy, evaluated_at = evaluate(predict, x_test, y_test, mesh), step
        if rank == 0:
            bar.write(
                f"epoch {epoch + 1:3d}  train loss {loss_sum[0] / loss_sum[1]:.4f}  "
                f"test accuracy {accuracy:.4f}"
            )
            seconds = time.perf_counter() - epoch_start  # (evaluation included: the epoch as it took)
            samples_per_s = (step - epoch_first_step) * args.batch_size / seconds if seconds > 0 else None
            metrics.step(
                step, loss=loss_sum[0] / loss_sum[1], accuracy=accuracy, lr=args.lr,
                samples_per_s=samples_per_s, max_rss_mib=max_rss_mib(),
            )  # fmt: skip
        epoch_start, epoch_first_step = time.perf_counter(), step
        loss_sum = np.zeros(2)
    bar.close()
    if args.checkpoint_dir and saved_at != step:
        save_checkpoint(args, model, optimizer, mesh, sampler, step, loss_sum)
    checkpoint.wait_pending()  # --async-checkpoint: the last save is committed (or its error raised) now
    if step < total and rank == 0:  # --resume needs a checkpoint: without --checkpoint-dir none was saved
        then = "continue with --resume" if args.checkpoint_dir else "nothing saved (no --checkpoint-dir)"
        print(f"stopped at step {step} of {total} (--max-steps); {then}")
    if evaluated_at != step:  # stopped inside an epoch, or resumed a finished run
        accuracy = evaluate(predict, x_test, y_test, mesh)
    if args.trace or args.straggler_report:
        save_trace(args, world, mesh)
    if args.report_bytes and isinstance(model, DistributedDataParallel) and rank == 0:  # (others: alike)
        per_step = model.comm_stats.per_step()
        print(
            f"gradient all-reduce with --comm-hook {args.comm_hook}: {per_step['bytes_sent'] / 1024:.1f} KiB "
            f"sent per step by rank 0, payload {per_step['payload_bytes'] / 1024:.1f} KiB instead of "
            f"{per_step['uncompressed_bytes'] / 1024:.1f} KiB ({per_step['compression_ratio']:.1f}x smaller)"
        )
    if tracker is not None:
        print_memory_tables(tracker, world)
    if rank == 0:  # after --max-steps the model is not the final one: say what was measured
        done = "final test accuracy" if step >= total else f"test accuracy after {step} steps"
        print(f"{done}: {accuracy:.4f}")
    return accuracy


def train_step(
    model: Any, xb: np.ndarray, yb: np.ndarray, args: argparse.Namespace, mesh: ProcessMesh
) -> list:
    """Forward and backward of one global batch (this rank's share of it); returns [loss sum, samples]."""
    if mesh.pp > 1:
        # The microbatches flow through the stages (each stage's spans are traced by the executor);
        # the returned loss is the mean over the global batch, on every rank.
        loss = model.train_step(xb, yb, nn.functional.cross_entropy)
        return [loss * len(xb), len(xb)]  # summed over dp later: mean x global batch
    # Gradient accumulation: K micro-batches. All but the last backward run in no_sync, so the
    # gradients add up locally; the last backward all-reduces the sum, once.
    total = [0.0, 0]
    for k, micro in enumerate(np.array_split(np.arange(len(xb)), args.grad_accum)):
        with trace.span("forward", "forward"):
            logits = model(md.tensor(xb[micro]))
            # Sum over my samples / global batch * dp size: after DDP averages over the replicas this
            # is the gradient of the mean loss over the global batch, even when ranks hold unequal
            # shares (128 samples on 3 ranks: 43 + 43 + 42) or micro-batches.
            local_sum = nn.functional.cross_entropy(logits, yb[micro], reduction="sum")
            loss = local_sum * (mesh.dp / args.batch_size)
        last = k == args.grad_accum - 1
        with (
            trace.span("backward", trace.BACKWARD),
            contextlib.nullcontext() if last or args.zero else model.no_sync(),
        ):
            loss.backward()  # the last one returns with gradients averaged over all ranks
        total[0] += local_sum.item()
        total[1] += len(micro)
    return total


def resume(args: argparse.Namespace, model: Any, optimizer: Any, mesh: ProcessMesh, sampler: Any) -> tuple:
    """Load the newest checkpoint of --checkpoint-dir into model, optimizer and sampler (collective).

    Returns (step, loss_sum): the step it was saved after, and the running [loss sum, samples] of its
    epoch, on dp rank 0 only, because the epoch summary sums loss_sum over the dp group. None there:
    (0, zeros), a fresh start. A checkpoint that fails to verify is skipped for the one before it.
    """
    # Checkpoints of another --seed: one message naming the flag (load_latest would report each one as a
    # checkpoint that does not load, as if the files were damaged), on every rank alike.
    mismatch = mesh.world.mpi.bcast(
        seed_mismatch(args.checkpoint_dir, args.seed) if mesh.rank == 0 else None, root=0
    )
    if mismatch:
        raise ValueError(mismatch)
    info = checkpoint.load_latest(
        args.checkpoint_dir, model, optimizer, mesh=mesh, sampler=sampler, fallback=True, missing_ok=True
    )
    if info is None:
        if mesh.rank == 0:
            print(f"no checkpoint in {args.checkpoint_dir}: starting from scratch")
        return 0, np.zeros(2)
    loss_sum = np.array(info["extra"]["loss_sum"]) if mesh.dp_rank == 0 else np.zeros(2)
    if mesh.rank == 0:
        saved = " x ".join(f"{dim}={info['saved_mesh'][dim]}" for dim in ("dp", "tp", "pp"))
        how = f" (saved on {saved}, resharded)" if info["resharded"] else ""
        print(
            f"resumed from {info['path']}{how}: step {info['step']}, epoch {sampler.epoch + 1}, "
            f"batch {sampler.position // sampler.local_batch_size} done"
        )
    return info["step"], loss_sum


def save_checkpoint(
    args: argparse.Namespace, model: Any, optimizer: Any, mesh: ProcessMesh, sampler: Any, step: int,
    loss_sum: np.ndarray,
) -> int:  # fmt: skip
    """Save step ``step`` in --checkpoint-dir, keeping the newest 3 (collective); returns ``step``.

    The model may be DDP, a plain module under ZeRO, or a pipeline (each stage saves its layers under
    the full model's names); every rank writes its shards, rank 0 commits. The epoch's running loss is
    summed over dp first, so that a resumed run can print the whole epoch's loss."""
    running = loss_sum.copy()
    dist.all_reduce(running, op="sum", group=mesh.dp_group)
    checkpoint.save(
        args.checkpoint_dir, model, optimizer, step=step, mesh=mesh, sampler=sampler, keep_last=3,
        extra={"epoch": sampler.epoch, "loss_sum": running.tolist()}, async_save=args.async_checkpoint,
    )  # fmt: skip
    return step


def start_memory_tracker(args: argparse.Namespace, model: Any, optimizer: Any, rank: int) -> Any:
    """A running ``memory.MemoryTracker`` if --memory, --memory-budget or MINIDIST_MEMORY_BUDGET asks
    for one (the budget: an out-of-memory error on the rank that would exceed it), else None."""
    if not (args.memory or args.memory_budget or os.environ.get(memory.BUDGET_ENV)):
        return None
    return memory.MemoryTracker(model, optimizer, budget=args.memory_budget, rank=rank).start()


def print_memory_tables(tracker: Any, world: dist.Communicator) -> None:
    """Rank 0 prints every rank's memory table (now, peak, and each category at the total's peak)."""
    tracker.stop()
    tables = world.mpi.gather(tracker.table(), root=0)  # a string per rank
    if world.rank == 0:
        print("\n".join(tables))


def save_trace(args: argparse.Namespace, world: dist.Communicator, mesh: ProcessMesh) -> None:
    """Gather every rank's spans on rank 0 and put them on rank 0's clock (Cristian's algorithm, a few
    ping-pongs); print the straggler report (--straggler-report); write one Chrome-trace JSON, one track
    per rank (--trace), and print the overlap fraction (DDP's all-reduce hidden behind backward; a pipeline
    has no such overlap: its waits are the bubble). Collective."""
    trace.disable()
    offsets = clock_offsets(world)
    everyone = world.mpi.gather(trace.events(), root=0)  # a pickled Python list per rank
    groups = world.mpi.gather(tuple(mesh.dp_group.collective_channel.calls.world_ranks), root=0)
    if world.rank != 0:
        return
    if args.straggler_report:
        print(straggler_report(everyone, offsets, groups=sorted(set(groups))))  # within each dp group
    if not args.trace:
        return
    everyone = align(everyone, offsets)
    timeline.save_chrome_trace(args.trace, everyone)
    if mesh.pp > 1:
        print(f"trace written to {args.trace}")
        return
    hidden = [timeline.overlap_fraction(events) for events in everyone]
    print(
        f"trace written to {args.trace}; communication hidden behind backward: "
        f"{np.mean(hidden):.1%} (mean over ranks, min {min(hidden):.1%})"
    )


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:  # Ctrl-C reaches every rank: one line for the job, not a traceback per rank
        exit_interrupted()
    except (ValueError, OSError, backend.DeviceUnavailableError, checkpoint.CheckpointError,
            memory.OutOfMemoryError) as error:  # fmt: skip
        # Bad input, missing data, no checkpoint that loads, over --memory-budget: a message, not a
        # traceback, printed once ("error on ranks 0-7: ..."; "[rank r] error: ..." and MPI_Abort if only
        # some ranks raised it), exit code 2. (Any other error ends the job through dist's abort hook,
        # with a traceback.)
        exit_with_error(error, code=2)
