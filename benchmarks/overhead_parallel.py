"""The DDP and pipeline rows of ``overhead.py``: each wrapper against the same work done by hand.

Each function returns ``(ours, bare)`` closures running forward + backward (no optimizer) on the
small MLP of ``small_mlp.py``; ``overhead.py`` times them in turns on all ranks (the slowest rank's
time per step) and prints the difference.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np
from mpi4py import MPI
from small_mlp import Workload

import minidist as md
from minidist import nn
from minidist.parallel import DistributedDataParallel
from minidist.parallel.data_parallel.buckets import flatten, unflatten_into
from minidist.parallel.pipeline import PipelineParallel


def backward_step(w: Workload, wrap: Callable) -> tuple[Callable, list]:
    """(forward + backward of the small MLP from seed 0, wrapped by ``wrap``, on this rank's batch,
    gradients set to None first; its parameters). No optimizer."""
    model = wrap(w.new_model())
    params = list(model.parameters())
    xt = md.tensor(w.x)

    def step() -> None:
        for p in params:
            p.grad = None
        nn.functional.cross_entropy(model(xt), w.y).backward()

    return step, params


def averaged_by_hand(w: Workload, local: Callable, params: list) -> Callable:
    """``local()``, then what DDP does after the backward, by hand: pack the gradients, one mpi4py
    ``Allreduce`` over the dp group, divide, unpack."""

    def step() -> None:
        local()
        grads = [p.grad for p in params]
        flat = flatten(grads)
        w.dp_comm.Allreduce(MPI.IN_PLACE, flat)
        flat /= w.mesh.dp_group.size
        unflatten_into(flat, grads)

    return step


def ddp_pairs(w: Workload) -> dict[str, tuple[Callable, Callable]]:
    """Two pairs of (forward + backward) closures, no optimizer:

    * per step: DDP with its one bucket against the local model + what DDP does, by hand, after the
      backward (pack the gradients, one ``Allreduce``, divide, unpack): the difference is DDP's hooks,
      bucket bookkeeping, communication thread and checks;
    * per extra bucket: DDP with one bucket per parameter (6) against DDP with one bucket + 5 bare
      ``Allreduce``s of one float (the latency of 5 more messages; the bytes are the same): the
      difference / 5 is what one more bucket costs DDP beyond its message. These buckets are small,
      so DDP all-reduces them on the calling thread after backward (its lean path);
    * per extra bucket via the comm thread: the same with ``small_bucket_bytes=0``, so that the first
      5 buckets go through the communication thread during backward, as big buckets do: the hand-off.
    """
    group = w.mesh.dp_group
    make = functools.partial(backward_step, w)

    ddp_one, _ = make(lambda m: DistributedDataParallel(m, group=group))
    ddp_six, _ = make(lambda m: DistributedDataParallel(m, group=group, bucket_cap_mb=1e-9))  # a bucket each
    ddp_six_thread, _ = make(
        lambda m: DistributedDataParallel(m, group=group, bucket_cap_mb=1e-9, small_bucket_bytes=0)
    )
    local, params = make(lambda m: m)
    one_float = np.zeros(1, dtype=np.float32)

    local_then_allreduce = averaged_by_hand(w, local, params)

    def ddp_one_and_five_messages() -> None:
        ddp_one()
        for _ in range(5):
            w.dp_comm.Allreduce(MPI.IN_PLACE, one_float)

    return {
        "DDP, per step": (ddp_one, local_then_allreduce),
        "DDP, per extra bucket": (ddp_six, ddp_one_and_five_messages),
        "DDP, per extra bucket via the comm thread": (ddp_six_thread, ddp_one_and_five_messages),
    }


def pipeline_pair(w: Workload) -> tuple[Callable, Callable]:
    """(``PipelineParallel.train_step`` with GPipe, the same stage module run by a hand-written GPipe
    loop with mpi4py ``Send``/``Recv`` and, with dp > 1, one ``Allreduce`` of the stage's gradients).
    Forward + backward only. The difference / m is the executor's cost per microbatch, its per-step
    work (argument agreement, the loss all-reduce) included."""
    mesh, m = w.mesh, w.args.microbatches
    pipe = PipelineParallel(w.new_model(), mesh, microbatches=m, schedule="gpipe", cuts=w.cuts)
    stage, params = pipe.chunks[0], list(pipe.parameters())
    pp, dp = w.pp_comm, w.dp_comm
    s, p, size = pp.Get_rank(), pp.Get_size(), len(w.x) // m
    xt = md.tensor(w.x)
    width_in = params[0].shape[1]
    loss_fn = nn.functional.cross_entropy

    def ours() -> None:
        for q in params:
            q.grad = None
        pipe.train_step(xt, w.y, loss_fn)

    def by_hand() -> None:
        for q in params:
            q.grad = None
        ins, outs = [], []
        for i in range(m):
            if s == 0:
                inp = md.tensor(w.x[i * size : (i + 1) * size])
            else:
                buf = np.empty((size, width_in), dtype=np.float32)
                pp.Recv(buf, source=s - 1, tag=i)
                inp = md.tensor(buf, requires_grad=True)
            out = stage(inp)
            if s == p - 1:
                out = loss_fn(out, w.y[i * size : (i + 1) * size]) * (1.0 / m)
            else:
                pp.Send(np.ascontiguousarray(out.data), dest=s + 1, tag=i)
            ins.append(inp)
            outs.append(out)
        for i in reversed(range(m)):
            if s == p - 1:
                outs[i].backward()
            else:
                grad = np.empty(outs[i].shape, dtype=np.float32)
                pp.Recv(grad, source=s + 1, tag=m + i)
                outs[i].backward(grad)
            if s > 0:
                pp.Send(np.ascontiguousarray(ins[i].grad), dest=s - 1, tag=m + i)
        if dp.Get_size() > 1:
            grads = [q.grad for q in params]
            flat = flatten(grads)
            dp.Allreduce(MPI.IN_PLACE, flat)
            flat /= dp.Get_size()
            unflatten_into(flat, grads)

    return ours, by_hand
