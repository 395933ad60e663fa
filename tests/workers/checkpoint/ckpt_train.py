"""Train a small MLP on any dp x tp x pp mesh with checkpoints; optionally kill a rank on purpose.

Usage: ckpt_train.py OUT CKPT --mesh dp,tp,pp --steps N [--every K] [--resume | --resume-from PATH]
       [--optims sgd,adamw] [--dropout P] [--zero] [--async-save] [--expect-error]
       [--then OUT CKPT --mesh ... ...]

``--then`` starts another run in the same launch, after the previous one ended (each on its own mesh of
the same world size): starting 4 or 8 Python ranks costs more than training this model, so a test
runs its reference and its resumed run, or several layouts, in one ``mpiexec``. Each run seeds every
generator itself (``model_parallel_manual_seed``, the sampler's seed), so it computes exactly what it
would in a launch of its own.

The model is ``Sequential(ParallelMLP(6, 16, 8), Tanh, ParallelMLP(8, 8, 4))`` in float64: its
global parameter names and values are the same on every mesh (ParallelMLP starts equal to the
dense layers of the same seed), so checkpoints of one layout load into another. Data: 40 samples,
global batch 8 split over the dp ranks by a global-batch DistributedSampler (5 steps per epoch).

For each optimizer, rank 0 writes ``OUT/<optim>.npz`` with the *global* parameters after training
(tp shards concatenated along tp_dim, gathered from every stage), and ``OUT/<optim>_step.json``.

``CKPT_KILL="rank:step:phase"`` makes that rank SIGKILL itself: phase ``train`` before training
step ``step + 1``; ``save`` right after writing its shard of checkpoint ``step`` (before the commit);
``commit`` (rank 0) after writing the manifest, just before the rename. ``--async-save`` saves with
``async_save=True`` (the ``save`` kill then hits the background thread while training goes on).
``--expect-error``: the load must raise CheckpointError; each rank writes ``OUT/error_<rank>.json``
with the message.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parents[1]))  # tests/workers: the shared worker modules
from dist_worker_utils import run_worker  # noqa: E402

import minidist as md  # noqa: E402
import minidist.distributed as dist  # noqa: E402
from minidist import checkpoint, nn, optim  # noqa: E402
from minidist.checkpoint import CheckpointError, atomic  # noqa: E402
from minidist.data import DataLoader, DistributedSampler  # noqa: E402
from minidist.parallel import DistributedDataParallel, ParallelMLP, ProcessMesh, ZeroRedundancyOptimizer  # noqa: E402
from minidist.parallel.pipeline import PipelineParallel  # noqa: E402
from minidist.parallel.tensor_parallel import model_parallel_manual_seed  # noqa: E402

N_SAMPLES, GLOBAL_BATCH = 40, 8


def install_kill(rank: int) -> tuple[int, str] | None:
    """Parse CKPT_KILL; patch the checkpoint's file steps for the save/commit phases."""
    spec = os.environ.get("CKPT_KILL")
    if not spec:
        return None
    k, s, phase = spec.split(":")
    if int(k) != rank:
        return None
    target = atomic.step_dirname(int(s))
    if phase == "save":
        real_write = atomic.write_shard

        def write_then_die(path, arrays):
            result = real_write(path, arrays)
            if target in path.parent.name:
                os.kill(os.getpid(), signal.SIGKILL)
            return result

        atomic.write_shard = write_then_die
    if phase == "commit":
        real_commit = atomic.commit_dir

        def die_or_commit(tmp, final):
            if final.name == target:
                os.kill(os.getpid(), signal.SIGKILL)
            real_commit(tmp, final)

        atomic.commit_dir = die_or_commit
    if phase == "latest":  # after the folder's rename, before 'latest' is replaced
        real_latest = atomic.write_latest

        def die_or_point(root, name):
            if name == target:
                os.kill(os.getpid(), signal.SIGKILL)
            real_latest(root, name)

        atomic.write_latest = die_or_point
    return int(s), phase


def main() -> None:
    world = dist.init()
    kill = install_kill(world.rank)
    argv, runs = sys.argv[1:], [[]]
    for arg in argv:  # split on --then: one argument list per run
        if arg == "--then":
            runs.append([])
        else:
            runs[-1].append(arg)
    for run_argv in runs:
        run(parse(run_argv), world, kill)


