"""``save``: every rank writes its shard, rank 0 writes the manifest and commits atomically.

``save`` reads as its steps (see ``atomic.py`` for why each fsync and rename is there), after
``checks.save_arguments`` (valid, and the same on every rank):

1. ``_prepare``: rank 0 checks the target (``checks.damage_of_existing``), creates
   ``DIR/.tmp-step_<n>-<id>/``; the ranks agree on its name;
2. ``stage.stage``: what this rank writes (``collect.py`` says what a rank saves,
   ``layout.assign_writers`` who writes it: every distinct shard once, bytes balanced over the ranks
   that hold a copy), its RNG and sampler states; copied to fresh host memory for an asynchronous save;
3. ``_persist``, which an asynchronous save runs on a background thread (``background.py``):
   ``_write_shard`` writes this rank's tensors as one safetensors file and fsyncs it; the ranks
   all-gather what they wrote (keys, shapes, sha256 of their file); ``_commit``: rank 0 writes
   ``manifest.json``, renames the folder to ``DIR/step_<n>``, replaces ``DIR/latest``; only then
   ``_prune`` deletes checkpoints beyond ``keep_last``.

Any failure on any rank, at any step (an ``OSError``, safetensors' own error, a user's sampler
raising), is raised as the same ``CheckpointError`` on every rank (``checks.any_failure``, built on
``checks.on_every_rank``), naming the rank, the file and the cause. It deletes the temporary folder
and undoes a half-done commit, leaving every existing checkpoint and ``latest`` untouched.

This follows the design of sharded checkpointing in Megatron-LM's ``dist_checkpointing``
and PyTorch's ``torch.distributed.checkpoint`` (one file per writer plus a global metadata file),
reduced to its essentials.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from minidist.checkpoint import atomic, background, checks, fsdp_state
from minidist.checkpoint import format as fmt
from minidist.checkpoint.checks import all_gather_json, any_failure
from minidist.checkpoint.errors import CheckpointError
from minidist.checkpoint.stage import Staged, stage


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
    async_save: bool = False,
) -> Path | background.SaveHandle:
    """Collective: write ``model``, ``optimizer`` and ``sampler`` state as ``directory/step_<step>``.

    Args:
        directory: the checkpoint root; created if missing. It holds ``step_<n>/`` folders and ``latest``.
        model: a Module, a ``DistributedDataParallel``, a ``PipelineParallel`` or a
            ``FullyShardedDataParallel`` (global names are used; FSDP's full parameters and optimizer
            state are gathered over its group first, ``fsdp_state.py``, so the files are the same).
        optimizer: an ``Optimizer`` or ``ZeroRedundancyOptimizer`` over the model's parameters (under
            FSDP: over ``fsdp.parameters()``, its shard tensors), or None.
        step: the training step (an int >= 0) this state is *after*; names the folder.
        mesh: the run's ``ProcessMesh`` (None: pure data parallelism over the world).
        extra: anything JSON-serialisable (rank 0's is stored), returned by ``load`` as ``info["extra"]``.
        sampler: a ``DistributedSampler`` whose ``state_dict()`` (epoch, position) each rank stores, or
            the ``DataLoader`` drawing from it (it hands over its sampler's state), or any object with a
            JSON-serialisable ``state_dict()`` and a ``load_state_dict()`` (``data.RandomWindows``); if it
            has ``resume_point(state)``, ``load`` calls it first to check the state fits.
        keep_last: after committing, delete all but the newest ``keep_last`` checkpoints (None: keep all).
        async_save: return as soon as this rank's state is copied to host memory, and write and commit
            on a background thread (``background.py``: the same steps, files and rules); training may
            change the parameters at once. Must be the same on every rank.

    Returns:
        the committed folder, on every rank; with ``async_save`` a ``SaveHandle`` whose ``wait()``
        returns it once committed (``done()`` says whether it has finished).

    Raises:
        CheckpointError: on every rank, if ``step_<step>`` already exists and verifies (nothing is
            overwritten), or anything fails on any rank (writing, fsync, rename, ``latest``, the
            sampler's state, ...): the message names the rank, the file and the cause, and the folder
            is as it was (the previous checkpoint stays loadable). If only deleting old checkpoints
            for ``keep_last`` failed, the new checkpoint is committed, and the message says so. An
            existing ``step_<step>`` that fails verification (a damaged checkpoint that
            ``load_latest(fallback=True)`` skipped) is renamed aside to ``DIR/.corrupt-step_<step>-<time>``
            (never deleted; a ``UserWarning`` on every rank says so) and the step is saved anew.
            Also if the tp ranks' pieces of a sharded tensor are not split.py's pieces of their sum,
            or a tied copy (``is_tied_copy``, never saved itself) has no original on any rank.
            With ``async_save`` the errors of the background steps are raised by the handle's
            ``wait()``, or else by the next ``save``/``load``/``checkpoint.wait_pending()``; a
            pending save's error is raised here before anything else is done.
        TypeError / ValueError: on every rank, if any rank passes a non-int or negative ``step``, a
            ``keep_last`` that is not None or an int >= 1, an ``extra`` that is not JSON-serialisable,
            a mesh that does not match the world, or if the ranks pass different steps, ``keep_last``
            or ``async_save``.
    """
    background.wait_pending()  # one save at a time: the previous asynchronous one finishes first
    comm = checks.world_comm(mesh)
    layout, module = checks.save_arguments(comm, mesh, model, step, keep_last, extra, async_save)
    root = Path(directory)
    final = root / atomic.step_dirname(int(step))

    tmp = _prepare(comm, root, final)  # 1. rank 0 makes a temporary folder; every rank learns its name
    with _removed_on_error(comm, tmp):  # a failure on any rank deletes the temporary folder
        fsdp = model if fsdp_state.is_fsdp(model) else None  # gathered first: full tensors by name
        copy = bool(async_save)
        staged = stage(comm, tmp, module, optimizer, layout, sampler, extra, copy=copy, fsdp=fsdp)  # 2.
    mesh_description = layout.describe()

    def persist(comm: Any) -> None:  # 3. over the world, or on the background thread over its duplicate
        _persist(comm, root, tmp, final, staged, mesh_description, int(step), keep_last)

    if async_save:
        return background.start(comm, persist, final)
    persist(comm)
    return final


def _persist(
    comm: Any, root: Path, tmp: Path, final: Path, staged: Staged, mesh: dict, step: int, keep: int | None
) -> None:
    """Step 3, collective over ``comm``: write this rank's shard, gather every rank's record, build the
    manifest, commit, prune. Reads nothing but ``staged``: it may run while training goes on."""
    with _removed_on_error(comm, tmp):  # a failure on any rank deletes the temporary folder
        written = _write_shard(comm, tmp, staged)  # this rank's shard file, fsynced
        records = all_gather_json(staged.record | {"written": written}, comm)  # every rank's, in order
        with any_failure(comm, "building the manifest", tmp / atomic.MANIFEST):
            manifest = fmt.build_manifest(records, mesh, step, staged.extra, staged.header)
            checks.tied_originals(records, manifest)  # a tied copy's original was saved by some rank
        _commit(comm, root, tmp, final, manifest)  # rank 0: manifest, rename into place, latest
    _prune(comm, root, final, keep)  # only once the new checkpoint is committed


def _prepare(comm: Any, root: Path, final: Path) -> Path:
    """Step 1: rank 0 checks that ``final`` is new and makes the temporary folder; all ranks learn its name.

    An existing ``final`` that verifies is never touched (error). One that does not (a damaged
    checkpoint, e.g. skipped by ``load_latest(fallback=True)`` before this run retrained its steps) is
    moved aside, so that a resumed run is not stuck on it forever; every rank warns about it.
    """
    name, moved = None, None
    with any_failure(comm, "preparing the checkpoint folder", root):
        if comm.rank == 0:
            name, moved = _make_tmp(root, final)
    name, moved = all_gather_json([name, moved], comm)[0]
    if moved:
        warnings.warn(
            f"checkpoint.save: {final} failed verification ({moved['problem']}); it was moved aside to "
            f"{moved['to']} (nothing deleted) and this step is saved anew",
            stacklevel=3,
        )
    tmp = root / name
    with _removed_on_error(comm, tmp):
        checks.sees_folder(comm, tmp, root)  # the same directory, on a file system all ranks share
    return tmp


def _make_tmp(root: Path, final: Path) -> tuple[str, dict | None]:
    """Rank 0: the temporary folder's name, after moving a damaged ``final`` aside (``{"to", "problem"}``)."""
    moved = None
    try:
        root.mkdir(parents=True, exist_ok=True)
        problem = checks.damage_of_existing(final)  # an error if final verifies: it is never overwritten
        if problem is not None:
            moved = {"to": str(atomic.move_aside(root, final)), "problem": problem}
        atomic.remove_stale_tmp(root)
        name = f"{atomic.TMP_PREFIX}{final.name}-{uuid.uuid4().hex[:8]}"
        (root / name).mkdir()
    except OSError as err:
        raise CheckpointError(f"cannot create the checkpoint folder ({err})", root) from None
    return name, moved


@contextlib.contextmanager
def _removed_on_error(comm: Any, tmp: Path) -> Iterator[None]:
    """If the block raises ``CheckpointError``, rank 0 deletes ``tmp``: our own unfinished folder."""
    try:
        yield
    except CheckpointError:
        if comm.rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        raise


def _write_shard(comm: Any, tmp: Path, staged: Staged) -> dict[str, Any] | None:
    """Write the arrays staged for this rank as one safetensors file, fsynced; describe what was written.

    Returns None if this rank was assigned nothing (another replica writes its tensors). The full
    shape of a sharded tensor is not known here: ``format.build_manifest`` sums the pieces.
    """
    checksum, nbytes = None, 0
    # A rank that cannot write stops every rank: an OSError; a TypeError for a dtype safetensors cannot
    # store; safetensors' own SafetensorError for a full disk or a file-size limit (no OSError).
    with any_failure(comm, "writing this rank's shard", tmp / staged.file):
        if staged.arrays:
            checksum, nbytes = atomic.write_shard(tmp / staged.file, staged.arrays)
    if not staged.arrays:
        return None
    return {"file": staged.file, "sha256": checksum, "bytes": nbytes, "entries": staged.entries}


def _commit(comm: Any, root: Path, tmp: Path, final: Path, manifest: dict) -> None:
    """Step 3, rank 0: the manifest (durable), the folder renamed into place, ``latest`` switched. A crash
    at any moment leaves a loadable checkpoint (``atomic.py``); a failure (a full disk, a file-size
    limit) undoes what was done, so that the error means "this step was not saved" on every rank."""
    with checks.on_every_rank(comm):
        if comm.rank == 0:
            previous = atomic.latest_or_none(root)
            doing, path = "writing the manifest", tmp / atomic.MANIFEST
            try:
                # BEGIN SOLUTION A6.2: manifest (durable), commit the folder, then switch latest
                atomic.write_durable(tmp / atomic.MANIFEST, fmt.dumps(manifest))
                doing, path = "renaming the folder into place", final
                atomic.commit_dir(tmp, final)
                doing, path = "replacing the 'latest' pointer", root / atomic.LATEST
                atomic.write_latest(root, final.name)
                # END SOLUTION
            except Exception as err:  # noqa: BLE001  (any failure: undone, then raised on every rank)
                atomic.undo_commit(root, tmp, final, previous)
                raise CheckpointError(f"{doing} failed ({type(err).__name__}: {err})", path) from None


def _prune(comm: Any, root: Path, final: Path, keep_last: int | None) -> None:
    """Rank 0 deletes checkpoints beyond ``keep_last`` (collective: a failure is raised on every rank)."""
    with any_failure(
        comm, f"deleting old checkpoints (keep_last={keep_last}) after committing {final.name}", root
    ):
        if comm.rank == 0 and keep_last is not None:
            atomic.prune(root, int(keep_last), protect=final)
