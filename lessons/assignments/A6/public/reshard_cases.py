"""Check ``needed_shards`` + ``local_piece`` on hand-made manifest entries (no files, no MPI).

A global tensor G is "saved" as ``T`` shards along ``saved_dim`` (or one replicated shard when
``saved_dim`` is None), cut by split.py's rule (``shard_index``: uneven pieces as numpy.array_split,
``saved_stride`` equal blocks); a rank at tensor-parallel size ``tp`` with ``tp_dim`` and ``stride``
must get ``G[shard_index(G.shape, tp_dim, tp, tp_rank, stride)]`` (G itself for a replicated
parameter), reading only its own shard when nothing changed.
"""

from __future__ import annotations

import numpy as np


def entry_for(
    full: np.ndarray, saved_dim: int | None, saved_tp: int, saved_stride: int = 1
) -> tuple[dict, dict]:
    """A manifest entry and ``{file: array}`` for ``full``, saved in ``saved_tp`` shards on ``saved_dim``."""
    from minidist.parallel.tensor_parallel.split import shard_index

    if saved_dim is None:
        shards = [{"file": "rank00000.safetensors", "tp_rank": None, "shape": list(full.shape)}]
        files = {"rank00000.safetensors": full.copy()}
    else:
        pieces = [
            full[shard_index(full.shape, saved_dim, saved_tp, t, saved_stride)] for t in range(saved_tp)
        ]
        shards = [
            {"file": f"rank{t:05d}.safetensors", "tp_rank": t, "shape": list(a.shape)}
            for t, a in enumerate(pieces)
        ]
        files = {s["file"]: a.copy() for s, a in zip(shards, pieces)}
    entry = {
        "name": "w",
        "kind": "model",
        "state": None,
        "global_shape": list(full.shape),
        "dtype": str(full.dtype),
        "tp_dim": saved_dim,
        "tp_stride": saved_stride,
        "shards": shards,
    }
    return entry, files


def check_reshard(shape, saved_dim, saved_tp, tp_dim, tp, saved_stride=1, stride=1, seed: int = 0) -> None:
    from minidist.checkpoint.errors import CheckpointError
    from minidist.checkpoint.layout import local_piece, needed_shards
    from minidist.parallel.tensor_parallel.split import shard_index

    full = np.random.default_rng(seed).standard_normal(shape)
    entry, files = entry_for(full, saved_dim, saved_tp, saved_stride)
    saved = "replicated" if saved_dim is None else f"tp_dim={saved_dim} in {saved_tp} shards"
    saved += f", tp_stride={saved_stride}" if saved_stride > 1 else ""
    cuttable = tp_dim is None or shape[tp_dim] % stride == 0
    for rank in range(tp):
        where = (
            f"a tensor of global shape {list(shape)} saved {saved}, loaded by tp rank {rank} of {tp} "
            f"with tp_dim={tp_dim}" + (f", tp_stride={stride}" if stride > 1 else "")
        )
        records = needed_shards(entry, tp, rank, tp_dim, stride)
        unchanged = (
            saved_dim is not None and saved_dim == tp_dim and saved_tp == tp and saved_stride == stride
        )
        if unchanged and [r["file"] for r in records] != [entry["shards"][rank]["file"]]:
            raise AssertionError(
                f"{where}: the layout did not change, so read only this rank's own shard "
                f"{entry['shards'][rank]['file']!r}; needed_shards returned "
                f"{[r['file'] for r in records]}"
            )
        arrays = [files[r["file"]] for r in records]
        if not cuttable:
            try:
                local_piece("w", entry, arrays, tp, rank, tp_dim, stride)
            except CheckpointError:
                continue
            raise AssertionError(
                f"{where}: {shape[tp_dim]} rows are not {stride} equal blocks: raise CheckpointError"
            )
        got = local_piece("w", entry, arrays, tp, rank, tp_dim, stride)
        want = full if tp_dim is None else full[shard_index(full.shape, tp_dim, tp, rank, stride)]
        if np.shape(got) == want.shape and np.array_equal(got, want):
            continue
        why = ""
        for axis in range(full.ndim):
            if axis != tp_dim and tp_dim is not None:
                other = full[shard_index(full.shape, axis, tp, rank)]
                if np.shape(got) == other.shape and np.array_equal(got, other):
                    why = (
                        f" It is piece {rank} along axis {axis}: slice along THIS model's tp_dim "
                        f"({tp_dim}), after assembling the shards along the SAVED tp_dim ({saved_dim})."
                    )
        if not why and saved_dim is not None and np.shape(got) != want.shape:
            why = f" Its shape is {list(np.shape(got))}, expected {list(want.shape)} (split.py's rule)."
        raise AssertionError(
            f"{where}: got {np.asarray(got).reshape(-1)[:6]}..., expected "
            f"{want.reshape(-1)[:6]}... (the values must be copied exactly).{why}"
        )
