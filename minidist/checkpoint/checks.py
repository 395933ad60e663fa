"""The safety net of ``save`` and ``load``: every rank raises the same error, and the checks of a call.

**Every rank the same error.** A checkpoint problem seen by one rank (its shard is corrupt, its disk
is full, a bad argument there) must stop *every* rank, or the others would wait forever in the next
collective. So each step of ``save``/``load`` runs its checks inside ``with on_every_rank(comm):``: at
the end of the block the ranks exchange their error (or None) through
``minidist.distributed.safety.agreement``, and if any rank had one, all of them raise the lowest
rank's, rebuilt as the same class with the same path. ``any_failure`` turns any exception of its block
(an ``OSError`` of a full disk) into such a ``CheckpointError``. These helpers are
``minidist.distributed``'s, with the checkpoint's error classes filled in. They import it when first
called: importing it starts MPI, and importing ``minidist.checkpoint`` must not (``minidist checkpoint
info`` runs without MPI).

**The checks of a call**, each one step of ``save`` or ``load``: the arguments (the same on every
rank), an existing checkpoint of the step being saved, tied copies, and whether a checkpoint fits the
model, optimizer and sampler it is loaded into. The files themselves (the manifest's fields, each
shard's size and sha256) are checked by ``file_checks.py``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from minidist.checkpoint import atomic, fsdp_state, optim_state
from minidist.checkpoint import format as fmt
from minidist.checkpoint.errors import CheckpointError, NewerFormatError
from minidist.checkpoint.layout import Layout, layout_of, piece_shape, tp_dim_of, tp_stride_of, unwrap
from minidist.nn.module import Module

KINDS = (CheckpointError, NewerFormatError)  # rebuilt by name on the ranks that did not raise them
LABEL = "world"  # checkpoints are collective over the whole run: "rank 1 of the world: ..."


# --- every rank the same error ---------------------------------------------------------------------
def world_comm(mesh: Any) -> Any:
    """The ``Communicator`` of the whole run, over which the checkpoint ranks agree: the mesh's world,
    else ``dist.init()``'s."""
    world = getattr(mesh, "world", None) if mesh is not None else None
    if world is None:
        import minidist.distributed as dist  # noqa: PLC0415  (MPI only when a collective checkpoint call is made)

        world = dist.init()
    return world


@contextlib.contextmanager
def on_every_rank(comm: Any, *kinds: type[Exception]) -> Iterator[None]:
    """Collective: if the block raises one of ``kinds`` (default ``CheckpointError``) on any rank, every
    rank raises it (the lowest rank's error, prefixed ``"rank R of the world: "``).

    Every rank must enter the block; a rank whose block succeeds still takes part in the exchange at
    its end. Other exceptions pass through without one (a killed process does not agree either).
    """
    error, caught = None, kinds or (CheckpointError,)
    try:
        yield
    except caught as err:
        error = err
    import minidist.distributed as dist  # noqa: PLC0415  (MPI only when a collective checkpoint call is made)

    dist.raise_if_any(error, comm, label=LABEL, kinds=KINDS)


@contextlib.contextmanager
def any_failure(comm: Any, what: str, path: Path | None) -> Iterator[None]:
    """Collective: whatever the block raises on any rank (an ``OSError`` of a full disk, safetensors' own
    error, a ``TypeError`` from a user's sampler) becomes the same ``CheckpointError`` on every rank,
    naming the rank (``on_every_rank`` prefixes it), ``path`` and the cause. A rank that raised alone
    would leave the others waiting forever in the next collective."""
    with on_every_rank(comm):
        try:
            yield
        except CheckpointError:
            raise
        except Exception as err:  # noqa: BLE001  (any failure: every rank must learn of it)
            where = getattr(err, "filename", None) or path  # an OSError knows its file
            raise CheckpointError(f"{what} failed ({type(err).__name__}: {err})", where) from None


