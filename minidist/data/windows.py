"""RandomWindows: batches of random windows of a token stream, the same global batch on every rank.

A language model learns from windows of ``block_size`` consecutive tokens: the input ``x`` is the
window and the target ``y`` is the same window shifted by one token, so position t learns to predict
token t + 1. The windows start at uniformly random places (nanoGPT's ``get_batch``), which needs no
epochs: any of the ``N - block_size`` starting places can come up at any step.

Data parallelism: every rank draws the same ``batch_size`` starting places (the global batch) and
keeps one contiguous slice of it, so W ranks see together exactly what one process sees, step by step.

Reproducible and resumable without storing a generator: the starting places of global batch s come
from a generator made fresh from ``(seed, s)`` (as ``DistributedSampler`` draws epoch e's permutation
from ``(seed, e)``). The whole state of the stream is then the count of batches drawn, two ints that a
checkpoint stores in its manifest, and a resumed run draws bit-identical batches on any number of
ranks. Evaluation batches come from another stream, ``(seed, EVAL_STREAM, i)``, the same every time.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from minidist.data.checks import check_int

TRAIN_STREAM, EVAL_STREAM = 0, 1  # the second word of the generator's seed: the two never share windows


class RandomWindows:
    """This rank's microbatches ``(x, y)`` of random windows of ``ids``, the next one per :meth:`next`.

    Args:
        ids: the token stream, a 1-D integer array (or list) of N ids, e.g. ``tokenizer.encode(text)``.
        block_size: T, the tokens per window (the model's context length), an int >= 1; N >= T + 1.
        batch_size: B, the GLOBAL number of windows per optimizer step, summed over ranks and
            accumulation steps; must divide by ``world_size * accumulation_steps``.
        seed: the stream's seed, an int >= 0, the same on every rank.
        rank: this data-parallel rank r (no default from MPI: pass ``dist.get_rank()``; this module
            never imports MPI).
        world_size: the number of data-parallel ranks W (``dist.get_world_size()``).
        accumulation_steps: k, the microbatches per optimizer step on each rank (gradient accumulation).

    Each global batch draws B starting places, uniform on ``[0, N - T)``, from
    ``np.random.default_rng((seed, 0, s))`` for the s-th global batch. Row order (the rule every layout
    shares): rank r takes rows ``[r*B/W, (r+1)*B/W)`` and cuts them into k consecutive microbatches of
    ``B/(W*k)`` rows, handed out by k calls of :meth:`next`. So the B rows of a step do not depend on W or
    k, and each rank's rows of a step do not depend on k: one process with k = W accumulation steps
    sees as its microbatch m exactly rank m's rows of a W-rank run without accumulation.

    Returns (from :meth:`next`, also ``next(windows)`` and ``for x, y in windows``, which never ends):
        ``x, y``: int64 NumPy arrays of shape ``(B / (W*k), T)``, ``y[:, t] == x[:, t + 1]`` for
        ``t < T - 1`` and ``y[:, -1]`` the token after the window. They are host arrays; the training loop
        moves them to the GPU if there is one (as with ``DataLoader``).

    A training step (DDP averages over the W ranks, the ``/ k`` over the microbatches, so the gradient
    is the mean over all B windows, as one process with the whole batch computes it)::

        for micro in range(k):
            x, y = windows.next()
            with ddp.no_sync() if micro < k - 1 else contextlib.nullcontext():
                (cross_entropy(model(x).reshape(-1, V), y.reshape(-1)) / k).backward()
        opt.step(); opt.zero_grad()

    Resuming: ``state_dict()`` / ``load_state_dict()`` (``checkpoint.save(..., sampler=windows)`` and
    ``checkpoint.load(..., sampler=windows)`` call them) carry the count of global batches drawn and of
    microbatches taken from the current one; the next batch after a load is bit-identical to the one an
    uninterrupted run would draw, also on another number of ranks or accumulation steps with the same
    B (at a step boundary).

    Raises:
        TypeError: ``ids`` not integers; a non-int ``block_size``, ``batch_size``, ``seed``, ``rank``,
            ``world_size`` or ``accumulation_steps``.
        ValueError: ``ids`` not 1-D or shorter than ``block_size + 1``; an argument below its minimum;
            ``rank`` outside ``[0, world_size)``; ``batch_size`` not divisible by
            ``world_size * accumulation_steps`` (the message says which batch sizes work).
    """

    def __init__(
        self,
        ids: Any,
        block_size: int,
        batch_size: int,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        accumulation_steps: int = 1,
    ) -> None:
        ids = np.asarray(ids)
        if ids.size and not np.issubdtype(ids.dtype, np.integer):
            raise TypeError(f"ids must be integer token ids, got dtype {ids.dtype}.")
        if ids.ndim != 1:
            raise ValueError(f"ids must be a 1-D token stream, got shape {ids.shape}.")
        self.ids = ids.astype(np.int64, copy=False)
        self.block_size = check_int("block_size", block_size, 1)
        self.batch_size = check_int("batch_size", batch_size, 1)
        self.seed = check_int("seed", seed, 0)
        self.world_size = check_int("world_size", world_size, 1)
        self.rank = check_int("rank", rank, 0)
        self.accumulation_steps = check_int("accumulation_steps", accumulation_steps, 1)
        if self.rank >= self.world_size:
            raise ValueError(f"rank must be in [0, world_size) = [0, {self.world_size}), got {self.rank}.")
        if len(self.ids) < self.block_size + 1:
            raise ValueError(
                f"a token stream of {len(self.ids)} ids is too short for block_size={self.block_size}: a "
                f"window and its shifted target need {self.block_size + 1}; use a longer text or a smaller "
                "block_size."
            )
        parts = self.world_size * self.accumulation_steps
        if self.batch_size % parts:
            lower, upper = self.batch_size // parts * parts, (self.batch_size // parts + 1) * parts
            raise ValueError(
                f"batch_size={self.batch_size} does not divide by world_size * accumulation_steps = "
                f"{self.world_size} * {self.accumulation_steps} = {parts}; use a multiple of {parts} "
                f"(e.g. {upper}{f' or {lower}' if lower else ''}) or another number of ranks."
            )
        self.micro_batch_size = self.batch_size // parts
        self.step = 0  # global batches fully taken
        self.micro = 0  # microbatches taken from global batch `step`

    def starts(self, index: int, stream: int = TRAIN_STREAM) -> np.ndarray:
        """The B starting places of global batch ``index`` of a stream, identical on every rank:
        int64 array of shape ``(B,)`` with values in ``[0, N - T)``."""
        rng = np.random.default_rng((self.seed, stream, index))
        return rng.integers(0, len(self.ids) - self.block_size, size=self.batch_size, dtype=np.int64)

    def windows(self, starts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(x, y)`` for the given starting places: ``x[i] = ids[s_i : s_i + T]``, ``y[i]`` one later."""
        positions = starts[:, None] + np.arange(self.block_size)  # (rows, T): one gather per array
        return self.ids[positions], self.ids[positions + 1]

    def micro_starts(self, all_starts: np.ndarray, micro: int) -> np.ndarray:
        """This rank's microbatch ``micro`` (in ``[0, k)``) of a global batch's starting places."""
        first = self.rank * (self.batch_size // self.world_size) + micro * self.micro_batch_size
        return all_starts[first : first + self.micro_batch_size]

    def next(self) -> tuple[np.ndarray, np.ndarray]:
        """This rank's next microbatch ``(x, y)``; a new global batch begins every k calls."""
        x, y = self.windows(self.micro_starts(self.starts(self.step), self.micro))
        self.micro += 1
        if self.micro == self.accumulation_steps:
            self.step, self.micro = self.step + 1, 0
        return x, y

    def __next__(self) -> tuple[np.ndarray, np.ndarray]:
        return self.next()

    def __iter__(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        return self

    def eval_batches(self, num_batches: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """This rank's microbatches of ``num_batches`` global evaluation batches: ``num_batches * k``
        pairs ``(x, y)``, in the order of :meth:`next`, the same at every call.

        They come from the evaluation stream ``(seed, EVAL_STREAM, i)``, never from the training one,
        and leave the training position as it was: every evaluation of a run (train or validation loss)
        sees the same windows, so two estimates differ only because the model did. Raises
        ``TypeError``/``ValueError`` for a ``num_batches`` that is not an int >= 1.
        """
        num_batches = check_int("num_batches", num_batches, 1)
        for index in range(num_batches):
            all_starts = self.starts(index, EVAL_STREAM)
            for micro in range(self.accumulation_steps):
                yield self.windows(self.micro_starts(all_starts, micro))

    def state_dict(self) -> dict[str, Any]:
        """``{"step", "micro", "seed", "batch_size", "block_size", "num_tokens", "world_size",
        "accumulation_steps"}`` (JSON-serialisable). Seed, batch size, block size and the stream's
        length fix the windows, so a resumed stream must have the same (``load_state_dict`` checks)."""
        return {
            "step": self.step,
            "micro": self.micro,
            "seed": self.seed,
            "batch_size": self.batch_size,
            "block_size": self.block_size,
            "num_tokens": len(self.ids),
            "world_size": self.world_size,
            "accumulation_steps": self.accumulation_steps,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue at the saved position (checked by :meth:`resume_point`)."""
        self.step, self.micro = self.resume_point(state)

    def resume_point(self, state: dict[str, Any]) -> tuple[int, int]:
        """The ``(step, micro)`` that ``load_state_dict(state)`` sets; changes nothing.

        Raises ``ValueError`` if the state was saved with another seed, batch size, block size or token
        stream length (the windows would differ), or inside a global batch (``micro > 0``) by a run
        with another ``world_size`` or ``accumulation_steps`` (its microbatches cut the rows differently).
        ``checkpoint.load`` calls this on every rank before it changes anything.
        """
        mine = self.state_dict()
        for field in ("seed", "batch_size", "block_size", "num_tokens"):
            if state.get(field) != mine[field]:
                raise ValueError(
                    f"the saved RandomWindows state has {field}={state.get(field)!r} but this one has "
                    f"{field}={mine[field]!r}, so it would draw other windows; create it with the same "
                    "seed, batch size, block size and text as the run that saved (e.g. the same --seed, "
                    "--batch-size, --block-size and --data), or restore without the sampler."
                )
        step, micro = check_int("step", state["step"], 0), check_int("micro", state["micro"], 0)
        saved_k = check_int("accumulation_steps", state.get("accumulation_steps", 1), 1)
        saved_w = check_int("world_size", state.get("world_size", 1), 1)
        if micro >= saved_k:
            raise ValueError(f"the saved state has micro={micro} >= accumulation_steps={saved_k} (corrupt?).")
        if micro and (saved_w, saved_k) != (self.world_size, self.accumulation_steps):
            raise ValueError(
                f"the state was saved after microbatch {micro} of a global batch by world_size={saved_w}, "
                f"accumulation_steps={saved_k}; this run has {self.world_size}, {self.accumulation_steps}, "
                "which cut the batch into other microbatches. Save at a step boundary (after the optimizer "
                "step) to resume on another layout."
            )
        return step, micro
