"""Central differences of a scalar that all ranks compute together (a collective objective).

Used by the workers that check distributed operators' gradients (tensor_parallel/tp_mappings.py,
sp_mappings.py, vocab_gradcheck.py, context_parallel/ring_check.py). The objective J is one number of
the whole program, so every rank must evaluate it for every perturbed entry, also for entries another
rank owns (it then passes its input unmoved): otherwise the ranks' collectives would not match.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np


def numeric_gradient(
    x: np.ndarray,
    objective: Callable[[np.ndarray], float],
    rank: int,
    owners: Iterable[tuple[int | None, tuple[int, ...]]],
    eps: float,
) -> np.ndarray:
    """dJ/dx for this rank's ``x`` by central differences, ``(J(x + eps) - J(x - eps)) / (2 eps)``.

    ``owners`` lists ``(owner, shape)``: the entries of ``shape`` that rank ``owner`` perturbs in turn
    (``owner`` None: every rank moves the same entry of its copy at once, for a replicated input).
    ``objective(moved)`` is called on every rank for every entry of every owner. Returns an array
    like ``x`` holding this rank's entries.
    """
    numeric = np.zeros_like(x)
    for owner, shape in owners:
        moves = owner is None or owner == rank
        for index in np.ndindex(*shape):
            values = []
            for step in (eps, -eps):
                moved = x.copy()
                if moves:
                    moved[index] += step
                values.append(objective(moved))
            if moves:
                numeric[index] = (values[0] - values[1]) / (2 * eps)
    return numeric
