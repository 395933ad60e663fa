"""``PipelineParallel`` takes a raw array batch as ``md.tensor`` takes it: its dtype kept, never cast.

A float64 model fed a float64 NumPy batch trains in float64, exactly as the same model run by hand
(the batch used to be cast to float32 silently, and the float64 model raised on it); a float32
model fed float64 data raises, as torch does, instead of training on a silent cast; Python lists of
floats become float32, as ``md.tensor`` makes them. One-rank pipelines, in this process.
"""

from __future__ import annotations

import numpy as np
import pytest

import minidist as md
import minidist.distributed as dist
from minidist import nn
from minidist.parallel.pipeline import PipelineParallel


def _model(dtype):
    md.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8, dtype=dtype), nn.Tanh(), nn.Linear(8, 4, dtype=dtype))


@pytest.fixture
def world():
    world = dist.init()
    if world.size != 1:
        pytest.skip("runs in a single process")
    return world


def test_a_float64_batch_trains_a_float64_model_in_float64(world):
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((8, 6)), rng.integers(0, 4, 8)  # x: float64, as NumPy makes it
    reference = _model(np.float64)
    nn.functional.cross_entropy(reference(md.tensor(x)), y).backward()
    pipe = PipelineParallel(_model(np.float64), world, microbatches=1)
    loss = pipe.train_step(x, y, nn.functional.cross_entropy)
    expected = dict(reference.named_parameters())
    for name, p in pipe.named_parameters():
        assert p.grad.dtype == np.float64, name
        assert np.array_equal(p.grad, expected[name].grad), name
    assert loss == pytest.approx(
        float(nn.functional.cross_entropy(reference(md.tensor(x)), y).item()), rel=1e-15
    )
    out = pipe.predict(x)
    assert out.dtype == np.float64
    np.testing.assert_array_equal(out, reference(md.tensor(x)).data)


def test_a_float64_batch_into_a_float32_model_raises_as_in_torch(world):
    x, y = np.ones((4, 6)), np.zeros(4, dtype=np.int64)
    pipe = PipelineParallel(_model(np.float32), world, microbatches=1)
    with pytest.raises((TypeError, ValueError, RuntimeError), match="float64"):
        pipe.train_step(x, y, nn.functional.cross_entropy)


def test_python_floats_become_float32_as_md_tensor_makes_them(world):
    pipe = PipelineParallel(_model(np.float32), world, microbatches=2)
    x, y = [[0.5] * 6 for _ in range(4)], np.zeros(4, dtype=np.int64)
    assert np.isfinite(pipe.train_step(x, y, nn.functional.cross_entropy))
    assert all(p.grad.dtype == np.float32 for p in pipe.parameters())
    assert pipe.predict(x).dtype == np.float32
