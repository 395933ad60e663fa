"""Pipeline parallelism in its simplest form: one naive, blocking GPipe step. Read this file first.

The model is cut into ``p`` stages of consecutive layers, one per rank of the pipeline group
(``partition.py``), and the batch into ``m`` microbatches. GPipe (Huang et al. 2019, §2.3) runs every
forward, then every backward: stage s receives its input from stage s-1 (stage 0: the data), runs its
layers, keeps the output with its graph and sends it to stage s+1; then it receives the gradient of
that output from s+1 (the last stage: ``d(loss_i / m)``), runs backward and sends its input's gradient
to s-1. Parameter gradients add up over the microbatches to the gradient of the batch's mean loss.

**Why it is slow.** With ``t_f``, ``t_b`` the forward and backward time of a microbatch on a stage, a
step lasts ``(m + p - 1)(t_f + t_b)``, of which a stage computes ``m (t_f + t_b)``: it idles for the
*bubble* ``(p - 1) / (m + p - 1)`` of the step, while the pipe fills and drains. More microbatches
shrink it, but every stage holds the activations of all ``m`` at the turn from forward to backward;
1F1B (``schedules.py``) has the same bubble and holds at most ``p - s``. There the order is data, run
by one executor (``executor.py``) and checked for deadlocks on paper (``simulate.py``).

**Left out**: all that keeps a mistake from hanging the job (consistent arguments on every rank, a
stage whose layers raise), data parallelism, evaluation. ``PipelineParallel(schedule="gpipe")`` and
``"1f1b"`` give the same numbers, bit for bit (``tests/parallel/pipeline/test_pipeline_naive.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

import minidist.distributed as dist
from minidist import backend
from minidist.autograd import Tensor
from minidist.distributed import Communicator
from minidist.nn.module import Module
from minidist.parallel.pipeline import messages


def naive_gpipe_step(
    stage: Module, group: Communicator, inputs: Tensor | None, targets: Any, loss_fn: Callable, m: int
) -> float:
    """Forward, then backward, of ``m`` microbatches through this rank's ``stage``; returns the mean loss.

    ``stage``: rank s's layers, e.g. ``build_stage(model, partition(model, p)[s])`` (``partition.py``).
    ``inputs``: the batch, a Tensor of shape ``(B, ...)``, on stage 0 (None elsewhere); ``targets``:
    shape ``(B, ...)``, on the last stage; ``loss_fn(output, targets) -> scalar Tensor``, the mean over
    a microbatch. ``B`` must be divisible by ``m``, else ``ValueError`` on the ranks that hold the batch
    (the safety net then ends the others). Gradients accumulate into ``.grad``; the loss is returned on
    every rank.
    """
    s, p, xp = group.rank, group.size, backend.xp()
    size = len(inputs) if s == 0 else len(targets) if s == p - 1 else m
    if m < 1 or size % m:  # a remainder would leave samples out of the loss without a word
        raise ValueError(f"naive_gpipe_step: a batch of {size} cannot be cut into m={m} equal microbatches")
    xs, outs = [], []  # per microbatch: this stage's input and output (with its graph), for backward
    for i in range(m):  # 1. every forward
        if s == 0:
            n = len(inputs) // m
            x = Tensor(inputs.data[i * n : (i + 1) * n])
        else:  # first the activation's shape and dtype (a small header: messages.py), then the data
            header = group.recv(messages.header_buffer(), s - 1, tag=messages.TAG_HEADER)
            buffer = xp.empty(*messages.decode_header(header))
            x = Tensor(group.recv(buffer, s - 1, tag=messages.TAG_ACT), requires_grad=True)
        out = stage(x)
        if s < p - 1:
            data = xp.ascontiguousarray(out.data)
            group.send(messages.encode_header(data), s + 1, tag=messages.TAG_HEADER)
            group.send(data, s + 1, tag=messages.TAG_ACT)
        else:  # the last stage's output becomes the microbatch's loss
            n = len(targets) // m
            out = loss_fn(out, targets[i * n : (i + 1) * n])
        xs.append(x)
        outs.append(out)
    loss = 0.0
    for i in range(m):  # 2. every backward, in the same microbatch order
        out = outs[i]
        if s == p - 1:  # d(loss_i / m) / d(loss_i) = 1/m: the mean over microbatches is the batch mean
            loss += out.item() / m
            grad = xp.full(out.data.shape, 1.0 / m, dtype=out.data.dtype)
        else:
            grad = group.recv(xp.empty(out.data.shape, out.data.dtype), s + 1, tag=messages.TAG_GRAD)
        out.backward(grad)
        if s > 0:
            group.send(xp.ascontiguousarray(xs[i].grad), s - 1, tag=messages.TAG_GRAD)
    total = np.array([loss if s == p - 1 else 0.0])  # known on the last stage: sum it to every rank
    return float(dist.all_reduce(total, op="sum", group=group)[0])
