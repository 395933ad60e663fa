"""Durable, atomic file-system steps, every one a save takes: a rank's shard (written, hashed, fsynced),
write + fsync, rename into place, the ``latest`` pointer (and ``resolve``, which follows it), moving a
damaged checkpoint aside, pruning old ones.

A checkpoint is committed in this order, so a crash at any moment leaves the previous one loadable:

1. every rank writes its shard into ``DIR/.tmp-step_000123-<id>/`` and fsyncs the file;
2. rank 0 writes ``manifest.json`` there, fsyncs it and the folder, and renames the folder to
   ``DIR/step_000123`` (``rename`` of a folder is atomic on POSIX), then fsyncs ``DIR``;
3. rank 0 writes ``DIR/latest.tmp`` (the folder name), fsyncs it and ``os.replace``s it onto
   ``DIR/latest``, then fsyncs ``DIR``.

Before step 2 the new checkpoint does not exist under its name; before step 3 ``latest`` still names
the old one. The fsyncs make the order hold after a power cut too, not only after a killed process
(Pillai et al., "All File Systems Are Not Created Equal", OSDI 2014, on why the folder needs one).
"""

from __future__ import annotations

import contextlib
import hashlib
import mmap
import os
import re
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import safetensors.numpy

from minidist.checkpoint.errors import CheckpointError

LATEST = "latest"
MANIFEST = "manifest.json"
TMP_PREFIX = ".tmp-"
CORRUPT_PREFIX = ".corrupt-"  # a checkpoint that failed verification, moved aside (never deleted)
_STEP_DIR = re.compile(r"^step_(\d+)$")


def step_dirname(step: int) -> str:
    """``step_000123``: names sort by step for steps below 10**9."""
    return f"step_{step:09d}"


def is_step_dirname(name: str) -> bool:
    """Whether ``name`` is a committed checkpoint's folder name (what ``latest`` may hold)."""
    return _STEP_DIR.match(name) is not None


