"""A stage whose output shape changes from one microbatch to the next, on 2 ranks: each case must raise
the same error, naming the stage, the microbatch and both shapes, on every rank, and never hang.

    mpiexec -n 2 python pp_shapes.py OUT_DIR

Writes OUT_DIR/rank{r}.json: {case: [exception type, message]}, plus "after": the loss of one correct
step afterwards (no case may leave a stray message behind).
"""

import json
import sys
from pathlib import Path

import numpy as np
import pp_common

import minidist as md
import minidist.distributed as dist
from minidist import nn
from minidist.autograd import Function
from minidist.parallel.pipeline import PipelineParallel

out = Path(sys.argv[1])
world = dist.init()
rank = world.rank
x, y = pp_common.make_data(0, 8)


class DropRowsOnSecondCall(nn.Module):
    """The identity, except that every second call drops the last row: a data-dependent shape, as a
    layer that filters or pads its input would produce."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def forward(self, h):
        self.calls += 1
        return h if self.calls % 2 else h[:-1]


def pipe_with(layer: nn.Module, schedule: str = "1f1b", v: int = 1, cuts=(2,)) -> PipelineParallel:
    """make_model's 7 layers with ``layer`` after the first Linear; ``cuts`` place the stage boundaries."""
    layers = list(pp_common.make_model(0)._modules.values())
    model = nn.Sequential(layers[0], layer, *layers[1:])
    return PipelineParallel(model, world, microbatches=2, schedule=schedule, virtual_stages=v, cuts=cuts)


def step(pipe):
    return pipe.train_step(md.tensor(x, dtype=np.float64), y, nn.functional.cross_entropy)


class FailOnSecondCall(DropRowsOnSecondCall):
    def forward(self, h):
        self.calls += 1
        if self.calls % 2 == 0:
            raise KeyError("no such token")
        return h


class FailOnFirstCall(DropRowsOnSecondCall):
    def forward(self, h):
        self.calls += 1
        if self.calls == 1:
            raise KeyError("no such token")
        return h


class _RaiseInBackward(Function):
    """The identity in forward; its backward raises, as a custom op with a bug in its derivative would."""

    def forward(self, h):
        return h

    def backward(self, grad):
        raise ArithmeticError("derivative not implemented")


class FailInBackward(nn.Module):
    def forward(self, h):
        return _RaiseInBackward.apply(h)


def too_wide_for_stage_1(schedule: str = "1f1b") -> PipelineParallel:
    """Stage 0 ends in Linear(6, 16) but stage 1 begins with Linear(12, 4)."""
    md.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(6, 16, dtype=np.float64), nn.Tanh(), nn.Linear(12, 4, dtype=np.float64), nn.Tanh()
    )
    return PipelineParallel(model, world, microbatches=2, schedule=schedule, cuts=[2])


def interleaved_failing_on_rank_1() -> PipelineParallel:
    """Virtual stage 1 (rank 1) fails on microbatch 0; its stand-in, shaped like its input (4, 16), then
    makes virtual stage 2 (rank 0: Linear(12, 8)) fail too. Rank 1's failure came first."""
    md.manual_seed(0)
    f64 = np.float64
    model = nn.Sequential(
        nn.Linear(6, 16, dtype=f64), FailOnFirstCall(), nn.Linear(16, 12, dtype=f64), nn.Tanh(),
        nn.Linear(12, 8, dtype=f64), nn.Tanh(), nn.Linear(8, 4, dtype=f64),
    )  # fmt: skip
    return PipelineParallel(
        model, world, microbatches=2, schedule="interleaved", virtual_stages=2, cuts=[1, 3, 5]
    )


cases = {
    "interleaved_first_failure_wins": lambda: step(interleaved_failing_on_rank_1()),
    "too_wide_1f1b": lambda: step(too_wide_for_stage_1()),
    "too_wide_gpipe": lambda: step(too_wide_for_stage_1("gpipe")),
    # stage 0's layer fails on microbatch 1 only: stage 1 gets zeros of the right shape and succeeds
    "fails_on_microbatch_1": lambda: step(pipe_with(FailOnSecondCall())),
    # stage 0 fails on microbatch 0, before any activation fixed the boundary's shape: its stand-in
    # (zeros shaped like its input) makes stage 1 fail too; the first failure is the one reported
    "fails_on_microbatch_0_then_stage_1": lambda: step(pipe_with(FailOnFirstCall())),
    "rows_1f1b": lambda: step(pipe_with(DropRowsOnSecondCall())),
    "rows_gpipe": lambda: step(pipe_with(DropRowsOnSecondCall(), "gpipe")),
    "rows_interleaved": lambda: step(pipe_with(DropRowsOnSecondCall(), "interleaved", 2, [2, 4, 6])),
    # virtual stage 1 (rank 1's first chunk) changes shape; its output goes to rank 0's second chunk
    "rows_interleaved_rank_1": lambda: step(pipe_with(DropRowsOnSecondCall(), "interleaved", 2, [1, 4, 6])),
    # a layer whose backward raises, on stage 0 (cuts=[3]: after the Tanh) or on the last stage
    "backward_fails_stage_0": lambda: step(pipe_with(FailInBackward(), cuts=(3,))),
    "backward_fails_last_stage_gpipe": lambda: step(pipe_with(FailInBackward(), "gpipe", cuts=(1,))),
    "backward_fails_interleaved": lambda: step(pipe_with(FailInBackward(), "interleaved", 2, [2, 4, 6])),
    # forward only: rank 1's layer raised there alone and rank 0 waited forever for the output
    "predict_too_wide": lambda: too_wide_for_stage_1().predict(md.tensor(x, dtype=np.float64)),
    "predict_interleaved_first_failure_wins": lambda: interleaved_failing_on_rank_1().predict(
        md.tensor(x, dtype=np.float64)
    ),
}
results = {}
for name, case in cases.items():
    try:
        case()
        results[name] = [None, "no error"]
    except (TypeError, ValueError, RuntimeError) as error:
        results[name] = [type(error).__name__, str(error)]
results["after"] = step(PipelineParallel(pp_common.make_model(0), world, microbatches=2))
(out / f"rank{rank}.json").write_text(json.dumps(results))
