"""benchmarks/feature_cost.py switches minidist's per-op features off without changing its arithmetic.

The ablation's rows only mean "what a feature costs" if every level computes the same step and the
patches are undone: each level's parameters after a few SGD steps equal minidist's public API's, and
``ablated`` restores the functions it replaced, also when the step inside it raises.
"""

from __future__ import annotations

import importlib
import sys

import numpy as np
import pytest
from mpi_utils import BENCHMARKS, run_mpi

sys.path.insert(0, str(BENCHMARKS))
import feature_cost  # noqa: E402

from minidist.autograd import function, graph  # noqa: E402

linear_op = importlib.import_module("minidist.ops.linear")


def test_every_level_trains_the_same_parameters_as_the_public_api():
    built = feature_cost.build(rows=16)
    # float32, the same ops in the same order: equal to a few ulps (allclose(rtol=1e-5, atol=1e-6)
    # inside check()); a level that dropped a bias or a ReLU mask would move parameters by ~lr * 1e-2.
    worst = feature_cost.check(built)
    assert worst < 1e-6
    moved = [np.max(np.abs(np.asarray(p.data) - q)) for p, q in zip(built["minidist"][1], _initial())]
    assert min(moved) > 1e-4  # the check compared trained parameters, not the initial ones


def _initial() -> list[np.ndarray]:
    fresh = feature_cost.build(rows=16)
    return [np.asarray(p.data).copy() for p in fresh["minidist"][1]]


def test_ablated_restores_what_it_patched_even_after_an_error():
    before = linear_op._check, graph._checked_backward, function.Function.__dict__["apply"]
    with pytest.raises(ZeroDivisionError), feature_cost.ablated(len(feature_cost.LEVELS) - 1):
        assert graph._checked_backward is not before[1]
        1 / 0  # noqa: B018
    assert (linear_op._check, graph._checked_backward, function.Function.__dict__["apply"]) == before


def test_ddp_breakdown_contenders_compute_the_same_step_on_two_ranks():
    """benchmarks/ddp_breakdown.py's split only means something if its by-hand contenders average the
    gradients as DDP does (and the unaveraged ones agree with each other): its own check, on 2 real ranks."""
    script = BENCHMARKS / "ddp_breakdown.py"
    out = run_mpi(2, script, "--rounds", "1", timeout=120).stdout
    checks = [line for line in out.splitlines() if line.startswith("check:")]
    assert len(checks) == 5 and all(line.endswith("allclose True") for line in checks), out
    assert "DDP's bookkeeping: ddp - ours" in out
