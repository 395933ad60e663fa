"""Helpers of the A9 tests and of its MPI worker: the parts of ring attention that need no ranks.

* :func:`plan_failures`: ``attention_blocks`` (the causal plan) against the causal mask itself, every
  (query, key) pair of the whole sequence accounted for;
* :func:`online_step_failures`: ``_online_softmax_step`` folding blocks one at a time against the
  softmax of all scores at once.

Each returns failure messages in plain words (empty: all good). Only NumPy and the code under test.
"""

from __future__ import annotations

import numpy as np

RTOL, ATOL = 1e-10, 1e-12


def plan_failures(seq_len: int, cp: int, layout: str) -> list[str]:
    """Every rank's plan against every source block: each visible pair covered once, no masked pair,
    no block without a visible pair (a fully masked block must be skipped)."""
    from minidist.parallel.context_parallel.ring_attention import attention_blocks  # noqa: PLC0415
    from minidist.parallel.context_parallel.split import context_parallel_positions  # noqa: PLC0415

    failures = []
    for rank in range(cp):
        queries = context_parallel_positions(seq_len, cp, rank, layout)
        for source in range(cp):
            keys = context_parallel_positions(seq_len, cp, source, layout)
            where = f"attention_blocks({seq_len}, cp={cp}, rank={rank}, source={source}, layout={layout!r})"
            covered = np.zeros((len(queries), len(keys)), dtype=int)
            for b in attention_blocks(seq_len, cp, rank, source, True, layout):
                q, k = queries[b.q], keys[b.k]
                if b.diagonal is None:
                    visible = np.ones((len(q), len(k)), dtype=bool)
                else:
                    visible = np.tri(len(q), len(k), k=b.diagonal, dtype=bool)
                if not visible.any() or not (k[None, :] <= q[:, None]).any():
                    return [
                        f"{where}: the block of queries {q.tolist()} and keys {k.tolist()} is computed, but "
                        "under the causal mask it is fully masked (every key comes after every query): "
                        "skip it, it only adds exp(-inf) = 0 at the cost of a block of scores"
                    ]
                wrong = visible & (k[None, :] > q[:, None])
                if wrong.any():
                    i, j = np.argwhere(wrong)[0]
                    return [
                        f"{where}: query at position {q[i]} sees the key at position {k[j]}, a later token: "
                        "the mask of this block is wrong (work from the global positions of the chunks)"
                    ]
                covered[b.q, b.k] += visible
            want = (keys[None, :] <= queries[:, None]).astype(int)
            if (covered > 1).any():
                failures.append(f"{where}: some (query, key) pairs are computed twice: blocks overlap")
            elif (covered != want).any():
                i, j = np.argwhere(covered != want)[0]
                failures.append(
                    f"{where}: the query at position {queries[i]} never sees the key at position {keys[j]}, "
                    "which the causal mask keeps (a block left out, or a mask that hides too much)"
                )
            if failures:
                return failures
    return failures


def online_step_failures(seed: int = 0) -> list[str]:
    """Fold 3 blocks, one call of ``_online_softmax_step`` each, into running arrays that start at
    (-inf, 0, 0); after every call the arrays must be those of all blocks so far taken at once. The
    later blocks hold larger scores, so the running maximum grows."""
    from minidist.parallel.context_parallel.ring_attention import _online_softmax_step  # noqa: PLC0415

    rng = np.random.default_rng(seed)
    q = rng.standard_normal((1, 2, 4, 3))  # (B, heads, queries, hs): already scaled
    blocks = [  # (K, V); the later blocks' keys are larger, so their scores raise the maximum
        (rng.standard_normal((1, 2, n, 3)) * (1 + 3 * i), rng.standard_normal((1, 2, n, 2)))
        for i, n in enumerate((3, 2, 4))
    ]
    m = np.full((1, 2, 4, 1), -np.inf)
    l = np.zeros((1, 2, 4, 1))  # noqa: E741
    o = np.zeros((1, 2, 4, 2))
    for i, (k, v) in enumerate(blocks):
        _online_softmax_step(q, k.copy(), v.copy(), None, m, l, o)
        seen = blocks[: i + 1]
        scores = np.concatenate([q @ b[0].swapaxes(-1, -2) for b in seen], axis=-1)
        values = np.concatenate([b[1] for b in seen], axis=-2)
        want_m = scores.max(axis=-1, keepdims=True)
        e = np.exp(scores - want_m)
        want_l, want_o = e.sum(axis=-1, keepdims=True), e @ values
        where = f"_online_softmax_step after block {i + 1} of 3"
        if not np.allclose(m, want_m, rtol=RTOL, atol=ATOL):
            return [
                f"{where}: the running maximum m is {m.ravel()[:4]}, expected {want_m.ravel()[:4]} (the "
                "largest score seen so far; update m in place: it is a view of the whole array)"
            ]
        if not np.allclose(l, want_l, rtol=RTOL, atol=ATOL):
            return [
                f"{where}: the running sum l is {l.ravel()[:4]}, expected {want_l.ravel()[:4]}: l must hold "
                "the sum of exp(score - m) over all keys so far, measured from the CURRENT maximum"
            ]
        if not np.allclose(o, want_o, rtol=RTOL, atol=ATOL):
            why = ""
            if i > 0:
                why = (" The running output must be rescaled too when the maximum grows, by the same "
                       "factor as l: both were summed under the old maximum.")  # fmt: skip
            return [f"{where}: the running output o is {o.ravel()[:4]}, expected {want_o.ravel()[:4]}.{why}"]
    return []
