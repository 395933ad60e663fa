"""PipelineParallel equals single-process training (docs/design.md, property 3), plus its measurements.

For pp in {2, 4}, m in {1, 3, 4, 8} and both schedules, and for dp=2 x pp=2 (groups from world.split),
k steps on real MPI ranks must give the parameters and losses of k steps on the whole batch in one
process, and ``predict`` the trained model's outputs. Each launch runs many configurations one after
another, because a launch costs ~1 s.
"""

from __future__ import annotations

import json

import numpy as np
import pp_common  # noqa: E402
import pytest
import strategies as S
from mpi_utils import run_mpi  # noqa: E402

from minidist.parallel.pipeline import make_schedule  # noqa: E402
from minidist.parallel.pipeline.schedules import FORWARD, parts  # noqa: E402
from minidist_tools.gantt import timeline_from_trace  # noqa: E402

pytestmark = pytest.mark.mpi

# float64: pipelining changes only the order in which per-sample gradients are summed (per microbatch,
# then accumulated over microbatches and, with dp, averaged over replicas), a few ulps (~1e-16
# relative) per step. After 3 steps of this small model 1e-10 is a wide margin that still catches any
# real error (a missing 1/m, a microbatch sent to the wrong stage) by many orders of magnitude.
TOL = dict(rtol=1e-10, atol=1e-12)
STEPS = 3


def run_configs(tmp_path, world_size, configs):
    run_mpi(world_size, "pipeline/pp_equivalence.py", tmp_path, json.dumps(configs), timeout=120)
    for k, cfg in enumerate(configs):
        ref_params, ref_losses, ref_outputs = pp_common.single_process(
            cfg["seed"],
            cfg["steps"],
            cfg["opt"],
            cfg.get("width", 16),
            cfg.get("batch", pp_common.BATCH),
            cfg.get("model", "mlp"),
        )
        merged = {}
        infos = [json.loads((tmp_path / f"{k}_rank{r}.json").read_text()) for r in range(world_size)]
        for r, info in enumerate(infos):
            params = dict(np.load(tmp_path / f"{k}_rank{r}.npz"))
            assert sorted(params) == sorted(info["names"])
            for name, value in params.items():  # every dp replica of a stage must equal the reference
                np.testing.assert_allclose(
                    value, ref_params[name], **TOL, err_msg=f"{cfg}: {name} on rank {r}"
                )
            merged.update(params)
            # predict: the trained model's forward, down the stages, the result on every rank
            predicted = np.load(tmp_path / f"{k}_rank{r}_predict.npy")
            np.testing.assert_allclose(predicted, ref_outputs, **TOL, err_msg=f"{cfg}: predict, rank {r}")
            np.testing.assert_allclose(info["losses"], ref_losses, **TOL, err_msg=f"{cfg}: losses, rank {r}")
            # the executor held exactly as many microbatches as the schedule says (1F1B: <= p, GPipe: m)
            assert info["peaks"] == [info["theory_peak"]] * cfg["steps"], (cfg, r)
        assert sorted(merged) == sorted(ref_params), cfg  # the stages together hold the whole model
        yield cfg, infos


def configs(pp, dp, ms, seed=0, opt="sgd", **extra):
    return [dict(pp=pp, dp=dp, m=m, schedule=s, steps=STEPS, seed=seed, opt=opt, **extra)
            for m in ms for s in S.PIPELINE_SCHEDULES]  # fmt: skip


def test_two_stages_equal_one_process(tmp_path):
    cfgs = configs(2, 1, (1, 3, 4, 8)) + configs(2, 1, (3,), seed=2, opt="adamw")
    # wide activations (12 x 1024 float64 = 96 KiB) exceed MPI's eager limit: sends really block
    cfgs += [dict(pp=2, dp=1, m=4, schedule="1f1b", steps=2, seed=1, opt="sgd", width=1024)]
    assert len(list(run_configs(tmp_path, 2, cfgs))) == len(cfgs)


