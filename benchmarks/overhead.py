"""Where one training step's time goes beyond the NumPy kernels (issue 16, item 1).

    mpiexec -n 1 python benchmarks/overhead.py               # 1 rank
    mpiexec -n 2 python benchmarks/overhead.py               # DP 2 (-n 4: DP 4)
    mpiexec -n 2 python benchmarks/overhead.py --pp 2        # 2 GPipe stages
    mpiexec -n 4 python benchmarks/overhead.py --dp 2 --pp 2

The small MLP of ``small_mlp.py`` (64-256-256-10, batch 128, float32, SGD). Every row times a piece of
minidist against the bare work it wraps, *interleaved* (one block of each in turn, ``--rounds`` times,
medians of the per-call times), so that load from other processes hits both sides alike; the overhead
is the difference of the medians:

* ops (forward, graph built): ``x @ w.T`` (128x256 @ 256x256), ``+ bias``, ``F.linear`` (the two in
  one op), ``relu``, ``cross_entropy`` (128x10) against the same NumPy expressions;
* forward of the model + loss; backward, per graph node (against ``numpy_reference``'s hand-written
  backward); ``SGD.step`` and ``zero_grad``, per parameter (against ``p -= lr * g``);
* data loading per batch: ``DataLoader`` + ``DistributedSampler`` against ``x[perm[i:i+B]]``;
* the step as a whole: minidist against the NumPy reference (``peer.py`` for the full comparison);
* with dp > 1 (pp = 1): DDP per step (DDP step - local step - one MPI ``Allreduce`` of all gradients)
  and per bucket (one bucket per parameter vs one bucket, minus the same for bare ``Allreduce``s);
* with pp > 1: the executor per microbatch (``PipelineParallel.train_step`` against the same stage
  modules driven by a hand-written GPipe loop with mpi4py ``Send``/``Recv``);
* with > 1 rank: the collective call path per message, ``dist.all_reduce`` (auto) of 4 KiB against
  MPI's ``Allreduce`` (``collectives.timed_together``: one call each in turn, the slowest rank's time).

Rows timed on one rank are rank 0's while all ranks run the same code (the load of a real run); the
others are the slowest rank's. Writes ``benchmarks/results/overhead_dp{dp}_pp{pp}.csv``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import numpy as np  # noqa: E402
from collectives import call, timed_together  # noqa: E402
from ddp import time_round  # noqa: E402
from numpy_reference import ReferenceStage, cross_entropy  # noqa: E402
from overhead_parallel import ddp_pairs, pipeline_pair  # noqa: E402
from small_mlp import Workload, add_workload_args, make_workload, minidist_step, reference_step, write_csv  # noqa: E402

import minidist as md  # noqa: E402
import minidist.distributed as dist  # noqa: E402
from minidist import nn, optim  # noqa: E402
from minidist.data import DataLoader, DistributedSampler  # noqa: E402
from minidist.models import MLP  # noqa: E402

Row = tuple[str, float, float, float]  # (what, minidist s, bare s, count the overhead is divided by)


def interleaved(pairs: dict[str, tuple[Callable, Callable]], rounds: int, inner: int) -> dict[str, tuple]:
    """name -> (median s per call of ours, of bare); each round times ``inner`` calls of each in turn.
    A ``setup`` callable may precede: pairs[name] = (ours, bare) or (ours, bare, setup) where setup()
    runs untimed before every call (e.g. the forward that a timed backward needs)."""
    times = {name: ([], []) for name in pairs}
    for _ in range(rounds):
        for name, (ours, bare, *setup) in pairs.items():
            for side, fn in enumerate((ours, bare)):
                total = 0.0
                for _ in range(inner):
                    if setup:
                        setup[0](side)
                    start = time.perf_counter()
                    fn()
                    total += time.perf_counter() - start
                times[name][side].append(total / inner)
    return {name: (float(np.median(a)), float(np.median(b))) for name, (a, b) in times.items()}


def bare_xent(logits: np.ndarray, y: np.ndarray) -> float:
    z = logits - logits.max(axis=1, keepdims=True)
    return float(np.mean(np.log(np.exp(z).sum(axis=1)) - z[np.arange(len(y)), y]))


def graph_nodes(root: md.Tensor) -> int:
    """Functions (graph nodes) that a backward from ``root`` visits."""
    seen, todo = set(), [root]
    while todo:
        t = todo.pop()
        if t._ctx is not None and id(t._ctx) not in seen:
            seen.add(id(t._ctx))
            todo.extend(i for i in t._ctx.inputs if hasattr(i, "_ctx"))
    return len(seen)


def bare_linear(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    """x @ w.T + b as the NumPy reference writes it: the bias added in place into the matmul's result."""
    y = x @ w.T
    y += b
    return y


