"""The interleaved 1F1B schedule (Narayanan et al. 2021, §2.2.2) as data, through the simulator, no MPI.

Hypothesis draws p stages, v chunks per stage and m = k * p microbatches, and the backward/forward time
ratio. The simulator runs every stage's program with rendezvous (worst-case blocking) messages, so a
schedule that passes cannot deadlock on real ranks, and its sends meet receives of the same microbatch
and chunk; the bubble it measures must be the paper's (p-1)/(v m) relative to the ideal step.
``PipelineParallel`` runs it on a one-rank group here (all chunks in this process); on 2 and 4 ranks
in ``test_pipeline_equivalence.py``, its errors in ``test_pipeline_errors.py``.
"""

from __future__ import annotations

import numpy as np
import pp_common  # noqa: E402
import pytest
import strategies as S
from hypothesis import given

import minidist as md
import minidist.distributed as dist
from minidist import nn
from minidist.parallel.pipeline import (
    Batch,
    Instruction,
    PipelineParallel,
    interleaved,
    make_schedule,
    one_f_one_b,
    peak_activations,
    simulate,
)
from minidist.parallel.pipeline.schedules import BACKWARD, FORWARD, RECV_ACT, SEND_ACT, SEND_GRAD, parts
from minidist_tools.gantt import text_grid


@given(S.interleaved_configs(), S.backward_time_ratios)
def test_bubble_is_p_minus_1_over_v_m_and_nothing_deadlocks(config, tb):
    p, m, v = config
    # a stage's forward takes 1 and its backward tb; each of its v chunks takes 1/v of that
    timeline = simulate(interleaved(p, m, v), forward_time=1.0 / v, backward_time=tb / v)
    assert timeline.bubble_overhead() == pytest.approx((p - 1) / (v * m), abs=1e-12)
    assert timeline.total == pytest.approx((m + (p - 1) / v) * (1.0 + tb))
    if v > 1 and p > 1:  # strictly smaller than 1F1B's (p-1)/m for the same p, m and stage times
        assert timeline.bubble_overhead() < simulate(one_f_one_b(p, m), 1.0, tb).bubble_overhead()


@given(S.interleaved_configs())
def test_every_microbatch_runs_forward_then_backward_once_on_every_chunk(config):
    p, m, v = config
    schedule = make_schedule("interleaved", p, m, virtual_stages=v)
    assert (schedule.num_stages, schedule.num_microbatches, schedule.virtual_stages) == (p, m, v)
    for prog in schedule.stages:
        order = [
            (i.kind, i.microbatch, i.chunk)
            for step in prog
            for i in parts(step)
            if i.kind in (FORWARD, BACKWARD)
        ]
        units = [(i, c) for i in range(m) for c in range(v)]
        assert sorted(order) == sorted([(FORWARD, *u) for u in units] + [(BACKWARD, *u) for u in units])
        for i, c in units:
            assert order.index((FORWARD, i, c)) < order.index((BACKWARD, i, c))
        for i in range(m):  # a microbatch visits the chunks in order forwards, in reverse backwards
            forwards = [c for kind, mb, c in order if kind == FORWARD and mb == i]
            backwards = [c for kind, mb, c in order if kind == BACKWARD and mb == i]
            assert forwards == list(range(v)) and backwards == list(reversed(range(v)))


@given(S.interleaved_configs(min_stages=2, max_stages=6, max_chunks=4, max_rounds=4))
def test_chunks_hand_over_round_the_ring(config):
    p, m, v = config
    schedule = interleaved(p, m, v)
    sends = [i for step in schedule.stages[p - 1] for i in parts(step) if i.kind == SEND_ACT]
    # the last stage's chunk c feeds chunk c+1 on stage 0; only its last chunk sends nothing forward
    assert {i.chunk for i in sends} == set(range(v - 1))
    for i in sends:
        assert schedule.peer(p - 1, i) == (0, i.chunk + 1)
    grads = [i for step in schedule.stages[0] for i in parts(step) if i.kind == SEND_GRAD]
    assert {i.chunk for i in grads} == set(range(1, v))
    for i in grads:
        assert schedule.peer(0, i) == (p - 1, i.chunk - 1)


