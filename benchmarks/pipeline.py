"""Benchmark pipeline parallelism: measured against theoretical bubble, and activation memory.

    mpirun -n 2 python benchmarks/pipeline.py      # p = 2 stages (the world size)
    mpirun -n 4 python benchmarks/pipeline.py      # p = 4
    mpirun -n 4 python benchmarks/pipeline.py --microbatches 1 4 --rounds 2 --no-plots   # quicker

For each schedule (GPipe, 1F1B, and interleaved 1F1B with ``--virtual-stages`` v = 2 model chunks per
rank, for the m that are multiples of p) and microbatch count m (default 1, 2, 4, 8, 16), one launch
trains an MLP of 8 Linear(512, 512) + ReLU layers (balanced: 8/p Linear layers per stage, 8/(p v) per
chunk) on a fixed global batch of 256 float32 samples, and prints per configuration:

* the theoretical bubble ``(p-1)/(m+p-1)``, interleaved ``(p-1)/(v m + p-1)`` (``simulate`` on the
  schedule, forward : backward = 1 : 2; Narayanan et al. 2021, §2.2.2);
* the measured bubble from the trace (``minidist.trace`` spans of every stage, merged with
  ``timeline_from_trace``: idle share of the window from the first forward to the last backward, the
  same definition as the theory);
* the executor's own figure (``pipe.stats``: idle / step time, where the step also includes the shape
  header and the final loss broadcast);
* the peak number of microbatches whose activations a stage held (GPipe: m; 1F1B: min(p, m);
  interleaved: counted per chunk, each ``1/v`` of a stage's activations), measured by the executor,
  with the schedule's prediction;
* the step time.

Each configuration runs ``--warmup`` steps, then ``--rounds`` traced steps; the step with the smallest
time is reported (on a shared machine other work only ever adds time). Gantt charts of the simulated and
the measured m=8 steps go to ``benchmarks/results/pipeline_p{p}_{schedule}_m8_{simulated,measured}.png``
(needs matplotlib, the ``bench`` extra), and all numbers to ``benchmarks/results/pipeline_p{p}.csv``.

With more ranks than cores, a rank waiting in a receive spins on a core that a computing rank needs, and
the measured bubble grows beyond the theory's; the load average is printed, check it.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")  # one BLAS thread per rank: the ranks share the cores

import numpy as np  # noqa: E402

import minidist as md  # noqa: E402
import minidist.distributed as dist  # noqa: E402
from minidist import nn, trace  # noqa: E402
from minidist.parallel.pipeline import PipelineParallel, peak_activations, simulate  # noqa: E402
from minidist_tools.gantt import draw_gantt, timeline_from_trace  # noqa: E402

RESULTS = Path(__file__).parent / "results"


def make_model(width: int, layers: int) -> nn.Sequential:
    md.manual_seed(0)
    modules: list[nn.Module] = []
    for _ in range(layers):
        modules += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*modules)


def measure(world, args, schedule: str, m: int, v: int) -> dict:
    """Run one configuration; return rank 0's summary (other ranks return {})."""
    model = make_model(args.width, args.layers)
    pipe = PipelineParallel(model, world, microbatches=m, schedule=schedule, virtual_stages=v)
    rng = np.random.default_rng(0)
    x = md.tensor(rng.standard_normal((args.batch, args.width)), dtype=np.float32)
    y = rng.integers(0, args.width, args.batch)
    for _ in range(args.warmup):
        pipe.zero_grad()
        pipe.train_step(x, y, nn.functional.cross_entropy)
    best = None
    for _ in range(args.rounds):
        pipe.zero_grad()
        dist.barrier(world)
        trace.enable()  # right after a barrier: the ranks' clocks start together
        start = time.perf_counter()
        pipe.train_step(x, y, nn.functional.cross_entropy)
        elapsed = time.perf_counter() - start
        trace.disable()
        stats = pipe.stats
        row = np.array([elapsed, stats.bubble_fraction, stats.peak_activations], np.float64)
        everyone = world.mpi.gather((row, trace.events()), root=0)
        if world.rank == 0:
            rows = np.array([r for r, _ in everyone])
            step_time = rows[:, 0].max()
            if best is None or step_time < best["step_s"]:
                measured = timeline_from_trace(pipe.schedule, [events for _, events in everyone])
                best = {
                    "step_s": step_time,
                    "executor_bubble": rows[:, 1].mean(),
                    "peak": int(rows[:, 2].max()),
                    "timeline": measured,
                }
    if world.rank != 0:
        return {}
    best["trace_bubble"] = best["timeline"].bubble_fraction()
    best["theory_bubble"] = simulate(pipe.schedule).bubble_fraction()
    best["theory_peak"] = max(peak_activations(pipe.schedule))
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--microbatches", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--schedules", nargs="+", default=["gpipe", "1f1b", "interleaved"])
    parser.add_argument("--virtual-stages", type=int, default=2, help="model chunks per rank (interleaved)")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8, help="Linear layers (each followed by a ReLU)")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--no-plots", action="store_true")
    args = parser.parse_args()
    world = dist.init()
    p = world.size
    if world.rank == 0:
        model = f"{args.layers} x Linear({args.width}, {args.width}) + ReLU"
        print(
            f"pipeline benchmark: p={p} stages, batch {args.batch}, {model}, float32; "
            f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs"
        )
        print(
            f"{'schedule':>11} {'p':>2} {'v':>2} {'m':>3} {'bubble theory':>13} {'measured(trace)':>15} "
            f"{'executor':>8} {'peak act':>8} {'theory':>6} {'step ms':>8}"
        )
    lines = ["schedule,p,v,m,theory_bubble,trace_bubble,executor_bubble,peak_activations,theory_peak,step_s"]
    for schedule in args.schedules:
        v = args.virtual_stages if schedule == "interleaved" else 1
        for m in args.microbatches:
            if schedule == "interleaved" and m % p:
                continue  # the interleaved schedule needs m to be a multiple of p
            r = measure(world, args, schedule, m, v)
            if world.rank != 0:
                continue
            print(
                f"{schedule:>11} {p:>2} {v:>2} {m:>3} {r['theory_bubble']:>13.3f} {r['trace_bubble']:>15.3f} "
                f"{r['executor_bubble']:>8.3f} {r['peak']:>8} {r['theory_peak']:>6} "
                f"{r['step_s'] * 1e3:>8.1f}",
                flush=True,
            )
            lines.append(
                f"{schedule},{p},{v},{m},{r['theory_bubble']:.4f},{r['trace_bubble']:.4f},"
                f"{r['executor_bubble']:.4f},{r['peak']},{r['theory_peak']},{r['step_s']:.5f}"
            )
            if m == 8 and not args.no_plots:
                save_charts(r["timeline"], schedule, p)
    if world.rank == 0:
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / f"pipeline_p{p}.csv").write_text("\n".join(lines) + "\n")


def save_charts(measured, schedule: str, p: int) -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print('(no Gantt charts: pip install -e ".[bench]" for matplotlib)')
        return
    RESULTS.mkdir(exist_ok=True)
    stem = RESULTS / f"pipeline_p{p}_{schedule}_m8"
    draw_gantt(measured.schedule, f"{stem}_simulated.png")
    draw_gantt(
        measured,
        f"{stem}_measured.png",
        title=f"{schedule}, p={p}, m=8, measured: bubble {measured.bubble_fraction():.2f}",
    )


if __name__ == "__main__":
    main()
