"""DataLoader: cut an in-memory data set into mini-batches, in an order chosen by a sampler.

The whole data set lives in host memory as NumPy arrays, so a "loader" is only index
bookkeeping: decide an order of sample indices, cut it into runs of ``batch_size``, and gather
``x[idx], y[idx]`` for each run. There are no worker processes; the training loop turns each
batch into tensors (and moves it to the GPU if there is one).

The order comes from one of three places:

* ``sampler`` given: its indices, in its order (e.g. a :class:`DistributedSampler`, which hands
  each data-parallel rank its own share).
* ``shuffle=True``: ``np.random.default_rng((seed, epoch)).permutation(N)``.
* otherwise: ``0, 1, ..., N-1``.

The shuffled order depends only on ``(seed, epoch)``, never on how many batches were drawn
before, so a run resumed from a checkpoint at epoch e sees exactly the batches of an uninterrupted
run. The price is that you must call ``set_epoch(epoch)`` each epoch to get a new order.

Resuming mid-epoch: the loader takes its indices from the sampler one batch at a time, never the
whole epoch up front, so a :class:`DistributedSampler`'s ``position`` always equals the samples of
the batches yielded so far. ``checkpoint.save(..., sampler=sampler)`` (or ``sampler=loader``: the
loader hands over its sampler's state) inside the loop therefore records the real progress, and
after ``checkpoint.load`` the same loop continues with the next batch (PyTorch keeps this progress
in a separate ``StatefulDataLoader`` of torchdata; here the sampler carries it).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from minidist.data.checks import check_int


class DataLoader:
    """Iterate over mini-batches ``(x[idx], y[idx])`` of a tuple of equal-length arrays.

    Args:
        dataset: a tuple (or list) of NumPy arrays whose first dimensions all equal N, e.g.
            ``(x, y)`` with x of shape (N, features) and y of shape (N,).
        batch_size: samples per batch, a positive int. With a global-batch
            :class:`DistributedSampler` pass ``sampler.local_batch_size``.
        shuffle: draw a new order each epoch from ``np.random.default_rng((seed, epoch))``.
            Must be False when ``sampler`` is given (the sampler decides the order).
        sampler: an iterable of int indices with ``len()``; if it has ``set_epoch`` the loader's
            ``set_epoch`` forwards to it, and if it has ``batches(batch_size)`` (as
            :class:`DistributedSampler` does) the loader takes each batch's index array from it,
            unless a subclass changed ``__iter__`` without ``batches`` (then ``iter(sampler)`` wins).
        drop_last: skip the last batch when it has fewer than ``batch_size`` samples.
        seed: the shuffle seed, an int >= 0.

    Iterating yields one tuple per batch, with one array per dataset array: ``dataset[i][idx]`` for the
    batch's indices ``idx`` (first dimension ``batch_size``, or less for a last partial batch), with the
    dtypes of the dataset arrays.

    Raises:
        TypeError: ``dataset`` is not a tuple/list of NumPy arrays; ``batch_size`` or ``seed`` is
            not an int.
        ValueError: an array is 0-d or the arrays have different lengths; ``batch_size < 1``;
            ``seed < 0``; or both ``shuffle=True`` and a ``sampler``.
    """

    def __init__(
        self,
        dataset: tuple[np.ndarray, ...] | list[np.ndarray],
        batch_size: int = 1,
        shuffle: bool = False,
        sampler: Iterable[int] | None = None,
        drop_last: bool = False,
        seed: int = 0,
    ) -> None:
        if not isinstance(dataset, (tuple, list)) or len(dataset) == 0:
            raise TypeError(
                f"DataLoader expects a non-empty tuple of NumPy arrays such as (x, y), got "
                f"{type(dataset).__name__}; wrap a single array as (x,)."
            )
        for i, array in enumerate(dataset):
            if not isinstance(array, np.ndarray):
                raise TypeError(
                    f"dataset[{i}] is a {type(array).__name__}, not a numpy.ndarray; "
                    "convert it with np.asarray (a Tensor with .numpy())."
                )
            if array.ndim == 0:
                raise ValueError(f"dataset[{i}] is a 0-d array; each array needs a first (sample) dimension.")
        lengths = [len(array) for array in dataset]
        if len(set(lengths)) != 1:
            raise ValueError(
                f"all dataset arrays must have the same number of samples (first dimension), got "
                f"lengths {lengths}; every x row needs exactly one y."
            )
        if sampler is not None and shuffle:
            raise ValueError(
                "shuffle=True and a sampler are mutually exclusive: the sampler already decides the "
                "order; pass shuffle=False (and shuffle=True to the sampler instead)."
            )
        self.dataset = tuple(dataset)
        self.batch_size = check_int("batch_size", batch_size, 1)
        self.shuffle = bool(shuffle)
        self.sampler = sampler
        self.drop_last = bool(drop_last)
        self.seed = check_int("seed", seed, 0)  # np.random.default_rng rejects negative seeds
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch (an int >= 0) for the shuffled order; forwards to ``sampler.set_epoch`` if any."""
        self.epoch = check_int("epoch", epoch, 0)
        if self.sampler is not None and hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)

    def state_dict(self) -> dict[str, Any]:
        """The sampler's ``state_dict()`` (epoch and position): what ``checkpoint.save(..., sampler=loader)``
        stores. Raises ``TypeError`` if the loader has no sampler with a state (use a DistributedSampler)."""
        return self._stateful_sampler().state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume the sampler at the saved epoch and position (``DistributedSampler.load_state_dict``)."""
        self._stateful_sampler().load_state_dict(state)

    def resume_point(self, state: dict[str, Any]) -> tuple[int, int]:
        """The sampler's ``resume_point(state)``: checks a saved state without changing anything."""
        return self._stateful_sampler().resume_point(state)

    def _stateful_sampler(self) -> Any:
        if not hasattr(self.sampler, "state_dict"):
            raise TypeError(
                "this DataLoader has no sampler that records its progress (shuffle=True or a plain list), "
                "so a checkpoint cannot resume it; give it a DistributedSampler (num_replicas=1, rank=0 in "
                "one process) and pass that, or the loader, as checkpoint.save(..., sampler=...)."
            )
        return self.sampler

    def _pull_batches(self, indices: Iterator[int]) -> Iterator[np.ndarray]:
        """Index arrays of up to ``batch_size`` from ``indices``, each pulled only when it is needed."""
        while True:
            yield np.fromiter(itertools.islice(indices, self.batch_size), dtype=np.int64)

    def _order(self) -> np.ndarray:
        """The sample indices of this epoch without a sampler, in the order they will be batched."""
        n = len(self.dataset[0])
        if self.shuffle:
            return np.random.default_rng((self.seed, self.epoch)).permutation(n)
        return np.arange(n)

    def __len__(self) -> int:
        """The number of batches one pass yields."""
        n = len(self.sampler) if self.sampler is not None else len(self.dataset[0])
        if self.drop_last:
            return n // self.batch_size
        return -(-n // self.batch_size)  # ceiling division: the partial last batch counts

    def __iter__(self) -> Iterator[tuple[np.ndarray, ...]]:
        if self.sampler is None:
            order = self._order()
            batches = (
                order[start : start + self.batch_size] for start in range(0, len(order), self.batch_size)
            )
        elif _batches_agree_with_iter(self.sampler):
            # A DistributedSampler hands out a batch's indices as one array slice, advancing its position
            # by the batch: a checkpoint saved in the loop body records exactly the batches handed out.
            batches = self.sampler.batches(self.batch_size)
        else:
            # Any other sampler (e.g. a list): one batch of indices at a time, never the whole epoch.
            batches = self._pull_batches(iter(self.sampler))
        for idx in batches:
            if len(idx) == 0 or (self.drop_last and len(idx) < self.batch_size):
                return
            yield tuple(array[idx] for array in self.dataset)


def _batches_agree_with_iter(sampler: object) -> bool:
    """Whether ``sampler.batches(b)`` yields what batching ``iter(sampler)`` would: the same class in the
    sampler's MRO gives it both. A subclass that overrides only ``__iter__`` (to filter, say) is
    iterated index by index, as torch's DataLoader always does, so its own order is what you get."""
    mro = type(sampler).__mro__
    owner_of_batches = next((c for c in mro if "batches" in c.__dict__), None)
    owner_of_iter = next((c for c in mro if "__iter__" in c.__dict__), None)
    return owner_of_batches is not None and owner_of_batches is owner_of_iter
