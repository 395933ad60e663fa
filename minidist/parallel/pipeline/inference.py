"""Forward-only passes through a pipeline, for evaluation: no schedule, no gradients, no microbatches.

Training needs a schedule because backward passes must interleave with forwards. Evaluation only
runs forwards, so the batch simply travels down the chain of stages once: stage 0 computes and sends
its output to stage 1, which computes and sends to stage 2, and so on; every rank blocks only on its
own predecessor, so this cannot deadlock. The last stage then broadcasts the output over the pipeline
group, so that every rank (e.g. every rank of a dp replica that counts correct predictions) gets it.

With interleaving (``virtual_stages=v``) the model is cut into ``p*v`` chunks and chunk ``g`` lives on
rank ``g % p``; the batch visits the chunks in order 0, 1, ..., ``p*v - 1``, going round the ranks
``v`` times (rank ``p-1`` hands chunk ``p-1``'s output to rank 0's chunk ``p``).

Shapes travel as a small int64 header before each activation (``messages.py``); the messages use
their own tags, so a stray training message could never be mistaken for one of these.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

import minidist.distributed as dist
from minidist import autograd, backend
from minidist.autograd import Tensor
from minidist.distributed import Communicator
from minidist.nn.module import Module
from minidist.parallel.pipeline.checks import run_chunk, stand_in_spec
from minidist.parallel.pipeline.messages import (
    TAG_PREDICT,
    TAG_PREDICT_HEADER,
    decode_header,
    encode_header,
    header_buffer,
)
from minidist.parallel.pipeline.step_checks import gather_step


def forward_only(chunks: Sequence[Module], group: Communicator, inputs: Any) -> Any:
    """Run ``inputs`` through every rank's ``chunks`` in pipeline order; return the output on every rank.

    Args:
        chunks: this rank's model chunks; chunk ``k`` is virtual stage ``k * p + rank`` (``p`` =
            ``group.size``); one chunk per rank without interleaving.
        group: the pipeline group (rank s holds stage s).
        inputs: the batch, shape ``(B, ...)``, a backend array; needed on rank 0 only.

    Returns the last chunk's output as a backend array, shape ``(B, ...)``, on every rank of ``group``.
    Runs under ``no_grad``, with the chunks in eval mode (restored afterwards). Raises ``ValueError`` on
    every rank if rank 0 has no inputs, or if some ranks called ``train_step`` instead
    (``agreement.gather_step``). If a chunk raises (e.g. its input does not fit its first layer), it sends
    zeros on instead and every rank raises the first failure along the chain, naming the stage and
    the input's shape (``checks.run_chunk``: a ``ValueError``/``TypeError``, else ``RuntimeError``).
    """
    p, rank = group.size, group.rank
    has_inputs, mismatch = gather_step(group, "predict", [inputs is not None])
    if mismatch is not None:
        raise mismatch
    if not has_inputs[0][0]:
        raise ValueError(
            "predict: the first stage (rank 0 of the pipeline group) got no inputs; pass the batch"
        )
    modes = [c.training for c in chunks]
    for c in chunks:
        c.eval()
    total, error, failed_at = p * len(chunks), None, p * len(chunks)
    try:
        with autograd.no_grad():
            x = inputs
            for g in range(total):
                if g % p != rank:
                    continue
                if g > 0 and p > 1:  # the previous chunk lives on the previous rank (round the ring)
                    x = _recv(group, (g - 1) % p)
                if error is None:
                    out, error = run_chunk(chunks[g // p], Tensor(x), rank, g // p, g, None, len(chunks))
                    failed_at = g if error is not None else failed_at
                # A failed chunk still sends (zeros shaped like its input), or the ranks after it
                # would wait forever; the error is raised on every rank below.
                x = out.data if error is None else backend.xp().zeros(*stand_in_spec(x))
                if g < total - 1 and p > 1:
                    _send(group, x, (g + 1) % p)
    finally:
        for c, mode in zip(chunks, modes):
            c.train(mode)
    if p > 1:  # the first failure in the data flow (the zeros sent on may make later chunks fail too)
        where = dist.all_gather(np.array([failed_at], np.int64), group=group)
        if where.min() < total:
            dist.raise_if_any(error if where.argmin() == rank else None, group, label="pipeline group")
    elif error is not None:
        raise error
    last = (total - 1) % p
    if p == 1:
        return x
    header = encode_header(x) if rank == last else header_buffer()
    dist.broadcast(header, src=last, group=group)
    shape, dtype = decode_header(header)
    out = backend.xp().ascontiguousarray(x) if rank == last else backend.xp().empty(shape, dtype)
    return dist.broadcast(out, src=last, group=group)


def _send(group: Communicator, array: Any, dst: int) -> None:
    array = backend.xp().ascontiguousarray(array)
    group.send(encode_header(array), dst, tag=TAG_PREDICT_HEADER)
    group.send(array, dst, tag=TAG_PREDICT)


def _recv(group: Communicator, src: int) -> Any:
    header = group.recv(header_buffer(), src, tag=TAG_PREDICT_HEADER)
    shape, dtype = decode_header(header)
    return group.recv(backend.xp().empty(shape, dtype), src, tag=TAG_PREDICT)
