"""``load_latest``: resume from the newest checkpoint of a root, stepping back past damaged ones.

"The newest checkpoint" is the committed ``step_<n>`` folder with the highest step; ``latest`` is a
hint. It is replaced only after the folder is renamed into place, so a save killed in between leaves
``latest`` naming the previous checkpoint while the new folder is complete (``atomic.resolve`` then
takes the newer folder; resuming from the older one would retrain its steps and then fail to save
them over the folder that exists). The ranks must try the same folders in the same order, or one
would wait in a collective the others never enter; so rank 0 lists the candidates (the folder
``resolve`` picks, then every other committed ``step_<n>`` folder, newest first) and shares the list.
Each try is a full :func:`load`, which raises the same ``CheckpointError`` on every rank, so all ranks
move on together. A skipped folder is left in place (a load never changes the files); ``save`` moves it
aside if the run saves that step again.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from minidist.checkpoint import atomic, background
from minidist.checkpoint.checks import agree, all_gather_json, on_every_rank, world_comm
from minidist.checkpoint.errors import CheckpointError
from minidist.checkpoint.load import load


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
    """Collective: load the newest checkpoint of ``directory``: the committed ``step_<n>`` folder with
    the highest step, even if a save was killed before it replaced ``latest`` (``atomic.resolve``).

    If that folder is newer than the one ``latest`` names (a save was stopped between the two) and
    does not load, the one ``latest`` names is tried next, also without ``fallback``. With
    ``fallback``, a checkpoint that fails to load is skipped (a warning is printed on rank 0)
    and the committed ``step_<n>`` folders are tried newest first, until one loads. A skipped folder
    is left as it is; when the resumed run saves that step again, ``save`` moves the damaged one aside
    to ``.corrupt-step_<n>-<time>``. With ``missing_ok``, a directory holding no checkpoint at all
    returns None (a fresh start).

    Raises ``CheckpointError`` on every rank if nothing loads (listing each checkpoint's problem), and
    ``ValueError`` on every rank if the ranks pass different directories.
    """
    background.wait_pending()  # a save still being written in the background is committed first
    comm = world_comm(mesh)
    root = Path(directory)
    agree({"directory": os.path.abspath(root)}, comm, what="checkpoint.load_latest",
          fix="pass the same directory on every rank")  # fmt: skip
    # Rank 0 lists the candidates for everyone: all ranks then try the same folders in the same order.
    found = None
    with on_every_rank(comm):
        if comm.rank == 0:
            found = _candidates(root)
    found = all_gather_json(found, comm)[0]
    pointer, committed = found["pointer"], found["committed"]
    if missing_ok and pointer is None and not committed:
        return None
    # ``root`` itself goes through resolve(), which checks the pointer's contents.
    candidates = [str(root)] if pointer is not None else []
    skip = {found["resolved"]} if found["resolved"] is not None else set()
    # A folder newer than 'latest' was never confirmed by it: if it does not load, 'latest' still
    # stands, so it is tried next even without fallback (a restart must not stop at that folder).
    hinted = pointer not in (None, "?") and found["resolved"] != str(root / pointer)
    if fallback or pointer is None:
        candidates += [path for path in committed if path not in skip]
    elif hinted:
        candidates.append(str(root / pointer))
    tries = len(candidates) if fallback else min(len(candidates), 2 if hinted else 1)
    problems = []
    for candidate in candidates[:tries]:
        try:
            return load(candidate, model, optimizer, mesh=mesh, sampler=sampler)
        except CheckpointError as err:  # raised identically on every rank, so all move on together
            problems.append(str(err))
            if tries == 1 and not fallback:
                raise
            if comm.rank == 0:
                print(
                    f"checkpoint.load_latest: skipping a checkpoint that does not load: {err}. It is left "
                    "in place; a later save of the same step moves it aside to .corrupt-<name>-<time>",
                    flush=True,
                )
    raise CheckpointError(
        "no checkpoint loads" + (": " + "; ".join(problems) if problems else " (none found)"), root
    )


def _candidates(root: Path) -> dict[str, Any]:
    """Rank 0: ``{"committed": step_<n> folders, newest first, "pointer": what 'latest' names or None,
    "resolved": the folder ``load(root)`` takes or None}``."""
    try:
        committed = [str(path) for _, path in reversed(atomic.list_checkpoints(root))]
        try:
            pointer = atomic.read_latest(root)
            resolved = str(atomic.resolve(root)) if pointer is not None else None  # what load(root) takes
        except CheckpointError:
            pointer, resolved = "?", None  # present but unreadable: load(root) reports why, as a candidate
    except OSError as err:
        raise CheckpointError(f"cannot list the checkpoint folder ({err})", root) from None
    if pointer not in (None, "?") and resolved != str(root / pointer):
        print(
            f"checkpoint.load_latest: 'latest' names {pointer} but {Path(resolved).name} is newer (a save "
            "was stopped after committing it, before replacing 'latest'); resuming from the newer one",
            flush=True,
        )
    return {"committed": committed, "pointer": pointer, "resolved": resolved}
