"""Tensor-parallel layers built after a per-rank seed are still *one* layer.

``md.manual_seed(rank)`` is a common data-parallel habit. A tensor-parallel layer draws its full weight
from the default generator and keeps its slice; with a different seed per rank the slices came from
different matrices and the replicated row-parallel bias differed (by 0.3-0.45 in the report), silently.
The layers now adopt the group's first rank's generator at construction, so the model (and the dropout
masks of replicated activations after it) equals the one rank 0's seed builds on one device.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from mpi_utils import run_mpi

pytestmark = pytest.mark.mpi

ERRORS = {
    "group_not_a_communicator_on_rank_1": r"rank 1 of the tensor-parallel group: ColumnParallelLinear: group "
    r"must be a minidist.distributed.Communicator or None \(the world\), got str",
    "bias_array_on_rank_0": r"rank 0 of the tensor-parallel group: RowParallelLinear: bias must be True or "
    r"False, got ndarray",
    "mlp_bias_array_on_rank_1": r"rank 1 of the tensor-parallel group: ParallelMLP: bias must be True or",
    "mlp_group_not_a_communicator_on_rank_0": r"rank 0 of the tensor-parallel group: ParallelMLP: group must "
    r"be a minidist.distributed.Communicator .* got Intracomm",
}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("tp_seed")
    run_mpi(2, "tensor_parallel/tp_seed.py", out, timeout=90)
    ranks = [dict(np.load(out / f"rank{r}.npz")) for r in range(2)]
    errors = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    return ranks, errors


def test_a_per_rank_seed_builds_the_model_rank_0_would_build_on_one_device(run):
    ranks, _ = run
    for r, arrays in enumerate(ranks):
        for name in ("0.weight", "0.bias", "2.weight", "2.bias", "4.weight", "4.bias"):
            np.testing.assert_array_equal(
                arrays[f"full.{name}"], arrays[f"dense.{name}"], err_msg=f"{r} {name}"
            )
        for name in ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"):
            np.testing.assert_array_equal(arrays[f"mlp.{name}"], arrays[f"dense_mlp.{name}"], err_msg=name)


def test_a_per_rank_seed_gives_the_same_outputs_on_every_rank(run):
    ranks, _ = run
    # the row layer's replicated bias, the dense layer after the tp layers, the replicated dropout mask
    np.testing.assert_array_equal(ranks[0]["full.2.bias"], ranks[1]["full.2.bias"])
    np.testing.assert_array_equal(ranks[0]["full.4.weight"], ranks[1]["full.4.weight"])
    np.testing.assert_allclose(ranks[0]["y"], ranks[1]["y"], rtol=0, atol=0)
    np.testing.assert_allclose(ranks[0]["y"], ranks[0]["dense_y"], rtol=1e-12, atol=1e-12)
    assert not np.allclose(ranks[0]["y"], ranks[0]["y_eval"])  # the dropout dropped: masks were compared


def test_a_bad_group_or_bias_on_one_rank_raises_on_every_rank(run):
    _, errors = run
    for case, pattern in ERRORS.items():
        assert errors[0][case] == errors[1][case], case
        kind, message = errors[0][case]
        assert kind == "TypeError" and re.search(pattern, message), (case, message)
    assert errors[0]["after"] == errors[1]["after"]  # the group still works


def test_each_tp_group_of_a_mesh_builds_its_first_ranks_model_and_replicas_keep_their_own(tmp_path):
    """dp=2 x tp=2 with md.manual_seed(rank): tp group {0, 1} builds seed 0's layers, {2, 3} seed 2's.
    The replicas differ (DDP broadcasts replica 0's weights, as with any per-rank seed)."""
    run_mpi(4, "tensor_parallel/tp_seed_mesh.py", tmp_path, timeout=120)
    ranks = [dict(np.load(tmp_path / f"rank{r}.npz")) for r in range(4)]
    for r, arrays in enumerate(ranks):
        for k in range(2):
            for name in ("weight", "bias"):
                np.testing.assert_array_equal(
                    arrays[f"tp{k}.{name}"], arrays[f"dense{k}.{name}"], err_msg=f"{r}"
                )
    np.testing.assert_array_equal(ranks[0]["tp1.bias"], ranks[1]["tp1.bias"])
    np.testing.assert_array_equal(ranks[2]["tp1.bias"], ranks[3]["tp1.bias"])
    assert not np.array_equal(ranks[0]["tp0.weight"], ranks[2]["tp0.weight"])  # replicas: own streams
