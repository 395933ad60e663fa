"""Cutting a Sequential into pipeline stages: balanced cuts, explicit cuts, global parameter names."""

from __future__ import annotations

import itertools

import numpy as np
import pp_common  # noqa: E402
import pytest
from hypothesis import given
from hypothesis import strategies as st

import minidist as md  # noqa: E402
from minidist import nn  # noqa: E402
from minidist.parallel.pipeline import balanced_cuts, partition  # noqa: E402
from minidist.parallel.pipeline.partition import build_stage  # noqa: E402


def largest_stage(weights, cuts):
    bounds = [0, *cuts, len(weights)]
    return max(sum(weights[a:b]) for a, b in zip(bounds, bounds[1:]))


@st.composite
def weights_and_stages(draw):
    weights = draw(st.lists(st.integers(0, 50), min_size=1, max_size=8))
    return weights, draw(st.integers(1, len(weights)))


@given(weights_and_stages())
def test_balanced_cuts_minimise_the_largest_stage(case):
    weights, p = case
    cuts = balanced_cuts(weights, p)
    assert len(cuts) == p - 1 and cuts == sorted(set(cuts)) and all(0 < c < len(weights) for c in cuts)
    best = min(largest_stage(weights, c) for c in itertools.combinations(range(1, len(weights)), p - 1))
    assert largest_stage(weights, cuts) == best


def test_balanced_partition_of_an_mlp_by_parameter_count():
    model = pp_common.make_model(0)  # parameters per layer: 112, 0, 204, 0, 104, 0, 36
    assert partition(model, 2) == [(0, 3), (3, 7)]  # 316 | 140, the best split into two
    assert partition(model, 7) == [(i, i + 1) for i in range(7)]
    assert partition(model, 3, cuts=[1, 5]) == [(0, 1), (1, 5), (5, 7)]


def test_stages_keep_the_full_models_names_and_compute_the_same_function():
    model = pp_common.make_model(0)
    stages = [build_stage(model, b) for b in partition(model, 3)]
    names = [name for stage in stages for name, _ in stage.named_parameters()]
    assert names == [name for name, _ in model.named_parameters()]  # "0.weight", ..., "6.bias"
    x = md.tensor(np.random.default_rng(0).standard_normal((5, 6)), dtype=np.float64)
    h = x
    for stage in stages:
        h = stage(h)
    np.testing.assert_array_equal(h.data, model(x).data)  # the same layer objects, the same order


def test_partition_errors_say_what_to_do():
    model = pp_common.make_model(0)
    with pytest.raises(ValueError, match=r"model with 7 layer\(s\) into 8 pipeline stages"):
        partition(model, 8)
    with pytest.raises(ValueError, match="3 stages need 2 cut points"):
        partition(model, 3, cuts=[2])
    with pytest.raises(ValueError, match="strictly increasing"):
        partition(model, 3, cuts=[4, 4])
    with pytest.raises(ValueError, match="strictly increasing"):
        partition(model, 2, cuts=[0])
    with pytest.raises(TypeError, match="nn.Sequential"):
        partition(nn.Linear(2, 2), 1)
