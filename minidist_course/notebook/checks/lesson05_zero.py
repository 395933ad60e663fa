"""Check of lesson 05 (ZeRO): the bytes per rank of each ZeRO stage (Rajbhandari et al. 2020, §5)."""

from __future__ import annotations

from collections.abc import Callable

from minidist_course.notebook.checks.harness import call, close, exercise


@exercise(
    "Which of the three parts (parameters, gradients, optimizer state) does each stage shard, and what "
    "does sharding a part over N ranks do to its bytes on one rank?",
    "Compute the three parts of plain data parallelism separately, divide each one by N only if the stage "
    "shards it, and add them; stage 0 divides none, stage 3 all three.",
)
def zero_bytes(fn: Callable[..., float]) -> None:
    """zero_bytes(psi, n, stage, b, k) gives the ZeRO paper's Figure 1 for stages 0 to 3, and a small
    float32 case."""
    # The ZeRO paper's Figure 1: Psi = 7.5 B parameters, N = 64, mixed-precision Adam (2 + 2 + 12 bytes).
    paper = {0: 120e9, 1: 31.4e9, 2: 16.6e9, 3: 1.875e9}  # the figure rounds the last to 1.9 GB
    for stage, want in paper.items():
        got = call(fn, 7.5e9, 64, stage, 2, 12)
        context = f"zero_bytes(psi=7.5e9, n=64, stage={stage}, b=2, k=12) (ZeRO Figure 1: {want / 1e9} GB)"
        close(got, want, context, rtol=0.01)
    close(call(fn, 1000, 4, 2, 4, 8), 4000 + 12000 / 4, "zero_bytes(psi=1000, n=4, stage=2, b=4, k=8)")
