"""``OutOfMemoryError``: the tracked bytes of a rank would exceed its budget (``MemoryTracker(budget=)``).

A subclass of ``MemoryError``, as PyTorch's ``torch.cuda.OutOfMemoryError``, so code that catches the
built-in error catches it too. The message is built by :func:`describe_overflow` from the counters at the
moment of the overflow: the budget, the total, each category's bytes with its largest owners, and what to
do about it. Each remedy cuts a different category (Rajbhandari et al. 2020, §5; Korthikanti et al. 2022).
"""

from __future__ import annotations

from minidist.memory.sizes import format_bytes

REMEDIES = (
    "to fit, shard what dominates: parameters, gradients and optimizer state with "
    "FullyShardedDataParallel (ZeRO-3) or ZeroRedundancyOptimizer (ZeRO-1/2, optimizer state and gradients); "
    "activations with tensor + sequence parallelism (ParallelGPT), pipeline parallelism, activation "
    "recomputation (minidist.nn.recompute) or a smaller batch / sequence length; or raise the budget "
    "(MemoryTracker(budget=...) or MINIDIST_MEMORY_BUDGET)"
)


class OutOfMemoryError(MemoryError):
    """The tracked memory of this rank would exceed its budget. ``.budget`` and ``.total`` in bytes,
    ``.categories``: bytes per category at the overflow."""

    def __init__(self, message: str, budget: int, total: int, categories: dict[str, int]):
        super().__init__(message)
        self.budget, self.total, self.categories = budget, total, categories


def describe_overflow(budget: int, current: dict[str, int], owners: dict[str, list[tuple[str, int]]]) -> str:
    """The message: ``owners`` maps a category to its largest (owner, bytes), largest first. It names no
    rank: ``minidist_tools.report.exit_with_error`` adds the ranks that raised it."""
    total = sum(current.values())
    lines = [
        f"out of memory: the tracked total {format_bytes(total)} ({total} bytes) exceeds the budget "
        f"{format_bytes(budget)} ({budget} bytes). Held now:"
    ]
    for category, nbytes in sorted(current.items(), key=lambda kv: -kv[1]):
        if nbytes == 0:
            continue
        top = ", ".join(f"{name} {format_bytes(b)}" for name, b in owners.get(category, [])[:3] if b > 0)
        lines.append(f"  {category} {format_bytes(nbytes)}" + (f" (largest: {top})" if top else ""))
    lines.append(REMEDIES)
    return "\n".join(lines)
