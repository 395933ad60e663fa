"""ZeroRedundancyOptimizer with parameter groups, gradient clipping and a learning-rate schedule.

The GPT recipe (two AdamW groups, no weight decay on biases and norms, each group with its own lr;
``zero.clip_grad_norm_``; ``cosine_with_warmup``; two microbatches of gradient accumulation per step)
on real MPI ranks (``tests/workers/zero/zero_groups.py``, one launch per world size runs stages 1
and 2) against one process doing the same with a plain AdamW and ``minidist.nn.utils.clip_grad_norm_``
on the whole batch. The errors of groups and of clipping are in ``tests/parallel/zero/test_zero.py``'s error
cases.

The reference runs in this process, without MPI (this process never imports ``minidist.distributed``).
"""

from __future__ import annotations

import functools
import json

import numpy as np
import pytest
import zero_common as zc  # noqa: E402
from mpi_utils import run_mpi  # noqa: E402

from minidist import optim  # noqa: E402
from minidist.nn.utils import clip_grad_norm_  # noqa: E402

SEED = 3
# float64. One process and N ranks differ only in the order in which the gradients are summed (per
# rank, then over the ranks in the reduce-scatter) and the squares of the norm are added (per shard,
# then over the ranks): a few ulps (~1e-16 relative) per step. Clipping scales by max_norm / norm and
# Adam divides by sqrt(v), both well conditioned here (norms 0.28-0.47, eps 1e-8 far below sqrt(v)),
# so after 6 steps 1e-9 is a wide margin that still catches any real error (a group's weight decay on
# the wrong shard, an lr that does not reach a rank, a norm over local instead of averaged gradients:
# all change the parameters by more than 1e-4).
TOLERANCE = dict(rtol=1e-9, atol=1e-11)


@pytest.fixture(scope="module", params=[2, 3], ids=lambda n: f"N={n}")
def groups_run(request, tmp_path_factory):
    """Run the worker once per world size; return ``(n, load)`` with ``load(stage, rank)``."""
    n = request.param
    out = tmp_path_factory.mktemp(f"zero_groups_n{n}")
    run_mpi(n, "zero/zero_groups.py", out, SEED, timeout=120)

    def load(stage: int, rank: int) -> tuple[dict[str, np.ndarray], dict]:
        with np.load(out / f"stage{stage}_rank{rank}.npz") as archive:
            params = dict(archive)
        return params, json.loads((out / f"stage{stage}_rank{rank}.json").read_text())

    return n, load


@functools.cache
def single_process() -> tuple[dict[str, np.ndarray], list[float], list[float], list[list[float]]]:
    """The reference: plain AdamW with the same groups, clipping and schedule, on the whole batch."""
    x, y = zc.make_data(SEED)
    model, _ = zc.make_model(SEED, np.float64)
    opt = optim.AdamW(zc.grouped(model), **zc.GROUP_KWARGS)
    clip = functools.partial(clip_grad_norm_, list(model.parameters()), zc.MAX_NORM)
    sums, norms, lrs = zc.train_grouped(model, opt, zc.schedule(opt), clip, x, y, zc.GROUP_STEPS)
    params = {k: np.array(v) for k, v in model.state_dict().items()}
    return params, [s / zc.GROUP_BATCH for s in sums], norms, lrs


def test_the_reference_clips_some_steps_and_not_others():
    """Otherwise the equivalence below would not test clipping (or would test only clipped steps)."""
    norms = single_process()[2]
    assert min(norms) < zc.MAX_NORM < max(norms), norms


@pytest.mark.mpi
@pytest.mark.parametrize("stage", [1, 2])
def test_zero_with_groups_clipping_and_schedule_equals_one_process(groups_run, stage):
    n, load = groups_run
    ref_params, ref_losses, ref_norms, ref_lrs = single_process()
    rank0 = load(stage, 0)[0]
    for rank in range(n):
        params, report = load(stage, rank)
        assert sorted(params) == sorted(ref_params)
        for name, ref in ref_params.items():
            np.testing.assert_allclose(params[name], ref, **TOLERANCE, err_msg=f"rank {rank} {name}")
            np.testing.assert_array_equal(params[name], rank0[name], err_msg=f"rank {rank} {name}")
        np.testing.assert_allclose(report["losses"], ref_losses, **TOLERANCE)
        # clip_grad_norm_ returns the norm of the averaged gradient, the same float on every rank.
        np.testing.assert_allclose(report["norms"], ref_norms, **TOLERANCE)
        assert report["norms"] == load(stage, 0)[1]["norms"]
        assert report["lrs"] == ref_lrs  # the scheduler drives both groups, exactly as on one process


