"""MPI worker (2 ranks): misuse of the vocabulary-parallel layers raises the same error on every rank.

    mpiexec -n 2 python vocab_errors.py OUT_DIR

Several cases are bad on one rank only (an id or a target out of range there, another vocabulary
size): the other rank must raise too instead of waiting in a collective. rank{r}.json records, per
case, [exception type, message] or [None, result]; the last entry checks that the group still works.
"""

import json
import sys
from pathlib import Path

import numpy as np

import minidist as md
import minidist.distributed as dist
from minidist.parallel.tensor_parallel import VocabParallelEmbedding, vocab_parallel_cross_entropy

out = Path(sys.argv[1])
world = dist.init()
rank = world.rank
V = 7  # rank 0 holds ids 0-3, rank 1 ids 4-6
ids = np.array([[0, 6, 3], [4, 4, 1]])
logits = md.tensor(np.random.default_rng(0).standard_normal((2, 3, 4 if rank == 0 else 3)))


def embedding(ids_here):
    md.manual_seed(0)
    return VocabParallelEmbedding(V, 5, world)(ids_here).numpy().sum()


def loss(targets, z=logits, reduction="mean"):
    return float(vocab_parallel_cross_entropy(z, targets, world, reduction).numpy().sum())


cases = {
    "embedding_id_too_large_on_rank_1": lambda: embedding(ids + 3 * rank),
    "embedding_negative_id_on_rank_0": lambda: embedding(ids - 1 + rank),
    "embedding_float_ids": lambda: embedding(ids.astype(np.float32)),
    "embedding_vocab_smaller_than_tp": lambda: VocabParallelEmbedding(1, 5, world),
    "embedding_vocab_differs": lambda: VocabParallelEmbedding(7 + rank, 5, world),
    "embedding_padding_idx_out_of_range": lambda: VocabParallelEmbedding(V, 5, world, padding_idx=7),
    "from_weight_not_2d": lambda: VocabParallelEmbedding.from_weight(np.zeros(7), world),
    "from_weight_shape_differs": lambda: VocabParallelEmbedding.from_weight(np.zeros((7 + rank, 2)), world),
    "loss_target_too_large_on_rank_1": lambda: loss(ids + 3 * rank),
    "loss_negative_target": lambda: loss(ids - 1),
    "loss_float_targets": lambda: loss(ids.astype(np.float64)),
    "loss_target_shape": lambda: loss(ids.reshape(-1)),
    "loss_reduction": lambda: loss(ids, reduction="avg"),
    "loss_empty_mean": lambda: loss(ids[:0], z=logits[:0]),
    "loss_empty_sum": lambda: loss(ids[:0], z=logits[:0], reduction="sum"),
    "loss_fewer_targets_on_rank_1": lambda: loss(ids[: 2 - rank], z=logits[: 2 - rank]),
    "loss_no_vocabulary_on_rank_1": lambda: loss(
        ids, z=logits if rank == 0 else md.tensor(np.ones((2, 3, 0)))
    ),
}
results = {}
for name, case in cases.items():
    try:
        results[name] = [None, case()]
    except (TypeError, ValueError, RuntimeError, IndexError) as error:
        results[name] = [type(error).__name__, str(error)]
results["after"] = [loss(ids), float(embedding(ids))]  # the group still works: nothing left half done
(out / f"rank{rank}.json").write_text(json.dumps(results))