def parse(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("ckpt")
    ap.add_argument("--mesh", default="1,1,1")
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--every", type=int, default=0)
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--resume-from")
    ap.add_argument("--optims", default="sgd,adamw")
    ap.add_argument("--dropout", type=float, default=0.0)
    ap.add_argument("--zero", action="store_true")
    ap.add_argument("--async-save", action="store_true")
    ap.add_argument("--expect-error", action="store_true")
    return ap.parse_args(argv)


def run(args: argparse.Namespace, world: dist.Communicator, kill) -> None:
    dp, tp, pp = map(int, args.mesh.split(","))
    assert dp * tp * pp == world.size, f"--mesh {args.mesh} needs {dp * tp * pp} ranks, not {world.size}"
    mesh = ProcessMesh(dp=dp, tp=tp, pp=pp)
    for name in args.optims.split(","):
        train(args, mesh, name, kill)


def train(args, mesh: ProcessMesh, opt_name: str, kill) -> None:
    model_parallel_manual_seed(0, group=mesh.tp_group)
    model = nn.Sequential(
        ParallelMLP(6, 16, 8, activation="tanh", dropout=args.dropout, group=mesh.tp_group, dtype=np.float64),
        nn.Tanh(),
        ParallelMLP(8, 8, 4, activation="gelu", group=mesh.tp_group, dtype=np.float64),
    )
    rng = np.random.default_rng(1000)
    x, y = rng.standard_normal((N_SAMPLES, 6)), rng.integers(0, 4, N_SAMPLES)
    sampler = DistributedSampler(
        N_SAMPLES, num_replicas=mesh.dp, rank=mesh.dp_rank, batch_size=GLOBAL_BATCH, seed=5
    )
    loader = DataLoader((x, y), batch_size=sampler.local_batch_size, sampler=sampler)
    kwargs = dict(lr=0.1, momentum=0.9, weight_decay=1e-3) if opt_name == "sgd" else dict(lr=0.01)
    opt_class = optim.SGD if opt_name == "sgd" else optim.AdamW
    if mesh.pp > 1:
        runner = PipelineParallel(model, group=mesh, microbatches=2)
        opt = opt_class(runner.parameters(), **kwargs)
    elif args.zero:
        runner = model
        opt = ZeroRedundancyOptimizer(model.parameters(), opt_class, group=mesh.dp_group, stage=2, **kwargs)
    else:
        runner = DistributedDataParallel(model, group=mesh.dp_group)
        opt = opt_class(model.parameters(), **kwargs)

    ckpt = Path(args.ckpt) / opt_name
    step = 0
    try:
        if args.resume_from:
            step = checkpoint.load(
                Path(args.resume_from) / opt_name, runner, opt, mesh=mesh, sampler=sampler
            )["step"]
        elif args.resume:
            info = checkpoint.load_latest(ckpt, runner, opt, mesh=mesh, sampler=sampler, missing_ok=True)
            step = 0 if info is None else info["step"]
    except CheckpointError as err:
        if not args.expect_error:
            raise
        Path(args.out, f"error_{mesh.rank}.json").write_text(json.dumps({"error": str(err)}))
        return
    if args.expect_error:
        raise AssertionError("the load did not raise CheckpointError")

    while step < args.steps:
        for xb, yb in loader:  # the sampler counts the batches handed out: no bookkeeping here
            if kill is not None and kill == (step, "train"):
                os.kill(os.getpid(), signal.SIGKILL)
            opt.zero_grad()
            if mesh.pp > 1:
                runner.train_step(md.tensor(xb, dtype=np.float64), yb, nn.functional.cross_entropy)
            else:
                nn.functional.cross_entropy(runner(md.tensor(xb, dtype=np.float64)), yb).backward()
            opt.step()
            step += 1
            if args.every and step % args.every == 0:
                checkpoint.save(ckpt, runner, opt, step=step, mesh=mesh, sampler=sampler, keep_last=2,
                                async_save=args.async_save)  # fmt: skip
            if step == args.steps:
                break
        else:
            sampler.set_epoch(sampler.epoch + 1)
    checkpoint.wait_pending()  # --async-save: the last save is committed before the run ends
    write_global_params(args.out, opt_name, runner, mesh, step)


def write_global_params(out: str, opt_name: str, runner, mesh: ProcessMesh, step: int) -> None:
    """Rank 0 writes every parameter's global value (independently of the checkpoint code)."""
    module = runner.stage_module if hasattr(runner, "stage_module") else getattr(runner, "module", runner)
    mine = [(n, mesh.tp_rank, getattr(p, "tp_dim", None), p.numpy()) for n, p in module.named_parameters()]
    everyone = mesh.world.mpi.gather(mine if mesh.dp_rank == 0 else [], root=0)
    if mesh.rank != 0:
        return
    pieces: dict[str, dict[int, tuple]] = {}
    for part in everyone:
        for n, t, d, a in part:
            pieces.setdefault(n, {})[t] = (d, a)
    full = {}
    for n, by_rank in pieces.items():
        d = by_rank[0][0]
        full[n] = (
            by_rank[0][1] if d is None else np.concatenate([by_rank[t][1] for t in sorted(by_rank)], axis=d)
        )
    np.savez(Path(out) / f"{opt_name}.npz", **full)
    Path(out, f"{opt_name}_step.json").write_text(json.dumps({"step": step}))


if __name__ == "__main__":
    run_worker(main)