@pytest.mark.mpi
def test_ranks_owning_nothing_of_a_group_leave_it_out_of_the_wrapped_optimizer(groups_run):
    """On 3 ranks the matrices (256 of the 284 elements, laid first) fill ranks 0 and 1: those ranks'
    wrapped optimizers have one group, yet the schedule (checked above) still reaches every group."""
    n, load = groups_run
    counts = [load(1, rank)[1]["group_count"] for rank in range(n)]
    assert counts == ([1, 2] if n == 2 else [1, 1, 2])


@pytest.mark.mpi
@pytest.mark.parametrize("stage", [1, 2])
def test_resume_with_groups_is_bit_identical(groups_run, stage):
    n, load = groups_run
    for rank in range(n):
        report = load(stage, rank)[1]
        assert report["state_dict_bit_identical"], f"rank {rank}: zero.load_state_dict"
        assert report["checkpoint_bit_identical"], f"rank {rank}: checkpoint.load into ZeRO"
        # Into a plain AdamW: other summation order (one process), so allclose, not bit-identical.
        assert report["plain_max_diff"] < 1e-12, f"rank {rank}: checkpoint.load into a plain AdamW"


def test_the_reference_recipe_is_pytorchs():
    """The one-process reference (groups, clipping, schedule, accumulation) step by step against
    PyTorch in float64 (an optional oracle: skipped without torch). Same float64 arithmetic in another
    order (torch's fused kernels): 1e-12 is ~1e4 ulps, and any semantic difference (decay on the
    wrong group, clipping after instead of before, a schedule off by one step) is above 1e-5."""
    torch = pytest.importorskip("torch")
    ref_params, ref_losses, ref_norms, ref_lrs = single_process()
    x, y = zc.make_data(SEED)
    model, _ = zc.make_model(SEED, np.float64)
    tnn = torch.nn
    net = tnn.Sequential(
        tnn.Linear(6, 16), tnn.Tanh(), tnn.Linear(16, 8), tnn.GELU(), tnn.Linear(8, 4)
    ).double()
    net.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in model.state_dict().items()})
    decay, no_decay = ([p for p in net.parameters() if (p.ndim >= 2) == want] for want in (True, False))
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0, "lr": 0.01}],
        lr=0.02,
    )
    sched = torch.optim.lr_scheduler
    scheduler = sched.SequentialLR(
        opt,
        [
            sched.LinearLR(opt, start_factor=0.1, total_iters=2),
            sched.CosineAnnealingLR(opt, T_max=zc.GROUP_STEPS - 2),
        ],
        milestones=[2],
    )
    losses, norms, lrs = [], [], []
    for step in range(zc.GROUP_STEPS):
        xb, yb = zc.global_batch(x, y, step, zc.GROUP_BATCH)
        opt.zero_grad()
        total = 0.0
        for micro in np.array_split(np.arange(zc.GROUP_BATCH), zc.MICROBATCHES):
            out = net(torch.from_numpy(xb[micro]))
            loss = torch.nn.functional.cross_entropy(out, torch.from_numpy(yb[micro]), reduction="sum")
            (loss / zc.GROUP_BATCH).backward()
            total += loss.item()
        norms.append(float(torch.nn.utils.clip_grad_norm_(net.parameters(), zc.MAX_NORM)))
        lrs.append([g["lr"] for g in opt.param_groups])
        opt.step()
        scheduler.step()
        losses.append(total / zc.GROUP_BATCH)
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-12)
    np.testing.assert_allclose(norms, ref_norms, rtol=1e-12)
    np.testing.assert_allclose(lrs, ref_lrs, rtol=1e-12)
    for name, p in net.state_dict().items():
        np.testing.assert_allclose(p.numpy(), ref_params[name], rtol=1e-12, atol=1e-14, err_msg=name)
