"""DistributedDataParallel equals single-process training (docs/design.md, property 3).

The reference trains the same model, from the same seed, on the whole global batch in this
process (no MPI). The MPI run splits every global batch across N real ranks, with every way of
communicating DDP offers: overlapped or after backward, one bucket or one per parameter or a few
parameters per bucket, and k accumulated micro-steps (no_sync) per step.

Starting the ranks costs more than these runs, so the fixed configurations (``CONFIGS``) of a world size
all run in one launch (``ddp_equivalence.py ... --then ...``), made by the module fixture ``launches``
when a test first needs one of them; each test then compares its configuration's results.
"""

from __future__ import annotations

import json
from pathlib import Path

import ddp_common  # noqa: E402
import numpy as np
import pytest
import strategies as S
from hypothesis import given, settings
from hypothesis import strategies as st
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


def single_process_two_heads(seed: int, steps: int, batch: int, opt_name: str, world_size: int):
    """TwoHeads, where rank r's share uses the `extra` head only in some steps: the reference loss is the
    same sum of per-share losses, computed in one process (float64)."""
    x, y = ddp_common.make_data(seed, 64)
    model = ddp_common.TwoHeads(seed, np.float64)
    opt = ddp_common.make_optimizer(opt_name, model.parameters())
    losses = []
    for step in range(steps):
        xb, yb = ddp_common.global_batch(x, y, step, batch)
        total = 0
        for rank in range(world_size):
            mine = ddp_common.share(batch, world_size, rank)
            logits = model(md.tensor(xb[mine], dtype=np.float64), ddp_common.uses_extra(rank, step))
            total = total + nn.functional.cross_entropy(logits, yb[mine], reduction="sum")
        loss = total * (1 / batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return model.state_dict(), losses


def check_equivalence(tmp_path, world_size, seed, steps, batch, opt_name, dtype, *options):
    """Run the worker with ``options`` (its --flags) and compare every rank with the reference."""
    args = (seed, steps, batch, opt_name, dtype, *options)
    run_mpi(world_size, "ddp/ddp_equivalence.py", tmp_path, *args, timeout=120)
    compare(tmp_path, world_size, seed, steps, batch, opt_name, dtype, *options)


def compare(tmp_path, world_size, seed, steps, batch, opt_name, dtype, *options):
    """Every rank's parameters and losses in ``tmp_path`` against the single-process reference."""
    if "--two-heads" in options:
        ref_params, ref_losses = single_process_two_heads(seed, steps, batch, opt_name, world_size)
    else:
        ref_params, ref_losses = single_process(seed, steps, batch, opt_name, dtype)
    tol = TOLERANCE[dtype]
    for rank in range(world_size):
        params = np.load(tmp_path / f"params_rank{rank}.npz")
        assert sorted(params.files) == sorted(ref_params)
        for name, ref in ref_params.items():
            np.testing.assert_allclose(params[name], ref, **tol, err_msg=f"rank {rank} parameter {name}")
        losses = json.loads((tmp_path / f"losses_rank{rank}.json").read_text())
        np.testing.assert_allclose(losses, ref_losses, **tol)


# A configuration: (world size, seed, steps, global batch, optimizer, dtype, *worker flags).
FIVE_STEPS = {ws: (ws, 3, 5, 12, "sgd", "float64") for ws in (2, 3, 4)}
UNEVEN_ADAMW = (3, 5, 5, 10, "adamw", "float64")  # 10 samples on 3 ranks: shares 4, 3, 3
FLOAT32 = (4, 7, 5, 16, "sgd", "float32")


class Launches:
    """The results of ``CONFIGS``, made on first use: every configuration of a world size in one launch."""

    def __init__(self, tmp: Path) -> None:
        self.tmp, self.folders = tmp, {}

    def results(self, config: tuple) -> Path:
        """The folder holding ``config``'s parameters and losses (after its launch)."""
        if config not in self.folders:
            world_size = config[0]
            specs = [c for c in CONFIGS if c[0] == world_size]
            args = []
            for i, c in enumerate(specs):
                self.folders[c] = self.tmp / f"run{world_size}_{i}"
                self.folders[c].mkdir()
                args += ["--then"] * (i > 0) + [str(self.folders[c]), *map(str, c[1:])]
            run_mpi(world_size, "ddp/ddp_equivalence.py", *args, timeout=120 + 30 * len(specs))
        return self.folders[config]


@pytest.fixture(scope="module")
def launches(tmp_path_factory) -> Launches:
    return Launches(tmp_path_factory.mktemp("ddp"))


def check_config(launches: Launches, config: tuple) -> None:
    compare(launches.results(config), *config)


@pytest.mark.mpi
@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_ddp_matches_single_process_after_5_steps(launches, world_size):
    check_config(launches, FIVE_STEPS[world_size])


@pytest.mark.mpi
def test_ddp_matches_single_process_with_uneven_shares_and_adamw(launches):
    # 10 samples on 3 ranks: shares 4, 3, 3 — the loss scaling in the worker keeps it exact.
    check_config(launches, UNEVEN_ADAMW)


@pytest.mark.mpi
def test_ddp_matches_single_process_in_float32(launches):
    check_config(launches, FLOAT32)


@pytest.mark.mpi
@settings(max_examples=3)
@given(
    world_size=S.world_sizes(max_size=5),
    batch=st.integers(5, 20),
    seed=st.integers(0, 1000),
    opt_name=S.optimizers,
)
def test_ddp_equivalence_property(tmp_path_factory, world_size, batch, seed, opt_name):
    tmp_path = tmp_path_factory.mktemp("ddp")
    check_equivalence(tmp_path, world_size, seed, steps=3, batch=batch, opt_name=opt_name, dtype="float64")


# Buckets: 1e-6 MiB is smaller than any parameter (one bucket per parameter, 6 buckets); 0.0005 MiB
# (524 bytes) holds a few small float64 parameters per bucket (16*8 weights = 1 KiB gets its own); 25 is
# the default (one bucket). Overlap on and off.
# small_bucket_bytes: 0 sends every bucket but the last through the comm thread; 500 splits the 0.0005
# plan (buckets of 352, 1024, 128 and 768 bytes): bucket 1 goes to the thread during backward and the
# others follow at the end, so the ranks all-reduce in the order 1, 0, 2, 3 (the lean path on both
# sides of its threshold). The default (1 MiB) puts all of these small buckets on the lean path: see
# the no_sync test below.
BUCKET_ROWS = [
    (2, "sgd", ("--bucket-cap-mb", "1e-6", "--small-bucket-bytes", "0")),
    (3, "adamw", ("--bucket-cap-mb", "1e-6", "--no-overlap")),
    (4, "adamw", ("--bucket-cap-mb", "0.0005", "--small-bucket-bytes", "0")),
    (2, "sgd", ("--bucket-cap-mb", "0.0005", "--no-overlap")),
    (2, "sgd", ("--bucket-cap-mb", "0.0005", "--small-bucket-bytes", "500")),
]


@pytest.mark.mpi
@pytest.mark.parametrize("world_size, opt_name, options", BUCKET_ROWS)
def test_ddp_matches_single_process_for_bucket_sizes_and_overlap(launches, world_size, opt_name, options):
    check_config(launches, (world_size, 11, 4, 12, opt_name, "float64", *options))


# no_sync: k micro-steps of (global batch / k) on N ranks, each micro-step's loss scaled by 1/k (here:
# by world_size / global batch on the summed loss, which is the same thing for equal shares and stays
# exact for unequal ones), equal one step on the whole global batch in one process. 14 samples in 3
# micro-batches (5, 5, 4) on 2 or 3 ranks also gives unequal shares.
# The first row's 6 small buckets all take the lean path (default small_bucket_bytes).
NO_SYNC_ROWS = [
    (2, "sgd", ("--grad-accum", "3", "--bucket-cap-mb", "1e-6")),
    (3, "adamw", ("--grad-accum", "2", "--no-overlap")),
]


@pytest.mark.mpi
@pytest.mark.parametrize("world_size, opt_name, options", NO_SYNC_ROWS)
def test_no_sync_accumulation_matches_one_big_step(launches, world_size, opt_name, options):
    check_config(launches, (world_size, 13, 4, 14, opt_name, "float64", *options))


# find_unused_parameters=True: the `extra` head is used by some ranks only, and its bucket starts late;
# the average with zeros for the ranks without it equals the gradient of the summed per-share losses.
# With small_bucket_bytes=100 the two 256-byte weights' buckets (1 and 3) go to the thread and the
# rest follow at the end: a rank without `extra` cannot hand over bucket 1 during backward, so it runs
# 1 and 3 itself at the end, in the same order as the others.
UNUSED_ROWS = [("--bucket-cap-mb", "1e-6", "--small-bucket-bytes", "100"), ("--no-overlap",)]


@pytest.mark.mpi
@pytest.mark.parametrize("options", UNUSED_ROWS)
def test_find_unused_parameters_matches_single_process(launches, options):
    check_config(launches, (3, 17, 4, 12, "sgd", "float64", "--two-heads", *options))


CONFIGS = [
    *FIVE_STEPS.values(),
    UNEVEN_ADAMW,
    FLOAT32,
    *[(ws, 11, 4, 12, opt, "float64", *options) for ws, opt, options in BUCKET_ROWS],
    *[(ws, 13, 4, 14, opt, "float64", *options) for ws, opt, options in NO_SYNC_ROWS],
    *[(3, 17, 4, 12, "sgd", "float64", "--two-heads", *options) for options in UNUSED_ROWS],
]
