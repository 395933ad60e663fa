"""The alpha-beta-gamma cost model of each collective algorithm, and a fit of its constants.

Sending a message of m bytes costs ``alpha + m * beta`` seconds (latency plus transfer), reducing m
bytes costs ``m * gamma`` (Hockney 1994; used for collectives by Thakur, Rabenseifner & Gropp,
"Optimization of Collective Communication Operations in MPICH", IJHPCA 2005, §2). Each function
below returns the predicted seconds for ``nbytes`` (the whole vector, N bytes) on ``n`` ranks.
"""

from __future__ import annotations

import math

import numpy as np


def _log2(n: int) -> int:
    return math.ceil(math.log2(n)) if n > 1 else 0


def _fold(n: int) -> int:
    """Extra steps of the non-power-of-two fold-in/fold-out (0 when n is a power of two)."""
    return 0 if n & (n - 1) == 0 else 2


# Each entry: (n, N bytes, alpha, beta, gamma) -> seconds.
MODELS = {
    ("all_reduce", "ring"): lambda n, N, a, b, g: (
        2 * (n - 1) * a + 2 * (n - 1) / n * N * b + (n - 1) / n * N * g
    ),
    ("all_reduce", "recursive_doubling"): lambda n, N, a, b, g: (
        (int(math.log2(n)) + _fold(n)) * (a + N * b) + (int(math.log2(n)) + _fold(n) / 2) * N * g
    ),
    ("all_reduce", "rabenseifner"): lambda n, N, a, b, g: (
        (2 * int(math.log2(n)) + _fold(n)) * a + (2 * (n - 1) / n + _fold(n)) * N * b + (n - 1) / n * N * g
    ),
    ("reduce_scatter", "ring"): lambda n, N, a, b, g: (n - 1) * a + (n - 1) / n * N * (b + g),
    ("all_gather", "ring"): lambda n, N, a, b, g: (n - 1) * a + (n - 1) / n * N * b,
    ("broadcast", "tree"): lambda n, N, a, b, g: _log2(n) * (a + N * b),
    ("broadcast", "scatter_allgather"): lambda n, N, a, b, g: (
        (_log2(n) + n - 1) * a + 2 * (n - 1) / n * N * b
    ),
    ("reduce", "tree"): lambda n, N, a, b, g: _log2(n) * (a + N * b + N * g),
}  # fmt: skip


def predict(collective: str, algorithm: str, n: int, nbytes: int, alpha: float, beta: float, gamma: float):
    """Predicted seconds, or None when no model is written down for this algorithm (e.g. "mpi")."""
    model = MODELS.get((collective, algorithm))
    return None if model is None else model(n, nbytes, alpha, beta, gamma)


def predict_hierarchical(
    nodes: int,
    ranks_per_node: int,
    nbytes: int,
    intra: tuple[float, float],
    inter: tuple[float, float],
    gamma: float,
) -> float:
    """Predicted seconds of ``all_reduce(algorithm="hierarchical")``
    (``distributed/algorithms/hierarchical.py``): a tree reduce and a tree broadcast inside each node
    (``intra`` = (alpha, beta) of shared memory), a
    ring across the ``nodes`` leaders (``inter`` = (alpha, beta) of the network link)."""
    inside = (
        2 * _log2(ranks_per_node) * (intra[0] + nbytes * intra[1]) + _log2(ranks_per_node) * nbytes * gamma
    )
    return inside + MODELS[("all_reduce", "ring")](nodes, nbytes, *inter, gamma)


def fit_alpha_beta(sizes_bytes: np.ndarray, seconds: np.ndarray) -> tuple[float, float]:
    """Least-squares fit of ``t = alpha + beta * m`` to one-way message times; returns (alpha, beta).

    Weighted by 1/t so that the small messages (which decide alpha) count as much as the large ones.
    """
    weights = 1.0 / seconds
    design = np.stack([np.ones_like(sizes_bytes, dtype=float), sizes_bytes.astype(float)], axis=1)
    coef, *_ = np.linalg.lstsq(design * weights[:, None], seconds * weights, rcond=None)
    return float(max(coef[0], 0.0)), float(max(coef[1], 0.0))
