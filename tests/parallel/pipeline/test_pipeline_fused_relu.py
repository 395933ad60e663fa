"""A pipeline of a ReLU MLP on a one-rank group, bit for bit against the microbatches run by hand.

The pipeline tests' models (tests/workers/pp_common.py) use Tanh and GELU, so they never run the fused
Linear + ReLU of a stage (``PipelineStage.forward`` -> ``nn.layers.run_in_order``); and the last stage
starts each microbatch's backward from the seed 1/m (``StageExecutor._backward``) where it used to
backpropagate 1 through ``loss * (1/m)``. Both are claimed bit-identical: the reference here is that
old formula on the whole model, microbatch after microbatch, for a loss of shape (), one of shape (1,)
and a float64 one, and chunk boundaries that cut a Linear from its ReLU.
"""

from __future__ import annotations

import numpy as np
import pytest

import minidist as md
import minidist.distributed as dist
from minidist import nn
from minidist.parallel.pipeline import PipelineParallel

LOSSES = {
    "scalar": nn.functional.cross_entropy,
    "shape (1,)": lambda out, t: nn.functional.cross_entropy(out, t).reshape(1),
    "float64": lambda out, t: nn.functional.cross_entropy(out, t).double(),
}


def _model():
    md.manual_seed(0)  # 7 layers: 4 chunks of the interleaved schedule cut some Linear from its ReLU
    return nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 12), nn.ReLU(),
                         nn.Linear(12, 8), nn.ReLU(), nn.Linear(8, 4))  # fmt: skip


@pytest.mark.parametrize("loss", LOSSES)
@pytest.mark.parametrize(("schedule", "v"), [("1f1b", 1), ("gpipe", 1), ("interleaved", 4)])
def test_one_rank_pipeline_equals_the_microbatches_by_hand_bit_for_bit(schedule, v, loss):
    world = dist.init()
    if world.size != 1:
        pytest.skip("runs in a single process")
    loss_fn, m = LOSSES[loss], 3  # 1/3 is not a binary fraction: its rounding is part of the check
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((12, 6)).astype(np.float32), rng.integers(0, 4, 12)
    reference = _model()
    for i in range(m):
        part = slice(4 * i, 4 * (i + 1))
        (loss_fn(reference(md.tensor(x[part])), y[part]) * (1.0 / m)).backward()
    pipe = PipelineParallel(_model(), world, microbatches=m, schedule=schedule, virtual_stages=v)
    pipe.train_step(md.tensor(x), y, loss_fn)
    expected = dict(reference.named_parameters())
    for name, p in pipe.named_parameters():
        assert np.array_equal(p.grad, expected[name].grad), name
