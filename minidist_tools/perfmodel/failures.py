"""How often to checkpoint: failures at scale, the optimum interval, and a simulator to check it.

A job on ``N`` nodes fails whenever any node does. If each node fails after an exponentially
distributed time of mean ``M_node`` (its mean time between failures, MTBF), independently of the
others, the first of ``N`` failures comes after an exponential time of mean ``M = M_node / N`` (the
minimum of independent exponentials adds their rates): 1,024 nodes that each fail once in 5 years
fail, together, every 43 hours.

Saving a checkpoint costs ``C`` seconds; a failure loses the work since the last one and costs a
restart ``R`` (relaunch, load). Saving often wastes time in saves; saving rarely wastes it in redone
work. The balance:

* **Young** (J. W. Young, "A first order approximation to the optimum checkpoint interval", CACM 17(9),
  1974): ``tau = sqrt(2 C M)`` seconds of work between saves.
* **Daly** (J. T. Daly, "A higher order estimate of the optimum checkpoint interval for restart dumps",
  Future Generation Computer Systems 22(3), 2006, its perturbation solution):
  ``tau = sqrt(2 C M) (1 + sqrt(C / 2M) / 3 + (C / 2M) / 9) - C`` while ``C < 2M``, else ``tau = M``.
* **The exact optimum** of Daly's complete runtime model (:func:`expected_runtime`): setting its
  derivative in ``tau`` to zero gives ``e^((tau + C) / M) (1 - tau / M) = 1``, whose root is
  ``tau = M (1 + W(-e^(-1 - C / M)))`` with ``W`` the principal branch of Lambert's W function.

Young and Daly are approximations of that root for ``C << M``; :func:`simulate_run` checks all of it
by injecting exponential failures into a simulated job. Pure arithmetic; every time is in seconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Integral, Real

import numpy as np
from scipy.special import lambertw


def _check_positive(**values: float) -> None:
    for name, value in values.items():
        if isinstance(value, bool) or not (isinstance(value, Real) and math.isfinite(value) and value > 0):
            raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")


def _check_non_negative(**values: float) -> None:
    for name, value in values.items():
        if isinstance(value, bool) or not (isinstance(value, Real) and math.isfinite(value) and value >= 0):
            raise ValueError(f"{name} must be zero or a positive number of seconds, got {value!r}")


def system_mtbf(node_mtbf_s: float, nodes: int) -> float:
    """Mean time between failures of a job on ``nodes`` nodes, seconds: ``node_mtbf_s / nodes``.

    Assumes every node fails independently after an exponential time of mean ``node_mtbf_s``; the
    job fails at the first of them, an exponential of rate ``nodes / node_mtbf_s``. Raises
    ``ValueError`` for a non-positive MTBF or a node count that is not a positive integer."""
    _check_positive(node_mtbf_s=node_mtbf_s)
    if not isinstance(nodes, Integral) or isinstance(nodes, bool) or nodes < 1:
        raise ValueError(f"nodes must be a positive integer, got {nodes!r}")
    return node_mtbf_s / nodes


def young_interval(save_cost_s: float, mtbf_s: float) -> float:
    """Young's first-order optimum: ``sqrt(2 C M)`` seconds of work between two checkpoints (Young
    1974), for a save of ``save_cost_s`` seconds and a system MTBF of ``mtbf_s`` seconds.
    Good while ``C << M``; raises ``ValueError`` for a non-positive input."""
    _check_positive(save_cost_s=save_cost_s, mtbf_s=mtbf_s)
    return math.sqrt(2.0 * save_cost_s * mtbf_s)


def daly_interval(save_cost_s: float, mtbf_s: float) -> float:
    """Daly's higher-order optimum, seconds of work between two checkpoints (Daly 2006;
    his Figs. 3-5 quote 117, 57 and 9.1 min for C = 5 min and M = 24 h, 6 h, 15 min):
    ``sqrt(2 C M) (1 + sqrt(C / 2M) / 3 + (C / 2M) / 9) - C`` for ``C < 2M``, and ``M`` beyond (a
    save that long: checkpoint once per MTBF). Raises ``ValueError`` for a non-positive input."""
    _check_positive(save_cost_s=save_cost_s, mtbf_s=mtbf_s)
    if save_cost_s >= 2.0 * mtbf_s:
        return mtbf_s
    x = save_cost_s / (2.0 * mtbf_s)
    return math.sqrt(2.0 * save_cost_s * mtbf_s) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - save_cost_s


def optimal_interval(save_cost_s: float, mtbf_s: float) -> float:
    """The interval that minimises :func:`expected_runtime` (for work a multiple of it), seconds:
    ``M (1 + W0(-e^(-1 - C / M)))``, the root of ``e^((tau + C) / M) (1 - tau / M) = 1`` (the
    derivative of Daly 2006's complete model set to zero; it does not depend on the restart cost, which only
    scales that runtime). Raises ``ValueError`` for a non-positive input."""
    _check_positive(save_cost_s=save_cost_s, mtbf_s=mtbf_s)
    w = lambertw(-math.exp(-1.0 - save_cost_s / mtbf_s), k=0).real  # in (-1, 0): tau in (0, M)
    return mtbf_s * (1.0 + w)


def _segments(work_s: float, interval_s: float) -> tuple[int, float]:
    """Whole segments of ``interval_s`` in ``work_s`` and the last one's length (``interval_s`` when it
    divides evenly: a remainder below one part in 10^9 is rounding, not an extra segment)."""
    count = math.ceil(work_s / interval_s - 1e-9)
    return count, work_s - (count - 1) * interval_s


def expected_runtime(
    work_s: float, interval_s: float, save_cost_s: float, restart_cost_s: float, mtbf_s: float
) -> float:
    """Mean wall-clock seconds to finish ``work_s`` seconds of failure-free compute, saving after every
    ``interval_s`` seconds of it (and after the last, shorter piece), under exponential failures of
    mean ``mtbf_s``.

    Daly 2006's complete model: a segment of ``L = tau + C`` seconds (work, then the save) costs on average
    ``M e^(R / M) (e^(L / M) - 1)``, failures striking during work, save or restart alike, each one
    sending the job back to its last checkpoint after a restart of ``R`` seconds. Summed here over the
    ``ceil(work / tau)`` segments (Daly writes ``work / tau`` of them). Raises ``ValueError`` for a
    non-positive work, interval or MTBF, or a negative save or restart cost."""
    _check_positive(work_s=work_s, interval_s=interval_s, mtbf_s=mtbf_s)
    _check_non_negative(save_cost_s=save_cost_s, restart_cost_s=restart_cost_s)
    count, last = _segments(work_s, interval_s)

    def segment(length: float) -> float:  # expm1: exact for L << M, where e^(L/M) - 1 loses digits
        try:
            return mtbf_s * math.exp(restart_cost_s / mtbf_s) * math.expm1(length / mtbf_s)
        except OverflowError:  # L or R > 709 M: the job (practically) never finishes
            return math.inf

    whole = (count - 1) * segment(interval_s + save_cost_s) if count > 1 else 0.0  # not 0 * inf
    return whole + segment(last + save_cost_s)


@dataclass(frozen=True, eq=False)
class RunStats:
    """What :func:`simulate_run` measured over ``runs`` simulated jobs. ``runtimes_s``: each job's
    wall-clock seconds (shape ``(runs,)``); ``mean_s``, ``std_s``: their mean and standard deviation;
    ``stderr_s = std_s / sqrt(runs)``, the standard error of the mean; ``mean_failures``: failures
    per job, restarts interrupted by another failure included."""

    runs: int
    mean_s: float
    std_s: float
    stderr_s: float
    mean_failures: float
    runtimes_s: np.ndarray


def simulate_run(
    work_s: float,
    interval_s: float,
    save_cost_s: float,
    restart_cost_s: float,
    mtbf_s: float,
    seed: int = 0,
    runs: int = 1000,
) -> RunStats:
    """Monte-Carlo: ``runs`` jobs of ``work_s`` seconds of work, saving after every ``interval_s``
    seconds of it, each against its own stream of failures (independent exponential gaps of mean
    ``mtbf_s`` on the wall clock, from ``numpy.random.default_rng(seed)``).

    No formula of this module is used: every job walks through its segments (work then save); a
    failure before a segment's save completes throws the segment away, and the job restarts
    (``restart_cost_s``; a failure during the restart starts the restart again) from the last save.
    The mean converges to :func:`expected_runtime`. Raises ``ValueError`` for the inputs
    :func:`expected_runtime` refuses or ``runs`` < 2."""
    _check_positive(work_s=work_s, interval_s=interval_s, mtbf_s=mtbf_s)
    _check_non_negative(save_cost_s=save_cost_s, restart_cost_s=restart_cost_s)
    if not isinstance(runs, Integral) or isinstance(runs, bool) or runs < 2:
        raise ValueError(f"runs must be an integer >= 2 (a standard error needs two), got {runs!r}")
    count, last = _segments(work_s, interval_s)
    tries = math.exp(min(max(interval_s, last) + save_cost_s + restart_cost_s, 709 * mtbf_s) / mtbf_s)
    if tries > 1e6:  # each segment would need that many attempts: the loop below would (practically) hang
        raise ValueError(
            f"a segment of {interval_s + save_cost_s:g} s of work and save, with a restart of "
            f"{restart_cost_s:g} s, against an MTBF of {mtbf_s:g} s succeeds about once in {tries:.3g} "
            "tries: the simulation would not finish; shorten the interval or the save"
        )
    rng = np.random.default_rng(seed)
    clock = np.zeros(runs)  # each job's wall clock
    done = np.zeros(runs, dtype=np.int64)  # segments saved so far
    failures = np.zeros(runs, dtype=np.int64)
    next_failure = rng.exponential(mtbf_s, runs)  # wall-clock time of each job's next failure
    running = done < count
    while running.any():
        length = np.where(done == count - 1, last, interval_s) + save_cost_s
        saved = running & (clock + length <= next_failure)
        clock[saved] += length[saved]
        done[saved] += 1
        # The others fail before their save completes: the segment is lost; the clock jumps to the failure.
        failed = running & ~saved
        clock[failed] = next_failure[failed]
        restarting = failed
        while restarting.any():  # a restart takes restart_cost_s, unless the next failure comes first
            failures[restarting] += 1
            next_failure[restarting] = clock[restarting] + rng.exponential(mtbf_s, int(restarting.sum()))
            interrupted = restarting & (next_failure < clock + restart_cost_s)
            clock[interrupted] = next_failure[interrupted]
            restarting = interrupted
        clock[failed] += restart_cost_s
        running = done < count
    std = float(clock.std(ddof=1))
    return RunStats(
        runs=runs,
        mean_s=float(clock.mean()),
        std_s=std,
        stderr_s=std / math.sqrt(runs),
        mean_failures=float(failures.mean()),
        runtimes_s=clock,
    )
