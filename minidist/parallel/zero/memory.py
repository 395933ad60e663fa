"""What ZeRO saves, in bytes: the paper's per-rank formulas, and the report that measures them.

Memory per rank, for P parameters of b bytes and K bytes of optimizer state per parameter, on N ranks:

    plain data parallel:  b P + b P + K P
    stage 1:              b P + b P + K P / N
    stage 2:              b P + (b + K) P / N

where "P / N" means this rank's chunk, P // N or P // N + 1 elements (``layout.py``). The paper
(Rajbhandari et al., SC 2020, §5) writes (2 + 2 + K) Psi for mixed precision: fp16 parameters and
gradients, and K = 12 for Adam (fp32 master weights, momentum, variance). minidist trains in one dtype
with no master copy, so in fp32 b = 4 and K = 8 for AdamW (exp_avg, exp_avg_sq) or 4 for SGD
(momentum buffer).

:func:`memory_report` (``ZeroRedundancyOptimizer.memory_report()``) measures what a rank holds instead of
computing it, so a test can hold the implementation to the formulas.
"""

from __future__ import annotations

from collections.abc import Sequence

from minidist.autograd import Tensor
from minidist.memory.activations import unique_nbytes
from minidist.optim.optimizer import Optimizer


def memory_report(params: Sequence[Tensor], shards: Sequence[Tensor], optimizer: Optimizer) -> dict[str, int]:
    """Bytes held now by ``params``, this rank's ``shards`` and the wrapped ``optimizer``'s state:
    ``{"parameters", "gradients", "optimizer_state", "total"}``.

    Measured, not computed: every buffer behind the parameters, the gradients (``p.grad`` and the
    shards' ``.grad``) and the arrays of the optimizer state is counted once (views are charged to
    the array they view). Transient communication buffers inside ``step()`` are not included. Call
    it after ``step()`` (before ``zero_grad()``) to compare with the formulas above.
    """
    report = {
        "parameters": unique_nbytes([p.data for p in params] + [s.data for s in shards]),
        "gradients": unique_nbytes([p.grad for p in params] + [s.grad for s in shards]),
        "optimizer_state": unique_nbytes(
            [v for s in optimizer.state.values() for v in s.values() if hasattr(v, "nbytes")]
        ),
    }
    report["total"] = sum(report.values())
    return report
