"""Misuse of PipelineParallel on 2 ranks: each case must raise the same error on every rank, no hang.

    mpiexec -n 2 python pp_errors.py OUT_DIR

Writes OUT_DIR/rank{r}.json: {case: [exception type, message]}, then checks that the group still works
(one correct step with 1F1B, one with interleaving) so that no case left a stray message behind.
"""

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pp_common

import minidist as md
from minidist import dist, nn
from minidist.parallel.pipeline import PipelineParallel

out = Path(sys.argv[1])
world = dist.init()
rank = world.rank
x, y = pp_common.make_data(0, 10)
ce = nn.functional.cross_entropy


def tiny() -> nn.Sequential:
    return nn.Sequential(nn.Linear(6, 4, dtype=np.float64))


def step(pipe, inputs=x, targets=y):
    return pipe.train_step(md.tensor(inputs, dtype=np.float64), targets, ce)


def interleaved(microbatches=2, **kwargs) -> PipelineParallel:
    model = pp_common.make_model(0)
    return PipelineParallel(model, world, microbatches=microbatches, schedule="interleaved", **kwargs)


cases = {
    "more_stages_than_layers": lambda: PipelineParallel(tiny(), world, microbatches=2),
    "batch_not_divisible": lambda: step(PipelineParallel(pp_common.make_model(0), world, microbatches=4)),
    "batch_differs": lambda: step(
        PipelineParallel(pp_common.make_model(0), world, microbatches=2), x[: 8 + 2 * rank], y[: 8 + 2 * rank]
    ),
    "microbatches_differ": lambda: PipelineParallel(pp_common.make_model(0), world, microbatches=2 + rank),
    "not_sequential_on_rank_0": lambda: PipelineParallel(
        nn.Linear(6, 4) if rank == 0 else pp_common.make_model(0), world
    ),
    "unknown_schedule": lambda: PipelineParallel(pp_common.make_model(0), world, schedule="zigzag"),
    "bad_cuts": lambda: PipelineParallel(pp_common.make_model(0), world, cuts=[7]),
    "mismatched_mesh": lambda: PipelineParallel(
        pp_common.make_model(0), SimpleNamespace(pp=4, pp_group=world, dp_group=None)
    ),
    "not_a_group": lambda: PipelineParallel(pp_common.make_model(0), "world"),
    # dp=2 x pp=1: replica 0's batch of 10 is not divisible by m=4: its pipeline raises, and replica 1
    # (batch 8, fine) must raise too instead of waiting in the gradient all-reduce
    "dp_replica_fails": lambda: step(
        PipelineParallel(pp_common.make_model(0), world.split(rank), microbatches=4, dp_group=world),
        x[: 10 - 2 * rank],
        y[: 10 - 2 * rank],
    ),
    "predict_without_inputs": lambda: PipelineParallel(pp_common.make_model(0), world).predict(None),
    # the interleaved schedule (v model chunks per rank)
    "interleaved_m_not_multiple_of_p": lambda: interleaved(microbatches=3, virtual_stages=2),
    "interleaved_too_few_layers": lambda: interleaved(virtual_stages=4),  # 8 chunks of 7 layers
    "virtual_stages_below_1": lambda: interleaved(virtual_stages=0),
    "virtual_stages_without_interleaved": lambda: PipelineParallel(
        pp_common.make_model(0), world, microbatches=2, virtual_stages=2
    ),
    "virtual_stages_differ": lambda: interleaved(virtual_stages=1 + rank),
    "interleaved_predict_without_inputs": lambda: interleaved(virtual_stages=2).predict(None),
}
results = {}
for name, case in cases.items():
    try:
        case()
        results[name] = [None, "no error"]
    except (TypeError, ValueError) as error:
        results[name] = [type(error).__name__, str(error)]

pipe = PipelineParallel(pp_common.make_model(0), world, microbatches=2)
results["after"] = step(pipe)
results["after_interleaved"] = step(interleaved(virtual_stages=3))
(out / f"rank{rank}.json").write_text(json.dumps(results))