def agree(values: dict[str, Any], comm: Any, *, what: str, fix: str) -> None:
    """Collective: ``ValueError`` on every rank if the ranks' JSON ``values`` differ (``dist.agree``)."""
    import minidist.distributed as dist  # noqa: PLC0415  (MPI only when called)

    dist.agree(values, None, comm, what=what, label=LABEL, fix=fix)


def all_gather_json(obj: Any, comm: Any) -> list[Any]:
    """Collective: every rank's JSON ``obj``, in rank order, on every rank (``dist.all_gather_json``)."""
    import minidist.distributed as dist  # noqa: PLC0415  (MPI only when called)

    return dist.all_gather_json(obj, comm)


# --- save --------------------------------------------------------------------------------------------
def save_arguments(
    comm: Any, mesh: Any, model: Any, step: Any, keep_last: Any, extra: Any, async_save: Any
) -> tuple[Layout, Module]:
    """This rank's ``Layout`` and model, once every rank has passed valid and equal arguments.

    A bad argument on one rank only (``step=-1`` there) raises on every rank: the others must not be
    left waiting in the next collective.
    """
    with on_every_rank(comm, TypeError, ValueError):
        if not isinstance(step, (int, np.integer)) or isinstance(step, bool) or step < 0:
            raise TypeError(f"checkpoint.save: step must be an int >= 0, got {step!r}")
        if keep_last is not None and (
            not isinstance(keep_last, (int, np.integer)) or isinstance(keep_last, bool) or keep_last < 1
        ):  # a bool is an int to Python, but keep_last=True is surely not "keep 1"
            raise ValueError(f"checkpoint.save: keep_last must be None or an int >= 1, got {keep_last!r}")
        try:
            json.dumps(extra)
        except (TypeError, ValueError) as err:
            raise TypeError(f"checkpoint.save: extra must be JSON-serialisable ({err})") from None
        layout = layout_of(mesh, comm)
        module = unwrap(model)
    keep = None if keep_last is None else int(keep_last)
    # async_save too: ranks that disagree would run the remaining collectives on different communicators
    same = {"step": int(step), "keep_last": keep, "async_save": bool(async_save)}
    agree(same, comm, what="checkpoint.save", fix="pass the same step, keep_last, async_save on every rank")
    return layout, module


def damage_of_existing(final: Path) -> str | None:
    """Rank 0, before saving into ``final``: None if there is no such folder, else the problem that
    makes it fail verification (``save`` then moves it aside).

    Raises ``CheckpointError`` if it verifies (never overwritten) or a newer minidist wrote it.
    """
    if not (final.exists() or final.is_symlink()):
        return None
    try:
        problem = fmt.verify_folder(final)
    except NewerFormatError as err:
        raise CheckpointError(
            f"a checkpoint for this step already exists, written by a newer minidist ({err.problem}); "
            "nothing was overwritten. Save under another step or upgrade minidist",
            final,
        ) from None
    if problem is None:
        raise CheckpointError(
            "a checkpoint for this step already exists and verifies; nothing was overwritten. "
            "Resume from it, delete or rename it yourself, or save under another step",
            final,
        )
    return problem


def sees_folder(comm: Any, tmp: Path, root: Path) -> None:
    """Collective: ``CheckpointError`` on every rank unless every rank sees rank 0's new folder ``tmp``."""
    with on_every_rank(comm):
        if not tmp.is_dir():  # every rank must see rank 0's folder: same directory, shared file system
            raise CheckpointError(
                f"this rank does not see the folder {tmp.name} that rank 0 created; pass the same "
                "directory on every rank, on a file system that all ranks share",
                root,
            )


def tied_originals(records: list[dict], manifest: dict) -> None:
    """A tied copy is loaded from its original's tensor: some stage must have saved one."""
    for r in records:
        for name in r["tied"]:
            if fmt.model_key(name) not in manifest["tensors"]:
                raise CheckpointError(
                    f"parameter {name!r} of rank {r['rank']} is a tied copy (is_tied_copy) but no "
                    "rank holds its original to save; mark only the second copy of a tied weight"
                )