def test_four_stages_and_dp2_x_pp2_equal_one_process(tmp_path):
    cfgs = configs(4, 1, (1, 3, 4, 8)) + configs(2, 2, (1, 3, 4, 8), seed=1, opt="adamw")
    # unequal dp shares (47 samples: 24 + 23) are weighted by share when combined over dp
    cfgs += [dict(pp=2, dp=2, m=1, schedule="1f1b", steps=STEPS, seed=4, opt="sgd", batch=47)]
    cfgs.append(dict(pp=4, dp=1, m=8, schedule="1f1b", steps=STEPS, seed=3, opt="sgd", trace=True))
    for cfg, infos in run_configs(tmp_path, 4, cfgs):
        if not cfg.get("trace"):
            continue
        # the recorded spans run each stage's computations in the schedule's order, with a bubble
        schedule = make_schedule(cfg["schedule"], cfg["pp"], cfg["m"])
        measured = timeline_from_trace(schedule, [info["events"] for info in infos])
        for s, slots in enumerate(measured.slots):
            planned = [(i.kind, i.microbatch) for step in schedule.stages[s] for i in parts(step)]
            assert [(x.kind, x.microbatch) for x in slots] == [
                k for k in planned if k[0] in (FORWARD, "backward")
            ]
        # the size of the measured bubble depends on the machine (benchmarks/pipeline.py compares it with
        # theory); here only that some stage really waited and some computed
        assert 0 < measured.bubble_fraction() < 1


def interleaved_configs(pp, dp, ms, v=2, seed=0, opt="sgd", **extra):
    return [dict(pp=pp, dp=dp, m=m, schedule="interleaved", v=v, steps=STEPS, seed=seed, opt=opt, **extra)
            for m in ms]  # fmt: skip


def check_trace_follows_schedule(cfg, infos):
    """The recorded spans run each rank's computations (microbatch and chunk) in the schedule's order."""
    schedule = make_schedule(cfg["schedule"], cfg["pp"], cfg["m"], virtual_stages=cfg.get("v", 1))
    measured = timeline_from_trace(schedule, [info["events"] for info in infos])
    for s, slots in enumerate(measured.slots):
        planned = [(i.kind, i.microbatch, i.chunk) for step in schedule.stages[s] for i in parts(step)]
        assert [(x.kind, x.microbatch, x.chunk) for x in slots] == [
            k for k in planned if k[0] in (FORWARD, "backward")
        ]
    assert 0 < measured.bubble_fraction() < 1


def test_interleaved_on_two_ranks_equals_one_process(tmp_path):
    # v=2 chunks per rank of the 7-layer MLP and of the 15-layer "deep" model (8 Linear layers whose
    # boundaries carry activations of different widths), v=3 of the deep one, v=1 (plain 1F1B order)
    cfgs = interleaved_configs(2, 1, (2, 4)) + interleaved_configs(2, 1, (2, 4), seed=1, model="deep")
    cfgs += interleaved_configs(2, 1, (4,), v=3, seed=2, opt="adamw", model="deep")
    cfgs += interleaved_configs(2, 1, (2,), v=1, seed=3)
    # wide activations (12 x 1024 float64 = 96 KiB) exceed MPI's eager limit: sends wait for receives
    cfgs += [dict(pp=2, dp=1, m=4, schedule="interleaved", v=2, steps=2, seed=1, opt="sgd", width=1024)]
    cfgs += interleaved_configs(2, 1, (4,), seed=4, model="deep", trace=True)
    for cfg, infos in run_configs(tmp_path, 2, cfgs):
        if cfg.get("trace"):
            check_trace_follows_schedule(cfg, infos)


def test_interleaved_on_four_ranks_and_dp2_x_pp2_equals_one_process(tmp_path):
    cfgs = interleaved_configs(4, 1, (4, 8), model="deep")  # p * v = 8 chunks of 15 layers
    cfgs += interleaved_configs(2, 2, (2, 4), seed=1, opt="adamw", model="deep")
    cfgs += interleaved_configs(4, 1, (4,), seed=2, model="deep", trace=True)
    for cfg, infos in run_configs(tmp_path, 4, cfgs):
        if cfg.get("trace"):
            check_trace_follows_schedule(cfg, infos)
