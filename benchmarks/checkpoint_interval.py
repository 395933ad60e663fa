"""The checkpoint-interval calculator against its Monte-Carlo simulation, for a few settings.

    python benchmarks/checkpoint_interval.py            # 1000 simulated jobs per point
    python benchmarks/checkpoint_interval.py --runs 4000 --seed 3

For each setting (Daly 2006's Figs. 3-5, and two clusters of 5-year nodes) it prints the system MTBF,
Young's, Daly's and the exact optimum interval, the expected runtime at Daly's interval next to the
simulated one (mean +- 2 standard errors), and the interval that simulated fastest in a sweep of 9
intervals from 0.5x to 2x Young's (all simulated with the same seed). A markdown table, as in
benchmarks/README.md, "Checkpoint interval". Pure arithmetic and NumPy: no MPI, no load sensitivity
beyond the run time.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from minidist_tools.checkpoint_interval import format_duration as fd
from minidist_tools.checkpoint_interval import parse_duration as pd
from minidist_tools.perfmodel import failures as pf

# name, node MTBF, nodes, save cost, restart cost, work
SETTINGS = [
    ("Daly Fig. 3", "24h", 1, "5min", "10min", "500h"),
    ("Daly Fig. 4", "6h", 1, "5min", "10min", "500h"),
    ("Daly Fig. 5", "15min", 1, "5min", "10min", "500h"),
    ("1,024 nodes", "5y", 1024, "60s", "300s", "30d"),
    ("16,384 nodes", "5y", 16384, "300s", "600s", "30d"),
]


def row(setting: tuple, runs: int, seed: int) -> str:
    """One table row; ``setting`` is one of SETTINGS."""
    name, node_mtbf, nodes, save, restart, work = setting
    mtbf = pf.system_mtbf(pd(node_mtbf), nodes)
    c, r, w = pd(save), pd(restart), pd(work)
    young, daly, best = pf.young_interval(c, mtbf), pf.daly_interval(c, mtbf), pf.optimal_interval(c, mtbf)
    expected = pf.expected_runtime(w, daly, c, r, mtbf)
    at_daly = pf.simulate_run(w, daly, c, r, mtbf, seed, runs)
    sweep = young * np.geomspace(0.5, 2.0, 9)
    means = [pf.simulate_run(w, t, c, r, mtbf, seed, runs).mean_s for t in sweep]
    fastest = sweep[int(np.argmin(means))]
    return (
        f"| {name} | {fd(mtbf)} | {save} / {restart} | {fd(young)} | {fd(daly)} | {fd(best)} | "
        f"{fd(expected, 4)} ({w / expected:.1%}) | {fd(at_daly.mean_s, 4)} +- {fd(2 * at_daly.stderr_s)} | "
        f"{fd(fastest)} ({fastest / young:.2f}x Young) |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1000, help="simulated jobs per point (default 1000)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(
        "| setting | system MTBF | save / restart | Young | Daly | exact optimum | expected runtime at Daly "
        "(useful) | simulated at Daly (+- 2 stderr) | fastest in the simulated sweep |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    start = time.perf_counter()
    for setting in SETTINGS:
        print(row(setting, args.runs, args.seed), flush=True)
    print(f"\n{args.runs} jobs per point, seed {args.seed}: {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
