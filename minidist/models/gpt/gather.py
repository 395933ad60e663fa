"""``gather_gpt``: the one-process ``GPT`` a parallel layout holds, assembled from every rank's pieces.

A ``ParallelGPT`` (or its pipeline stages) is the one-process model cut into pieces by ``split.py``'s
rule: a tp rank holds piece ``tp_rank`` of each sharded tensor along ``tp_dim`` (uneven and strided
pieces included), every tp rank the same replicated tensors, each pipeline stage its own layers, and
dp / cp ranks copies of all that. To sample text from the trained model, or to compare a layout's
weights with one process's (tests), this puts the pieces back together.

How, with one collective: every rank allocates the full model's tensors as zeros and writes the pieces
it *owns* into their places (``full[shard_index(...)] = piece``); the ranks then sum the buffers.
Every element is written by exactly one rank, so the sum is exact (``x + 0 = x`` in floating point):
the gathered weights are the layout's weights bit for bit. A piece is owned by the ranks with
``dp_rank = cp_rank = 0`` (the others hold copies), replicated tensors by tp rank 0, and a pipeline's
tied copy (``is_tied_copy``) by no one: its original, on the first stage, is equal to it.

The full model costs one model's memory on every rank and one all-reduce of it: fine at the end of a
run (this is not a training-time path).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

import minidist.distributed as dist
from minidist import random
from minidist.models.gpt.model import GPT, GPTConfig
from minidist.nn.module import Parameter
from minidist.parallel.tensor_parallel.split import shard_index


def gather_gpt(
    config: GPTConfig, named_parameters: Iterable[tuple[str, Parameter]], mesh: Any, root: int | None = 0
) -> GPT | None:
    """The one-process ``GPT(config)`` with the weights of this layout, on world rank ``root``.

    Args:
        config: the model's config (the same on every rank).
        named_parameters: this rank's pieces under GPT's names: ``model.named_parameters()`` of a
            ``ParallelGPT``, or ``pipe.stage_module.named_parameters()`` under pipeline parallelism
            (a stage's parameters only: the other layers of its ParallelGPT are not trained there).
        mesh: the ``ProcessMesh`` (``tp_group``, ``dp_rank``, ``cp_rank``, ``world``).
        root: the world rank that gets the model (None: every rank does).

    Returns the GPT on ``root`` (host arrays, the config's dtype), None on the other ranks. The default
    generator's state is left as it was (building the GPT draws initial weights, then overwritten).
    Collective over ``mesh.world``. Raises ``KeyError`` for a name that is not one of GPT's.
    """
    state = random.get_rng_state()
    gpt = GPT(config)  # the full shapes; its random weights are all overwritten below
    random.set_rng_state(state)
    params = dict(gpt.named_parameters())
    order = list(params)  # the same order on every rank
    offsets = np.cumsum([0] + [params[n].size for n in order])
    buffer = np.zeros(int(offsets[-1]), dtype=np.dtype(config.dtype))
    owner = mesh.dp_rank == 0 and getattr(mesh, "cp_rank", 0) == 0
    tp, tp_rank = mesh.tp_group.size, mesh.tp_group.rank
    for name, piece in named_parameters:
        if not owner or getattr(piece, "is_tied_copy", False):
            continue
        if name not in params:
            raise KeyError(f"gather_gpt: {name!r} is not a parameter of GPT({config})")
        i = order.index(name)
        full = buffer[offsets[i] : offsets[i + 1]].reshape(params[name].shape)  # a view into the buffer
        if getattr(piece, "tp_dim", None) is None:
            if tp_rank == 0:
                full[...] = piece.numpy()
        else:
            where = shard_index(full.shape, piece.tp_dim, tp, tp_rank, getattr(piece, "tp_stride", 1))
            full[where] = piece.numpy()
    if root is None:
        dist.all_reduce(buffer, op="sum", group=mesh.world)
    else:
        dist.reduce(buffer, dst=root, op="sum", group=mesh.world)
        if mesh.world.rank != root:
            return None
    for i, name in enumerate(order):
        params[name].data[...] = buffer[offsets[i] : offsets[i + 1]].reshape(params[name].shape)
    return gpt
