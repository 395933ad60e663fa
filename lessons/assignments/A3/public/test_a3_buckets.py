"""A3 public test of the bucket plan (task A3.1): a pure function, no MPI needed."""

from __future__ import annotations

import numpy as np

from minidist.parallel.data_parallel.buckets import plan_buckets


def check_plan(nbytes: list[int], dtypes: list, cap: float) -> None:
    """The plan's properties: a partition, in reverse order, one dtype per bucket, within the cap, greedy."""
    plan = plan_buckets(nbytes, dtypes, cap)
    setup = f"plan_buckets(nbytes={nbytes}, cap={cap})"
    flat = [i for bucket in plan for i in bucket]
    assert flat == list(reversed(range(len(nbytes)))), (
        f"{setup} returned {plan}: read in order, the buckets must list every parameter once, in REVERSE "
        f"registration order {list(reversed(range(len(nbytes))))} (backward produces the last layer's "
        "gradients first, so bucket 0 must hold them)"
    )
    for bucket in plan:
        size = sum(nbytes[i] for i in bucket)
        assert len(bucket) == 1 or size <= cap, f"{setup}: bucket {bucket} holds {size} bytes, over the cap"
        assert len({np.dtype(dtypes[i]) for i in bucket}) == 1, f"{setup}: bucket {bucket} mixes dtypes"
    for this, following in zip(plan, plan[1:]):
        nxt = following[0]
        fits = sum(nbytes[i] for i in this) + nbytes[nxt] <= cap
        same = np.dtype(dtypes[this[0]]) == np.dtype(dtypes[nxt])
        assert not (fits and same), (
            f"{setup} returned {plan}: parameter {nxt} would still fit into bucket {this}; close a bucket "
            "only when the next gradient would go over the cap or has another dtype"
        )


def test_plan_buckets():
    f32 = np.float32
    check_plan([400, 40, 400, 40], [f32] * 4, 500)  # -> [[3, 2], [1, 0]]
    check_plan([100, 100, 100], [f32] * 3, 1e9)  # one bucket
    check_plan([100, 100, 100], [f32] * 3, 1)  # tiny cap: one bucket per parameter
