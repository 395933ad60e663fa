"""MPI worker for A9: the vocabulary-parallel cross-entropy and ring attention on real ranks against one
process, in plain words.

Config (OUT_DIR/config.json)::

    {"cases": [{"kind": "loss", "seed": 0, "vocab": 65, "shape": [2, 3], "reduction": "mean",
                "backward": false},
               {"kind": "ring", "seed": 0, "shape": [1, 2, 12, 3], "causal": true,
                "layout": "balanced", "backward": false}, ...]}

Every rank draws the same whole arrays from ``seed`` and computes the one-process answer itself
(``F.cross_entropy`` of all the logits; ``F.scaled_dot_product_attention`` of the whole sequence), then
runs the code under test on its piece. float64 throughout: the two differ only in the order of float
sums (a few ulp), so rtol 1e-10 is safe while every mistake below is off by O(1).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # gradelib, rules
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # a9lib
import a9lib  # noqa: E402
import gradelib  # noqa: E402
import rules  # noqa: E402

import minidist as md  # noqa: E402
from minidist.nn import functional as F  # noqa: E402
from minidist.parallel.context_parallel import ring_attention  # noqa: E402
from minidist.parallel.context_parallel.split import context_parallel_positions  # noqa: E402
from minidist.parallel.tensor_parallel import vocab_parallel_cross_entropy  # noqa: E402
from minidist.parallel.tensor_parallel.split import shard_bounds  # noqa: E402

# The handout's "Not allowed": the whole logits gathered, or MPI's own collectives.
RULE = rules.Rule(
    files=("minidist.parallel.tensor_parallel.vocab_parallel_loss",),
    why="the handout asks for the loss from three all-reduces of B x T numbers, never the gathered logits",
    functions=("minidist.distributed.collectives:all_gather",),
)
RTOL, ATOL = 1e-10, 1e-12


def close(a, b) -> bool:
    return a is not None and np.shape(a) == np.shape(b) and np.allclose(a, b, rtol=RTOL, atol=ATOL)


def any_rank(group, failures: list[str]) -> bool:
    """True on every rank if any rank failed: all stop together (no rank left alone in a collective)."""
    return any(group.mpi.allgather(bool(failures)))


def _own_max_loss(logits: np.ndarray, targets: np.ndarray, n: int, r: int) -> np.ndarray:
    """What rank r computes if every rank measures its exponentials from its own largest logit."""
    pieces = np.array_split(logits, n, axis=-1)
    total = sum(np.exp(p - p.max(axis=-1, keepdims=True)).sum(axis=-1) for p in pieces)
    picked = np.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    return np.log(total) + pieces[r].max(axis=-1) - picked


def check_loss(group, case: dict) -> list[str]:
    n, r = group.size, group.rank
    vocab, shape, reduction = case["vocab"], tuple(case["shape"]), case["reduction"]
    rng = np.random.default_rng(case["seed"])
    logits = rng.standard_normal((*shape, vocab)) * 4 + 800.0  # exp(800) overflows float64
    logits[..., : max(1, vocab // 3)] += 30.0  # the ranks' largest logits differ widely
    borders = [shard_bounds(vocab, n, q)[0] for q in range(n)] + [vocab - 1]  # first ids, the last id
    targets = rng.integers(0, vocab, shape)
    targets.reshape(-1)[: len(borders)] = borders[: targets.size]
    start, stop = shard_bounds(vocab, n, r)
    mine = md.tensor(logits[..., start:stop].copy(), requires_grad=True)
    whole = md.tensor(logits, requires_grad=True)
    want = F.cross_entropy(whole.reshape(-1, vocab), targets.reshape(-1), reduction=reduction)
    if reduction == "none":
        want = want.reshape(shape)
    where = (
        f"vocab_parallel_cross_entropy(V={vocab} over {n} ranks, targets {shape}, reduction={reduction!r})"
    )
    got = vocab_parallel_cross_entropy(mine, targets, group, reduction=reduction)
    failures = []
    if not close(got.data, want.data):
        per_token = np.broadcast_to(got.data, shape) if reduction == "none" else None
        why = ""
        if not np.all(np.isfinite(got.data)):
            why = (" It is not finite: the logits here are near 800 and exp(800) overflows. Measure every "
                   "exponential from the largest logit of ALL ranks.")  # fmt: skip
        elif per_token is not None and close(per_token, _own_max_loss(logits, targets, n, r)):
            why = (" Each rank measured its exponentials from its own largest logit, so the ranks' sums "
                   "mix different scales: all-reduce the maximum (op='max') first, so that every rank "
                   "uses the same one.")  # fmt: skip
        elif per_token is not None:
            wrong = ~np.isclose(per_token, want.data, rtol=RTOL, atol=ATOL)
            owners = sorted({int(np.searchsorted(borders[1:n], t, side="right")) for t in targets[wrong]})
            why = (f" Wrong for targets {sorted(set(targets[wrong].tolist()))} (owned by ranks {owners}): a "
                   "rank that does not own the target must add nothing, and its owner adds the logit from "
                   "the right column of its own slice (ids [start, stop)).")  # fmt: skip
        failures.append(
            f"{where} on rank {r}: loss {gradelib.show(got.data)}, but cross_entropy of the whole logits "
            f"gives {gradelib.show(want.data)}.{why}"
        )
    if any_rank(group, failures) or not case.get("backward"):
        return failures
    g = rng.standard_normal(shape) if reduction == "none" else np.array(1.7)
    got.backward(g)
    want.backward(g)
    ref = whole.grad[..., start:stop]
    if not close(mine.grad, ref):
        why = ""
        count = targets.size if reduction == "mean" else 1
        if mine.grad is not None and count > 1 and close(mine.grad, ref * count):
            why = f" It is {count} times too large: the mean divides by the number of tokens."
        failures.append(
            f"{where} backward on rank {r}: dL/dlogits of this rank's slice is {gradelib.show(mine.grad)}, "
            f"expected the slice of the whole gradient {gradelib.show(ref)} (softmax minus one-hot, the "
            f"one-hot only where this rank owns the target).{why}"
        )
    return failures


def check_ring(group, case: dict) -> list[str]:
    cp, r = group.size, group.rank
    shape, causal, layout = tuple(case["shape"]), case["causal"], case["layout"]
    seq = shape[2]
    rng = np.random.default_rng(case["seed"])
    q, k, v, do = (rng.standard_normal(shape) * s for s in (2.0, 2.0, 1.0, 1.0))
    full = [md.tensor(a, requires_grad=True) for a in (q, k, v)]
    want = F.scaled_dot_product_attention(*full, is_causal=causal)
    mine_pos = context_parallel_positions(seq, cp, r, layout)
    local = [md.tensor(a[:, :, mine_pos].copy(), requires_grad=True) for a in (q, k, v)]
    where = f"ring_attention(cp={cp}, rank {r}, T={seq}, is_causal={causal}, layout={layout!r})"
    got = ring_attention(*local, group=group, is_causal=causal, layout=layout)
    failures = []
    if not close(got.data, want.data[:, :, mine_pos]):
        bad = ~np.isclose(got.data, want.data[:, :, mine_pos], rtol=RTOL, atol=ATOL).all(axis=(0, 1, 3))
        parts = a9lib.plan_failures(seq, cp, layout) + a9lib.online_step_failures()
        why = " " + parts[0] if parts else (
            " The causal plan (attention_blocks) and the online softmax step pass their own checks, so a "
            "rank used a K/V block as if it came from another rank: check which rank's block a rank holds "
            "at each step (blocks travel from rank r to rank r + 1)."
        )  # fmt: skip
        failures.append(
            f"{where}: the output of the queries at positions {mine_pos[bad].tolist()} differs from "
            f"scaled_dot_product_attention of the whole sequence.{why}"
        )
    if any_rank(group, failures) or not case.get("backward"):
        return failures
    want.backward(do)
    got.backward(do[:, :, mine_pos].copy())
    for name, a, b in zip("qkv", local, full):
        if not close(a.grad, b.grad[:, :, mine_pos]):
            failures.append(
                f"{where} backward: dL/d{name} of this rank's tokens is {gradelib.show(a.grad)}, expected "
                f"{gradelib.show(b.grad[:, :, mine_pos])} (backward must visit the blocks in the same ring "
                "order as forward)"
            )
            break
    return failures


CHECKS = {"loss": check_loss, "ring": check_ring}


def body(world, config: dict) -> list[str]:
    failures: list[str] = []
    for case in config["cases"]:
        failures += CHECKS[case["kind"]](world, case)
        if any_rank(world, failures):
            break
    return failures


if __name__ == "__main__":
    gradelib.worker_main(body, RULE)
