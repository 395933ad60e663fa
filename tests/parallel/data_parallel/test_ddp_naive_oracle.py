"""``DataParallelNaive`` as the oracle of ``DistributedDataParallel``, on real ranks.

The naive wrapper (``minidist/parallel/data_parallel/naive.py``) is short enough to check by reading: one
broadcast per parameter at construction, one ``all_reduce(op="avg")`` per gradient during backward. DDP
must train the same model to the same numbers with every way it packs and schedules the gradients:
one bucket per parameter on the communication thread, a few parameters per bucket on the thread or on
the lean path, one bucket after backward. One launch per world size runs the naive wrapper and every
DDP variant, in float64 and float32, from the same seeds (every rank seeds its own model: both
wrappers must broadcast rank 0's) and the same global batches.

What may differ: both wrappers hand the same local gradients to ``dist.all_reduce``, which sums them
over the ranks; DDP's buffers lay the values out differently, and where a value sits can decide the
order in which the ranks' values are added (a ring adds each chunk starting from another rank). With 2
ranks every element is ``a + b`` in one order or the other, which IEEE addition makes bit-identical: the
parameters must be *equal*. With 3 ranks an element's sum may round differently by an ulp (1e-16
relative in float64, 6e-8 in float32) per step, so the test allows far less than any real error would
cause (a missing average, a gradient sent twice or not at all is off by 1e-2 or more) but more than 5
steps of such ulps. (Today every buffer here is under 1 MiB, where ``auto`` picks recursive doubling on 3
ranks, whose order does not depend on the position: the measured difference is 0; the tuning table
may change, ``minidist/distributed/tuning.py``.)
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from mpi_utils import run_mpi

from tests.parallel.data_parallel import test_ddp

SEED, STEPS, BATCH = 17, 5, 12  # 12 samples: equal shares on 2 and 3 ranks
DTYPES = ("float64", "float32")
# 1e-6 MiB is smaller than any parameter (one bucket each); 0.0005 MiB holds a few float64 parameters
# (half as many bytes in float32: fewer buckets); small_bucket_bytes=0 sends every bucket but the last
# through the communication thread, the default keeps these small buckets on the lean path.
VARIANTS = [
    {"bucket_cap_mb": 1e-6, "small_bucket_bytes": 0},
    {"bucket_cap_mb": 0.0005, "small_bucket_bytes": 0},
    {"bucket_cap_mb": 0.0005},
    {"bucket_cap_mb": 25, "overlap": False},
]
# 3 ranks: the summation order of three values (module docstring): 5 steps of ulps (1e-16 in float64,
# 6e-8 in float32) on parameters of order 0.1-1, with margins of 100x and more.
TOLERANCE = {"float64": dict(rtol=1e-12, atol=1e-14), "float32": dict(rtol=1e-5, atol=1e-6)}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """World size -> the folder of its launch (made on first use)."""
    folders = {}

    def results(world_size: int):
        if world_size not in folders:
            out = tmp_path_factory.mktemp(f"naive_oracle{world_size}")
            args = (out, SEED, STEPS, BATCH, json.dumps(VARIANTS), *DTYPES)
            run_mpi(world_size, "ddp/ddp_naive_oracle.py", *args, timeout=240)
            folders[world_size] = out
        return folders[world_size]

    return results


def load(folder, world_size: int) -> list[dict[str, np.ndarray]]:
    """Every rank's parameters, by name."""
    return [dict(np.load(folder / f"params_rank{r}.npz")) for r in range(world_size)]


@pytest.mark.mpi
@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("dtype", DTYPES)
def test_the_naive_wrapper_matches_single_process_training(runs, world_size, dtype):
    # The oracle itself: N ranks train exactly the model one process trains on the whole batch.
    test_ddp.compare(runs(world_size) / dtype / "naive", world_size, SEED, STEPS, BATCH, "sgd", dtype)


@pytest.mark.mpi
@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("variant", range(len(VARIANTS)))
def test_ddp_trains_the_naive_wrappers_parameters(runs, world_size, dtype, variant):
    folder = runs(world_size) / dtype
    naive, ddp = load(folder / "naive", world_size), load(folder / f"ddp{variant}", world_size)
    initial = test_ddp.single_process(SEED, 0, BATCH, "sgd", dtype)[0]
    for rank in range(world_size):
        assert sorted(ddp[rank]) == sorted(naive[rank]) == sorted(initial)
        for name, want in naive[rank].items():
            where = f"{VARIANTS[variant]}, rank {rank}, parameter {name}"
            assert not np.array_equal(want, initial[name]), f"{where}: did not train"
            np.testing.assert_array_equal(ddp[rank][name], ddp[0][name], err_msg=f"{where}: replicas differ")
            if world_size == 2:  # a + b == b + a: the same sums, the same bits
                np.testing.assert_array_equal(ddp[rank][name], want, err_msg=where)
            else:
                np.testing.assert_allclose(ddp[rank][name], want, **TOLERANCE[dtype], err_msg=where)
