"""What a save writes, fixed at the moment ``save`` is called: the ``Staged`` state of this rank.

``save`` first *stages* (this file), then *persists* (``save._persist``: write, agree, commit). Staging
is everything that reads the live training state: the model and optimizer tensors this rank writes,
its generator and sampler states, the optimizer's counters and current hyperparameters, ``extra``.
A synchronous save persists at once, so it may write the parameters' own arrays. An asynchronous save
(``background.py``) persists on another thread while training goes on and changes the parameters in
place, so staging copies every array into fresh host memory (``copy=True``; a CuPy array's copy to
the host is already fresh) and every JSON value by a JSON round trip: after ``stage`` returns, nothing
that training does reaches the checkpoint. This is PyTorch's ``AsyncStager.stage`` step of
``torch.distributed.checkpoint.async_save``: a "training-safe" copy of the state in CPU memory.

The arrays copied are only those this rank writes (``layout.assign_writers``: one replica writes each
shard), so the extra host memory of an asynchronous save is this rank's share of the checkpoint.

**The copies reuse the previous asynchronous save's buffers** (``_buffers``), when a tensor's shape
and dtype are the same. Why: a fresh array is memory the kernel has never handed out, and the first
write to each 4 KiB page faults and zeroes it; measured here, copying 403 MB into fresh arrays took 5.7x
as long as copying it into arrays written before (docs/performance.md, "Checkpoints").
Reuse is safe because a save starts only after the previous one finished (``background.py``). The
price: after the first asynchronous save, this rank keeps one copy of its shard in host memory for
the rest of the run, as PyTorch's stager does with ``cache_staged_state_dict=True``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from minidist import backend
from minidist import random as md_random
from minidist.checkpoint import optim_state
from minidist.checkpoint.checks import any_failure
from minidist.checkpoint.collect import collect, writer_items
from minidist.checkpoint.layout import Layout, assign_writers


class Staged(NamedTuple):
    """This rank's part of one checkpoint, independent of the live training state (with ``copy``)."""

    file: str  # the shard's file name, ``rank<r>.safetensors``
    arrays: dict[str, np.ndarray]  # key -> host array this rank writes (C-contiguous)
    entries: dict[str, dict]  # key -> the manifest's description of it (name, kind, shape, tp split...)
    record: dict[str, Any]  # this rank's record for the manifest, less "written" (added after the write)
    header: dict[str, Any] | None  # the optimizer's class, defaults and hyperparameters, or None
    extra: Any  # the caller's ``extra`` (JSON)


def stage(
    comm: Any, tmp: Path, module: Any, optimizer: Any, layout: Layout, sampler: Any, extra: Any, *,
    copy: bool, fsdp: Any = None,
) -> Staged:  # fmt: skip
    """Collective (``collect`` gathers ZeRO and FSDP shards; ``writer_items`` all-gathers sizes): this rank's
    ``Staged`` state for the checkpoint being written in ``tmp`` (named in errors). With ``copy`` every
    array is a fresh host copy (an asynchronous save). ``fsdp``: the ``FullyShardedDataParallel``
    wrapping ``module``, if any (its full parameters and optimizer state are gathered first).

    Raises ``CheckpointError`` on every rank if collecting the state, copying it to the host or
    reading the generator or sampler state fails on any rank.
    """
    with any_failure(comm, "collecting this rank's model and optimizer state", tmp):
        tensors, scalars, tied = collect(module, optimizer, fsdp)  # (collective for ZeRO and FSDP)
    writers = assign_writers(writer_items(comm, tensors, layout), layout)
    mine = {
        k: t
        for k, t in tensors.items()
        if writers[(k, None if t.tp_dim is None else layout.tp_rank)] == layout.rank
    }
    file = f"rank{layout.rank:05d}.safetensors"
    with any_failure(comm, "copying this rank's shard to host memory", tmp / file):
        arrays = {k: _host(t.array, copy, _buffers.get(k)) for k, t in mine.items()}
    if copy:  # kept for the next asynchronous save (only these: a buffer no longer saved is freed)
        _buffers.clear()
        _buffers.update(arrays)
    entries = {
        k: {
            "name": t.name, "kind": t.kind, "state": t.state, "shape": list(arrays[k].shape),
            "dtype": str(arrays[k].dtype), "tp_dim": t.tp_dim, "tp_stride": t.tp_stride,
            "tp_rank": None if t.tp_dim is None else layout.tp_rank,
        }
        for k, t in mine.items()
    }  # fmt: skip
    with any_failure(comm, "recording this rank's generator and sampler states", None):
        generators = md_random.get_all_rng_states()
        state = sampler.state_dict() if sampler is not None else None
        json.dumps(state)  # strict: all_gather_json would store a NumPy int silently as a string
        record = {
            "rank": layout.rank,
            "coords": [layout.dp_rank, layout.tp_rank, layout.pp_rank, layout.cp_rank],
            "rng": generators["rng"],
            "tp_rng": generators.get("tp_rng"),  # None: tensor parallelism was never imported
            "sampler": state,
            "scalars": scalars,
            "tied": tied,  # names of tied copies here: checked, not stored
        }
        header = optim_state.header(optimizer)
        # A JSON round trip is a deep copy (a sampler's or the caller's dict changed after save() must
        # not change the manifest) that also gives the sync and async paths the very same values.
        record, header, extra = json.loads(json.dumps([record, header, extra]))
    return Staged(file, arrays, entries, record, header, extra)


_buffers: dict[str, np.ndarray] = {}  # key -> the last asynchronous save's copy, reused by the next


def _host(array: Any, copy: bool, buffer: np.ndarray | None) -> np.ndarray:
    """``array`` as a C-contiguous host array; with ``copy``, a copy that training cannot change: into
    ``buffer`` if it fits, else into new memory (``backend.to_numpy`` of a CuPy array is a new host
    copy already; of a NumPy array it is the array itself)."""
    host = backend.to_numpy(array)
    if not copy or backend.is_gpu_array(array):
        return np.ascontiguousarray(host)
    if buffer is None or buffer.shape != host.shape or buffer.dtype != host.dtype:
        buffer = np.empty(host.shape, dtype=host.dtype)
    np.copyto(buffer, host)
    return buffer
