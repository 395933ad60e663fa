"""``load`` and ``load_latest``: verify everything first, then restore, on the same or another layout.

Nothing in the model, optimizer, generators or sampler changes until every rank has checked
everything it needs: the manifest (format version, the model's names and global shapes, the
optimizer class) and the sha256 and size of every shard file. Each file is verified by at least one
rank (file i by rank i mod world size, plus every rank that reads it), and any problem is raised as
the same ``CheckpointError`` on every rank. Loading uses only JSON and safetensors, never pickle,
so a checkpoint cannot run code.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from minidist import backend
from minidist.checkpoint import atomic, optim_state, rng
from minidist.checkpoint import manifest as mf
from minidist.checkpoint.agree import allgather_json, raise_if_any
from minidist.checkpoint.errors import CheckpointError
from minidist.checkpoint.layout import Layout, layout_of, tp_dim_of, unwrap
from minidist.checkpoint.reshard import local_piece, needed_shards
from minidist.checkpoint.save import world_comm


def resolve(directory: str | os.PathLike) -> Path:
    """The checkpoint folder: ``directory`` if it holds a manifest, else what ``directory/latest`` names.

    Raises ``CheckpointError`` if neither exists.
    """
    path = Path(directory)
    if (path / atomic.MANIFEST).exists():
        return path
    name = atomic.read_latest(path)
    if name is None:
        raise CheckpointError("no checkpoint here: neither a manifest.json nor a 'latest' pointer", path)
    if "/" in name or name.startswith("."):
        raise CheckpointError(f"the 'latest' pointer names {name!r}, which is not a checkpoint folder", path)
    return path / name


def load(
    directory: str | os.PathLike,
    model: Any,
    optimizer: Any = None,
    *,
    mesh: Any = None,
    sampler: Any = None,
) -> dict[str, Any]:
    """Collective: restore ``model`` (and ``optimizer``, ``sampler``, RNG states) from a checkpoint.

    Args:
        directory: a checkpoint folder (``.../step_000123``) or the root holding ``latest``.
        model, optimizer, mesh, sampler: as for ``save``; the mesh may differ from the saved one
            (another dp, tp, pp or world size): tensors are then resharded by global name.

    Returns:
        ``{"step", "extra", "path", "saved_mesh", "resharded": bool, "rng_restored": bool}``. The
        generators are restored only on the same layout (each rank its own state, bit-exact resume).

    Raises:
        CheckpointError: on every rank, naming the file and the problem: missing / unreadable /
            corrupt / truncated files, a newer format version, a model whose names or global shapes
            or dtypes differ, a different optimizer class. Nothing has been changed when it is raised.
    """
    comm = world_comm(mesh)
    layout = layout_of(mesh, comm)
    module = unwrap(model)
    error, folder, manifest = None, None, None
    try:
        folder = resolve(directory)
        manifest = mf.read_manifest(folder)
    except CheckpointError as err:
        error = err
    raise_if_any(comm, error)

    params = dict(module.named_parameters())
    error, plan = None, None
    try:
        plan = _plan(manifest, folder, params, optimizer, module, layout)
    except CheckpointError as err:
        error = err
    raise_if_any(comm, error)
    names = {n for part in allgather_json(comm, sorted(params)) for n in part}
    saved = {t["name"] for t in manifest["tensors"].values() if t["kind"] == "model"}
    if names != saved:
        raise CheckpointError(
            f"the checkpoint is from an incompatible model: names only in the checkpoint "
            f"{sorted(saved - names)[:5]}, only in this model {sorted(names - saved)[:5]}",
            folder / atomic.MANIFEST,
        )

    error, arrays = None, None
    try:
        arrays = _read(comm, folder, manifest, plan, layout)
    except CheckpointError as err:
        error = err
    raise_if_any(comm, error)

    # Everything verified on every rank: now change state.
    for name, p in params.items():
        p.data[...] = backend.asarray(arrays[mf.model_key(name)])
    if optimizer is not None:
        state: dict[str, dict[str, Any]] = {}
        for key, t in manifest["tensors"].items():
            if t["kind"] == "optim" and key in arrays:
                state.setdefault(t["name"], {})[t["state"]] = arrays[key]
        for name, counters in manifest["optimizer"]["scalars"].items():
            if name in params:
                state.setdefault(name, {}).update(counters)
        optim_state.load_by_name(optimizer, module, manifest["optimizer"], state)
    same_layout = manifest["mesh"] == layout.describe()
    rng_restored = False
    if same_layout:
        mine = manifest["ranks"][layout.rank]
        rng.set_states(mine)
        rng_restored = True
    if sampler is not None:
        saved_states = [r["sampler"] for r in manifest["ranks"] if r["sampler"] is not None]
        same = [r["sampler"] for r in manifest["ranks"] if r["rank"] == layout.rank and r["sampler"]]
        if same_layout and same:
            sampler.load_state_dict(same[0])
        elif saved_states:
            sampler.load_state_dict(saved_states[0])
    return {
        "step": manifest["step"],
        "extra": manifest.get("extra"),
        "path": folder,
        "saved_mesh": manifest["mesh"],
        "resharded": not same_layout,
        "rng_restored": rng_restored,
    }


def _plan(manifest: dict, folder: Path, params: dict, optimizer: Any, module: Any, layout: Layout) -> dict:
    """``{tensor key: (shard records to read, tp_dim here)}``; checks names, global shapes and dtypes."""
    where = folder / atomic.MANIFEST
    tensors = manifest["tensors"]
    plan = {}
    for name, p in params.items():
        key, tp_dim = mf.model_key(name), tp_dim_of(p)
        entry = tensors.get(key)
        if entry is None:
            raise CheckpointError(f"incompatible model: the checkpoint has no parameter {name!r}", where)
        expected = _global_shape(p.shape, tp_dim, layout.tp)
        if list(entry["global_shape"]) != expected or entry["dtype"] != str(p.dtype):
            raise CheckpointError(
                f"incompatible model: parameter {name!r} is {entry['global_shape']} {entry['dtype']} in the "
                f"checkpoint but {expected} {p.dtype} (global) here",
                where,
            )
        plan[key] = (needed_shards(entry, layout.tp, layout.tp_rank, tp_dim), tp_dim)
    if optimizer is None:
        return plan
    header = manifest.get("optimizer")
    wanted = type(optim_state.inner(optimizer)).__name__
    if header is None or header["class"] != wanted:
        found = "no optimizer state" if header is None else f"{header['class']} state"
        raise CheckpointError(f"the checkpoint holds {found}, but the optimizer here is {wanted}", where)
    for key, entry in tensors.items():
        if entry["kind"] == "optim" and entry["name"] in params:
            tp_dim = tp_dim_of(params[entry["name"]])
            plan[key] = (needed_shards(entry, layout.tp, layout.tp_rank, tp_dim), tp_dim)
    return plan


def _global_shape(shape: tuple[int, ...], tp_dim: int | None, tp: int) -> list[int]:
    out = list(shape)
    if tp_dim is not None:
        out[tp_dim] *= tp
    return out


def _read(comm: Any, folder: Path, manifest: dict, plan: dict, layout: Layout) -> dict[str, np.ndarray]:
    """Collective: verify every file, read what this rank needs, return its local arrays.

    A file that *every* rank needs (data-parallel replicas of the same tensors) is read and verified
    by one rank only (file i by rank i mod world size) and then broadcast: N ranks reading the same
    bytes from one disk would each pay the full read and checksum. Any other file is read by each
    rank that needs it, and every file nobody reads is still verified by rank i mod world size.
    """
    files = sorted(manifest["files"])
    mine = sorted({s["file"] for shards, _ in plan.values() for s in shards})
    everyone = allgather_json(comm, mine)
    shared = set.intersection(*(set(part) for part in everyone))  # needed by every rank
    contents: dict[str, dict[str, np.ndarray]] = {}
    error = None
    try:
        for s in (s for t in manifest["tensors"].values() for s in t["shards"]):
            if s["file"] not in manifest["files"]:
                raise CheckpointError(
                    f"the manifest refers to {s['file']!r} but lists no checksum for it", folder
                )
        for i, name in enumerate(files):
            reader = i % layout.world_size == layout.rank
            if reader or (name in mine and name not in shared):
                contents[name] = mf.verify_file(folder, name, manifest, keep=name in mine)
    except CheckpointError as err:
        error = err
    raise_if_any(comm, error)
    for i, name in enumerate(files):  # the same order on every rank
        if name in shared:
            contents[name] = _broadcast_file(comm, manifest, name, contents.get(name), i % layout.world_size)
    out = {}
    for key, (shards, tp_dim) in plan.items():
        entry = manifest["tensors"][key]
        pieces = []
        for s in shards:
            array = contents[s["file"]].get(key)
            if array is None or list(array.shape) != list(s["shape"]):
                raise CheckpointError(f"tensor {key!r} missing or misshapen in the file", folder / s["file"])
            pieces.append(array)
        out[key] = local_piece(key, entry, pieces, layout.tp, layout.tp_rank, tp_dim)
    return out


def _broadcast_file(comm: Any, manifest: dict, name: str, arrays: dict | None, root: int) -> dict:
    """The arrays of file ``name`` on every rank, sent by ``root`` (shapes and dtypes from the manifest)."""
    out = {}
    for key in sorted(
        k for k, t in manifest["tensors"].items() if any(s["file"] == name for s in t["shards"])
    ):
        t = manifest["tensors"][key]
        shape = next(s["shape"] for s in t["shards"] if s["file"] == name)
        a = arrays[key] if comm.Get_rank() == root else np.empty(shape, dtype=t["dtype"])
        if a.size:
            comm.Bcast(a.reshape(-1).view(np.uint8), root=root)
        out[key] = a
    return out


def load_latest(
    directory: str | os.PathLike,
    model: Any,
    optimizer: Any = None,
    *,
    mesh: Any = None,
    sampler: Any = None,
    fallback: bool = False,
    missing_ok: bool = False,
) -> dict[str, Any] | None:
    """Collective: load the checkpoint ``directory/latest`` names.

    With ``fallback``, a checkpoint that fails to verify is skipped (a warning is printed on rank 0)
    and the committed ``step_<n>`` folders are tried newest first, until one loads. With
    ``missing_ok``, a directory holding no checkpoint at all returns None (a fresh start).

    Raises ``CheckpointError`` on every rank if nothing loads (listing each checkpoint's problem).
    """
    root = Path(directory)
    committed = [path for _, path in reversed(atomic.list_checkpoints(root))]
    pointer = atomic.read_latest(root)
    if missing_ok and pointer is None and not committed:
        return None
    # ``root`` itself goes through resolve(), which checks the pointer's contents.
    candidates = [root] if pointer is not None else []
    skip = {root / pointer} if pointer is not None else set()
    if fallback or pointer is None:
        candidates += [path for path in committed if path not in skip]
    problems = []
    for candidate in candidates:
        try:
            return load(candidate, model, optimizer, mesh=mesh, sampler=sampler)
        except CheckpointError as err:  # raised identically on every rank, so all move on together
            problems.append(str(err))
            if not fallback:
                raise
            if world_comm(mesh).Get_rank() == 0:
                print(f"checkpoint.load_latest: skipping a checkpoint that does not load: {err}", flush=True)
    raise CheckpointError(
        "no checkpoint loads" + (": " + "; ".join(problems) if problems else " (none found)"), root
    )
