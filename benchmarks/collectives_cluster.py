"""``collectives.py --cluster NxR``: run the all-reduce benchmark across nodes at several link speeds.

Starts a cluster of ``N`` network namespaces with ``R`` ranks each (``minidist_tools.cluster``, needs root),
and for each speed of ``--bandwidth`` (tc rates such as ``100mbit``, ``1gbit``, or ``none`` for an
unshaped veth) shapes every node's link and runs ``collectives.py`` itself on the cluster's ranks,
``all_reduce`` only. Each run writes ``collectives_n<NR>_<N>x<R>_<speed>.csv``; at the end this prints
one table: per speed and size, each algorithm's median time and the ratio of hierarchical to the best
flat hand-written algorithm and to MPI's built-in (< 1: hierarchical is faster). The cluster is taken
down at the end, also on an error or Ctrl-C.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

FLAT = ("ring", "recursive_doubling", "rabenseifner")
SHOWN = (*FLAT, "hierarchical", "mpi", "auto")


def forwarded(argv: list[str]) -> list[str]:
    """``argv`` without ``--cluster``/``--bandwidth``/``--collectives`` (and their values)."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0]
        if name in ("--cluster", "--bandwidth", "--collectives"):
            skip = "=" not in arg
            continue
        out.append(arg)
    return out


def run_on_cluster(args: argparse.Namespace, argv: list[str], script: Path) -> None:
    from minidist_tools.cluster import Cluster, cluster_available

    ok, reason = cluster_available()
    if not ok:
        sys.exit(f"--cluster: {reason}")
    try:
        nodes, rpn = (int(x) for x in args.cluster.lower().split("x"))
    except ValueError:
        sys.exit(f"--cluster {args.cluster!r}: expected NODESxRANKS_PER_NODE, e.g. 2x2")
    speeds = [s.strip() for s in args.bandwidth.split(",") if s.strip()]
    out_dir = Path(args.out_dir)
    csvs = []
    with Cluster.up(nodes=nodes, ranks_per_node=rpn) as cluster:
        for speed in speeds:
            cluster.set_bandwidth(None if speed == "none" else speed)
            label = f"{nodes}x{rpn}_{speed}"
            print(f"\n######## {nodes} nodes x {rpn} ranks, links {speed} ########", flush=True)
            command = ["python", str(script), *forwarded(argv), "--collectives", "all_reduce",
                       "--ranks-per-node", str(rpn), "--label", label]  # fmt: skip
            proc = cluster.run(command, timeout=3600, capture=False)
            if proc.returncode != 0:
                sys.exit(f"the run at {speed} failed (exit code {proc.returncode})")
            csvs.append((speed, out_dir / f"collectives_n{nodes * rpn}_{label}.csv"))
    print_summary(csvs, nodes, rpn)


def print_summary(csvs: list[tuple[str, Path]], nodes: int, rpn: int) -> None:
    """One markdown table: speed, size, each algorithm's time (ms), hierarchical / best flat, / mpi."""
    print(f"\n# all_reduce across {nodes} nodes x {rpn} ranks: median ms (slowest rank), ratios in one run")
    header = ["link", "size", *SHOWN, "hier/best flat", "hier/mpi"]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for speed, path in csvs:
        rows = list(csv.DictReader(path.open()))
        for size in sorted({int(r["size_bytes"]) for r in rows}):
            ms = {r["algorithm"]: float(r["time_us"]) / 1e3 for r in rows if int(r["size_bytes"]) == size}
            best_flat = min(ms[a] for a in FLAT)
            cells = [speed, human(size), *(f"{ms[a]:.3g}" for a in SHOWN)]
            cells += [f"{ms['hierarchical'] / best_flat:.2f}", f"{ms['hierarchical'] / ms['mpi']:.2f}"]
            print("| " + " | ".join(cells) + " |")


def human(nbytes: int) -> str:
    for unit, size in (("M", 1 << 20), ("K", 1 << 10)):
        if nbytes >= size:
            return f"{nbytes / size:g} {unit}iB"
    return f"{nbytes} B"
