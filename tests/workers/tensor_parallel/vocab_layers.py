"""MPI worker: VocabParallelEmbedding and vocab_parallel_cross_entropy on the world group.

argv: out_dir configs.json (see vocab_common and
tests/parallel/tensor_parallel/test_tensor_parallel_vocab.py). Per config i, every rank writes into
rank{r}.npz: the embedding's "{i}/y", "{i}/weight", "{i}/weight.grad" (this rank's rows), the same for the
layer cut from a full table with ``from_weight`` ("{i}/cut/...") and the loss's "{i}/loss" and
"{i}/logits.grad" (this rank's vocabulary slice of the logits).
"""

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parents[1]))  # tests/workers: the shared worker modules
import vocab_common as vc  # noqa: E402

import minidist as md  # noqa: E402
import minidist.distributed as dist  # noqa: E402
from minidist.parallel.tensor_parallel import VocabParallelEmbedding, vocab_parallel_cross_entropy  # noqa: E402
from minidist.parallel.tensor_parallel.split import shard_bounds  # noqa: E402

out_dir, configs = Path(sys.argv[1]), json.loads(Path(sys.argv[2]).read_text())
world = dist.init()
results = {}
for i, cfg in enumerate(configs):
    data = vc.inputs(cfg)
    md.manual_seed(cfg["seed"])
    emb = VocabParallelEmbedding(
        cfg["vocab"], cfg["dim"], world, dtype=vc.F64, padding_idx=cfg["padding_idx"]
    )
    results.update({f"{i}/{k}": v for k, v in vc.run_embedding(emb, emb.weight, data).items()})
    full = np.random.default_rng(cfg["seed"]).standard_normal((cfg["vocab"], cfg["dim"]))
    cut = VocabParallelEmbedding.from_weight(full, world, padding_idx=cfg["padding_idx"])
    results.update({f"{i}/cut/{k}": v for k, v in vc.run_embedding(cut, cut.weight, data).items()})
    start, stop = shard_bounds(cfg["vocab"], world.size, world.rank)

    def loss_fn(z, t, reduction=cfg["reduction"]):
        return vocab_parallel_cross_entropy(z, t, world, reduction=reduction)

    logits = np.ascontiguousarray(data["logits"][..., start:stop])
    results.update({f"{i}/{k}": v for k, v in vc.run_loss(loss_fn, logits, data).items()})
np.savez(out_dir / f"rank{world.rank}.npz", **results)