# --- load --------------------------------------------------------------------------------------------
def load_arguments(comm: Any, mesh: Any, model: Any, optimizer: Any, fsdp: Any) -> tuple[Layout, Module]:
    """This rank's ``Layout`` and model, once every rank passed a model and mesh that fit the world and,
    under FSDP (``fsdp``), an optimizer over its shard tensors (``fsdp.parameters()``)."""
    with on_every_rank(comm, TypeError, ValueError):  # a bad argument on one rank stops every rank
        layout, module = layout_of(mesh, comm), unwrap(model)
    with on_every_rank(comm, ValueError):  # an optimizer over the wrong tensors, before anything changes
        if fsdp is not None and optimizer is not None:
            fsdp_state.check_optimizer(fsdp, optimizer)
    return layout, module


def same_checkpoint(comm: Any, folder: Path, manifest: dict) -> None:
    """Collective: ``CheckpointError`` on every rank unless all ranks resolved the same folder and read
    the same manifest."""
    from minidist.distributed.safety import agreement  # noqa: PLC0415  (MPI only when called)

    digest = hashlib.sha256(fmt.dumps(manifest)).hexdigest()[:16]
    mine = {"folder": os.path.realpath(folder), "manifest sha256": digest}
    # Which values differ, the same text on every rank: "folder (/a on rank 0; /b on rank 1)".
    difference = agreement.describe_differences(agreement.all_gather_json(mine, comm))
    if difference:  # e.g. another directory per rank, or 'latest' switched between the ranks' reads
        raise CheckpointError(
            f"the ranks resolved different checkpoints: {difference}; pass the same directory on every "
            "rank (on a file system all ranks share) and do not save into it while loading"
        )


def fits(
    comm: Any, folder: Path, manifest: dict, params: dict, optimizer: Any, sampler: Any, sampler_state: Any,
    layout: Layout,
) -> None:  # fmt: skip
    """Collective: ``CheckpointError`` on every rank unless the checkpoint fits this model (``params``:
    its parameters by global name; names, global shapes, dtypes), ``optimizer`` (class, hyperparameters,
    groups) and ``sampler`` (``resume_point`` of ``sampler_state``, the state it would restore).

    A tied copy (``is_tied_copy``) reads the tensor of its own name, which its original saved.
    """
    where = folder / atomic.MANIFEST
    tensors = manifest["tensors"]
    with on_every_rank(comm):
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
            _piece_fits(key, entry, p, layout, where)
        if optimizer is not None:
            _optimizer_fits(manifest, params, optimizer, layout, where)
        if sampler_state is not None and hasattr(sampler, "resume_point"):
            try:
                sampler.resume_point(sampler_state)
            except (TypeError, ValueError, KeyError) as err:
                raise CheckpointError(f"the sampler state cannot be restored: {err}", where) from None
    names = {n for part in all_gather_json(sorted(params), comm) for n in part}  # every stage's names
    saved = {t["name"] for t in tensors.values() if t["kind"] == "model"}
    if names != saved:
        raise CheckpointError(
            f"the checkpoint is from an incompatible model: names only in the checkpoint "
            f"{sorted(saved - names)[:5]}, only in this model {sorted(names - saved)[:5]}",
            where,
        )


def _optimizer_fits(manifest: dict, params: dict, optimizer: Any, layout: Layout, where: Path) -> None:
    """The saved optimizer state is of ``optimizer``'s class, hyperparameters and groups, and every
    state array has its parameter's piece."""
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
    for key, entry in manifest["tensors"].items():
        if entry["kind"] == "optim" and entry["name"] in params:  # the state has its parameter's shape
            _piece_fits(key, entry, params[entry["name"]], layout, where)


def _piece_fits(key: str, entry: dict, p: Any, layout: Layout, where: Path) -> None:
    """split.py's piece of the saved full tensor ``entry`` for this tp rank has ``p``'s shape.

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
