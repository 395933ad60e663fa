"""``load``: verify everything first, then restore, on the same or another layout.

``load`` reads as its four steps:

1. ``_read_manifest``: every rank resolves the folder and reads and checks its manifest; the ranks
   make sure they all found the same one;
2. ``_check_fit``: the checkpoint fits this model (names, global shapes, dtypes), optimizer (class,
   hyperparameters) and sampler; ``_plan`` says which shards each tensor's piece comes from;
3. ``_read``: every shard file is verified (sha256 and size: file i by rank i mod world size, plus
   every rank that reads it) and this rank's pieces are cut from the shards (``layout.local_piece``);
4. ``_restore``: only now, with everything verified on every rank, the model, optimizer, generators
   and sampler change.

Any problem is raised as the same ``CheckpointError`` on every rank (``errors.on_every_rank``), and
nothing has changed when it is. Loading uses only JSON and safetensors, never pickle, so a checkpoint
cannot run code.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import numpy as np

from minidist import backend
from minidist import random as md_random
from minidist.checkpoint import atomic, background, fsdp_state, optim_state
from minidist.checkpoint import format as fmt
from minidist.checkpoint.errors import (
    CheckpointError,
    all_gather_json,
    differences,
    on_every_rank,
    world_comm,
)
from minidist.checkpoint.layout import (
    Layout,
    layout_of,
    local_piece,
    needed_shards,
    piece_shape,
    tp_dim_of,
    tp_stride_of,
    unwrap,
)


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
        directory: a checkpoint folder (``.../step_000123``) or the root holding ``latest``; the
            same folder on every rank.
        model, optimizer, mesh, sampler: as for ``save`` (a ``FullyShardedDataParallel`` reads the full
            tensors, then keeps its shards, ``fsdp_state.py``); the mesh may differ from the saved one
            (another dp, tp, pp, cp or world size): tensors are then resharded by global name, each
            rank's piece cut by split.py's rule (uneven, strided). A tied copy (``is_tied_copy``)
            and its optimizer state are filled from the tensors of its name.

    Returns:
        ``{"step", "extra", "path", "saved_mesh", "resharded": bool, "rng_restored": bool}``. The
        generators are restored only on the same layout (each rank its own state, bit-exact resume).

    Raises:
        CheckpointError: on every rank, naming the file and the problem: missing / unreadable /
            corrupt / truncated files, a malformed manifest, a newer format version, a model whose
            names or dtypes differ or whose piece on some rank is not split.py's piece of the saved
            tensor (another full shape, tp_dim or stride), a different optimizer class, a sampler state
            that does not fit ``sampler`` (another seed or data set), or ranks that resolved
            different folders. Nothing has been changed when it is raised. Also a pending
            asynchronous save's error (it is waited for first, ``background.wait_pending``).
        TypeError / ValueError: on every rank, for a model that is not a Module, an FSDP model whose
            optimizer holds other tensors than its shard tensors (``fsdp.parameters()``), or a mesh that does
            not match the world.
    """
    background.wait_pending()  # a save still being written in the background is committed first
    comm = world_comm(mesh)
    with on_every_rank(comm, TypeError, ValueError):  # a bad argument on one rank stops every rank
        layout, module = layout_of(mesh, comm), unwrap(model)
    fsdp = model if fsdp_state.is_fsdp(model) else None
    with on_every_rank(comm, ValueError):  # an optimizer over the wrong tensors, before anything changes
        if fsdp is not None and optimizer is not None:
            fsdp_state.check_optimizer(fsdp, optimizer)
    # Under FSDP the parameters hold no values between steps: load fills full arrays (collective).
    params = fsdp_state.load_targets(fsdp) if fsdp else dict(module.named_parameters())

    folder, manifest = _read_manifest(comm, directory)  # 1. the same checkpoint on every rank
    plan, sampler_state = _check_fit(comm, folder, manifest, params, optimizer, sampler, layout)  # 2.
    arrays = _read(comm, folder, manifest, plan, layout)  # 3. verified; this rank's pieces
    state = (manifest, arrays, module, optimizer, sampler, sampler_state, layout)
    return _restore(folder, *state, params, fsdp)  # 4.


def _read_manifest(comm: Any, directory: str | os.PathLike) -> tuple[Path, dict[str, Any]]:
    """Step 1: the checkpoint folder and its checked manifest, the same on every rank."""
    with on_every_rank(comm):
        folder = atomic.resolve(directory)
        manifest = fmt.read_manifest(folder)
    digest = hashlib.sha256(fmt.dumps(manifest)).hexdigest()[:16]
    difference = differences({"folder": os.path.realpath(folder), "manifest sha256": digest}, comm)
    if difference:  # e.g. another directory per rank, or 'latest' switched between the ranks' reads
        raise CheckpointError(
            f"the ranks resolved different checkpoints: {difference}; pass the same directory on every "
            "rank (on a file system all ranks share) and do not save into it while loading"
        )
    return folder, manifest


