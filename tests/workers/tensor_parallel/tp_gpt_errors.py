"""MPI worker (2 ranks): the parallel GPT's documented errors are raised on every rank, none hangs.

argv: out_dir. Each case runs on every rank inside try/except; the rank records the exception's class
and message (or "no error") in rank{r}.json. A rank that hung would fail the test by its timeout.
"""

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parents[1]))  # tests/workers: the shared worker modules
from dist_worker_utils import write_json  # noqa: E402

import minidist as md  # noqa: E402
import minidist.distributed as dist  # noqa: E402
from minidist.models import GPT, GPTConfig, ParallelGPT  # noqa: E402
from minidist.models.gpt.transformer import Block  # noqa: E402
from minidist.parallel import ProcessMesh  # noqa: E402
from minidist.parallel.tensor_parallel import ParallelBlock  # noqa: E402

out_dir = Path(sys.argv[1])
world = dist.init()
tp_mesh = ProcessMesh(dp=1, tp=2)
small = dict(vocab_size=11, block_size=16, n_layer=1, n_head=2, n_embd=8, dtype=np.float64)


def outcome(case) -> list[str]:
    try:
        case()
    except Exception as e:  # noqa: BLE001 (the class is what the test checks)
        return [type(e).__name__, str(e)]
    return ["none", "no error"]


def sequence_not_divisible() -> None:
    model = ParallelGPT(GPTConfig(**small), tp_mesh, sequence_parallel=True)
    model(np.zeros((2, 7), dtype=np.int64))


def dropout_under_cp() -> None:
    ParallelGPT(GPTConfig(**{**small, "dropout": 0.1}), ProcessMesh(dp=1, tp=1, cp=2))


def ids_out_of_range() -> None:
    model = ParallelGPT(GPTConfig(**small), tp_mesh)
    model(np.full((1, 4), 11 if world.rank == 1 else 0, dtype=np.int64))  # bad on rank 1 only


def gpt_from_per_rank_seeds() -> None:
    md.manual_seed(world.rank)
    ParallelGPT.from_gpt(GPT(GPTConfig(**small)), tp_mesh)


md.manual_seed(0)
cases = {
    "gpt_heads": lambda: ParallelGPT(GPTConfig(**{**small, "n_head": 1}), tp_mesh),
    "block_heads": lambda: ParallelBlock(Block(9, 3, dtype=np.float64), tp_mesh.tp_group),
    "from_gpt_heads": lambda: ParallelGPT.from_gpt(GPT(GPTConfig(**{**small, "n_head": 1})), tp_mesh),
    "sequence": sequence_not_divisible,
    "dropout_cp": dropout_under_cp,
    "ids": ids_out_of_range,
    "different_gpts": gpt_from_per_rank_seeds,
}
write_json(out_dir, f"rank{world.rank}.json", {name: outcome(case) for name, case in cases.items()})
