"""The network in the performance model: nodes of several ranks, fast inside a node, slow between nodes.

:mod:`minidist_tools.perfmodel.step` prices every message alike. Across machines that is wrong by orders of
magnitude: ranks of one node talk through shared memory (tens of GB/s), nodes through one network link
each (0.1-10 Gbit/s). This module splits the alpha-beta model (Hockney 1994) into two levels, as
Thakur, Rabenseifner & Gropp do for clusters of SMP nodes (IJHPCA 2005, §5), and prices with it:

* **Flat ring** over ``n = nodes * ranks_per_node`` ranks placed in blocks (ranks ``0..R-1`` on node 0,
  ...): ``2 (n - 1)`` steps, each moving one ``N / n`` chunk along every edge of the ring at once
  (Patarasuk & Yuan, JPDC 2009). Exactly one edge leaves each node, so every step waits for a network
  link: ``2 (n - 1) (alpha_e + N / n beta_e) + (n - 1) / n N gamma`` once the group spans nodes.
* **Hierarchical** (Horovod, Sergeev & Del Balso 2018, §4; ``minidist.distributed.algorithms.hierarchical``):
  a binomial-tree reduce to each node's leader and a broadcast back, ``ceil(log2 R)`` steps each of the
  whole ``N`` over shared memory, around a ring of the ``nodes`` leaders over the links. Fewer bytes and
  far fewer slow latencies cross the links; the price is the shared-memory steps.
* **Compression** (DDP communication hooks, :mod:`minidist_tools.perfmodel.compression`): the bytes divided
  by a compression ratio, more all-reduce rounds, plus the compute to compress.
* **A DDP step** with gradient buckets that all-reduce during backward (Li et al., "PyTorch
  Distributed", VLDB 2020, §3.2) or after it.
* **Calibration**: the link's ``alpha_e, beta_e`` fitted to all-reduce times measured across nodes, and
  the model's relative error at every measured point.

Pure arithmetic; units are seconds and bytes throughout.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from minidist_tools.perfmodel.compression import (  # noqa: F401  (re-exported: the network model's inputs)
    Compression,
    fp16_compression,
    powersgd_compression,
    powersgd_values,
)
from minidist_tools.perfmodel.step import (
    Hardware,
    Prediction,
    Workload,
    _check_positive_int,
    fit_alpha_beta,
    predict,
)


@dataclass(frozen=True)
class Network:
    """Two levels of links. ``intra_alpha`` / ``intra_beta``: seconds per message / per byte between two
    ranks of one node; ``inter_alpha`` / ``inter_beta``: the same between two nodes (one link per node,
    each direction at that speed); ``gamma``: seconds per byte to add received data."""

    intra_alpha: float
    intra_beta: float
    inter_alpha: float
    inter_beta: float
    gamma: float = 0.0
    name: str = ""

    @classmethod
    def from_hardware(
        cls, hardware: Hardware, inter_alpha: float, inter_beta: float, name: str = ""
    ) -> Network:
        """The one-level ``hardware`` (calibrated on one node) inside nodes, the given link between them."""
        return cls(hardware.alpha, hardware.beta, inter_alpha, inter_beta, hardware.gamma, name)


def link_beta(rate: str | float) -> float:
    """Seconds per byte of a link of ``rate``: bits/s as a number, or tc's syntax ("100mbit", "1gbit",
    "10gbit"; SI prefixes, as tc(8) reads them). Raises ``ValueError`` for anything else."""
    if isinstance(rate, (int, float)):
        bits = float(rate)
    else:
        match = re.fullmatch(r"\s*([0-9.]+)\s*([kmgt]?)bit\s*", str(rate).lower())
        if not match:
            raise ValueError(
                f"link rate {rate!r}: give bits/s or tc's form like '100mbit', '1gbit', '10gbit'"
            )
        bits = float(match.group(1)) * 1000 ** " kmgt".index(match.group(2) or " ")
    if not bits > 0:
        raise ValueError(f"link rate must be positive, got {rate!r}")
    return 8.0 / bits


def _tree_steps(ranks: int) -> int:
    return math.ceil(math.log2(ranks))  # binomial tree: the number of ranks holding data doubles each step


def flat_all_reduce_time(nbytes: float, nodes: int, ranks_per_node: int, network: Network) -> float:
    """Seconds for a ring all-reduce of ``nbytes`` over ``nodes * ranks_per_node`` ranks in blocks.

    Each of the ``2 (n - 1)`` steps lasts as long as its slowest edge: a shared-memory edge on one node,
    a network link as soon as there are two nodes. On one node this is ``perfmodel.ring_all_reduce_time``
    with the intra-node constants. Raises ``ValueError`` for sizes < 1."""
    _check_positive_int(nodes, "nodes")
    _check_positive_int(ranks_per_node, "ranks_per_node")
    n = nodes * ranks_per_node
    if n == 1:
        return 0.0
    chunk = nbytes / n
    step = network.intra_alpha + chunk * network.intra_beta if ranks_per_node > 1 else 0.0
    if nodes > 1:
        step = max(step, network.inter_alpha + chunk * network.inter_beta)
    return 2 * (n - 1) * step + (n - 1) / n * nbytes * network.gamma


def hierarchical_all_reduce_time(nbytes: float, nodes: int, ranks_per_node: int, network: Network) -> float:
    """Seconds for reduce in each node, ring across the ``nodes`` leaders, broadcast in each node:

    ``2 ceil(log2 R) (alpha_i + N beta_i) + ceil(log2 R) N gamma + 2 (k-1) (alpha_e + N/k beta_e) +
    (k-1)/k N gamma``. With one node or one rank per node there is no hierarchy and minidist runs the
    flat algorithm: :func:`flat_all_reduce_time`. Raises ``ValueError`` for sizes < 1."""
    if nodes == 1 or ranks_per_node == 1:
        return flat_all_reduce_time(nbytes, nodes, ranks_per_node, network)
    steps = _tree_steps(ranks_per_node)
    inside = 2 * steps * (network.intra_alpha + nbytes * network.intra_beta) + steps * nbytes * network.gamma
    return inside + flat_all_reduce_time(nbytes, nodes, 1, network)


def recursive_doubling_time(nbytes: float, nodes: int, ranks_per_node: int, network: Network) -> float:
    """Seconds for recursive doubling over ``n = nodes * ranks_per_node`` ranks (a power of two; Thakur
    et al. 2005, §4.1): ``log2 n`` exchanges of the whole ``N``, with partners ``1, 2, 4, ...`` ranks
    apart. Partners ``R`` or more apart sit on different nodes, and then all ``R`` ranks of a node send
    through its one link at once: ``alpha_e + R N beta_e`` per such step, ``alpha_i + N beta_i`` for the
    others; plus ``log2(n) N gamma``. Raises ``ValueError`` if ``n`` is not a power of two."""
    _check_positive_int(nodes, "nodes")
    _check_positive_int(ranks_per_node, "ranks_per_node")
    n = nodes * ranks_per_node
    if n & (n - 1):
        raise ValueError(f"recursive doubling is modelled for a power-of-two group size, got {n} ranks")
    time, distance = 0.0, 1
    while distance < n:
        if distance < ranks_per_node:
            time += network.intra_alpha + nbytes * network.intra_beta
        else:
            time += network.inter_alpha + ranks_per_node * nbytes * network.inter_beta
        time += nbytes * network.gamma
        distance *= 2
    return time


ALGORITHMS = ("ring", "hierarchical", "recursive_doubling")


def all_reduce_time(
    nbytes: float, nodes: int, ranks_per_node: int, network: Network, algorithm: str = "ring"
) -> float:
    """:func:`flat_all_reduce_time` (``"ring"``), :func:`hierarchical_all_reduce_time` or
    :func:`recursive_doubling_time`: pass what ``dist.all_reduce(algorithm="auto")`` runs for the size
    (``minidist.distributed.tuning``) to model minidist as it is."""
    if algorithm == "ring":
        return flat_all_reduce_time(nbytes, nodes, ranks_per_node, network)
    if algorithm == "hierarchical":
        return hierarchical_all_reduce_time(nbytes, nodes, ranks_per_node, network)
    if algorithm == "recursive_doubling":
        return recursive_doubling_time(nbytes, nodes, ranks_per_node, network)
    raise ValueError(f"unknown all-reduce algorithm {algorithm!r}; choose one of {ALGORITHMS}")


def inter_node_bytes(nbytes: float, nodes: int, ranks_per_node: int, algorithm: str = "ring") -> float:
    """Bytes one all-reduce of ``nbytes`` sends out of each node over its link (and receives): one ring
    edge per node carries ``2 (r - 1) / r N`` for a ring of ``r`` = all ranks (``"ring"``) or the
    ``nodes`` leaders (``"hierarchical"``); 0 on one node."""
    _check_positive_int(nodes, "nodes")
    _check_positive_int(ranks_per_node, "ranks_per_node")
    if algorithm not in ("ring", "hierarchical"):
        raise ValueError(f"unknown all-reduce algorithm {algorithm!r}; choose 'ring' or 'hierarchical'")
    if nodes == 1:
        return 0.0
    ring = nodes * ranks_per_node if algorithm == "ring" else nodes
    return 2 * (ring - 1) / ring * nbytes


# --- one DDP step ----------------------------------------------------------------------------------------


def backward_with_buckets(
    backward: float, bucket_bytes: Sequence[float], bucket_seconds: Sequence[float]
) -> float:
    """Seconds from the start of backward until the last bucket is all-reduced, with overlap.

    Bucket ``i`` is ready when backward has produced its gradients, at ``backward * (bytes of buckets
    0..i) / all bytes`` (backward's work is proportional to the parameters it reaches, for dense layers);
    one all-reduce at a time, each as soon as its bucket is ready and the previous one done (DDP's
    communication thread). At least ``backward``; one bucket: ``backward + its seconds`` (no overlap)."""
    total = float(sum(bucket_bytes))
    done, made = 0.0, 0.0
    for nbytes, seconds in zip(bucket_bytes, bucket_seconds, strict=True):
        made += nbytes
        ready = backward * made / total if total > 0 else backward
        done = max(done, ready) + seconds
    return max(done, backward)


def predict_nodes(
    workload: Workload,
    flops: float,
    network: Network,
    nodes: int,
    ranks_per_node: int = 1,
    overlap: bool = False,
    bucket_bytes: Sequence[float] | None = None,
    algorithm: str = "ring",
    compression: Compression | None = None,
) -> Prediction:
    """Predict one DDP step of ``workload`` (strong scaling: the global batch split over all ranks) on
    ``nodes`` x ``ranks_per_node`` ranks of ``flops`` FLOP/s each (measured with all ranks running).

    ``bucket_bytes``: the gradient buckets in the order DDP all-reduces them (default: one bucket of
    all gradients); ``overlap``: all-reduce each during backward (:func:`backward_with_buckets`; forward
    is 1/3 of the compute, backward 2/3, Kaplan et al. 2020 §2.1) or all after backward. ``algorithm``:
    one of :data:`ALGORITHMS` for every bucket (see :func:`all_reduce_time`); ``compression``: a hook's
    effect (default none). ``dp_comm`` is the communication and compression time, ``dp_comm_exposed``
    what of it the step waits for.
    On one node, one bucket and no compression this is ``perfmodel.predict(dp=ranks_per_node)`` with the
    intra-node constants. Raises ``ValueError`` for sizes < 1 or a batch smaller than the ranks."""
    _check_positive_int(nodes, "nodes")
    _check_positive_int(ranks_per_node, "ranks_per_node")
    n = nodes * ranks_per_node
    one_level = Hardware(flops, network.intra_alpha, network.intra_beta, network.gamma)
    base = predict(workload, one_level, dp=n)  # checks the batch; its compute term is ours
    comp = compression or Compression()
    grad_bytes = workload.params * workload.bytes_per_value
    buckets = list(bucket_bytes) if bucket_bytes is not None else [grad_bytes]
    per_bucket = [0.0] * len(buckets)  # one rank: DDP sends nothing and compresses nothing
    for i, nbytes in enumerate(buckets if n > 1 else []):
        # The time is affine in the bytes (while one kind of link stays the slowest), so rounds of equal
        # size sum to what PowerSGD's unequal P and Q rounds take.
        sent = nbytes / comp.ratio / comp.rounds
        ar = comp.rounds * all_reduce_time(sent, nodes, ranks_per_node, network, algorithm)
        per_bucket[i] = ar + comp.seconds * nbytes / sum(buckets)
    comm = sum(per_bucket)
    backward = 2.0 / 3.0 * base.compute
    if overlap:
        step = base.compute - backward + backward_with_buckets(backward, buckets, per_bucket)
    else:
        step = base.compute + comm
    single = workload.flops_per_step / flops
    return Prediction(
        devices=n, compute=base.compute, bubble=0.0, dp_comm=comm, dp_comm_exposed=step - base.compute,
        tp_comm=0.0, pp_comm=0.0, step=step, speedup=single / step, efficiency=single / step / n,
    )  # fmt: skip


# --- calibration -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Calibration:
    """A link fitted to measured all-reduces: ``alpha``, ``beta`` and, per measured point, its ``nbytes``,
    ``measured`` and ``predicted`` seconds. ``errors``: ``predicted / measured - 1`` per point."""

    alpha: float
    beta: float
    nbytes: tuple[float, ...]
    measured: tuple[float, ...]
    predicted: tuple[float, ...]

    @property
    def errors(self) -> tuple[float, ...]:
        return tuple(relative_errors(self.predicted, self.measured))

    @property
    def max_error(self) -> float:
        """The largest ``|predicted / measured - 1|`` over the points."""
        return max(abs(e) for e in self.errors)


def relative_errors(predicted: Sequence[float], measured: Sequence[float]) -> list[float]:
    """``predicted / measured - 1`` per point (+0.1: the model says 10 % slower than measured)."""
    if len(predicted) != len(measured):
        raise ValueError(f"{len(predicted)} predictions for {len(measured)} measurements")
    return [p / m - 1.0 for p, m in zip(predicted, measured)]


def calibrate_link(
    nbytes: Sequence[float], seconds: Sequence[float], nodes: int = 2, gamma: float = 0.0
) -> Calibration:
    """Fit a link's ``(alpha_e, beta_e)`` to ring all-reduce times measured on ``nodes`` nodes of one
    rank each (so that every step crosses a link). The ring's time
    ``2 (k-1) (alpha + N/k beta) + (k-1)/k N gamma`` makes ``(t - (k-1)/k N gamma) / (2 (k-1))`` one
    message of ``N / k`` bytes, fitted as ``perfmodel.fit_alpha_beta`` fits ping-pongs (relative least
    squares). Raises ``ValueError`` for ``nodes < 2`` or fewer than two points."""
    _check_positive_int(nodes, "nodes")
    if nodes < 2:
        raise ValueError("calibrate_link needs all-reduces across at least 2 nodes (1 rank each)")
    size, t = np.asarray(nbytes, dtype=float), np.asarray(seconds, dtype=float)
    k = nodes
    alpha, beta = fit_alpha_beta(size / k, (t - (k - 1) / k * size * gamma) / (2 * (k - 1)))
    net = Network(0.0, 0.0, alpha, beta, gamma)
    predicted = tuple(flat_all_reduce_time(float(s), k, 1, net) for s in size)
    return Calibration(alpha, beta, tuple(size.tolist()), tuple(t.tolist()), predicted)
