"""The hand-written NumPy reference of benchmarks/numpy_reference.py computes minidist's gradients.

benchmarks/peer.py times minidist against that reference; the comparison only means something if both
do the same arithmetic. One process: the whole-model step and the GPipe step (one stage, 4
microbatches, over MPI.COMM_SELF) against minidist's autograd on the 64-256-256-10 MLP, batch 128.
"""

from __future__ import annotations

import sys

import numpy as np
from mpi4py import MPI
from mpi_utils import BENCHMARKS

import minidist as md
from minidist import nn
from minidist.models import MLP

sys.path.insert(0, str(BENCHMARKS))
from numpy_reference import ReferenceStage, compare, cross_entropy, gpipe_step  # noqa: E402

# float32 sums of up to 256 products in another order (BLAS vs autograd's ops): relative errors of a
# few 1e-7 per element; gradients are O(1e-2), so 1e-6 absolute leaves margin without hiding a bug
# (a wrong ReLU mask or a missing 1/N changes them by O(1e-3) or more).
RTOL, ATOL = 1e-4, 1e-6


def _minidist_grads(model: MLP, x: np.ndarray, y: np.ndarray) -> tuple[float, list[np.ndarray]]:
    model.zero_grad()
    loss = nn.functional.cross_entropy(model(md.tensor(x)), y)
    loss.backward()
    return loss.item(), [p.grad for p in model.parameters()]


def _setup() -> tuple[MLP, np.ndarray, np.ndarray]:
    md.manual_seed(0)
    model = MLP(64, [256, 256], 10)
    rng = np.random.default_rng(0)
    return model, rng.standard_normal((128, 64), dtype=np.float32), rng.integers(0, 10, 128)


def test_reference_gradients_equal_minidist():
    model, x, y = _setup()
    loss, expected = _minidist_grads(model, x, y)
    ref = ReferenceStage([p.data for p in model.parameters()], head=True)
    ref_loss, grad = cross_entropy(ref.forward(x), y)
    ref.backward(grad)
    assert np.isclose(ref_loss, loss, rtol=1e-6)
    for got, want in zip(ref.grads, expected):
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


def test_reference_gpipe_step_equals_minidist_sgd_step():
    """Microbatched (4 x 32) on one stage: the accumulated gradient is the whole batch's, and the SGD
    update lands where minidist's lands."""
    model, x, y = _setup()
    _, grads = _minidist_grads(model, x, y)
    ref = ReferenceStage([p.data for p in model.parameters()], head=True)
    gpipe_step(ref, x, y, lr=0.1, microbatches=4, pp=MPI.COMM_SELF)
    for got, p, g in zip(ref.params, model.parameters(), grads):
        np.testing.assert_allclose(got, p.data - 0.1 * g, rtol=RTOL, atol=ATOL)


def test_compare_reports_the_largest_difference_and_reads_tensors_as_their_data():
    """peer.py's check before timing rests on ``compare``."""
    ours = [np.zeros((2, 3), dtype=np.float32), np.ones(3, dtype=np.float32)]
    theirs = [md.tensor(np.full((2, 3), 1e-3, dtype=np.float32)), np.ones(3, dtype=np.float32)]
    diff, ok = compare(theirs, ours, rtol=0.0, atol=1e-4)
    assert abs(diff - 1e-3) < 1e-9 and not ok  # 1e-3 off, beyond atol: caught
    diff, ok = compare(theirs, ours, rtol=0.0, atol=1e-2)
    assert abs(diff - 1e-3) < 1e-9 and ok  # within atol
    assert compare(ours, ours, rtol=0.0, atol=0.0) == (0.0, True)
