"""Sequence parallelism's mappings (Korthikanti et al. 2022, §4.2.2): values, gradients, errors.

The three mappings run on 3 real ranks (not a power of two, so the reduce-scatter is not a trivial
halving); their gradients are compared with central differences of one objective over all ranks
(tests/workers/tensor_parallel/sp_mappings.py). The whole transformer block under sequence
parallelism is checked against one process in test_parallel_transformer.py.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from fake_group import fake_group  # noqa: E402
from hypothesis import given, settings
from hypothesis import strategies as st
from mpi_utils import run_mpi  # noqa: E402

import minidist as md  # noqa: E402
from minidist.parallel.tensor_parallel import sequence_parallel as sp  # noqa: E402

RANKS = 3


@pytest.mark.mpi
@settings(max_examples=1)
@given(
    cfg=st.fixed_dictionaries(
        {
            "seed": st.integers(0, 2**31 - 1),
            "batch": st.integers(1, 2),
            "local_t": st.integers(1, 2),
            "extra": st.lists(st.integers(1, 2), min_size=0, max_size=2),
        }
    )
)
def test_sequence_mappings_values_and_gradients(tmp_path_factory, cfg):
    tmp = tmp_path_factory.mktemp("sp")
    (tmp / "cfg.json").write_text(json.dumps(cfg))
    run_mpi(RANKS, "tensor_parallel/sp_mappings.py", tmp, tmp / "cfg.json", timeout=120)
    ranks = [dict(np.load(tmp / f"rank{r}.npz")) for r in range(RANKS)]
    t = cfg["local_t"]
    for r, got in enumerate(ranks):
        mine = slice(r * t, (r + 1) * t)
        # forward values: own slice / every rank's positions in rank order / the sum's own positions
        np.testing.assert_array_equal(got["scatter/y"], got["scatter/x"][:, mine])
        gathered = np.concatenate([ranks[s]["gather/x"] for s in range(RANKS)], axis=1)
        np.testing.assert_array_equal(got["gather/y"], gathered)
        total = sum(ranks[s]["reduce_scatter/x"] for s in range(RANKS))
        np.testing.assert_allclose(got["reduce_scatter/y"], total[:, mine], rtol=1e-15, atol=1e-15)
        # a sequence shard is tagged as one (dropout draws a mask per rank); the gathered tensor is not
        assert got["scatter/sharded"] and got["reduce_scatter/sharded"] and not got["gather/sharded"]
        np.testing.assert_allclose(  # the fused linear's forward: the gathered sequence times W_r^T + b_r
            got["linear_x/y"], gathered_x_times(ranks, r), rtol=1e-12, atol=1e-12
        )
        for op in ("scatter", "gather", "reduce_scatter", "linear_x", "linear_w"):
            # J is linear in x: central differences are exact but for rounding (~1e-10 absolute with
            # eps 1e-6 on values of order 1-10); 1e-7 is far below any wrong gradient (order 1).
            np.testing.assert_allclose(
                got[f"{op}/analytic"], got[f"{op}/numeric"], atol=1e-7, err_msg=f"{op} on rank {r}"
            )
            assert np.abs(got[f"{op}/analytic"]).max() > 0.1  # a non-trivial gradient was checked
        # flagged gradients are summed over the ranks (float64 and float32), the unflagged one untouched
        assert int(got["count"]) == 2
        for i, tol in ((0, 1e-15), (1, 1e-6)):
            want = sum(ranks[s][f"before/{i}"].astype(np.float64) for s in range(RANKS))
            np.testing.assert_allclose(got[f"after/{i}"], want, rtol=tol, atol=tol)
            assert got[f"after/{i}"].dtype == got[f"before/{i}"].dtype
        np.testing.assert_array_equal(got["after/2"], got["before/2"])


def gathered_x_times(ranks: list[dict], r: int) -> np.ndarray:
    """What rank r's ``all_gather_linear`` must return: every rank's x on axis 1, times rank r's W, + b."""
    x = np.concatenate([got["linear_x/x"] for got in ranks], axis=1)
    return x @ ranks[r]["W0"].T + ranks[r]["b0"]


def test_a_sequence_not_divisible_by_the_group_is_an_error():
    x = md.tensor(np.zeros((2, 7, 4)))
    with pytest.raises(ValueError, match=r"a sequence of 7 positions cannot be split into 2 equal"):
        sp.scatter_to_sequence_parallel_region(x, fake_group(2))
    with pytest.raises(ValueError, match=r"a sequence of 7 positions cannot be split into 3 equal"):
        sp.reduce_scatter_to_sequence_parallel_region(x, fake_group(3))
    with pytest.raises(ValueError, match=r"expects activations \(B, T, \.\.\.\) .* got shape \(5,\)"):
        sp.scatter_to_sequence_parallel_region(md.tensor(np.zeros(5)), fake_group(2))


def test_split_sequence_takes_the_rank_th_contiguous_positions():
    x = np.arange(2 * 6 * 3).reshape(2, 6, 3)
    np.testing.assert_array_equal(sp.split_sequence(x, fake_group(3, rank=1)), x[:, 2:4])
    # one rank: the mappings are the identity, and the sum of gradients over one rank changes nothing
    y = sp.reduce_scatter_to_sequence_parallel_region(md.tensor(x * 1.0), fake_group(1))
    np.testing.assert_array_equal(y.numpy(), x)
