"""``save``: every rank writes its shard, rank 0 writes the manifest and commits atomically.

The protocol (see ``atomic.py`` for why each fsync and rename is there):

1. rank 0 checks the target, creates ``DIR/.tmp-step_<n>-<id>/``; the ranks agree on its name;
2. each rank writes the tensors it was assigned (``layout.assign_writers``: every distinct shard once,
   bytes balanced over the ranks that hold a copy) as one safetensors file and fsyncs it;
3. the ranks all-gather what they wrote (keys, shapes, sha256 of their file), their RNG and sampler
   states, and any error: an error anywhere raises ``CheckpointError`` everywhere and deletes the
   temporary folder, leaving every existing checkpoint untouched;
4. rank 0 writes ``manifest.json``, renames the folder to ``DIR/step_<n>``, replaces ``DIR/latest``,
   and only then deletes checkpoints beyond ``keep_last``.

This follows the design of sharded, asynchronous-free checkpointing in Megatron-LM's
``dist_checkpointing`` and PyTorch's ``torch.distributed.checkpoint`` (one file per writer plus a
global metadata file), reduced to its essentials.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from minidist import backend
from minidist import random as md_random
from minidist.checkpoint import atomic, optim_state
from minidist.checkpoint import manifest as mf
from minidist.checkpoint.agree import allgather_json, differing, raise_if_any, raise_if_any_argument_error
from minidist.checkpoint.errors import CheckpointError
from minidist.checkpoint.layout import Layout, assign_writers, global_shape, layout_of, tp_dim_of, unwrap
from minidist.checkpoint.manifest import NewerFormatError


def world_comm(mesh: Any) -> Any:
    """The raw mpi4py communicator of the whole run (the mesh's world, else ``dist.init()``'s)."""
    world = getattr(mesh, "world", None) if mesh is not None else None
    if world is None:
        import minidist.distributed as dist  # noqa: PLC0415  (MPI only when a collective checkpoint call is made)

        world = dist.init()
    return world.mpi


def save(
    directory: str | os.PathLike,
    model: Any,
    optimizer: Any = None,
    *,
    step: int,
    mesh: Any = None,
    extra: Any = None,
    sampler: Any = None,
    keep_last: int | None = None,
) -> Path:
    """Collective: write ``model``, ``optimizer`` and ``sampler`` state as ``directory/step_<step>``.

    Args:
        directory: the checkpoint root; created if missing. It holds ``step_<n>/`` folders and ``latest``.
        model: a Module, a ``DistributedDataParallel`` or a ``PipelineParallel`` (global names are used).
        optimizer: an ``Optimizer`` or ``ZeroRedundancyOptimizer`` over the model's parameters, or None.
        step: the training step (an int >= 0) this state is *after*; names the folder.
        mesh: the run's ``ProcessMesh`` (None: pure data parallelism over the world).
        extra: anything JSON-serialisable (rank 0's is stored), returned by ``load`` as ``info["extra"]``.
        sampler: a ``DistributedSampler`` whose ``state_dict()`` (epoch, position) each rank stores.
        keep_last: after committing, delete all but the newest ``keep_last`` checkpoints (None: keep all).

    Returns:
        the committed folder, on every rank.

    Raises:
        CheckpointError: on every rank, if ``step_<step>`` already exists and verifies (nothing is
            overwritten), or any rank fails to write; the previous checkpoint stays loadable. An
            existing ``step_<step>`` that fails verification (a damaged checkpoint that
            ``load_latest(fallback=True)`` skipped) is renamed aside to ``DIR/.corrupt-step_<step>-<time>``
            (never deleted; a ``UserWarning`` on every rank says so) and the step is saved anew.
        TypeError / ValueError: on every rank, if any rank passes a non-int or negative ``step``, a
            ``keep_last`` that is not None or an int >= 1, an ``extra`` that is not JSON-serialisable,
            a mesh that does not match the world, or if the ranks pass different steps or ``keep_last``.
    """
    comm = world_comm(mesh)
    error = None
    try:
        _check_arguments(step, keep_last, extra)
        layout = layout_of(mesh, comm)
        module = unwrap(model)
    except (TypeError, ValueError) as err:
        error = err
    raise_if_any_argument_error(comm, error)  # a bad argument on one rank stops every rank
    keep = None if keep_last is None else int(keep_last)
    mismatch = differing(comm, {"step": int(step), "keep_last": keep})
    if mismatch:
        raise ValueError(
            f"checkpoint.save: the ranks passed different {mismatch}; pass the same on every rank"
        )
    root = Path(directory)
    final = root / atomic.step_dirname(int(step))

    tmp = _prepare(comm, root, final)  # collective; raises everywhere if final exists
    tensors, scalars = _collect(module, optimizer, layout)  # collective for ZeRO
    error, written = None, None
    try:
        written = _write_shard(tmp, tensors, layout)
    except (OSError, TypeError) as err:  # TypeError: a dtype safetensors cannot store
        error = CheckpointError(f"rank {layout.rank} could not write its shard ({err})", tmp)
    generators = md_random.get_all_rng_states()
    mine = {
        "rank": layout.rank,
        "coords": [layout.dp_rank, layout.tp_rank, layout.pp_rank],
        "rng": generators["rng"],
        "tp_rng": generators.get("tp_rng"),  # None: tensor parallelism was never imported
        "sampler": sampler.state_dict() if sampler is not None else None,
        "written": written,
        "scalars": scalars,
        "error": None if error is None else error.problem,
    }
    everyone = allgather_json(comm, mine)
    failed = next((r["error"] for r in everyone if r["error"]), None)
    if failed is None and layout.rank == 0:
        try:
            header = optim_state.header(optimizer) if optimizer is not None else None
            manifest = _manifest(everyone, layout, int(step), extra, header)
            # BEGIN SOLUTION A6.2: manifest (durable), commit the folder, then switch latest
            atomic.write_durable(tmp / atomic.MANIFEST, mf.dumps(manifest))
            atomic.commit_dir(tmp, final)
            atomic.write_latest(root, final.name)
            # END SOLUTION
            if keep is not None:
                atomic.prune(root, keep, protect=final)
        except OSError as err:
            error = CheckpointError(f"committing the checkpoint failed ({err})", final)
    if layout.rank == 0 and (failed or error) and tmp.exists():
        shutil.rmtree(tmp, ignore_errors=True)  # our own unfinished folder, never a checkpoint
    raise_if_any(comm, error if error else (CheckpointError(failed, tmp) if failed else None))
    return final


def _check_arguments(step: Any, keep_last: Any, extra: Any) -> None:
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


def _prepare(comm: Any, root: Path, final: Path) -> Path:
    """Rank 0 checks that ``final`` is new and makes the temporary folder; all ranks learn its name.

    An existing ``final`` that verifies is never touched (error). One that does not (a damaged
    checkpoint, e.g. skipped by ``load_latest(fallback=True)`` before this run retrained its steps) is
    moved aside, so that a resumed run is not stuck on it forever; every rank warns about it.
    """
    error, name, moved = None, None, None
    if comm.Get_rank() == 0:
        try:
            root.mkdir(parents=True, exist_ok=True)
            if final.exists() or final.is_symlink():
                problem = _verify_existing(final)
                if problem is None:
                    error = CheckpointError(
                        "a checkpoint for this step already exists and verifies; nothing was overwritten. "
                        "Resume from it, delete or rename it yourself, or save under another step",
                        final,
                    )
                else:
                    moved = {"to": str(atomic.move_aside(root, final)), "problem": problem}
            if error is None:
                atomic.remove_stale_tmp(root)
                name = f"{atomic.TMP_PREFIX}{final.name}-{uuid.uuid4().hex[:8]}"
                (root / name).mkdir()
        except NewerFormatError as err:
            error = CheckpointError(
                f"a checkpoint for this step already exists, written by a newer minidist ({err.problem}); "
                "nothing was overwritten. Save under another step or upgrade minidist",
                final,
            )
        except OSError as err:
            error = CheckpointError(f"cannot create the checkpoint folder ({err})", root)
    raise_if_any(comm, error)
    name, moved = allgather_json(comm, [name, moved])[0]
    if moved:
        warnings.warn(
            f"checkpoint.save: {final} failed verification ({moved['problem']}); it was moved aside to "
            f"{moved['to']} (nothing deleted) and this step is saved anew",
            stacklevel=3,
        )
    tmp = root / name
    error = None
    if not tmp.is_dir():  # every rank must see rank 0's folder: same directory, shared file system
        error = CheckpointError(
            f"rank {comm.Get_rank()} does not see the folder {name} that rank 0 created; pass the same "
            "directory on every rank, on a file system that all ranks share",
            root,
        )
    try:
        raise_if_any(comm, error)
    except CheckpointError:
        if comm.Get_rank() == 0:
            shutil.rmtree(tmp, ignore_errors=True)  # our own empty folder, never a checkpoint
        raise
    return tmp


def _verify_existing(folder: Path) -> str | None:
    """The problem with an existing checkpoint folder (manifest, then every file), or None if it verifies.

    Run by rank 0 alone: it happens only when a save meets a folder of the same step, which is rare.
    Raises ``NewerFormatError`` for a checkpoint of a newer format (not damaged: never moved aside).
    """
    try:
        manifest = mf.read_manifest(folder)
        for file in sorted(manifest["files"]):
            mf.verify_file(folder, file, manifest)
    except NewerFormatError:
        raise
    except CheckpointError as err:
        return str(err)
    return None


def _collect(module: Any, optimizer: Any, layout: Layout) -> tuple[dict, dict]:
    """``{key: (array, tp_dim, name, kind, state)}`` of everything this rank holds, and its counters."""
    tensors: dict[str, tuple[Any, int | None, str, str, str | None]] = {}
    tp_dims = {}
    for name, p in module.named_parameters():
        tp_dims[name] = tp_dim_of(p)
        tensors[mf.model_key(name)] = (p.data, tp_dims[name], name, "model", None)
    scalars: dict[str, dict[str, int]] = {}
    if optimizer is not None:
        for name, state in optim_state.state_by_name(optimizer, module).items():
            for k, v in state.items():
                if hasattr(v, "shape"):
                    tensors[mf.optim_key(name, k)] = (v, tp_dims[name], name, "optim", k)
                else:
                    scalars.setdefault(name, {})[k] = int(v)
    return tensors, scalars


def _write_shard(tmp: Path, tensors: dict, layout: Layout) -> dict[str, Any] | None:
    """Write the tensors assigned to this rank as one safetensors file; describe what was written."""
    writers = assign_writers([(k, int(t[0].nbytes), t[1]) for k, t in tensors.items()], layout)
    mine = {
        k: t
        for k, t in tensors.items()
        if writers[(k, None if t[1] is None else layout.tp_rank)] == layout.rank
    }
    if not mine:
        return None
    file = f"rank{layout.rank:05d}.safetensors"
    arrays = {k: np.ascontiguousarray(backend.to_numpy(t[0])) for k, t in mine.items()}
    checksum, nbytes = atomic.write_shard(tmp / file, arrays)
    entries = {
        k: {
            "name": t[2], "kind": t[3], "state": t[4], "shape": list(arrays[k].shape),
            "dtype": str(arrays[k].dtype), "tp_dim": t[1],
            "tp_rank": None if t[1] is None else layout.tp_rank,
            "global_shape": global_shape(arrays[k].shape, t[1], layout.tp),
        }
        for k, t in mine.items()
    }  # fmt: skip
    return {"file": file, "sha256": checksum, "bytes": nbytes, "entries": entries}


def _manifest(everyone: list[dict], layout: Layout, step: int, extra: Any, header: Any) -> dict[str, Any]:
    import minidist  # noqa: PLC0415  (the version, without an import cycle at module load)

    files, tensors = {}, {}
    for r in everyone:
        w = r["written"]
        if w is None:
            continue
        files[w["file"]] = {"sha256": w["sha256"], "bytes": w["bytes"]}
        for key, e in w["entries"].items():
            t = tensors.setdefault(
                key,
                {k: e[k] for k in ("name", "kind", "state", "global_shape", "dtype", "tp_dim")}
                | {"shards": []},
            )
            t["shards"].append({"file": w["file"], "tp_rank": e["tp_rank"], "shape": e["shape"]})
    for t in tensors.values():
        t["shards"].sort(key=lambda s: -1 if s["tp_rank"] is None else s["tp_rank"])
    if header is not None:
        header = dict(header, scalars={})
        for r in everyone:
            header["scalars"].update(r["scalars"])
    return {
        "format": mf.FORMAT,
        "format_version": mf.FORMAT_VERSION,
        "minidist_version": minidist.__version__,
        "created": time.time(),
        "step": step,
        "extra": extra,
        "mesh": layout.describe(),
        "files": files,
        "tensors": tensors,
        "optimizer": header,
        "ranks": [{k: r[k] for k in ("rank", "coords", "rng", "tp_rng", "sampler")} for r in everyone],
    }
