"""Checks of lesson 08 (checkpoints and failures): the files of a committed checkpoint, and the saved
shards a resharded rank reads."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from minidist_course.notebook.checks.harness import call, exercise, holds, same


@exercise(
    "When rank 0 is about to switch `latest`, which folder has the checkpoint's files, and which files "
    "does a reader of that checkpoint open?",
    "The .tmp folder has already been renamed to the committed step folder (look at the listing of DIR "
    "above); a reader needs the manifest and one shard file per writing rank.",
)
def files_before_latest(fn: Callable[[int, list[int]], set[str]]) -> None:
    """files_before_latest(step, writers) is the set of files minidist.checkpoint has committed when
    `latest` moves, for three steps and sets of writers."""
    for step, writers in [(12, [0, 1]), (3, [0]), (40, [0, 2, 5])]:
        folder = f"step_{step:09d}"
        want = {f"{folder}/manifest.json"} | {f"{folder}/rank{r:05d}.safetensors" for r in writers}
        got = set(call(fn, step, writers))
        context = f"files_before_latest(step={step}, writers={writers})"
        holds(not got - want, context, sorted(got), f"{sorted(got - want)} is not a file this step writes")
        same(got, want, context, f"{len(want - got)} of the step's files are missing")


@exercise(
    "Which global rows does saved shard k hold, and which global rows does the new rank need?",
    "Intersect the two ranges of global rows; skip the shards whose intersection is empty; subtract the "
    "shard's first global row to make the rows local to it.",
)
def shards_needed(fn: Callable[[int, int, int, int], list[tuple[int, int, int]]]) -> None:
    """shards_needed(size, saved_tp, new_tp, r) reads exactly the rows each new rank needs, each saved
    shard at most once, for six reshardings."""
    for size, saved_tp, new_tp in [(12, 2, 3), (12, 3, 2), (8, 4, 4), (8, 1, 4), (8, 4, 1), (24, 4, 6)]:
        data = np.arange(size)
        saved = np.split(data, saved_tp)
        for r in range(new_tp):
            want = np.split(data, new_tp)[r]
            pieces = call(fn, size, saved_tp, new_tp, r)
            context = (
                f"shards_needed(size={size}, saved_tp={saved_tp}, new_tp={new_tp}, r={r}): the rank needs "
                f"global rows {want[0]}..{want[-1]}; you returned {pieces}"
            )
            assert all(hi > lo for _, lo, hi in pieces), (
                f"{context}. No empty pieces: read only what you need."
            )
            assert len({k for k, _, _ in pieces}) == len(pieces), f"{context}. Each saved shard at most once."
            got = np.concatenate([saved[k][lo:hi] for k, lo, hi in pieces]) if pieces else np.array([])
            assert np.array_equal(got, want), f"{context}, which reads rows {got.tolist()}."
