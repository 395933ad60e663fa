"""``load``: verify everything first, then restore, on the same or another layout.

``load`` reads as its four steps, after ``checks.load_arguments`` (valid on every rank):

1. ``_read_manifest``: every rank resolves the folder and reads and checks its manifest; the ranks
   make sure they all found the same one (``checks.same_checkpoint``);
2. ``checks.fits``: the checkpoint fits this model (names, global shapes, dtypes), optimizer (class,
   hyperparameters) and sampler;
3. ``_read``: ``_plan`` says which shards each tensor's piece comes from; every shard file is verified
   (``file_checks.verify_file``, sha256 and size: file i by rank i mod world size, plus every rank
   that reads it) and this rank's pieces are cut from the shards (``layout.local_piece``);
4. ``_restore``: only now, with everything verified on every rank, the model, optimizer, generators
   and sampler change.

Any problem is raised as the same ``CheckpointError`` on every rank (``checks.on_every_rank``), and
nothing has changed when it is. Loading uses only JSON and safetensors, never pickle, so a checkpoint
cannot run code.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from minidist import backend
from minidist import random as md_random
from minidist.checkpoint import atomic, background, checks, file_checks, fsdp_state, optim_state
from minidist.checkpoint import format as fmt
from minidist.checkpoint.checks import all_gather_json, on_every_rank
from minidist.checkpoint.layout import Layout, local_piece, needed_shards, tp_dim_of, tp_stride_of


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
    comm = checks.world_comm(mesh)
    fsdp = model if fsdp_state.is_fsdp(model) else None
    layout, module = checks.load_arguments(comm, mesh, model, optimizer, fsdp)
    # Under FSDP the parameters hold no values between steps: load fills full arrays (collective).
    params = fsdp_state.load_targets(fsdp) if fsdp else dict(module.named_parameters())

    folder, manifest = _read_manifest(comm, directory)  # 1. the same checkpoint on every rank
    sampler_state = _sampler_state(manifest, layout, sampler)  # its own on the same layout, else rank 0's
    checks.fits(comm, folder, manifest, params, optimizer, sampler, sampler_state, layout)  # 2.
    arrays = _read(comm, folder, manifest, _plan(manifest, params, optimizer, layout), layout)  # 3.
    state = (manifest, arrays, module, optimizer, sampler, sampler_state, layout)
    return _restore(folder, *state, params, fsdp)  # 4.


def _read_manifest(comm: Any, directory: str | os.PathLike) -> tuple[Path, dict[str, Any]]:
    """Step 1: the checkpoint folder and its checked manifest, the same on every rank."""
    with on_every_rank(comm):
        folder = atomic.resolve(directory)
        manifest = fmt.read_manifest(folder)
    checks.same_checkpoint(comm, folder, manifest)  # not: another folder per rank, 'latest' switched
    return folder, manifest


def _sampler_state(manifest: dict, layout: Layout, sampler: Any) -> Any:
    """The saved sampler state this rank restores: its own on the same layout, else rank 0's (None
    without a sampler). ``checks.fits`` asks the sampler whether it fits (``resume_point``)."""
    if sampler is None:
        return None
    same_layout = manifest["mesh"] == layout.describe()
    saved = [r["sampler"] for r in manifest["ranks"] if r["sampler"] is not None]
    same = [r["sampler"] for r in manifest["ranks"] if r["rank"] == layout.rank and r["sampler"]]
    return same[0] if same_layout and same else (saved[0] if saved else None)


def _plan(manifest: dict, params: dict, optimizer: Any, layout: Layout) -> dict:
    """``{tensor key: (shard records to read, tp_dim, tp_stride here)}`` for every tensor this rank
    restores (``params``: the parameters by global name; optimizer state has its parameter's split).

    A tied copy (``is_tied_copy``) reads the tensor of its own name, which its original saved.
    """
    plan = {}
    for name, p in params.items():
        key = fmt.model_key(name)
        plan[key] = _piece_plan(manifest["tensors"][key], p, layout)
    if optimizer is not None:
        for key, entry in manifest["tensors"].items():
            if entry["kind"] == "optim" and entry["name"] in params:
                plan[key] = _piece_plan(entry, params[entry["name"]], layout)
    return plan


def _piece_plan(entry: dict, p: Any, layout: Layout) -> tuple[list, int | None, int]:
    """``(shard records, tp_dim, tp_stride)`` for parameter ``p``'s piece of the saved tensor ``entry``
    (``checks.fits`` made sure that split.py's piece for this tp rank has ``p``'s shape)."""
    tp_dim, stride = tp_dim_of(p), tp_stride_of(p)
    return needed_shards(entry, layout.tp, layout.tp_rank, tp_dim, stride), tp_dim, stride


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
        file_checks.check_listed(folder, manifest)  # every shard's file has a checksum
        for i, name in enumerate(files):
            reader = i % layout.world_size == layout.rank
            if reader or (name in mine and name not in shared):
                contents[name] = file_checks.verify_file(folder, name, manifest, keep=name in mine)
    for i, name in enumerate(files):  # the same order on every rank
        if name in shared:
            contents[name] = _broadcast_file(comm, manifest, name, contents.get(name), i % layout.world_size)
    out = {}
    with on_every_rank(comm):  # a piece that cannot be cut (tp does not divide it) may concern one stage
        for key, (shards, tp_dim, stride) in plan.items():
            pieces = [contents[s["file"]].get(key) for s in shards]
            file_checks.check_found(key, pieces, shards, folder)  # each there, with the recorded shape
            out[key] = local_piece(
                key, manifest["tensors"][key], pieces, layout.tp, layout.tp_rank, tp_dim, stride
            )
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
        if fsdp is None:
            optim_state.load_by_name(optimizer, module, manifest["optimizer"], state)
        else:  # the optimizer steps FSDP's shard tensors, not the model's parameters: each gets its slice
            fsdp_state.load_by_name(fsdp, optimizer, manifest["optimizer"], state)
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
