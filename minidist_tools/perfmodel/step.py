"""A performance model of one training step: why 256 GPUs give about 200x, not 256x.

The model adds up the few costs the lessons derive, each from a published formula:

* **Compute.** Training costs about ``6 * params * tokens`` FLOPs per step: 2 per parameter per token
  for the forward multiply-adds and 4 for backward, which computes both the input and the weight
  gradient (Kaplan et al., "Scaling Laws for Neural Language Models", 2020, §2.1). An MLP sees one
  "token" per sample. Divided over ``dp * tp * pp`` devices of ``flops`` FLOP/s each.
* **Pipeline bubble.** With ``p`` stages and ``m`` microbatches a GPipe or 1F1B step takes
  ``m + p - 1`` microbatch slots where ``m`` would do: the idle fraction is ``(p - 1) / (m + p - 1)``
  (Huang et al., "GPipe", NeurIPS 2019, §2.3; Narayanan et al., "PipeDream-Flush / 1F1B", 2021).
* **Data-parallel gradients.** One ring all-reduce of the gradients of the ``params / (tp * pp)``
  parameters each device holds: ``2 (n - 1) alpha + 2 (n - 1) / n * N * beta (+ (n - 1) / n * N * gamma``
  to add the numbers) for N bytes on n ranks (Patarasuk & Yuan, "Bandwidth optimal all-reduce
  algorithms for clusters of workstations", JPDC 2009; Thakur et al., IJHPCA 2005, §2). A fraction
  ``overlap`` of it can hide behind backward (Li et al., "PyTorch Distributed", VLDB 2020, §3.2).
* **Tensor parallelism.** Each transformer layer all-reduces its activations (``tokens x hidden``)
  twice in forward (after attention and after the MLP) and twice in backward, over the tp group
  (Shoeybi et al., "Megatron-LM", 2019, §3); a column+row pair of an MLP once each way. These sit on the
  critical path: nothing hides them.
* **Pipeline messages.** Each microbatch's activations cross each stage boundary once forward and its
  gradient once backward: ``2 (m + p - 1)`` point-to-point messages on the critical path.

Costs follow the alpha-beta(-gamma) model: a message of N bytes costs ``alpha + N * beta`` seconds
(Hockney 1994). :func:`measure_flops` and :func:`measure_alpha_beta` calibrate it on this machine
(a timed matmul, a ping-pong between pairs of ranks); ``benchmarks/perfmodel_check.py`` compares its
predictions with measured DDP steps at 1, 2 and 4 ranks.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Hardware:
    """One device and its network. ``flops``: sustained FLOP/s of one device (not the datasheet peak);
    ``alpha``: seconds per message; ``beta``: seconds per byte (1 / bandwidth); ``gamma``: seconds per
    byte to reduce (add) received data, 0 where the reduction is free next to the transfer (GPUs)."""

    flops: float
    alpha: float
    beta: float
    gamma: float = 0.0
    name: str = ""


@dataclass(frozen=True)
class Workload:
    """What one training step computes. ``params``: parameter count; ``global_batch``: samples per
    step; ``tokens_per_sample``: sequence length (1 for an MLP); ``layers`` and ``hidden``: for the
    tensor/pipeline-parallel activation messages; ``bytes_per_value``: 4 for float32, 2 for bf16;
    ``tp_allreduces_per_layer``: 2 for a transformer layer (Megatron-LM §3), 1 for an MLP pair."""

    params: float
    global_batch: int
    tokens_per_sample: int = 1
    layers: int = 1
    hidden: int = 1
    bytes_per_value: int = 4
    tp_allreduces_per_layer: int = 2

    @property
    def flops_per_step(self) -> float:
        """``6 * params * tokens`` (Kaplan et al. 2020, §2.1): the FLOPs of forward plus backward."""
        return 6.0 * self.params * self.global_batch * self.tokens_per_sample


@dataclass(frozen=True)
class Prediction:
    """Seconds per step and its parts, for one (dp, tp, pp, microbatches) layout. ``step`` =
    ``compute + bubble + tp_comm + pp_comm + exposed dp_comm``; ``speedup`` is against one device
    (``step`` of dp=tp=pp=1) and ``efficiency = speedup / devices``."""

    devices: int
    compute: float
    bubble: float
    dp_comm: float
    dp_comm_exposed: float
    tp_comm: float
    pp_comm: float
    step: float
    speedup: float
    efficiency: float

    @property
    def bubble_fraction(self) -> float:
        """Share of the pipeline time the devices sit idle in the bubble."""
        return self.bubble / (self.compute + self.bubble) if self.compute + self.bubble > 0 else 0.0


def ring_all_reduce_time(nbytes: float, n: int, alpha: float, beta: float, gamma: float = 0.0) -> float:
    """Seconds for a ring all-reduce of ``nbytes`` on ``n`` ranks (Patarasuk & Yuan 2009):
    ``2 (n-1) alpha + 2 (n-1)/n N beta + (n-1)/n N gamma``: reduce-scatter then all-gather, n-1 steps
    each, every step moving one N/n chunk. 0 for one rank. Raises ``ValueError`` for ``n < 1``."""
    _check_positive_int(n, "n")
    if n == 1:
        return 0.0
    return 2 * (n - 1) * alpha + 2 * (n - 1) / n * nbytes * beta + (n - 1) / n * nbytes * gamma


def recursive_doubling_time(nbytes: float, n: int, alpha: float, beta: float, gamma: float = 0.0) -> float:
    """Seconds for a recursive-doubling all-reduce, ``n`` a power of two (Thakur et al. 2005, §4.1):
    ``log2(n) (alpha + N beta + N gamma)``: fewer messages than the ring (log2 n vs 2(n-1)), each the
    whole vector, so it wins for small messages and loses for large ones."""
    _check_positive_int(n, "n")
    return math.log2(n) * (alpha + nbytes * beta + nbytes * gamma)


def bubble_fraction(stages: int, microbatches: int) -> float:
    """``(p - 1) / (m + p - 1)``: the idle share of a GPipe / 1F1B step (Huang et al. 2019, §2.3)."""
    _check_positive_int(stages, "stages")
    _check_positive_int(microbatches, "microbatches")
    return (stages - 1) / (microbatches + stages - 1)


def predict(
    workload: Workload,
    hardware: Hardware,
    dp: int = 1,
    tp: int = 1,
    pp: int = 1,
    microbatches: int = 1,
    overlap: float = 0.0,
) -> Prediction:
    """Predict one training step of ``workload`` on ``dp * tp * pp`` devices of ``hardware``.

    ``overlap`` in [0, 1]: the fraction of the data-parallel all-reduce that can run during backward
    (2/3 of the compute); the exposed part is ``dp_comm - min(overlap * dp_comm, backward time)``.
    Raises ``ValueError`` for sizes < 1, ``overlap`` outside [0, 1], or a global batch smaller than
    ``dp * microbatches`` (some device would get no sample).
    """
    for value, name in ((dp, "dp"), (tp, "tp"), (pp, "pp"), (microbatches, "microbatches")):
        _check_positive_int(value, name)
    if not 0.0 <= overlap <= 1.0:
        raise ValueError(f"overlap is a fraction in [0, 1], got {overlap}")
    if workload.global_batch < dp * microbatches:
        raise ValueError(
            f"global batch {workload.global_batch} < dp * microbatches = {dp * microbatches}: every data-"
            "parallel rank needs at least one sample per microbatch; use fewer ranks or a larger batch"
        )
    hw = hardware
    compute = workload.flops_per_step / (dp * tp * pp) / hw.flops
    bubble = compute * (pp - 1) / microbatches  # (m + p - 1) slots of compute / m, minus compute
    grad_bytes = workload.params / (tp * pp) * workload.bytes_per_value
    dp_comm = ring_all_reduce_time(grad_bytes, dp, hw.alpha, hw.beta, hw.gamma)
    hidden = min(overlap * dp_comm, 2.0 / 3.0 * compute)
    # Activations of one microbatch on one data-parallel rank: tokens x hidden values.
    act_bytes = (
        workload.global_batch / (dp * microbatches) * workload.tokens_per_sample * workload.hidden
    ) * workload.bytes_per_value
    layers_per_stage = workload.layers / pp
    per_call = ring_all_reduce_time(act_bytes, tp, hw.alpha, hw.beta, hw.gamma)
    tp_comm = 2 * workload.tp_allreduces_per_layer * layers_per_stage * microbatches * per_call
    pp_comm = 2 * (microbatches + pp - 1) * (hw.alpha + act_bytes * hw.beta) if pp > 1 else 0.0
    step = compute + bubble + tp_comm + pp_comm + dp_comm - hidden
    single = workload.flops_per_step / hw.flops
    devices = dp * tp * pp
    return Prediction(
        devices=devices,
        compute=compute,
        bubble=bubble,
        dp_comm=dp_comm,
        dp_comm_exposed=dp_comm - hidden,
        tp_comm=tp_comm,
        pp_comm=pp_comm,
        step=step,
        speedup=single / step,
        efficiency=single / step / devices,
    )


def scaling_curve(
    workload: Workload, hardware: Hardware, devices: list[int], overlap: float = 0.0
) -> list[Prediction]:
    """Data parallelism only (strong scaling: the same global batch on ``dp`` = each of ``devices``)."""
    return [predict(workload, hardware, dp=n, overlap=overlap) for n in devices]


def sweet_spot(predictions: list[Prediction], min_efficiency: float = 0.75) -> Prediction:
    """The largest layout whose scaling efficiency is still ``>= min_efficiency``: past it, each added
    device buys less than ``min_efficiency`` of a device. Raises ``ValueError`` if none qualifies."""
    good = [p for p in predictions if p.efficiency >= min_efficiency]
    if not good:
        raise ValueError(f"no layout reaches {min_efficiency:.0%} efficiency; lower min_efficiency")
    return max(good, key=lambda p: p.devices)


# --- calibration on this machine -----------------------------------------------------------------------


def measure_flops(
    m: int = 256, k: int = 1024, n: int = 1024, repeats: int = 10, rounds: int = 3, dtype: Any = np.float32
) -> float:
    """Sustained FLOP/s of this process: ``repeats`` back-to-back ``(m, k) @ (k, n)`` matmuls (``2 m k n``
    FLOPs each) after a warm-up, total FLOPs / total time, the best of ``rounds`` (on a shared machine
    other work only ever slows a round down). Choose the shapes of your model's layers: small matmuls
    run further from the peak. Run it on every rank at once (after a barrier) to measure what each rank
    gets when ranks share the cores: a sustained loop sees the sharing, one short matmul would not."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, k)).astype(dtype)
    b = rng.standard_normal((k, n)).astype(dtype)
    out = np.empty((m, n), dtype=dtype)
    np.matmul(a, b, out=out)  # warm-up: first touch of the pages, BLAS thread start

    def run() -> None:
        for _ in range(repeats):
            np.matmul(a, b, out=out)

    return 2.0 * m * k * n * repeats / min(_clock(run) for _ in range(rounds))


