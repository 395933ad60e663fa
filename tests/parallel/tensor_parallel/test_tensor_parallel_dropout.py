"""Dropout on tensor-parallel activations, with real ranks.

A plain ``nn.Dropout`` on the output of ``ColumnParallelLinear(gather_output=False)`` drew the same mask
on every shard, since every rank's default generator is seeded alike: the same hidden units were
dropped in every slice. Shards now draw from the RNG tracker's per-rank stream (``ops/dropout.py``),
while replicated activations keep one mask on every rank.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from mpi_utils import run_mpi

pytestmark = pytest.mark.mpi


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("tp_dropout")
    run_mpi(2, "tensor_parallel/tp_dropout.py", out, timeout=90)
    ranks = [dict(np.load(out / f"rank{r}.npz")) for r in range(2)]
    errors = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    return ranks, errors


@pytest.mark.parametrize("name", ["shard", "shard_after_tanh", "shard_in_recompute"])
def test_dropout_masks_on_shards_differ_between_ranks(run, name):
    ranks, _ = run
    a, b = ranks[0][name], ranks[1][name]
    assert a.shape == b.shape == (6, 32)
    assert 0.3 < a.mean() < 0.7 and 0.3 < b.mean() < 0.7  # about half kept on each rank
    assert not np.array_equal(a, b)
    assert 0.3 < (a == b).mean() < 0.7  # independent masks agree on about half of the elements


@pytest.mark.parametrize("name", ["replicated_input", "replicated_output", "replicated_after_recompute"])
def test_dropout_masks_on_replicated_activations_are_the_same_on_every_rank(run, name):
    ranks, _ = run
    np.testing.assert_array_equal(ranks[0][name], ranks[1][name])
    assert 0.2 < ranks[0][name].mean() < 0.8


def test_a_model_with_dropout_between_the_layers_gives_the_same_output_on_every_rank(run):
    ranks, _ = run
    np.testing.assert_array_equal(ranks[0]["sequential_output"], ranks[1]["sequential_output"])


def test_dropout_on_a_shard_without_a_seeded_tracker_raises_on_every_rank(run):
    _, errors = run
    assert errors[0] == errors[1]
    kind, message = errors[0]["unseeded"]
    assert kind == "ValueError"
    assert "model_parallel_manual_seed" in message and "nn.Dropout after ColumnParallelLinear" in message
