"""Randomness inside tensor-parallel regions: the RNG tracker (Shoeybi et al. 2019, §3, last paragraph).

Dropout must behave differently on the two kinds of activations of a tensor-parallel model:

* **Replicated** activations (the input of a column-parallel layer, the output of a row-parallel
  one) are the same tensor on every tp rank. Their dropout mask must be the same on every rank too,
  or the replicas would stop being replicas. They draw from minidist's default generator, which
  ``md.manual_seed(seed)`` puts in the same state on every rank (as on a single device).
* **Sharded** activations (between a column- and a row-parallel layer) are different slices of one
  tensor. Each slice needs its own, independent mask: the same mask on every slice would correlate
  the dropped units of different slices. They draw from a second generator, seeded differently per
  tp rank, that the tracker keeps aside: ``with get_rng_tracker().fork(): ...`` swaps it in for the
  duration of the block and keeps its advanced state afterwards. Dropout does that by itself for a
  tensor the tp layers tagged as a shard (``Tensor.sharded_over``, passed on through every op), so
  a plain ``nn.Dropout`` after ``ColumnParallelLinear(gather_output=False)`` is right too: this
  module registers the fork with ``minidist.ops.dropout`` as the stream for shards.

Forking keeps the default generator untouched, so everything that draws from it (weight init, the
replicated dropouts) still draws exactly what a single device would. Megatron seeds the tracked
generator with ``seed + 2718 + tp_rank``; so does :func:`model_parallel_manual_seed`.

That needs the same default generator on every rank of a tp group, which a per-rank seed breaks: so
every tensor-parallel layer's construction ends its argument agreement (``checks/``) with
:func:`share_generator`, and the ranks adopt the group's first rank's state.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator

import numpy as np

from minidist import random
from minidist.distributed.comm import Communicator
from minidist.distributed.safety import agreement
from minidist.distributed.world import group_or_world
from minidist.ops.dropout import set_sharded_stream

MODEL_PARALLEL_RNG = "model-parallel-rng"
TP_SEED_OFFSET = 2718  # Megatron-LM's offset: keeps the tracked streams apart from the default one


class RNGStatesTracker:
    """Named generator states that can be swapped in for minidist's default generator.

    The states are plain dicts (NumPy ``bit_generator.state``, JSON-serialisable): the process-wide
    tracker is registered with ``minidist.random`` as ``"tp_rng"``, so that checkpoints and activation
    recomputation save and restore it (:meth:`get_states`, :meth:`set_states`) with the default generator.
    """

    def __init__(self) -> None:
        self._states: dict[str, dict] = {}
        self._forked: str | None = None  # the name being drawn from inside fork(), if any

    def reset(self) -> None:
        """Forget every named state."""
        self._states = {}

    def add(self, name: str, seed: int) -> None:
        """Start a generator named ``name`` from ``seed``. Raises ``ValueError`` if the name exists."""
        if name in self._states:
            raise ValueError(f"RNG tracker already has a generator named {name!r}; call reset() first")
        self._states[name] = np.random.default_rng(int(seed)).bit_generator.state

    def get_states(self) -> dict[str, dict]:
        """A deep copy of every named state: ``{name: bit_generator.state}``."""
        return copy.deepcopy(self._states)

    def set_states(self, states: dict[str, dict]) -> None:
        """Replace every named state with ``states`` (from :meth:`get_states`)."""
        self._states = copy.deepcopy(dict(states))

    @contextlib.contextmanager
    def fork(self, name: str = MODEL_PARALLEL_RNG) -> Iterator[None]:
        """Inside the block, minidist's default generator draws from the tracked state ``name``.

        On exit the tracked state keeps what was drawn and the default generator is back exactly
        where it was. Inside a fork of the same name, a nested one changes nothing (dropout forks by
        itself for shards, also inside a caller's fork). Raises ``ValueError`` if ``name`` was never
        added (seed it first with :func:`model_parallel_manual_seed`).
        """
        if self._forked == name:  # already drawing from it: swapping again would replay its numbers
            yield
            return
        if name not in self._states:
            raise ValueError(
                f"the RNG tracker has no generator named {name!r}: call "
                "minidist.parallel.tensor_parallel.model_parallel_manual_seed(seed, group=mesh.tp_group) "
                "on every rank before using dropout on tensor-parallel (sharded) activations, such as "
                "nn.Dropout after ColumnParallelLinear(gather_output=False)"
            )
        default_state, outer = random.get_rng_state(), self._forked
        random.set_rng_state(self._states[name])
        self._forked = name
        try:
            yield
        finally:
            self._forked = outer
            self._states[name] = random.get_rng_state()
            random.set_rng_state(default_state)


_TRACKER = RNGStatesTracker()
# Checkpoints and activation recomputation save and restore it with the default generator.
random.register("tp_rng", _TRACKER)
# Dropout on a tensor-parallel shard (Tensor.sharded_over) draws from the per-rank stream.
set_sharded_stream(_TRACKER.fork)


def get_rng_tracker() -> RNGStatesTracker:
    """The process-wide tracker (one per rank, like minidist's default generator)."""
    return _TRACKER


def model_parallel_manual_seed(seed: int, group: Communicator | None = None) -> None:
    """Seed both generators of this rank for tensor parallelism over ``group`` (default: the world).

    The default generator gets ``seed`` on every rank (``md.manual_seed(seed)``: replicated weights
    and replicated dropout masks agree across ranks and with a single device); the tracker's
    ``"model-parallel-rng"`` gets ``seed + 2718 + group.rank`` (a different stream per tp rank, for
    sharded dropout). Raises ``TypeError`` for a non-int seed.
    """
    random.manual_seed(seed)
    _TRACKER.reset()
    _TRACKER.add(MODEL_PARALLEL_RNG, seed + TP_SEED_OFFSET + group_or_world(group).rank)


def share_generator(group: Communicator) -> bool:
    """Make minidist's default generator the same on every rank of ``group``: the first rank's.

    Collective (one all-gather of the ~200-byte generator state, ``agreement.all_gather_json``). A
    tensor-parallel layer is one layer: its shards must be slices of *one* full weight, its replicated
    parameters (a row-parallel bias) equal on every rank, and the dropout masks of replicated
    activations too. All of that is drawn from the default generator, so a per-rank seed
    (``md.manual_seed(rank)``, a common data-parallel habit) would silently build a different layer on
    each rank. As DDP broadcasts rank 0's weights, the layer adopts the group's first rank's generator
    state before drawing: the model is then exactly the one that rank would build on one device, and
    the ranks keep drawing alike afterwards. Ranks of *other* tp groups (other data-parallel
    replicas) keep their own streams. Plain layers built *before* the first tensor-parallel layer
    drew from the ranks' own generators and may still differ: seed alike within a tp group, or build
    the tensor-parallel layers first. Returns True if this rank's state was replaced.
    """
    if group.size == 1:
        return False
    states = agreement.all_gather_json(random.get_rng_state(), group)
    if all(state == states[0] for state in states):
        return False
    random.set_rng_state(states[0])
    return True
