"""Check ``needed_shards`` + ``local_piece`` on hand-made manifest entries (no files, no MPI).

A global tensor G is "saved" as ``T`` shards along ``saved_dim`` (or one replicated shard when
``saved_dim`` is None); a rank at tensor-parallel size ``tp`` with ``tp_dim`` must get
``np.split(G, tp, axis=tp_dim)[tp_rank]`` (G itself for a replicated parameter), reading only its own
shard when nothing changed.
"""

from __future__ import annotations

import numpy as np


def entry_for(full: np.ndarray, saved_dim: int | None, saved_tp: int) -> tuple[dict, dict]:
    """A manifest entry and ``{file: array}`` for ``full``, saved in ``saved_tp`` shards on ``saved_dim``."""
    if saved_dim is None:
        shards = [{"file": "rank00000.safetensors", "tp_rank": None, "shape": list(full.shape)}]
        files = {"rank00000.safetensors": full.copy()}
    else:
        pieces = np.split(full, saved_tp, axis=saved_dim)
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
        "shards": shards,
    }
    return entry, files


def check_reshard(shape, saved_dim, saved_tp, tp_dim, tp, seed: int = 0) -> None:
    from minidist.checkpoint.errors import CheckpointError
    from minidist.checkpoint.layout import local_piece, needed_shards

    full = np.random.default_rng(seed).standard_normal(shape)
    entry, files = entry_for(full, saved_dim, saved_tp)
    saved = "replicated" if saved_dim is None else f"tp_dim={saved_dim} in {saved_tp} shards"
    divisible = tp_dim is None or shape[tp_dim] % tp == 0
    for rank in range(tp):
        where = (
            f"a tensor of global shape {list(shape)} saved {saved}, loaded by tp rank {rank} of {tp} "
            f"with tp_dim={tp_dim}"
        )
        records = needed_shards(entry, tp, rank, tp_dim)
        unchanged = saved_dim is not None and saved_dim == tp_dim and saved_tp == tp
        if unchanged and [r["file"] for r in records] != [entry["shards"][rank]["file"]]:
            raise AssertionError(
                f"{where}: the layout did not change, so read only this rank's own shard "
                f"{entry['shards'][rank]['file']!r}; needed_shards returned "
                f"{[r['file'] for r in records]}"
            )
        arrays = [files[r["file"]] for r in records]
        if not divisible:
            try:
                local_piece("w", entry, arrays, tp, rank, tp_dim)
            except CheckpointError:
                continue
            raise AssertionError(f"{where}: {shape[tp_dim]} is not divisible by {tp}: raise CheckpointError")
        got = local_piece("w", entry, arrays, tp, rank, tp_dim)
        want = full if tp_dim is None else np.split(full, tp, axis=tp_dim)[rank]
        if np.shape(got) == want.shape and np.array_equal(got, want):
            continue
        why = ""
        for axis in range(full.ndim):
            if axis != tp_dim and full.shape[axis] % tp == 0 and tp_dim is not None:
                other = np.split(full, tp, axis=axis)[rank]
                if np.shape(got) == other.shape and np.array_equal(got, other):
                    why = (
                        f" It is slice {rank} along axis {axis}: slice along THIS model's tp_dim "
                        f"({tp_dim}), after assembling the shards along the SAVED tp_dim ({saved_dim})."
                    )
        if not why and saved_dim is not None and np.shape(got) != want.shape:
            why = f" Its shape is {list(np.shape(got))}, expected {list(want.shape)}."
        raise AssertionError(
            f"{where}: got {np.asarray(got).reshape(-1)[:6]}..., expected "
            f"{want.reshape(-1)[:6]}... (the values must be copied exactly).{why}"
        )