def fit_alpha_beta(nbytes: np.ndarray, seconds: np.ndarray) -> tuple[float, float]:
    """Least-squares fit of ``t = alpha + beta * N`` to one-way message times, weighted by 1/t so the
    small messages (which decide alpha) count as much as the large ones. Returns ``(alpha, beta)``,
    each clipped at 0."""
    nbytes, seconds = np.asarray(nbytes, dtype=float), np.asarray(seconds, dtype=float)
    if nbytes.shape != seconds.shape or nbytes.size < 2:
        raise ValueError("fit_alpha_beta needs at least two (nbytes, seconds) pairs of equal length")
    w = 1.0 / seconds
    design = np.stack([np.ones_like(nbytes), nbytes], axis=1) * w[:, None]
    (alpha, beta), *_ = np.linalg.lstsq(design, seconds * w, rcond=None)
    return max(float(alpha), 0.0), max(float(beta), 0.0)


def measure_alpha_beta(
    comm: Any, sizes: tuple[int, ...] = (8, 1 << 12, 1 << 16, 1 << 20, 1 << 22), iters: int = 10
):
    """``(alpha, beta)`` from ping-pongs: ranks 2i and 2i+1 bounce messages of each size back and forth
    *at the same time* (as the ranks of a ring all do), half the fastest round trip is one message.
    Collective over ``comm`` (a ``dist.Communicator``); with an odd size the last rank only waits.
    Raises ``ValueError`` on a group of one rank (nothing to measure)."""
    if comm.size < 2:
        raise ValueError("measure_alpha_beta needs at least 2 ranks: run it under mpiexec -n 2 or more")
    peer = comm.rank ^ 1
    active = peer < comm.size
    one_way = []
    for nbytes in sizes:
        buf = np.zeros(nbytes, dtype=np.uint8)
        best = math.inf
        for _ in range(iters):
            comm.barrier()
            start = time.perf_counter()
            if active and comm.rank % 2 == 0:
                comm.send(buf, peer)
                comm.recv(buf, peer)
            elif active:
                comm.recv(buf, peer)
                comm.send(buf, peer)
            best = min(best, (time.perf_counter() - start) / 2)
        one_way.append(comm.mpi.allreduce(best, op=_mpi_max()))
    return fit_alpha_beta(np.array(sizes), np.array(one_way))


def measure_gamma(nbytes: int = 1 << 24, repeats: int = 5) -> float:
    """Seconds per byte to add two float32 arrays of ``nbytes`` in place (the ring's reduction)."""
    a = np.ones(nbytes // 4, dtype=np.float32)
    b = np.ones_like(a)
    np.add(a, b, out=a)
    return min(_clock(lambda: np.add(a, b, out=a)) for _ in range(repeats)) / a.nbytes


def _mpi_max() -> Any:
    from mpi4py import MPI  # only the calibration needs MPI; the model itself is pure arithmetic

    return MPI.MAX


def _clock(fn: Any) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _check_positive_int(value: Any, name: str) -> None:
    if not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