def test_one_chunk_per_stage_runs_1f1b_and_the_grid_names_chunks():
    for p, m in [(2, 4), (3, 6), (4, 8)]:
        assert simulate(interleaved(p, m, 1)).total == simulate(one_f_one_b(p, m)).total
    grid = text_grid(interleaved(2, 4, 2), backward_time=2).splitlines()
    assert grid[0].startswith("stage 0 | F0.0 F1.0 F0.1 F1.1 .... .... F2.0 B0.1")
    assert (
        grid[-1]
        == "interleaved: p=2, m=4, v=2, bubble overhead 0.125 ((p-1)/(v*m) = 0.125; 1f1b: (p-1)/m = 0.250)"
    )
    assert str(Instruction(FORWARD, 3, 1)) == "F3.1" and str(Instruction(FORWARD, 3)) == "F3"


def test_arguments_are_checked():
    with pytest.raises(ValueError, match=r"m=6 to be a multiple of the number of stages p=4 .* use m=4 or 8"):
        interleaved(4, 6, 2)
    with pytest.raises(ValueError, match=r"m=3 to be a multiple .* p=4 .* use m=4$"):
        interleaved(4, 3, 2)
    with pytest.raises(ValueError, match="chunks per stage v must be an integer >= 1, got 0"):
        interleaved(2, 2, 0)
    with pytest.raises(ValueError, match="virtual_stages=2 needs schedule='interleaved'"):
        make_schedule("1f1b", 2, 2, virtual_stages=2)
    with pytest.raises(ValueError, match="one or more messages, no computation"):
        Batch((Instruction(FORWARD, 0),))
    with pytest.raises(ValueError, match="virtual stage -1 does not exist"):
        interleaved(2, 2, 2).peer(0, Instruction(RECV_ACT, 0, 0))  # chunk 0 of stage 0 is the first
    with pytest.raises(ValueError, match="virtual stage 4 does not exist"):
        interleaved(2, 2, 2).peer(1, Instruction(SEND_ACT, 0, 1))  # chunk 1 of stage 1 is the last


def test_one_rank_runs_all_chunks_and_equals_the_whole_model():
    # a pipeline group of one rank (this test process): all v chunks are on it and hand activations and
    # gradients over in memory; float64, so only summation order differs (see test_pipeline_equivalence)
    world = dist.init()
    if world.size != 1:
        pytest.skip("runs in a single process")
    ref_params, ref_losses, ref_outputs = pp_common.single_process(5, 2, "sgd", model="deep")
    model = pp_common.make_deep_model(5)
    pipe = PipelineParallel(model, world, microbatches=3, schedule="interleaved", virtual_stages=4)
    assert [len(chunk._modules) for chunk in pipe.chunks] == [b - a for a, b in pipe.bounds]
    assert sorted(name for name, _ in pipe.named_parameters()) == sorted(ref_params)
    opt = pp_common.make_optimizer("sgd", pipe.parameters())
    x, y = pp_common.make_data(5)
    for step in range(2):
        xb, yb = pp_common.global_batch(x, y, step)
        opt.zero_grad()
        loss = pipe.train_step(md.tensor(xb, dtype=np.float64), yb, nn.functional.cross_entropy)
        opt.step()
        assert loss == pytest.approx(ref_losses[step], rel=1e-10)
    for name, value in pipe.stage_module.state_dict().items():
        np.testing.assert_allclose(value, ref_params[name], rtol=1e-10, atol=1e-12, err_msg=name)
    np.testing.assert_allclose(
        pipe.predict(md.tensor(x, dtype=np.float64)), ref_outputs, rtol=1e-10, atol=1e-12
    )
    assert pipe.stats.peak_activations == max(peak_activations(pipe.schedule))