def _check_fit(
    comm: Any, folder: Path, manifest: dict, params: dict, optimizer: Any, sampler: Any, layout: Layout
) -> tuple[dict, Any]:
    """Step 2: the read plan (``_plan``) and the sampler state to restore, once the checkpoint is known
    to fit this model (``params``: its parameters by global name), optimizer and sampler on every rank."""
    with on_every_rank(comm):
        plan = _plan(manifest, folder, params, optimizer, layout)
        sampler_state = _sampler_state(manifest, folder, layout, sampler)
    names = {n for part in all_gather_json(sorted(params), comm) for n in part}  # every stage's names
    saved = {t["name"] for t in manifest["tensors"].values() if t["kind"] == "model"}
    if names != saved:
        raise CheckpointError(
            f"the checkpoint is from an incompatible model: names only in the checkpoint "
            f"{sorted(saved - names)[:5]}, only in this model {sorted(names - saved)[:5]}",
            folder / atomic.MANIFEST,
        )
    return plan, sampler_state


def _restore(
    folder: Path, manifest: dict, arrays: dict, module: Any, optimizer: Any, sampler: Any,
    sampler_state: Any, layout: Layout, params: dict, fsdp: Any,
) -> dict[str, Any]:  # fmt: skip
    """Step 4: copy the verified arrays and states into the model, optimizer, generators and sampler
    (under FSDP, ``fsdp``, into the full arrays of ``params``, of which each rank keeps its shards)."""
    for name, p in params.items():
        p.data[...] = backend.asarray(arrays[fmt.model_key(name)])
    if fsdp is not None:
        fsdp_state.restore_parameters(fsdp, params)  # (collective)
    if optimizer is not None:
        state: dict[str, dict[str, Any]] = {}
        for key, t in manifest["tensors"].items():
            if t["kind"] == "optim" and key in arrays:
                state.setdefault(t["name"], {})[t["state"]] = arrays[key]
        for name, counters in manifest["optimizer"]["scalars"].items():
            if name in params:
                state.setdefault(name, {}).update(counters)
        optim_state.load_by_name(optimizer, module, manifest["optimizer"], state, fsdp=fsdp)
    same_layout = manifest["mesh"] == layout.describe()
    if same_layout:  # each rank its own generators: a bit-exact resume
        saved = manifest["ranks"][layout.rank]
        md_random.set_all_rng_states({"rng": saved["rng"], "tp_rng": saved["tp_rng"]})
    if sampler_state is not None:
        sampler.load_state_dict(sampler_state)
    return {
        "step": manifest["step"],
        "extra": manifest.get("extra"),
        "path": folder,
        "saved_mesh": manifest["mesh"],
        "resharded": not same_layout,
        "rng_restored": same_layout,
    }


def _plan(manifest: dict, folder: Path, params: dict, optimizer: Any, layout: Layout) -> dict:
    """``{tensor key: (shard records to read, tp_dim, tp_stride here)}``; checks names, shapes, dtypes.

    A tied copy (``is_tied_copy``) reads the tensor of its own name, which its original saved.
    """
    where = folder / atomic.MANIFEST
    tensors = manifest["tensors"]
    plan = {}
    for name, p in params.items():
        key = fmt.model_key(name)
        entry = tensors.get(key)
        if entry is None:
            raise CheckpointError(f"incompatible model: the checkpoint has no parameter {name!r}", where)
        if entry["dtype"] != str(p.dtype):
            raise CheckpointError(
                f"incompatible model: parameter {name!r} is {entry['dtype']} in the checkpoint but "
                f"{p.dtype} here",
                where,
            )
        plan[key] = _piece_plan(key, entry, p, layout, where)
    if optimizer is None:
        return plan
    header = manifest.get("optimizer")
    wanted = type(optim_state.inner(optimizer)).__name__
    if header is None or header["class"] != wanted:
        found = "no optimizer state" if header is None else f"{header['class']} state"
        raise CheckpointError(f"the checkpoint holds {found}, but the optimizer here is {wanted}", where)
    ours = optim_state.inner(optimizer).defaults
    for k, v in header["defaults"].items():  # restored into the optimizer: same names and arity
        if (
            k not in ours
            or isinstance(v, list) != isinstance(ours[k], (tuple, list))
            or (isinstance(v, list) and len(v) != len(ours[k]))
        ):
            raise CheckpointError(f"optimizer hyperparameter {k}={v!r} does not fit this {wanted}", where)
    groups, ours_groups = header.get("param_groups"), optimizer.param_groups  # ZeRO's: the user's groups
    if groups is not None and len(groups) != len(ours_groups):  # checked before anything is restored
        raise CheckpointError(
            f"the checkpoint's optimizer has {len(groups)} parameter groups, this one {len(ours_groups)}; "
            "build the optimizer with the same groups as the saved run",
            where,
        )
    for key, entry in tensors.items():
        if entry["kind"] == "optim" and entry["name"] in params:  # the state has its parameter's shape
            plan[key] = _piece_plan(key, entry, params[entry["name"]], layout, where)
    return plan