def write_durable(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` and fsync it: after this returns the bytes are on disk."""
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def new_file_mode() -> int:
    """The permission bits ``open(path, "w")`` gives a new file: ``0o666`` less the process's umask
    (``0o644`` under the usual umask ``022``).

    Why: the safetensors library writes a shard to a private temporary file (mode ``0o600``) and renames
    it, so without a ``chmod`` the shards would be readable by their owner only while ``manifest.json``
    and ``latest`` (written with ``open``) are readable by all: a checkpoint that another user, or a
    job running under another account, can list but not load. The umask is read from ``/proc`` on
    Linux; elsewhere it is set and restored with ``os.umask`` (the only portable way to read it).
    """
    try:
        with open("/proc/self/status") as status:
            umask = next(int(line.split()[1], 8) for line in status if line.startswith("Umask:"))
    except (OSError, StopIteration, ValueError, IndexError):
        umask = os.umask(0o022)
        os.umask(umask)
    return 0o666 & ~umask


def write_shard(path: Path, arrays: dict[str, np.ndarray]) -> tuple[str, int]:
    """Write ``arrays`` (NumPy, any shapes) as a safetensors file, fsynced.

    Returns ``(sha256 hex digest of the file, its size in bytes)``. The library writes the file
    (``safetensors.numpy.save_file``); then a helper thread hashes it from the page cache through a
    memory map while this thread waits for ``fsync``: the checksum costs no copy and hides behind the
    disk. The file gets the mode ``open()`` would give it (``0o644`` under umask ``022``), as the manifest
    does. Raises ``TypeError`` for a dtype safetensors cannot store (e.g. complex).
    """
    for key, a in arrays.items():
        if a.dtype.kind not in "biuf":
            raise TypeError(f"checkpoint: cannot store {key!r} of dtype {a.dtype} in safetensors")
    safetensors.numpy.save_file({key: np.ascontiguousarray(a) for key, a in arrays.items()}, str(path))
    os.chmod(path, new_file_mode())  # the library's temporary file is 0o600: give the manifest's mode
    with open(path, "rb+") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as pages:
        # fsync: on disk before the manifest that vouches for it is written
        return _sha256_while(pages, lambda: os.fsync(f.fileno())), len(pages)


def _sha256_while(pages: mmap.mmap, work: Callable[[], None]) -> str:
    """The sha256 hex digest of ``pages``, computed on a helper thread (hashlib releases the GIL) while
    this thread runs ``work``.

    A plain thread rather than a ``ThreadPoolExecutor``: an asynchronous save (``background.py``) may
    still be writing while the interpreter shuts down, and executors then refuse new work ("cannot
    schedule new futures after interpreter shutdown"); a thread may still be started then.
    """
    result: list[Any] = []

    def run() -> None:
        try:
            result.append(hashlib.sha256(pages).hexdigest())
        except BaseException as err:  # noqa: BLE001  (raised on the calling thread below)
            result.append(err)

    helper = threading.Thread(target=run, name="minidist-sha256")
    helper.start()
    try:
        work()
    finally:
        helper.join()
    if isinstance(result[0], BaseException):
        raise result[0]
    return result[0]


def fsync_dir(path: Path) -> None:
    """fsync a folder, so that the names created, renamed or deleted in it are durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def commit_dir(tmp: Path, final: Path) -> None:
    """Make the finished folder ``tmp`` appear as ``final`` in one atomic rename."""
    # BEGIN SOLUTION A6.2: fsync the folder, rename it into place, fsync the parent
    fsync_dir(tmp)
    os.rename(tmp, final)  # fails (rather than merging) if final exists as a non-empty folder
    fsync_dir(final.parent)
    # END SOLUTION


def write_latest(root: Path, name: str) -> None:
    """Point ``root/latest`` at checkpoint folder ``name``, replacing the old pointer atomically."""
    # BEGIN SOLUTION A6.2: write latest.tmp durably, os.replace it onto latest, fsync root
    tmp = root / (LATEST + ".tmp")
    write_durable(tmp, (name + "\n").encode())
    os.replace(tmp, root / LATEST)
    fsync_dir(root)
    # END SOLUTION


def read_latest(root: Path) -> str | None:
    """The folder name in ``root/latest``, or None if there is no pointer (or it is empty).

    Raises ``CheckpointError`` naming the pointer if it cannot be read (``root`` is a file, ...) or
    is not UTF-8 text.
    """
    path = root / LATEST
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as err:
        raise CheckpointError(f"cannot read the 'latest' pointer ({err})", path) from None
    try:
        return data.decode("utf-8").strip() or None
    except UnicodeDecodeError:
        raise CheckpointError("the 'latest' pointer is not UTF-8 text (corrupt?)", path) from None


def latest_or_none(root: Path) -> str | None:
    """What ``latest`` names now (None if nothing, or unreadable), to put it back if the commit fails."""
    try:
        return read_latest(root)
    except CheckpointError:
        return None


def undo_commit(root: Path, tmp: Path, final: Path, previous: str | None) -> None:
    """After a failed commit, best effort: put ``root`` back as it was before the save (the caller then
    deletes ``tmp``), so that the error means "this step was not saved".

    If the folder was already renamed, it goes back to its temporary name; ``latest`` is pointed back
    at ``previous`` if it was switched, and a half-written ``latest.tmp`` is deleted. What cannot be
    undone (the disk failed again) leaves a complete checkpoint or a stale temporary folder, never a
    damaged one under a committed name."""
    with contextlib.suppress(OSError):
        (root / (LATEST + ".tmp")).unlink(missing_ok=True)
    with contextlib.suppress(OSError, CheckpointError):
        if read_latest(root) == final.name and previous != final.name:
            if previous is None:
                (root / LATEST).unlink()
            else:
                write_latest(root, previous)
    with contextlib.suppress(OSError):
        if final.is_dir() and not tmp.exists():
            os.rename(final, tmp)


def resolve(directory: str | os.PathLike) -> Path:
    """The checkpoint folder: ``directory`` if it holds a manifest, else the newest of what
    ``directory/latest`` names and the committed ``step_<n>`` folders.

    ``latest`` is replaced only after the folder is renamed into place, so a save killed between the
    two leaves a complete ``step_<n>`` newer than the one ``latest`` names: the folders are the
    truth and ``latest`` a hint (a convenience for people and tools). Without a pointer the newest
    committed folder is taken.

    Raises ``CheckpointError`` if ``directory`` is a file, if neither exists, or if ``latest`` is
    unreadable or names something other than a ``step_<n>`` folder.
    """
    path = Path(directory)
    if path.exists() and not path.is_dir():
        raise CheckpointError(
            "this is a file, not a checkpoint folder or root; "
            "pass the folder holding manifest.json or 'latest'",
            path,
        )
    if (path / MANIFEST).exists():
        return path
    name = read_latest(path)
    committed = list_checkpoints(path)
    if name is None and committed:
        return committed[-1][1]  # killed before its first 'latest' was written
    if name is None:
        raise CheckpointError("no checkpoint here: neither a manifest.json nor a 'latest' pointer", path)
    if not is_step_dirname(name):
        raise CheckpointError(
            f"the 'latest' pointer names {name!r}, which is not a checkpoint folder (step_<n>); "
            "pass a step_<n> folder, or load_latest(fallback=True) to use the newest one that loads",
            path,
        )
    newest = committed[-1] if committed else None
    if newest is not None and newest[0] > int(_STEP_DIR.match(name).group(1)):
        return newest[1]  # a save was killed after its rename, before 'latest' was replaced
    return path / name


def list_checkpoints(root: Path) -> list[tuple[int, Path]]:
    """``(step, folder)`` of every committed checkpoint under ``root``, oldest first.

    A committed folder is one named ``step_<n>`` (temporary folders are skipped); whether its files
    verify is checked only when it is loaded.
    """
    found = []
    if root.is_dir():
        for child in root.iterdir():
            match = _STEP_DIR.match(child.name)
            if match and child.is_dir():
                found.append((int(match.group(1)), child))
    return sorted(found)


def move_aside(root: Path, folder: Path) -> Path:
    """Rename ``folder`` (a checkpoint that fails verification) to ``root/.corrupt-<name>-<time>``.

    Nothing is deleted: the bytes stay for a person to inspect or repair, under a name that
    ``list_checkpoints`` and ``remove_stale_tmp`` both ignore. Returns the new path.
    """
    target = root / f"{CORRUPT_PREFIX}{folder.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    n = 1
    while target.exists():  # moved aside twice within a second
        target, n = root / f"{CORRUPT_PREFIX}{folder.name}-{time.strftime('%Y%m%d-%H%M%S')}-{n}", n + 1
    os.rename(folder, target)
    fsync_dir(root)
    return target


def remove_stale_tmp(root: Path) -> None:
    """Delete temporary folders left by saves that crashed (never a committed checkpoint)."""
    if root.is_dir():
        for child in root.iterdir():
            if child.name.startswith(TMP_PREFIX) and child.is_dir():
                shutil.rmtree(child, ignore_errors=True)


def prune(root: Path, keep_last: int, protect: Path) -> list[Path]:
    """Delete all but the newest ``keep_last`` checkpoints (never ``protect``); returns what was deleted.

    Called only after the new checkpoint and ``latest`` are durable. A folder is first renamed to a
    temporary name, so a crash halfway through deleting it cannot leave a half-deleted ``step_`` folder
    that looks committed.
    """
    deleted = []
    for _, path in list_checkpoints(root)[:-keep_last]:
        if path.resolve() == protect.resolve():
            continue
        doomed = root / f"{TMP_PREFIX}deleting-{path.name}"
        os.rename(path, doomed)
        shutil.rmtree(doomed)
        deleted.append(path)
    if deleted:
        fsync_dir(root)
    return deleted
