"""DistributedDataParallel equals single-process training (DESIGN.md §3, property 3).

The reference trains the same model, from the same seed, on the whole global batch in this
process (no MPI). The MPI run splits every global batch across N real ranks.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).parent / "workers"))
import ddp_common  # noqa: E402
from mpi_utils import run_mpi  # noqa: E402

import minidist as md  # noqa: E402
from minidist import nn  # noqa: E402

# float64: the only difference between 1 and N ranks is the order in which per-sample gradients
# are summed (per rank, then across the ring), which perturbs results by a few ulps (~1e-16
# relative) per step; after 5 steps of a small, well-conditioned model 1e-9 is a wide margin that
# still catches any real error (a missing 1/N, a wrong share of the batch) by many orders.
# float32: the same reasoning with eps ~ 6e-8 gives rtol 1e-4 / atol 1e-5.
TOLERANCE = {"float64": dict(rtol=1e-9, atol=1e-11), "float32": dict(rtol=1e-4, atol=1e-5)}


def single_process(seed: int, steps: int, batch: int, opt_name: str, dtype: str):
    x, y = ddp_common.make_data(seed, 64)
    model = ddp_common.make_model(seed, np.dtype(dtype))
    opt = ddp_common.make_optimizer(opt_name, model.parameters())
    losses = []
    for step in range(steps):
        xb, yb = ddp_common.global_batch(x, y, step, batch)
        loss = nn.functional.cross_entropy(model(md.tensor(xb, dtype=dtype)), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return model.state_dict(), losses


def check_equivalence(tmp_path, world_size, seed, steps, batch, opt_name, dtype):
    run_mpi(world_size, "ddp_equivalence.py", tmp_path, seed, steps, batch, opt_name, dtype, timeout=120)
    ref_params, ref_losses = single_process(seed, steps, batch, opt_name, dtype)
    tol = TOLERANCE[dtype]
    for rank in range(world_size):
        params = np.load(tmp_path / f"params_rank{rank}.npz")
        assert sorted(params.files) == sorted(ref_params)
        for name, ref in ref_params.items():
            np.testing.assert_allclose(params[name], ref, **tol, err_msg=f"rank {rank} parameter {name}")
        losses = json.loads((tmp_path / f"losses_rank{rank}.json").read_text())
        np.testing.assert_allclose(losses, ref_losses, **tol)


@pytest.mark.mpi
@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_ddp_matches_single_process_after_5_steps(tmp_path, world_size):
    check_equivalence(tmp_path, world_size, seed=3, steps=5, batch=12, opt_name="sgd", dtype="float64")


@pytest.mark.mpi
def test_ddp_matches_single_process_with_uneven_shares_and_adamw(tmp_path):
    # 10 samples on 3 ranks: shares 4, 3, 3 — the loss scaling in the worker keeps it exact.
    check_equivalence(tmp_path, 3, seed=5, steps=5, batch=10, opt_name="adamw", dtype="float64")


@pytest.mark.mpi
def test_ddp_matches_single_process_in_float32(tmp_path):
    check_equivalence(tmp_path, 4, seed=7, steps=5, batch=16, opt_name="sgd", dtype="float32")


@pytest.mark.mpi
@settings(max_examples=3)
@given(
    world_size=st.integers(1, 5),
    batch=st.integers(5, 20),
    seed=st.integers(0, 1000),
    opt_name=st.sampled_from(["sgd", "adamw"]),
)
def test_ddp_equivalence_property(tmp_path_factory, world_size, batch, seed, opt_name):
    tmp_path = tmp_path_factory.mktemp("ddp")
    check_equivalence(tmp_path, world_size, seed, steps=3, batch=batch, opt_name=opt_name, dtype="float64")