def local_rows(w: Workload, rounds: int) -> list[Row]:
    """Ops, forward, backward, optimizer and data loading, on this rank alone (1 rank's model)."""
    rng = np.random.default_rng(1)
    h = rng.standard_normal((128, 256), dtype=np.float32)
    wt, bias = rng.standard_normal((256, 256), dtype=np.float32), rng.standard_normal(256, dtype=np.float32)
    logits, y = rng.standard_normal((128, 10), dtype=np.float32), rng.integers(0, 10, 128)
    tw = md.tensor(wt, requires_grad=True)
    th, twt = md.tensor(h, requires_grad=True), tw.T
    tb, tl = md.tensor(bias, requires_grad=True), md.tensor(logits, requires_grad=True)
    ops = {
        "op matmul 128x256 @ 256x256": (lambda: th @ twt, lambda: h @ wt.T),
        "op add bias 128x256 + 256": (lambda: th + tb, lambda: h + bias),
        "op linear 128x256 -> 256 (F.linear)": (
            lambda: nn.functional.linear(th, tw, tb),
            lambda: bare_linear(h, wt, bias),
        ),
        "op relu 128x256": (lambda: nn.functional.relu(th), lambda: np.maximum(h, 0)),
        "op cross_entropy 128x10": (lambda: nn.functional.cross_entropy(tl, y), lambda: bare_xent(logits, y)),
    }
    res = interleaved(ops, rounds, 200)
    rows: list[Row] = [(name, *res[name], 1) for name in ops]

    md.manual_seed(0)
    model = MLP(64, [256, 256], 10)
    ref = ReferenceStage([p.data for p in model.parameters()], head=True)
    xt, x = md.tensor(w.x), w.x
    nodes = graph_nodes(nn.functional.cross_entropy(model(xt), w.y))
    held = {}  # the loss (ours) / the loss gradient (bare) that the timed backward needs

    def forward_for_backward(side: int) -> None:
        if side == 0:
            model.zero_grad()
            held["loss"] = nn.functional.cross_entropy(model(xt), w.y)
        else:
            ref.zero_grad()
            held["grad"] = cross_entropy(ref.forward(x), w.y)[1]

    opt = optim.SGD(model.parameters(), lr=1e-6)  # a tiny lr: 1000s of timed steps barely move the model
    whole = {
        "forward (model + loss), per node": (
            lambda: nn.functional.cross_entropy(model(xt), w.y), lambda: bare_xent(ref.forward(x), w.y)),
        "backward, per node": (lambda: held["loss"].backward(), lambda: ref.backward(held["grad"]),
                               forward_for_backward),
        "SGD step, per parameter": (opt.step, lambda: ref.sgd(1e-6)),
        "zero_grad, per parameter": (lambda: opt.zero_grad(set_to_none=False), ref.zero_grad),
    }  # fmt: skip
    forward_for_backward(0)
    held["loss"].backward()  # SGD and zero_grad need gradients to work on
    res = interleaved(whole, rounds, 50)
    n_params = len(ref.params)
    counts = {"forward (model + loss), per node": nodes, "backward, per node": nodes}
    rows += [(name, *res[name], counts.get(name, n_params)) for name in whole]

    n = 128 * 50  # an epoch of 50 batches of the small MLP's 64 features
    data = (rng.standard_normal((n, 64), dtype=np.float32), rng.integers(0, 10, n))
    sampler = DistributedSampler(n, num_replicas=1, rank=0, batch_size=128, seed=0)
    loader = DataLoader(data, batch_size=128, sampler=sampler)

    def bare_epoch() -> None:
        order = np.random.default_rng(0).permutation(n)
        for start in range(0, n, 128):
            idx = order[start : start + 128]
            data[0][idx], data[1][idx]

    res = interleaved({"data loading, per batch": (lambda: sum(1 for _ in loader), bare_epoch)}, rounds, 3)
    rows.append(("data loading, per batch", *res["data loading, per batch"], n // 128))
    return rows


def distributed_rows(w: Workload, rounds: int, steps: int) -> list[Row]:
    """The whole step, DDP, the pipeline executor and the collective path; the slowest rank's times."""
    world, mesh = dist.init(), w.mesh
    comm = world.mpi
    ours, _ = minidist_step(w)
    bare, _ = reference_step(w)
    pairs: dict[str, tuple[Callable, Callable]] = {"whole training step": (ours, bare)}
    counts = {"whole training step": 1}
    if mesh.dp > 1 and mesh.pp == 1:
        pairs |= ddp_pairs(w)
        counts |= {
            "DDP, per step": 1,
            "DDP, per extra bucket": 5,
            "DDP, per extra bucket via the comm thread": 5,
        }
    if mesh.pp > 1:
        pairs["pipeline executor, per microbatch"] = pipeline_pair(w)
        counts["pipeline executor, per microbatch"] = w.args.microbatches
    for fns in pairs.values():
        for fn in fns:
            time_round(fn, comm, 5)  # warm up
    times = {name: ([], []) for name in pairs}
    for _ in range(rounds):
        for name, fns in pairs.items():
            for side, fn in enumerate(fns):
                times[name][side].append(time_round(fn, comm, steps))
    med = {name: (float(np.median(a)), float(np.median(b))) for name, (a, b) in times.items()}
    rows = [(name, *med[name], counts[name]) for name in pairs]
    if world.size > 1:
        a = np.zeros(1024, dtype=np.float32)  # 4 KiB; zeros: in-place sums double ones to inf
        calls = {"auto": call("all_reduce", "auto", a), "mpi": call("all_reduce", "mpi", a)}
        res = timed_together(world, calls, iters=rounds * 30, warmup=10)
        rows.append(("all_reduce 4 KiB, per message", res["auto"], res["mpi"], 1))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_workload_args(parser)
    parser.add_argument("--rounds", type=int, default=15, help="interleaved rounds (medians over them)")
    parser.add_argument("--steps", type=int, default=20, help="steps per round for the step-level rows")
    args = parser.parse_args()
    load_before = os.getloadavg()
    w = make_workload(args)
    rows = local_rows(w, args.rounds) + distributed_rows(w, args.rounds, args.steps)
    if w.mesh.world.rank != 0:
        return
    mesh = w.mesh
    print(
        f"overhead of minidist beyond the NumPy work: small MLP 64-256-256-10, global batch {args.batch}, "
        f"dp={mesh.dp} pp={mesh.pp}" + (f", GPipe {args.microbatches} microbatches" if mesh.pp > 1 else "")
    )
    print(
        f"load average before: {load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f}; "
        f"after: {os.getloadavg()[0]:.2f}; {os.cpu_count()} CPUs; {args.rounds} interleaved rounds"
    )
    print(f"{'':42s} {'minidist us':>11s} {'bare us':>9s} {'overhead us':>11s} {'per':>5s} {'us each':>8s}")
    lines = ["what,dp,pp,minidist_us,bare_us,overhead_us,count,overhead_each_us"]
    for name, ours, bare, count in rows:
        extra = (ours - bare) * 1e6
        print(
            f"{name:42s} {ours * 1e6:11.1f} {bare * 1e6:9.1f} {extra:11.1f} {count:5d} {extra / count:8.2f}"
        )
        lines.append(
            f"{name},{mesh.dp},{mesh.pp},{ours * 1e6:.2f},{bare * 1e6:.2f},{extra:.2f},{count},"
            f"{extra / count:.3f}"
        )
    write_csv("overhead", mesh, lines)


if __name__ == "__main__":
    main()
