"""minidist_tools.perfmodel.step: each formula against values worked out by hand, and the calibration
helpers."""

from __future__ import annotations

import math

import numpy as np
import pytest

from minidist_tools.perfmodel import step as pm


def test_ring_all_reduce_time_by_hand():
    # n = 4, N = 1 MB, alpha = 10 us, beta = 1 ns/B: 2*3*10us + 2*3/4 * 1e6 * 1e-9 = 60 us + 1.5 ms
    assert pm.ring_all_reduce_time(1e6, 4, 1e-5, 1e-9) == pytest.approx(60e-6 + 1.5e-3, rel=1e-12)
    # gamma adds (n-1)/n N gamma: 3/4 * 1e6 * 2e-10 = 150 us
    assert pm.ring_all_reduce_time(1e6, 4, 1e-5, 1e-9, 2e-10) == pytest.approx(1.71e-3, rel=1e-12)
    assert pm.ring_all_reduce_time(1e9, 1, 1.0, 1.0) == 0.0  # nothing to do on one rank


def test_recursive_doubling_beats_the_ring_only_for_small_messages():
    # n = 8: doubling 3 (alpha + N beta) vs ring 14 alpha + 1.75 N beta.
    assert pm.recursive_doubling_time(1e3, 8, 1e-5, 1e-9) == pytest.approx(3 * (1e-5 + 1e-6))
    assert pm.recursive_doubling_time(1e3, 8, 1e-5, 1e-9) < pm.ring_all_reduce_time(1e3, 8, 1e-5, 1e-9)
    assert pm.recursive_doubling_time(1e8, 8, 1e-5, 1e-9) > pm.ring_all_reduce_time(1e8, 8, 1e-5, 1e-9)


def test_bubble_fraction_by_hand():
    assert pm.bubble_fraction(4, 8) == pytest.approx(3 / 11)  # (p-1)/(m+p-1), GPipe §2.3
    assert pm.bubble_fraction(1, 5) == 0.0


def test_compute_is_six_flops_per_parameter_per_token():
    work = pm.Workload(params=1e9, global_batch=8, tokens_per_sample=1000)
    assert work.flops_per_step == 6 * 1e9 * 8000
    hw = pm.Hardware(flops=1e12, alpha=0.0, beta=0.0)
    p = pm.predict(work, hw)
    assert p.compute == pytest.approx(48.0) and p.step == pytest.approx(48.0)
    assert p.speedup == pytest.approx(1.0) and p.efficiency == pytest.approx(1.0)


def test_data_parallel_step_by_hand():
    # 1e9 params in bf16 (2 GB of gradients), 8 GPUs of 1e14 FLOP/s, alpha 5 us, 50 GB/s.
    work = pm.Workload(params=1e9, global_batch=64, tokens_per_sample=1000, bytes_per_value=2)
    hw = pm.Hardware(flops=1e14, alpha=5e-6, beta=1 / 50e9)
    p = pm.predict(work, hw, dp=8)
    compute = 6e9 * 64e3 / 8 / 1e14  # 0.48 s
    comm = 2 * 7 * 5e-6 + 2 * 7 / 8 * 2e9 / 50e9  # 70 us + 70 ms
    assert p.compute == pytest.approx(compute) and p.dp_comm == pytest.approx(comm)
    assert p.step == pytest.approx(compute + comm)
    assert p.speedup == pytest.approx(8 * compute / (compute + comm))
    # Full overlap hides the all-reduce (it is shorter than backward, 2/3 of the compute).
    hidden = pm.predict(work, hw, dp=8, overlap=1.0)
    assert hidden.step == pytest.approx(compute) and hidden.dp_comm_exposed == pytest.approx(0.0)


def test_pipeline_and_tensor_parallel_terms_by_hand():
    # 2 layers, hidden 100, 4 samples of 10 tokens, float32; pp=2, m=2, tp=2, dp=1; alpha=1, beta=0.
    work = pm.Workload(params=1e6, global_batch=4, tokens_per_sample=10, layers=2, hidden=100)
    hw = pm.Hardware(flops=1e6, alpha=1.0, beta=0.0)
    p = pm.predict(work, hw, tp=2, pp=2, microbatches=2)
    compute = 6e6 * 40 / 4 / 1e6  # 60 s per device
    assert p.compute == pytest.approx(compute)
    assert p.bubble == pytest.approx(compute * 1 / 2)  # (p-1)/m of the compute
    assert p.bubble_fraction == pytest.approx(pm.bubble_fraction(2, 2))
    # tp: 2 (fwd+bwd) x 2 all-reduces per layer x 1 layer per stage x 2 microbatches, each 2(tp-1) alpha
    assert p.tp_comm == pytest.approx(2 * 2 * 1 * 2 * 2.0)
    # pp: 2 messages (activation, gradient) per slot, m + p - 1 = 3 slots, each alpha
    assert p.pp_comm == pytest.approx(6.0)
    assert p.step == pytest.approx(compute + compute / 2 + 16 + 6)


def test_scaling_flattens_and_the_sweet_spot_is_where_efficiency_drops():
    work = pm.Workload(params=1.3e9, global_batch=1024, tokens_per_sample=2048, bytes_per_value=2)
    hw = pm.Hardware(flops=1.2e14, alpha=5e-6, beta=1 / 50e9)
    curve = pm.scaling_curve(work, hw, [1, 16, 64, 256, 1024])
    speedups = [p.speedup for p in curve]
    assert speedups == sorted(speedups)  # still faster with more GPUs...
    assert all(a.efficiency >= b.efficiency for a, b in zip(curve, curve[1:]))  # ...but less per GPU
    assert 190 < curve[3].speedup < 230  # "about 200x on 256 GPUs"
    assert pm.sweet_spot(curve, 0.75).devices == 256
    with pytest.raises(ValueError, match="efficiency"):
        pm.sweet_spot(curve[-1:], 0.99)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"dp": 0}, "dp"),
        ({"microbatches": 2.5}, "microbatches"),
        ({"overlap": 1.5}, "overlap"),
        ({"dp": 64}, "batch"),
    ],
)
def test_bad_arguments_raise_value_error(kwargs, match):
    work = pm.Workload(params=1e6, global_batch=32)
    with pytest.raises(ValueError, match=match):
        pm.predict(work, pm.Hardware(flops=1e9, alpha=0, beta=0), **kwargs)


def test_fit_alpha_beta_recovers_known_constants():
    sizes = np.array([8, 1024, 65536, 1 << 20])
    alpha, beta = pm.fit_alpha_beta(sizes, 3e-6 + sizes * 2e-10)
    assert alpha == pytest.approx(3e-6, rel=1e-6) and beta == pytest.approx(2e-10, rel=1e-6)
    with pytest.raises(ValueError):
        pm.fit_alpha_beta(np.array([1]), np.array([1.0]))


def test_measure_flops_and_gamma_are_plausible():
    flops = pm.measure_flops(64, 128, 128, repeats=3)
    assert 1e7 < flops < 1e14 and math.isfinite(flops)  # any CPU does 10 MFLOP/s; none 100 TFLOP/s
    assert 0 < pm.measure_gamma(1 << 20) < 1e-6  # adding 1 MB takes less than a second
