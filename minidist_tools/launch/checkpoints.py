"""What the launcher knows of the job's checkpoints: where they are, the newest one, the newest that verifies.

The launcher never loads a checkpoint (the restarted script does, with ``checkpoint.load_latest(...,
fallback=True)``, which steps back past a damaged one). It reads the folder without MPI, for two things:

* **progress**: a new committed ``step_<n>`` folder is the job's heartbeat with a meaning (the ``checkpoint``
  event), and tells how much work a failure can cost;
* **the restart point**: before a restart it checks, newest first, each committed checkpoint's manifest
  and every file's size and sha256 (``checkpoint.format.verify_folder``: the check ``load`` makes) and logs
  the newest that verifies (the ``verify`` event). The script, checking the same way, starts from it.

The folder is the command's ``--checkpoint-dir`` (both examples' flag; ``--checkpoint-dir=DIR`` too)
unless the launcher is given ``--checkpoint-dir`` itself.
"""

from __future__ import annotations

import os
from pathlib import Path

from minidist.checkpoint import atomic
from minidist.checkpoint import format as fmt
from minidist.checkpoint.errors import CheckpointError

FLAG = "--checkpoint-dir"


def checkpoint_dir_of(command: list[str], cwd: str | os.PathLike | None = None) -> Path | None:
    """The value of ``--checkpoint-dir`` in ``command`` (the last one given, as argparse takes it),
    relative to ``cwd``; None if the command has none."""
    found = None
    for i, arg in enumerate(command):
        if arg == FLAG and i + 1 < len(command):
            found = command[i + 1]
        elif arg.startswith(FLAG + "="):
            found = arg[len(FLAG) + 1 :]
    if found is None:
        return None
    return Path(cwd or ".", found) if not os.path.isabs(found) else Path(found)


def newest_committed(root: Path) -> tuple[int, Path] | None:
    """``(step, folder)`` of the newest committed checkpoint under ``root``, None if there is none.
    Only lists folders (cheap: called every monitor interval)."""
    try:
        found = atomic.list_checkpoints(root)
    except OSError:  # a folder being renamed or pruned while we list: next time
        return None
    return found[-1] if found else None


def newest_verified(root: Path) -> tuple[tuple[int, Path] | None, list[tuple[str, str]]]:
    """``((step, folder) or None, skipped)``: the newest committed checkpoint whose manifest and files all
    verify, and ``[(folder, problem), ...]`` for the newer ones that do not. None: start from scratch."""
    skipped = []
    for step, folder in reversed(atomic.list_checkpoints(root)):
        try:
            problem = fmt.verify_folder(folder)
        except CheckpointError as err:  # a newer format: not damage, but this minidist cannot load it
            problem = str(err)
        if problem is None:
            return (step, folder), skipped
        skipped.append((str(folder), problem))
    return None, skipped
