"""Checks of lesson 11 (transformer parallelism): the vocabulary-parallel loss, the online softmax of
ring attention, tensor parallelism's bytes per layer and a rank's place in the 4-D mesh.

The expected values come from minidist itself: ``cross_entropy`` and ``scaled_dot_product_attention``
on the whole, unsplit arrays (what one process computes), ``perfmodel_transformer`` and
``parallel.mesh``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from minidist_course.notebook.checks.harness import call, close, exercise, holds, same


def _one_process_loss(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    import minidist as md  # noqa: PLC0415  (the checks module imports without the autograd engine)
    from minidist.nn import functional as F  # noqa: PLC0415

    return F.cross_entropy(md.tensor(logits, dtype=np.float64), targets, reduction="none").numpy()


@exercise(
    "Which rank owns target id t, and at which column of its own slice does that id sit? And what does "
    "exp do to a logit of 1000?",
    "Every rank needs the same three numbers per token before it can finish: the largest logit over all "
    "ranks, the sum over all ranks of exponentials measured from it, and the target's logit, which only "
    "its owner has (the others add 0). Slices follow numpy.array_split: the first ranks may be one wider.",
)
def vocab_parallel_loss(fn: Callable[[list[np.ndarray], np.ndarray], np.ndarray]) -> None:
    """vocab_parallel_loss(shards, targets) is minidist's cross_entropy of the whole logits, for
    vocabularies split evenly and unevenly over 1 to 4 ranks, with logits far above 0."""
    rng = np.random.default_rng(11)
    for vocab, tp in [(8, 1), (8, 2), (65, 2), (65, 3), (10, 4)]:
        logits = rng.standard_normal((6, vocab)) * 20 + 1000.0  # exp(1000) overflows float64
        # The first and last ids, and the ids on both sides of every border between two slices.
        borders = np.cumsum([len(a) for a in np.array_split(np.arange(vocab), tp)])[:-1]
        targets = np.array([0, vocab - 1, *borders, *(borders - 1)] + [1] * 6)[:6].astype(np.int64)
        shards = [s.copy() for s in np.array_split(logits, tp, axis=1)]
        got = call(fn, shards, targets)
        close(got, _one_process_loss(logits, targets), f"vocab {vocab} on {tp} ranks, targets {targets}")


@exercise(
    "When a later block holds a larger score than any seen so far, what happens to the exponentials "
    "you already added into the sum and into the output?",
    "Keep three running quantities per query: the largest score seen, the sum of exponentials measured "
    "from it, and the unnormalised output. When the largest score grows, both the sum and the output "
    "were measured from the old one: multiply both by the same factor before adding the new block; "
    "divide once at the end.",
)
def online_attention(fn: Callable[[np.ndarray, list[np.ndarray], list[np.ndarray]], np.ndarray]) -> None:
    """online_attention(q, k_blocks, v_blocks) is minidist's scaled_dot_product_attention over all the
    keys at once, for 1 to 4 blocks of uneven sizes, small and very large scores."""
    import minidist as md  # noqa: PLC0415
    from minidist.nn import functional as F  # noqa: PLC0415

    rng = np.random.default_rng(12)
    for sizes, size_of_scores in [((5,), 1.0), ((2, 3, 1), 1.0), ((1, 4, 2, 3), 30.0), ((3, 3), 2000.0)]:
        q = rng.standard_normal((4, 3)) * size_of_scores
        k = rng.standard_normal((sum(sizes), 3)) * np.linspace(0.5, 2.0, sum(sizes))[:, None]  # later: larger
        v = rng.standard_normal((sum(sizes), 2))
        cuts = np.cumsum(sizes)[:-1]
        k_blocks, v_blocks = np.split(k, cuts), np.split(v, cuts)
        want = F.scaled_dot_product_attention(*(md.tensor(a, dtype=np.float64) for a in (q, k, v))).numpy()
        got = call(fn, q, [b.copy() for b in k_blocks], [b.copy() for b in v_blocks])
        close(got, want, f"blocks of {list(sizes)} keys, scores of size about {size_of_scores:g}")


@exercise(
    "How many all-reduces does one transformer layer make in forward, how many in backward, and how "
    "many bytes does one rank send in a ring all-reduce (lesson 03)?",
    "Forward: g after attention and g after the MLP; backward: f before each. Every one reduces an "
    "activation of batch x seq x hidden values, and a ring sends a fraction of its buffer that depends "
    "only on the group size (zero for one rank).",
)
def tp_bytes_per_layer(fn: Callable[[int, int, int, int, int], float]) -> None:
    """tp_bytes_per_layer(batch, seq, hidden, tp, bytes_per_value) is minidist_tools.perfmodel.transformer's
    bytes per rank per layer and step, for 1 to 8 tensor-parallel ranks."""
    from minidist_tools.perfmodel import transformer as pt  # noqa: PLC0415

    for batch, seq, hidden, tp, nbytes in [
        (1, 4, 2, 1, 4),
        (2, 3, 4, 2, 4),
        (8, 2048, 12288, 8, 2),
        (3, 5, 7, 3, 4),
    ]:
        want = pt.tensor_parallel_bytes_per_layer(batch, seq, hidden, tp, bytes_per_value=nbytes).total
        context = f"tp_bytes_per_layer(batch={batch}, seq={seq}, hidden={hidden}, tp={tp}, bytes={nbytes})"
        close(call(fn, batch, seq, hidden, tp, nbytes), want, context)


@exercise(
    "Which coordinate changes between rank 0 and rank 1, which between rank 0 and the first rank of "
    "the next cp group position, and how many ranks does one pipeline stage hold?",
    "Count from the fastest axis: tp, then cp, then dp, then pp. One step along an axis skips all the "
    "ranks that the faster axes hold together.",
)
def mesh_rank4(fn: Callable[..., int]) -> None:
    """mesh_rank4(dp_rank, tp_rank, pp_rank, cp_rank, dp, tp, cp) is the rank minidist.parallel.mesh gives
    every coordinate of five 4-D meshes."""
    from minidist.parallel.mesh import mesh_coords4  # noqa: PLC0415

    for dp, tp, pp, cp in [(2, 2, 1, 2), (1, 2, 2, 2), (2, 1, 2, 3), (3, 2, 2, 2), (1, 1, 1, 4)]:
        for want in range(dp * tp * pp * cp):
            d, t, s, c = mesh_coords4(want, dp, tp, pp, cp)
            got = call(fn, d, t, s, c, dp, tp, cp)
            context = (
                f"mesh_rank4(dp_rank={d}, tp_rank={t}, pp_rank={s}, cp_rank={c}, dp={dp}, tp={tp}, cp={cp})"
            )
            size = dp * tp * pp * cp
            holds(0 <= got < size, context, got, f"this mesh has ranks 0 to {size - 1}")
            same(got, want, context, "another coordinate of this mesh has that rank")
