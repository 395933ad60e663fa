"""minidist_tools.perfmodel.failures: the formulas against hand-computed values and Daly's published figures,
the exact optimum as a true minimum, and the Monte-Carlo simulator against the formulas (its mean
runtime, and where its optimum lies); ``minidist checkpoint interval`` on top."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minidist_cli import main as cli_main
from minidist_tools import checkpoint_interval as cli
from minidist_tools.perfmodel import failures as pf

YEAR = 365.25 * 86400


def test_system_mtbf_divides_by_the_nodes_and_matches_the_first_of_n_exponential_failures():
    assert pf.system_mtbf(5 * YEAR, 1024) == pytest.approx(154_089.84375)  # 157,788,000 s / 1024
    # The model's claim, sampled: the first of 64 independent exponential failures (mean 1000 s each)
    # comes after 1000 / 64 s on average. 20,000 samples: standard error 15.6 / sqrt(20000) = 0.11 s.
    first = np.random.default_rng(1).exponential(1000.0, (20_000, 64)).min(axis=1)
    assert first.mean() == pytest.approx(pf.system_mtbf(1000.0, 64), abs=4 * 15.625 / math.sqrt(20_000))
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="nodes must be a positive integer"):
            pf.system_mtbf(1000.0, bad)
    with pytest.raises(ValueError, match="node_mtbf_s must be a positive number"):
        pf.system_mtbf(0.0, 4)
    assert pf.system_mtbf(np.float32(100.0), np.int64(4)) == 25.0  # NumPy scalars are numbers too


def test_young_and_daly_against_hand_values_and_dalys_figures():
    # sqrt(2 * 60 * 154,089.84375) = sqrt(18,490,781.25) = 4300.0908...
    assert pf.young_interval(60, 154_089.84375) == pytest.approx(4300.0908, abs=1e-3)
    assert pf.young_interval(300, 86400) == pytest.approx(7200.0)  # sqrt(2 * 5 min * 24 h) = 2 h
    # Daly 2006, Figs. 3-5: C = 5 min, M = 24 h, 6 h, 15 min -> "tau_opt = 117, 57, 9.1 min".
    assert round(pf.daly_interval(300, 24 * 3600) / 60) == 117
    assert round(pf.daly_interval(300, 6 * 3600) / 60) == 57
    assert round(pf.daly_interval(300, 15 * 60) / 60, 1) == 9.1
    # By hand, C = 50, M = 100: x = C / 2M = 1/4, sqrt(2 C M) = 100: 100 (1 + 1/6 + 1/36) - 50 = 69.44.
    assert pf.daly_interval(50, 100) == pytest.approx(100 * (1 + 1 / 6 + 1 / 36) - 50)
    assert pf.daly_interval(200, 100) == 100  # C >= 2M: once per MTBF
    for function in (pf.young_interval, pf.daly_interval, pf.optimal_interval):
        with pytest.raises(ValueError, match="save_cost_s must be a positive number"):
            function(0, 100)
        with pytest.raises(ValueError, match="mtbf_s must be a positive number"):
            function(10, float("inf"))


def test_expected_runtime_by_hand_and_without_failures():
    # 10 segments of tau + C = 11 s, each M e^(R/M) (e^(L/M) - 1) with M = 100, R = 5 (Daly 2006).
    by_hand = 10 * 100 * math.exp(0.05) * (math.exp(0.11) - 1)
    assert pf.expected_runtime(100, 10, 1, 5, 100) == pytest.approx(by_hand, rel=1e-12)
    # 1000 s in 300 s pieces: 4 segments (the last 100 s), 4 saves; failures all but never happen.
    assert pf.expected_runtime(1000, 300, 10, 60, 1e12) == pytest.approx(1040, rel=1e-6)
    # Rounding does not invent a segment: 0.3 s of work in 0.1 s pieces is 3 segments, not 4.
    assert pf.expected_runtime(0.3, 0.1, 1, 0, 1e12) == pytest.approx(3.3, rel=1e-6)
    assert pf.expected_runtime(1e6, 1e6, 0, 0, 1) == math.inf  # e^(10^6): never finishes
    with pytest.raises(ValueError, match="restart_cost_s must be zero or a positive"):
        pf.expected_runtime(100, 10, 1, -5, 100)
    with pytest.raises(ValueError, match="interval_s must be a positive"):
        pf.expected_runtime(100, 0, 1, 5, 100)


def _seconds_per_work_second(interval: float, save: float, mtbf: float) -> float:
    return pf.expected_runtime(interval, interval, save, 0.0, mtbf) / interval  # one segment's rate


@settings(max_examples=60, deadline=None)
@given(st.floats(1e-6, 1.9), st.floats(1.0, 1e7))
def test_the_exact_optimum_is_a_minimum_and_daly_beats_young(ratio, mtbf):
    save = ratio * mtbf
    best = pf.optimal_interval(save, mtbf)
    # It solves e^((tau + C) / M) (1 - tau / M) = 1 ...
    assert math.exp((best + save) / mtbf) * (1 - best / mtbf) == pytest.approx(1.0, rel=1e-9)
    # ... and no interval 1 % either side does better.
    rate = _seconds_per_work_second(best, save, mtbf)
    assert rate <= _seconds_per_work_second(best * 1.01, save, mtbf) * (1 + 1e-12)
    assert rate <= _seconds_per_work_second(best * 0.99, save, mtbf) * (1 + 1e-12)
    # Daly's higher-order terms pay: his interval wastes no more time than Young's (C < 2M).
    daly = _seconds_per_work_second(pf.daly_interval(save, mtbf), save, mtbf)
    young = _seconds_per_work_second(pf.young_interval(save, mtbf), save, mtbf)
    assert rate <= daly * (1 + 1e-12) and daly <= young * (1 + 1e-12)


def test_young_and_daly_converge_to_the_exact_optimum_when_saves_are_cheap():
    for ratio, young_error, daly_error in ((1e-6, 1e-3, 1e-6), (1e-3, 0.03, 1e-3)):
        best = pf.optimal_interval(ratio, 1.0)
        assert abs(pf.young_interval(ratio, 1.0) / best - 1) < young_error
        assert abs(pf.daly_interval(ratio, 1.0) / best - 1) < daly_error


# A job of 20,000 s of work on a system failing every 1000 s, saves of 20 s, restarts of 50 s: about
# 25 failures per job, Young's interval 200 s. The simulator's mean runtime over RUNS independent jobs
# has a standard error stderr = std / sqrt(RUNS) (central limit theorem: each job's runtime is a sum
# of ~100 independent segment times). A gap of 4 standard errors happens by chance with probability
# 6e-5 (normal tails); the seeds are fixed, so the test is deterministic and this bounds how lucky
# they would have to be to hide an error.
RUNS = 2000
Z = 4.0


@pytest.mark.parametrize(
    "work, interval, save, restart, mtbf",
    [
        (20_000, 200, 20, 50, 1000),  # about the optimum
        (5_000, 700, 100, 300, 500),  # saves rarer than failures; the last piece 100 s; slow restarts
        (1_000, 300, 10, 0, 1e5),  # failures rare: work + 4 saves, plus a little
    ],
)
def test_simulated_mean_runtime_matches_expected_runtime(work, interval, save, restart, mtbf):
    stats = pf.simulate_run(work, interval, save, restart, mtbf, seed=7, runs=RUNS)
    expected = pf.expected_runtime(work, interval, save, restart, mtbf)
    assert stats.runtimes_s.shape == (RUNS,) and stats.runs == RUNS
    assert abs(stats.mean_s - expected) <= Z * stats.stderr_s, (stats.mean_s, expected, stats.stderr_s)
    assert stats.stderr_s < 0.02 * expected  # the check has teeth: a 10 % error in the model would show
    assert stats.runtimes_s.min() >= work + math.ceil(work / interval) * save - 1e-6  # never faster


def test_simulated_optimum_lies_at_young_and_daly():
    work, save, restart, mtbf = 20_000, 20, 50, 1000
    young, daly = pf.young_interval(save, mtbf), pf.daly_interval(save, mtbf)
    intervals = sorted([young * f for f in (0.25, 0.5, 0.7, 1.4, 2.0, 4.0)] + [young, daly])
    sims = {t: pf.simulate_run(work, t, save, restart, mtbf, seed=11, runs=RUNS) for t in intervals}
    for t, stats in sims.items():  # the whole curve, not only its minimum, follows the model
        assert abs(stats.mean_s - pf.expected_runtime(work, t, save, restart, mtbf)) <= Z * stats.stderr_s

    def gap(a: float, b: float) -> float:  # standard error of the difference of two independent means
        return Z * math.hypot(sims[a].stderr_s, sims[b].stderr_s)

    best = min(intervals, key=lambda t: sims[t].mean_s)
    assert 0.5 * young <= best <= 2.0 * young
    # Nothing on the sweep beats Daly's interval by more than the noise ...
    assert sims[daly].mean_s <= sims[best].mean_s + gap(daly, best)
    # ... and the optimum is real: saving 4x too often or 4x too rarely is clearly slower.
    for far in (intervals[0], intervals[-1]):
        assert sims[far].mean_s > sims[daly].mean_s + gap(far, daly)


def test_simulate_run_refuses_what_it_cannot_finish():
    with pytest.raises(ValueError, match="runs must be an integer >= 2"):
        pf.simulate_run(100, 10, 1, 1, 100, runs=1)
    with pytest.raises(ValueError, match="would not finish"):
        pf.simulate_run(1e5, 1e5, 1, 1, 100)


def test_parse_and_format_durations():
    assert cli.parse_duration("5y") == 5 * YEAR
    assert cli.parse_duration("3d") == 3 * 86400
    assert cli.parse_duration("1.5h") == 5400
    assert cli.parse_duration("90min") == cli.parse_duration("90m") == 5400
    assert cli.parse_duration("60") == cli.parse_duration("60s") == cli.parse_duration("6e1 s") == 60
    for bad in ("5 parsecs", "", "h", "-3s", "1.2.3d", "1e400s", "1e308y"):  # the last two: no finite time
        with pytest.raises(ValueError, match="cannot read the duration"):
            cli.parse_duration(bad)
    assert cli.format_duration(154_089.84375) == "1.78 d"
    assert cli.format_duration(4300.09) == "1.19 h"
    assert cli.format_duration(59) == "59 s"


def test_cli_prints_the_three_intervals_and_checks_them_by_simulation(capsys):
    argv = ["checkpoint", "interval", "--node-mtbf", "5y", "--nodes", "1024", "--save-cost", "60"]
    assert cli_main([*argv, "--restart-cost", "300", "--work", "2d", "--simulate", "50"]) == 0
    out = capsys.readouterr().out
    assert "1.78 d (154,090 s): 1024 node(s), each failing once in 5 y" in out
    rows = {" ".join(row.split()[:2]): row for row in out.splitlines() if row.startswith(("Young", "Daly"))}
    assert "1.19 h" in rows["Young 1974"]  # 4300 s
    assert "1.18 h" in rows["Daly 2006"]  # sqrt(2CM)(1 + ...) - C = 4254 s
    assert "exact optimum" in out and "+-" in out  # the simulated column is there
    assert cli_main([*argv, "--nodes", "0"]) == 2
    assert "nodes must be a positive integer" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        cli_main(["checkpoint", "interval", "--node-mtbf", "5 parsecs", "--save-cost", "60"])
    assert "cannot read the duration '5 parsecs'" in capsys.readouterr().err