def _piece_plan(key: str, entry: dict, p: Any, layout: Layout, where: Path) -> tuple[list, int | None, int]:
    """``(shard records, tp_dim, tp_stride)`` for parameter ``p``'s piece of ``entry``, once split.py's
    piece of the saved full tensor for this tp rank is known to have ``p``'s shape.

    Every tp rank checks its own piece (``load`` raises any rank's error on every rank), so the pieces
    of all tp ranks fit: the model's full tensor is the checkpoint's, uneven or strided.
    """
    tp_dim, stride = tp_dim_of(p), tp_stride_of(p)
    full = entry["global_shape"]
    try:
        if len(full) != p.ndim:
            raise ValueError(f"{len(full)} axes, not {p.ndim}")
        want = piece_shape(full, tp_dim, layout.tp, layout.tp_rank, stride)
    except (ValueError, IndexError) as err:
        want = f"none ({err})"
    if want != list(p.shape):
        split = "replicated" if tp_dim is None else f"axis {tp_dim}, tp_stride {stride}"
        raise CheckpointError(
            f"incompatible model: {key!r} is {full} (global) in the checkpoint, whose piece for tp rank "
            f"{layout.tp_rank} of {layout.tp} ({split}) is {want}, but this rank holds {list(p.shape)}",
            where,
        )
    return needed_shards(entry, layout.tp, layout.tp_rank, tp_dim, stride), tp_dim, stride


def _sampler_state(manifest: dict, folder: Path, layout: Layout, sampler: Any) -> Any:
    """The saved sampler state this rank restores (its own on the same layout, else rank 0's), checked.

    Raises ``CheckpointError`` if ``sampler`` refuses it (``resume_point``: another seed, data set
    length or shuffle setting, or a position that cannot carry over), before anything has changed.
    """
    if sampler is None:
        return None
    same_layout = manifest["mesh"] == layout.describe()
    saved = [r["sampler"] for r in manifest["ranks"] if r["sampler"] is not None]
    same = [r["sampler"] for r in manifest["ranks"] if r["rank"] == layout.rank and r["sampler"]]
    state = same[0] if same_layout and same else (saved[0] if saved else None)
    if state is not None and hasattr(sampler, "resume_point"):
        try:
            sampler.resume_point(state)
        except (TypeError, ValueError, KeyError) as err:
            raise CheckpointError(
                f"the sampler state cannot be restored: {err}", folder / atomic.MANIFEST
            ) from None
    return state


def _read(comm: Any, folder: Path, manifest: dict, plan: dict, layout: Layout) -> dict[str, np.ndarray]:
    """Step 3, collective: verify every file, read what this rank needs, return its local arrays.

    A file that *every* rank needs (data-parallel replicas of the same tensors) is read and verified
    by one rank only (file i by rank i mod world size) and then broadcast: N ranks reading the same
    bytes from one disk would each pay the full read and checksum. Any other file is read by each
    rank that needs it, and every file nobody reads is still verified by rank i mod world size.
    """
    files = sorted(manifest["files"])
    mine = sorted({s["file"] for shards, _, _ in plan.values() for s in shards})
    everyone = all_gather_json(mine, comm)
    shared = set.intersection(*(set(part) for part in everyone))  # needed by every rank
    contents: dict[str, dict[str, np.ndarray]] = {}
    with on_every_rank(comm):
        for s in (s for t in manifest["tensors"].values() for s in t["shards"]):
            if s["file"] not in manifest["files"]:
                raise CheckpointError(
                    f"the manifest refers to {s['file']!r} but lists no checksum for it", folder
                )
        for i, name in enumerate(files):
            reader = i % layout.world_size == layout.rank
            if reader or (name in mine and name not in shared):
                contents[name] = fmt.verify_file(folder, name, manifest, keep=name in mine)
    for i, name in enumerate(files):  # the same order on every rank
        if name in shared:
            contents[name] = _broadcast_file(comm, manifest, name, contents.get(name), i % layout.world_size)
    out = {}
    with on_every_rank(comm):  # a piece that cannot be cut (tp does not divide it) may concern one stage
        for key, (shards, tp_dim, stride) in plan.items():
            entry = manifest["tensors"][key]
            pieces = []
            for s in shards:
                array = contents[s["file"]].get(key)
                if array is None or list(array.shape) != list(s["shape"]):
                    raise CheckpointError(
                        f"tensor {key!r} missing or misshapen in the file", folder / s["file"]
                    )
                pieces.append(array)
            out[key] = local_piece(key, entry, pieces, layout.tp, layout.tp_rank, tp_dim, stride)
    return out


def _broadcast_file(comm: Any, manifest: dict, name: str, arrays: dict | None, root: int) -> dict:
    """The arrays of file ``name`` on every rank, sent by ``root`` (shapes and dtypes from the manifest)."""
    out = {}
    for key in sorted(
        k for k, t in manifest["tensors"].items() if any(s["file"] == name for s in t["shards"])
    ):
        t = manifest["tensors"][key]
        shape = next(s["shape"] for s in t["shards"] if s["file"] == name)
        a = arrays[key] if comm.rank == root else np.empty(shape, dtype=t["dtype"])
        if a.size:  # MPI's own broadcast of the raw bytes (any dtype; large messages are MPI's strength)
            comm.mpi.Bcast(a.reshape(-1).view(np.uint8), root=root)
        out[key] = a
    return out
