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
import minidist.distributed as dist
from minidist import nn
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


def fails_before_its_step(pipe, inputs, targets):
    """A step that must raise on every replica before any replica runs it: no gradient may change
    (a replica that ran its backward first would leave partial gradients behind)."""
    try:
        return step(pipe, inputs, targets)
    finally:
        changed = [name for name, p in pipe.named_parameters() if p.grad is not None]
        assert not changed, f"rank {rank}: the failed step left gradients in {changed}"


def interleaved(microbatches=2, **kwargs) -> PipelineParallel:
    model = pp_common.make_model(0)
    return PipelineParallel(model, world, microbatches=microbatches, schedule="interleaved", **kwargs)


def vector_loss(out, targets):
    return (out * out).mean(axis=1)  # one loss per sample, not their mean


def float_loss(out, targets):
    return float(ce(out, targets).item())  # a Python float: nothing to differentiate


def loss_fails(schedule="1f1b", v=1, microbatches=2, targets=None, loss_fn=ce, group=world, **kwargs):
    pipe = PipelineParallel(
        pp_common.make_model(0),
        group,
        microbatches=microbatches,
        schedule=schedule,
        virtual_stages=v,
        **kwargs,
    )
    return pipe.train_step(md.tensor(x[:8], dtype=np.float64), y[:8] if targets is None else targets, loss_fn)


def recovers_after_a_failed_loss():
    """The same pipeline trains normally after a step whose loss failed, like a fresh one."""
    pipe = PipelineParallel(pp_common.make_model(0), world, microbatches=2)
    try:
        step(pipe, x[:8], np.full(8, 9))
    except ValueError:
        pipe.zero_grad()
    fresh = PipelineParallel(pp_common.make_model(0), world, microbatches=2)
    return [step(pipe, x[:8], y[:8]), step(fresh, x[:8], y[:8])]


def numpy_counts():
    """NumPy integers on rank 0, ints on rank 1: the same pipeline, no disagreement."""
    m, v = (np.int64(2), np.int32(2)) if rank == 0 else (2, 2)
    return step(interleaved(microbatches=m, virtual_stages=v), x[:8], y[:8])


def predict_while_other_trains():
    pipe = PipelineParallel(pp_common.make_model(0), world, microbatches=2)
    return pipe.predict(x) if rank == 0 else step(pipe, x[:8], y[:8])


second_half_bad = np.concatenate([y[:4], np.full(4, 9)])  # microbatch 0 succeeds, microbatch 1 fails

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
    "dp_replica_fails": lambda: fails_before_its_step(
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
    # loss_fn misuse: seen on the last stage only, mid-schedule, but reported on every rank
    "loss_returns_vector": lambda: loss_fails(loss_fn=vector_loss),
    "loss_returns_float_gpipe": lambda: loss_fails("gpipe", loss_fn=float_loss),
    "targets_out_of_range": lambda: loss_fails(targets=np.full(8, 9)),
    "targets_bad_in_microbatch_1_gpipe": lambda: loss_fails("gpipe", targets=second_half_bad),
    "targets_bad_in_microbatch_1_interleaved": lambda: loss_fails("interleaved", 2, targets=second_half_bad),
    "loss_returns_vector_interleaved": lambda: loss_fails("interleaved", 3, loss_fn=vector_loss),
    "loss_fn_not_callable_on_rank_1": lambda: loss_fails(loss_fn=ce if rank == 0 else "cross_entropy"),
    # dp=2 x pp=1: replica 1's targets are out of range; replica 0 must raise too, not wait
    "dp_replica_loss_fails": lambda: loss_fails(
        group=world.split(rank), dp_group=world, targets=np.full(8, 9) if rank else None
    ),
    "predict_while_other_trains": predict_while_other_trains,
}
results = {}
for name, case in cases.items():
    try:
        case()
        results[name] = [None, "no error"]
    except (TypeError, ValueError) as error:
        results[name] = [type(error).__name__, str(error)]
results["recovers_after_a_failed_loss"] = recovers_after_a_failed_loss()
results["numpy_counts"] = numpy_counts()

pipe = PipelineParallel(pp_common.make_model(0), world, microbatches=2)
results["after"] = step(pipe)
results["after_interleaved"] = step(interleaved(virtual_stages=3))
(out / f"rank{rank}.json").write_text(json.dumps(results))
