"""DistributedSampler: which sample indices each data-parallel rank reads in one epoch.

In data parallelism every rank holds the whole model and a different slice of each batch. The
ranks never exchange data; instead each one computes the *same* permutation of the data set from a
shared seed and keeps only its own share of it. Two ways of sharing are offered:

* **Strided** (``batch_size=None``, PyTorch's layout): rank r takes ``perm[r::R]``. Unlike
  PyTorch we never pad with repeated samples, so every sample is used exactly once per epoch; the
  price is that when R does not divide N the ranks' lengths differ by one.
* **Global batch** (``batch_size=B``): the permutation is cut into global batches of B samples and
  each global batch is split across the R ranks in ``numpy.array_split`` order. Step k of an R-rank
  run then sees exactly the samples that step k of a one-process run with batch B sees, which is
  what lets us test "N processes == 1 process" even when R does not divide B.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from minidist.data.checks import check_int, check_same_permutation, dataset_length


def _default_world() -> tuple[int, int]:
    """(world size, rank) from ``minidist.distributed``, imported only when the caller gave neither.

    ``dist`` sits above ``data`` in the layer diagram, so we import it lazily and only as a
    convenience default; passing ``num_replicas`` and ``rank`` keeps this module MPI-free.
    """
    try:
        import minidist.distributed as dist  # noqa: PLC0415  (lazy: the sampler itself does not need MPI)

        return int(dist.get_world_size()), int(dist.get_rank())
    except (ImportError, AttributeError) as err:
        raise ValueError(
            "DistributedSampler could not ask minidist.distributed for the world size and rank "
            f"({err}); pass num_replicas= and rank= explicitly."
        ) from err


class DistributedSampler:
    """Yields this rank's share of a (shuffled) permutation of ``range(N)``, as Python ints.

    Args:
        dataset: an int N, a tuple ``(x, y)`` (N = ``len(x)``), or anything with ``len()``.
        num_replicas: the number of data-parallel ranks R (default: ``dist.get_world_size()``).
        rank: this rank, in ``[0, R)`` (default: ``dist.get_rank()``).
        shuffle: if True the permutation is ``np.random.default_rng((seed, epoch)).permutation(N)``,
            the same on every rank; if False it is ``0, 1, ..., N-1``.
        seed: shared by all ranks; an int >= 0.
        drop_last: strided mode: cut the permutation to the largest multiple of R so all ranks have
            the same length (each sample used at most once). Global-batch mode: drop the trailing
            partial global batch.
        batch_size: None for strided mode, or the GLOBAL batch size B (summed over all ranks) for
            global-batch mode; then B >= R is required so that no rank gets an empty batch.

    Call ``set_epoch(epoch)`` at the start of every epoch, as in PyTorch: otherwise every epoch
    repeats the order of epoch 0.

    Resuming: ``position`` counts this rank's indices already handed out in the current epoch.
    Iterating starts there and advances it index by index, and a ``DataLoader`` takes one batch of
    indices at a time (:meth:`batches`: a slice, the position advanced by the batch), so inside the
    body of ``for x, y in loader`` the position is exactly the
    batches yielded so far (this one included) times the batch size: what ``checkpoint.save(...,
    sampler=sampler)`` must record. An epoch iterated to its end leaves ``position == len(self)``
    ("this epoch is done"), so a checkpoint saved between two epochs resumes at the next one, not at
    the start of the same one. A new iteration in the same process (no ``set_epoch``; also after a
    ``break`` out of the loop) starts the epoch over, as in PyTorch: only a position restored by
    ``load_state_dict`` is resumed; ``set_epoch`` to another epoch starts it at 0. ``state_dict()`` /
    ``load_state_dict()`` carry epoch and position, and the seed, shuffle setting and data set
    length, which must match on resume.

    Uneven shares: with ``drop_last=False`` and R not dividing N (strided), or a trailing partial
    global batch smaller than R (global-batch mode), some ranks may get one batch fewer than others.
    A training loop whose every step is a collective (DDP) would then hang, so use ``drop_last=True``
    there. In global-batch mode with R not dividing B the local pieces differ in size by one: the
    one-process loss is then ``sum over ranks of local_mean * local_size / B``, which equals DDP's
    plain average of the local means only when every local size is B / R.

    Global-batch mode is used as
    ``DataLoader(data, batch_size=sampler.local_batch_size, sampler=sampler, drop_last=False)``.

    Raises:
        TypeError: a non-int ``num_replicas``, ``rank``, ``seed`` or ``batch_size``.
        ValueError: ``num_replicas < 1``; ``rank`` outside ``[0, num_replicas)``; ``seed < 0``;
            ``batch_size < num_replicas``; or no ``num_replicas``/``rank`` and no usable
            ``minidist.distributed``.
    """

    def __init__(
        self,
        dataset: Any,
        num_replicas: int | None = None,
        rank: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        batch_size: int | None = None,
    ) -> None:
        self.dataset_len = dataset_length(dataset)
        if num_replicas is None or rank is None:
            world_size, world_rank = _default_world()
            num_replicas = world_size if num_replicas is None else num_replicas
            rank = world_rank if rank is None else rank
        self.num_replicas = check_int("num_replicas", num_replicas, 1)
        self.rank = check_int("rank", rank, 0)
        if self.rank >= self.num_replicas:
            raise ValueError(
                f"rank must be in [0, num_replicas) = [0, {self.num_replicas}), got {self.rank}."
            )
        self.seed = check_int("seed", seed, 0)  # default_rng((seed, epoch)) rejects negative seeds
        self.shuffle = bool(shuffle)
        self.drop_last = bool(drop_last)
        self.batch_size = None if batch_size is None else check_int("batch_size", batch_size, 1)
        if self.batch_size is not None and self.batch_size < self.num_replicas:
            raise ValueError(
                f"global batch_size={self.batch_size} is smaller than num_replicas={self.num_replicas}, "
                "so some ranks would get empty batches; use a global batch size >= the number of ranks."
            )
        self.epoch = 0
        self.position = 0
        # True from load_state_dict to the next iter(): only a restored position is resumed; any other
        # new iteration starts the epoch over (as in PyTorch), also one after a `break` out of the loop.
        self._restored = False

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch whose permutation the next ``iter()`` uses (an int >= 0); a new epoch starts
        at position 0."""
        epoch = check_int("epoch", epoch, 0)
        if epoch != self.epoch:
            self.position, self._restored = 0, False
        self.epoch = epoch

    def state_dict(self) -> dict[str, Any]:
        """``{"epoch", "position", "num_replicas", "rank", "batch_size", "seed", "shuffle",
        "dataset_len", "drop_last"}`` (JSON-serialisable). Seed, shuffle and dataset_len fix the
        permutation: a resumed sampler must have the same ones (``load_state_dict`` checks)."""
        return {
            "epoch": self.epoch,
            "position": self.position,
            "num_replicas": self.num_replicas,
            "rank": self.rank,
            "batch_size": self.batch_size,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "dataset_len": self.dataset_len,
            "drop_last": self.drop_last,  # with the layout, says how long the saved rank's epoch was
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at the saved epoch and position (checked by :meth:`resume_point`)."""
        self.epoch, self.position = self.resume_point(state)
        self._restored = True  # position == len(self): the saved epoch was done; iterating yields nothing

    def resume_point(self, state: dict[str, Any]) -> tuple[int, int]:
        """The ``(epoch, position)`` that ``load_state_dict(state)`` sets; changes nothing.

        Saved by another number of replicas or global batch, a finished epoch carries over in every mode;
        a position inside an epoch only in global-batch mode with the same global batch size (as the
        number of whole global batches consumed, which every rank agrees on).

        Raises ``ValueError`` if the state was saved with another ``seed``, ``shuffle`` or data set
        length (the permutation would differ: samples repeated or skipped; states saved before these
        were recorded are not checked), for a position beyond this rank's share, or for a position
        inside an epoch saved with another ``num_replicas`` in strided mode or another global batch size.
        """
        check_same_permutation(state, seed=self.seed, shuffle=self.shuffle, dataset_len=self.dataset_len)
        epoch, position = check_int("epoch", state["epoch"], 0), check_int("position", state["position"], 0)
        saved_r = check_int("num_replicas", state.get("num_replicas", self.num_replicas), 1)
        saved_b = None if state.get("batch_size") is None else check_int("batch_size", state["batch_size"], 1)
        if position and (saved_r, saved_b) != (self.num_replicas, self.batch_size):
            if saved_b is not None and saved_b < saved_r:
                raise ValueError(
                    f"the saved state has batch_size={saved_b} < num_replicas={saved_r} (corrupt?)."
                )
            drop, saved_rank = bool(state.get("drop_last", self.drop_last)), state.get("rank", 0)
            saved = DistributedSampler(
                self.dataset_len, saved_r, saved_rank, drop_last=drop, batch_size=saved_b
            )
            # A finished epoch (its partial last batch too; a save after the inner loop) carries over in
            # every mode: the next epoch starts at 0 whatever the layout.
            if position == len(saved):
                position = len(self)
            elif self.batch_size is None or saved_b != self.batch_size:
                raise ValueError(
                    f"cannot carry a sampler position saved with num_replicas={saved_r}, "
                    f"batch_size={saved_b} over to num_replicas={self.num_replicas}, "
                    f"batch_size={self.batch_size}; "
                    "use global-batch mode with the same global batch size, or resume at an epoch boundary."
                )
            else:
                position = position // saved.local_batch_size * self.local_batch_size
        if position > len(self):
            raise ValueError(
                f"sampler position {position} is beyond this rank's {len(self)} indices per epoch."
            )
        return epoch, position

    @property
    def local_batch_size(self) -> int:
        """This rank's share of a full global batch: ``len(np.array_split(range(B), R)[rank])``.

        Raises ``ValueError`` in strided mode (``batch_size=None``), where it is not defined.
        """
        if self.batch_size is None:
            raise ValueError(
                "local_batch_size is only defined in global-batch mode; "
                "create the DistributedSampler with batch_size=<global batch size>."
            )
        # array_split gives the first B % R ranks one extra sample each.
        base, extra = divmod(self.batch_size, self.num_replicas)
        return base + (1 if self.rank < extra else 0)

    def permutation(self) -> np.ndarray:
        """The order of all N samples this epoch, identical on every rank: int64 array of shape (N,)."""
        if self.shuffle:
            return np.random.default_rng((self.seed, self.epoch)).permutation(self.dataset_len)
        return np.arange(self.dataset_len)

    def indices(self) -> np.ndarray:
        """This rank's sample indices for the current epoch, in order: int64 array of shape (len(self),)."""
        perm = self.permutation()
        if self.batch_size is None:
            return self._strided(perm)
        return self._global_batches(perm)

    def _strided(self, perm: np.ndarray) -> np.ndarray:
        R = self.num_replicas
        if self.drop_last:
            perm = perm[: len(perm) // R * R]  # the remainder would give some ranks one sample more
        return perm[self.rank :: R]

    def _global_batches(self, perm: np.ndarray) -> np.ndarray:
        B, R = self.batch_size, self.num_replicas
        n_full = len(perm) // B
        # Every full global batch is split the same way, so this rank's piece is one column range
        # [start, stop) of the (n_full, B) matrix of full batches.
        start = (B // R) * self.rank + min(self.rank, B % R)
        stop = start + self.local_batch_size
        pieces = perm[: n_full * B].reshape(n_full, B)[:, start:stop].ravel()
        tail = perm[n_full * B :]
        if self.drop_last or len(tail) == 0:
            return pieces
        # The partial last global batch is split in array_split order too (maybe empty on some ranks).
        return np.concatenate([pieces, np.array_split(tail, R)[self.rank]])

    def __len__(self) -> int:
        """The number of indices this rank yields per epoch (the same for every epoch).

        Computed by arithmetic, without drawing the permutation; the tests check it against
        ``len(self.indices())``.
        """
        N, R = self.dataset_len, self.num_replicas
        if self.batch_size is None:
            return N // R if self.drop_last else N // R + (1 if self.rank < N % R else 0)
        n_full, tail = divmod(N, self.batch_size)
        tail_piece = 0 if self.drop_last else tail // R + (1 if self.rank < tail % R else 0)
        return n_full * self.local_batch_size + tail_piece

    def __iter__(self) -> Iterator[int]:
        start, self._restored = (self.position if self._restored else 0), False
        # Advance the position as each index is handed out (not when the epoch is drawn): whoever pulls
        # indices one by one then leaves the true progress here for a checkpoint to save.
        for k, index in enumerate(self.indices()[start:].tolist()):  # tolist(): Python ints
            self.position = start + k + 1
            yield index  # at the end position stays len(self): a save now resumes at the next epoch

    def batches(self, batch_size: int) -> Iterator[np.ndarray]:
        """This rank's indices of the epoch in runs of ``batch_size`` (int64 arrays; the last may be
        shorter): what ``DataLoader`` asks for, the same order as ``iter(self)``.

        Each run is a slice of :meth:`indices`, handed out at once instead of index by index (one Python
        ``yield`` per sample cost 20-50 us per batch of 128), and ``position`` advances by
        the run's length just before it is yielded, so inside the loader's loop it is still exactly
        the batches handed out so far, as ``__iter__`` leaves it; resuming works alike (a restored
        position is the start, any other new iteration starts the epoch over).
        """
        batch_size = check_int("batch_size", batch_size, 1)
        start, self._restored = (self.position if self._restored else 0), False
        order = self.indices()
        for begin in range(start, len(order), batch_size):
            run = order[begin : begin + batch_size]
            self.position = begin + len(run)
            yield run
