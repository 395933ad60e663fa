"""``minidist checkpoint interval``: how often to checkpoint, from the node MTBF and save cost.

    minidist checkpoint interval --node-mtbf 5y --nodes 1024 --save-cost 60 --restart-cost 300

prints the system MTBF, Young's, Daly's and the exact optimum interval
(:mod:`minidist_tools.perfmodel.failures`), and for each the expected runtime of ``--work`` seconds of work
and the share of it that is useful;
``--interval`` adds your own interval to the table, ``--simulate RUNS`` a Monte-Carlo check of every
row. Durations take a unit: ``s``, ``m`` or ``min``, ``h``, ``d``, ``w``, ``y`` (365.25 days); a bare
number is seconds.
"""

from __future__ import annotations

import argparse
import math
import re

from minidist_tools.perfmodel import failures as pf

UNITS = {"s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0, "w": 7 * 86400.0, "y": 365.25 * 86400.0}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)(?:e([+-]?\d+))?\s*([a-z]*)\s*$", re.IGNORECASE)


def parse_duration(text: str) -> float:
    """Seconds in ``text``: a number and an optional unit of :data:`UNITS` (``"5y"``, ``"3d"``,
    ``"1.5h"``, ``"60"``). Raises ``ValueError`` naming the text and the units accepted."""
    match = _DURATION.match(text)
    unit = match.group(3).lower() if match else ""
    seconds = float(f"{match.group(1)}e{match.group(2) or 0}") * UNITS.get(unit, 1.0) if match else math.nan
    if not match or unit not in UNITS | {"": 1.0} or not math.isfinite(seconds):  # 1e400s is no duration
        raise ValueError(
            f"cannot read the duration {text!r}: write a finite number and a unit among {', '.join(UNITS)} "
            "(for example 5y, 3d, 90min, 60s; a bare number is seconds)"
        )
    return seconds


def format_duration(seconds: float, digits: int = 3) -> str:
    """``seconds`` in the largest unit that keeps the number at 1 or more, to ``digits`` significant
    digits: ``"42.8 h"``, ``"71.7 min"``."""
    for unit in ("y", "d", "h", "min"):
        if abs(seconds) >= UNITS[unit]:
            return f"{seconds / UNITS[unit]:.{digits}g} {unit}"
    return f"{seconds:.{digits}g} s"


def _duration(text: str) -> float:  # argparse turns the ValueError into "invalid _duration value"
    try:
        return parse_duration(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def add_parser(actions: argparse._SubParsersAction) -> None:
    """Register ``interval`` under ``minidist checkpoint``."""
    parser = actions.add_parser(
        "interval",
        help="how often to checkpoint: Young's, Daly's and the exact optimum interval",
        description="Print the system MTBF, Young's, Daly's and the exact optimum checkpoint interval, "
        "and the expected runtime of --work at each (minidist_tools.perfmodel.failures). Durations take a "
        "unit: s, m or min, h, d, w, y (365.25 days); a bare number is seconds.",
    )
    parser.add_argument("--node-mtbf", type=_duration, required=True, help="MTBF of one node, e.g. 5y")
    parser.add_argument("--nodes", type=int, default=1, help="nodes the job runs on (default 1)")
    parser.add_argument("--save-cost", type=_duration, required=True, help="time one save takes, e.g. 60s")
    parser.add_argument("--restart-cost", type=_duration, default=0.0, help="time to relaunch and load (0)")
    parser.add_argument("--work", type=_duration, default=30 * 86400.0, help="failure-free run time (30d)")
    parser.add_argument("--interval", type=_duration, help="also price this interval of work between saves")
    parser.add_argument(
        "--simulate",
        type=int,
        default=0,
        metavar="RUNS",
        help="simulate RUNS runs of the job and compare (default 0: none)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the simulation (default 0)")


def table(args: argparse.Namespace) -> str:
    """The report ``minidist checkpoint interval`` prints; raises ``ValueError`` on bad input."""
    mtbf = pf.system_mtbf(args.node_mtbf, args.nodes)
    rows = [
        ("Young 1974", pf.young_interval(args.save_cost, mtbf)),
        ("Daly 2006", pf.daly_interval(args.save_cost, mtbf)),
        ("exact optimum", pf.optimal_interval(args.save_cost, mtbf)),
    ]
    if args.interval is not None:
        rows.append(("--interval", args.interval))
    lines = [
        f"system MTBF   {format_duration(mtbf)} ({mtbf:,.0f} s): {args.nodes} node(s), "
        f"each failing once in {format_duration(args.node_mtbf)}",
        f"save {format_duration(args.save_cost)}, restart {format_duration(args.restart_cost)}, "
        f"work {format_duration(args.work)} without failures",
        "",
        f"{'':<14} {'interval':>19} {'expected runtime':>17} {'useful':>7}"
        + (f" {'simulated (+- 2 stderr)':>25} {'failures':>8}" if args.simulate else ""),
    ]
    for name, interval in rows:
        runtime = pf.expected_runtime(args.work, interval, args.save_cost, args.restart_cost, mtbf)
        shown = f"{format_duration(interval)} ({interval:,.0f} s)"
        line = f"{name:<14} {shown:>19} {format_duration(runtime, 4):>17} {args.work / runtime:>7.2%}"
        if args.simulate:
            stats = pf.simulate_run(
                args.work, interval, args.save_cost, args.restart_cost, mtbf, args.seed, args.simulate
            )
            spread = f"{format_duration(stats.mean_s, 4)} +- {format_duration(2 * stats.stderr_s)}"
            line += f" {spread:>25} {stats.mean_failures:>8.1f}"
        lines.append(line)
    if args.save_cost >= mtbf:
        lines.append("\nwarning: a save takes longer than the MTBF: the job will rarely finish; save faster")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """Print :func:`table`; a bad value prints ``error: ...`` and returns 2 (argparse's usage status)."""
    if args.simulate < 0 or args.simulate == 1:
        print(f"error: --simulate takes 0 (no simulation) or at least 2 runs, got {args.simulate}")
        return 2
    try:
        print(table(args))
    except ValueError as err:
        print(f"error: {err}")
        return 2
    return 0
