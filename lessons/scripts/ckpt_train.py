"""Lesson 08: train a tiny model on any dp x tp x pp mesh with checkpoints; optionally kill a rank.

    mpiexec -n 2 python lessons/scripts/ckpt_train.py OUT.npz --ckpt DIR --mesh 2,1,1 --steps 12 --every 4
    mpiexec -n 2 python lessons/scripts/ckpt_train.py OUT.npz --ckpt DIR --mesh 1,2,1 --steps 12 --resume

The model is ``Sequential(ParallelMLP(6, 16, 8), Tanh, ParallelMLP(8, 8, 4))`` in float64, trained
with AdamW on 40 random samples, global batch 8 (5 steps per epoch, reshuffled every epoch). Its
global parameters are the same on every mesh (``ParallelMLP`` starts equal to the dense layers of
the same seed), so a checkpoint saved on one mesh loads on another. ``--mesh dp,tp,pp``: with
``pp > 1`` the layers run as a ``PipelineParallel`` (2 microbatches), otherwise ``DistributedDataParallel``
over the dp group. ``--every K`` saves every K steps (keeping the last 3); ``--resume`` continues from
``DIR/latest``: the weights, AdamW's moments and step count, the sampler's epoch and position and the
generators, so the run goes on as if never interrupted.

``--kill RANK:STEP`` makes that rank SIGKILL itself just before training step STEP + 1: a crashed
node. Rank 0 prints every step's loss and writes the *global* parameters (tensor-parallel shards
concatenated, pipeline stages gathered) to OUT.npz at the end.
"""

import argparse
import os
import signal
import sys

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402

import minidist as md  # noqa: E402
import minidist.distributed as dist  # noqa: E402
from minidist import checkpoint, nn, optim  # noqa: E402
from minidist.data import DataLoader, DistributedSampler  # noqa: E402
from minidist.parallel import DistributedDataParallel, ParallelMLP, ProcessMesh  # noqa: E402
from minidist.parallel.pipeline import PipelineParallel  # noqa: E402
from minidist.parallel.tensor_parallel import model_parallel_manual_seed  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("out")
p.add_argument("--ckpt", required=True)
p.add_argument("--mesh", default="2,1,1", help="dp,tp,pp")
p.add_argument("--steps", type=int, default=12)
p.add_argument("--every", type=int, default=0)
p.add_argument("--resume", action="store_true")
p.add_argument("--kill", default=None, metavar="RANK:STEP")
args = p.parse_args()

world = dist.init()
dp, tp, pp = map(int, args.mesh.split(","))
mesh = ProcessMesh(dp=dp, tp=tp, pp=pp)
model_parallel_manual_seed(0, group=mesh.tp_group)
model = nn.Sequential(
    ParallelMLP(6, 16, 8, activation="tanh", group=mesh.tp_group, dtype=np.float64),
    nn.Tanh(),
    ParallelMLP(8, 8, 4, activation="gelu", group=mesh.tp_group, dtype=np.float64),
)
data = np.random.default_rng(1000)
x, y = data.standard_normal((40, 6)), data.integers(0, 4, 40)
sampler = DistributedSampler(40, num_replicas=mesh.dp, rank=mesh.dp_rank, batch_size=8, seed=5)
loader = DataLoader((x, y), batch_size=sampler.local_batch_size, sampler=sampler)
if pp > 1:
    runner = PipelineParallel(model, mesh, microbatches=2)
else:
    runner = DistributedDataParallel(model, group=mesh.dp_group)
opt = optim.AdamW(runner.parameters(), lr=0.01)

step = 0
if args.resume:
    info = checkpoint.load_latest(args.ckpt, runner, opt, mesh=mesh, sampler=sampler)
    step = info["step"]
    if world.rank == 0:
        saved = info["saved_mesh"]
        how = "resharded from" if info["resharded"] else "same mesh as"
        where = f"dp={saved['dp']} tp={saved['tp']} pp={saved['pp']}"
        print(f"resumed at step {step} ({how} {where})", flush=True)
kill_rank, kill_step = map(int, args.kill.split(":")) if args.kill else (-1, -1)

while step < args.steps:
    position = sampler.position  # where in the epoch we are (a resumed run starts mid-epoch)
    for k, (xb, yb) in enumerate(loader):
        if world.rank == kill_rank and step == kill_step:
            print(f"rank {world.rank}: killed before step {step + 1}", file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        opt.zero_grad()
        if pp > 1:
            loss = runner.train_step(md.tensor(xb, dtype=np.float64), yb, nn.functional.cross_entropy)
        else:
            local = nn.functional.cross_entropy(runner(md.tensor(xb, dtype=np.float64)), yb)
            local.backward()
            loss = float(dist.all_reduce(np.array([local.item()]), op="avg", group=mesh.dp_group)[0])
        opt.step()
        step += 1
        sampler.position = position + (k + 1) * sampler.local_batch_size
        if world.rank == 0:
            print(f"step {step:2d}  loss {loss:.15f}", flush=True)
        if args.every and step % args.every == 0:
            checkpoint.save(args.ckpt, runner, opt, step=step, mesh=mesh, sampler=sampler, keep_last=3)
        if step == args.steps:
            break
    else:
        sampler.set_epoch(sampler.epoch + 1)

# Global parameters, assembled independently of the checkpoint code: shards of dp replica 0 only.
module = runner.stage_module if pp > 1 else runner.module
mine = [(n, mesh.tp_rank, getattr(q, "tp_dim", None), q.numpy()) for n, q in module.named_parameters()]
everyone = mesh.world.mpi.gather(mine if mesh.dp_rank == 0 else [], root=0)
if world.rank == 0:
    pieces = {}
    for part in everyone:
        for name, t, d, a in part:
            pieces.setdefault(name, {})[t] = (d, a)
    full = {}
    for name, by_rank in pieces.items():
        d = by_rank[0][0]
        shards = [by_rank[t][1] for t in sorted(by_rank)]
        full[name] = shards[0] if d is None else np.concatenate(shards, axis=d)
    np.savez(args.out, **full)
