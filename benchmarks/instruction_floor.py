"""Instructions per step and per all-reduce, phase by phase: the measured floors of issue 16's unmet goals.

    python benchmarks/instruction_floor.py step [--dp D] [--pp P]   # goal (a): a step vs the NumPy reference
    python benchmarks/instruction_floor.py step --pp P [--dp D] --executor-only   # the executor alone
    python benchmarks/instruction_floor.py allreduce -n N           # goal (b): all_reduce vs mpi4py vs MPI

Each command launches ``mpiexec -n W valgrind --tool=callgrind python instruction_floor.py --worker ...``
(valgrind is an optional system tool, not a pip dependency) and prints a table. Instruction counts do
not change with the machine's load, step times do (by 2-10x on the shared 2-core machine of
``benchmarks/README.md``); that is why the floors are counted, not timed.

**How one run counts many things.** The worker builds every contender (a closure: one training step,
or one all-reduce), runs each a few times to warm up, then, for each contender in turn: a barrier,
``time.sleep(0)``, ``--calls`` calls, ``time.sleep(0)``. Callgrind's ``--dump-before=time_sleep``
writes the counters out and zeroes them each time Python enters ``time.sleep``, so the window between
the two sleeps holds exactly the contender's calls (``time.sleep`` is nothing's hot path: minidist's
only sleeps are in its timeout loops, off here, and the watchdog thread is switched off with
``MINIDIST_WATCHDOG=off`` so that it does not run inside the windows).

**What is counted.** A window's instructions are split by the shared object they ran in: those in the
MPI library and its transport (``libmpi``, UCX, libfabric, ...) and all the others (the Python
interpreter, NumPy, BLAS, mpi4py's wrapper, minidist). The MPI part includes the polling a rank does
while it waits for its partner, which grows with the wait, so it is *not* load-proof and is printed
only for orientation; the rest is. The tables give the mean over ranks per call.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
# Libraries whose instructions are MPI's own work (and its polling): matched against the object's file name.
# The model whose steps are counted by default: kernels nearly free, so what is counted is the fixed work
# around them (as in count_instructions.py); --model small counts the 64-256-256-10 MLP of the timings.
TINY, TINY_BATCH = (8, 8, 8, 4), 16
MPI_LIBRARY = re.compile(r"lib(mpi|ucp|uct|ucs|ucm|fabric|psm|hwloc|pmi|cma)", re.IGNORECASE)


# -- reading callgrind's output ----------------------------------------------------------------------
def instructions_by_library(path: Path) -> tuple[int, int]:
    """(instructions outside the MPI library, inside it) in one callgrind output file.

    "Inside" is the inclusive cost of every call from code outside the MPI library into it: MPI's own
    instructions and those of what it calls (``memcpy``, ``pthread_mutex_lock`` while it polls, ...).
    "Outside" is the rest of the file's total. In callgrind's format a ``calls=`` line is followed by
    the call's inclusive cost; the callee's object is the last ``cob=`` (the caller's own if none).
    """
    names: dict[str, str] = {}
    total, inside, caller, callee, in_call = 0, 0, "", None, False

    def object_name(spec: str) -> str:  # "(3) /path/lib.so" defines name 3, "(3)" refers to it
        match = re.match(r"(\(\d+\))?\s*(.*)", spec)
        ref, name = match.group(1), match.group(2)
        if ref and name:
            names[ref] = name
        return name or names.get(ref, "")

    for line in path.read_text().splitlines():
        if line.startswith("ob="):
            caller, callee = object_name(line[3:]), None
        elif line.startswith("cob="):
            callee = object_name(line[4:])
        elif line.startswith("calls="):
            in_call = True
        elif line.startswith("totals:"):
            total = int(line.split()[1])
        elif line[:1].isdigit() or line[:1] in "+-*":
            if in_call:  # the inclusive cost of the call just announced
                into = callee if callee is not None else caller
                if MPI_LIBRARY.search(Path(into).name) and not MPI_LIBRARY.search(Path(caller).name):
                    inside += int(line.split()[1])
                in_call, callee = False, None
        elif line.startswith("fn="):
            callee = None
    return total - inside, inside


def count(world: int, worker_args: list[str], calls: int) -> dict[str, tuple[float, float]]:
    """Run the worker under callgrind on ``world`` ranks; {contender: (outside, inside MPI) per call}."""
    from minidist_tools.mpiexec import mpiexec_path  # noqa: PLC0415  (imports no MPI)

    out = Path(tempfile.mkdtemp(prefix="instruction_floor_"))
    # MINIDIST_KEEP_FREED_MEMORY=0: glibc's default heap trimming. With minidist's tuning (host_memory.py)
    # the heap grows past valgrind's brk segment ("brk segment overflow"), and 2 of 3 pipeline runs
    # crashed under callgrind; the tiny model's arrays are far below either mmap threshold, so the
    # counts are the same.
    env = dict(os.environ, MINIDIST_WATCHDOG="off", MINIDIST_KEEP_FREED_MEMORY="0", OMP_NUM_THREADS="1",
               OPENBLAS_NUM_THREADS="1")  # fmt: skip
    names_file = out / "names.txt"
    cmd = [
        mpiexec_path(), "-n", str(world), "valgrind", "--tool=callgrind", "--dump-before=time_sleep",
        f"--callgrind-out-file={out}/cg.%p", sys.executable, __file__, "--worker", "--calls", str(calls),
        "--names-file", str(names_file), *worker_args,
    ]  # fmt: skip
    with open(out / "valgrind.log", "w") as log:
        if subprocess.run(cmd, env=env, stderr=log).returncode != 0:
            raise SystemExit(
                f"the counting run failed; valgrind's and the ranks' messages: {out}/valgrind.log"
            )
    names = names_file.read_text().split("\n")[:-1]
    per_rank: dict[str, list[tuple[int, int]]] = {name: [] for name in names}
    for base in sorted(p for p in out.glob("cg.*") if p.name.count(".") == 1):  # one per rank: cg.<pid>
        for j, name in enumerate(names):  # part 1: start-up; then (calls, barrier) per contender
            per_rank[name].append(instructions_by_library(Path(f"{base}.{2 + 2 * j}")))
    shutil.rmtree(out)  # callgrind's files, a few MB per rank (kept above when the run failed)
    return {
        name: tuple(sum(c[k] for c in counts) / len(counts) / calls for k in (0, 1))
        for name, counts in per_rank.items()
    }


# -- the contenders ------------------------------------------------------------------------------------
def step_contenders(args: argparse.Namespace) -> dict[str, Callable[[], object]]:
    """The small MLP's step of ``small_mlp.py`` in pieces, for minidist and for the reference; the
    minimal autograd engine's whole step (its pipeline version with --pp)."""
    import numpy as np  # noqa: PLC0415
    from mpi4py import MPI  # noqa: PLC0415
    from numpy_reference import ReferenceStage, cross_entropy, dp_step  # noqa: PLC0415
    from overhead_parallel import pipeline_pair  # noqa: PLC0415
    from small_mlp import minidist_step, minimal_autograd_step, reference_step  # noqa: PLC0415

    import minidist as md  # noqa: PLC0415
    import minidist.distributed as dist  # noqa: PLC0415
    from minidist import nn, optim  # noqa: PLC0415
    from minidist.parallel.data_parallel.buckets import flatten, unflatten_into  # noqa: PLC0415

    w = make_workload(args)
    lr, dp_n, dp = w.args.lr, w.mesh.dp, w.dp_comm
    steps: dict[str, Callable[[], object]] = {}
    if not args.executor_only:
        steps = {
            "reference": reference_step(w)[0],
            "minidist": minidist_step(w)[0],
            "minimal autograd": minimal_autograd_step(w)[0],
        }
    if w.mesh.pp > 1:  # the executor's own cost: train_step against a hand-written GPipe loop (no SGD)
        steps["pipeline train_step (no SGD)"], steps["the same loop by hand (no SGD)"] = pipeline_pair(w)
        return steps

    stage = ReferenceStage(w.init, head=True)
    steps["reference forward"] = lambda: cross_entropy(stage.forward(w.x), w.y)
    steps["reference forward + backward"] = lambda: stage.backward(cross_entropy(stage.forward(w.x), w.y)[1])
    steps["reference, no all-reduce"] = lambda: dp_step(stage, w.x, w.y, lr, None)
    model = w.new_model()
    params, xt, loss_fn = list(model.parameters()), md.tensor(w.x), nn.functional.cross_entropy
    opt = optim.SGD(params, lr=lr)

    def no_graph() -> None:
        with md.no_grad():
            loss_fn(model(xt), w.y)

    def local() -> None:
        opt.zero_grad()
        loss_fn(model(xt), w.y).backward()

    def by_hand(all_reduce: Callable[[np.ndarray], object]) -> Callable[[], None]:
        def step() -> None:  # DDP's work after backward, written out: pack, all-reduce, divide, unpack
            local()
            grads = [p.grad for p in params]
            flat = flatten(grads)
            all_reduce(flat)
            flat /= dp_n
            unflatten_into(flat, grads)
            opt.step()

        return step

    steps["minidist forward, no graph"] = no_graph
    steps["minidist forward"] = lambda: loss_fn(model(xt), w.y)
    steps["minidist forward + backward"] = local
    steps["minidist, no all-reduce"] = lambda: (local(), opt.step())
    if dp_n > 1:
        steps["by hand, mpi4py Allreduce"] = by_hand(lambda a: dp.Allreduce(MPI.IN_PLACE, a))
        steps["by hand, dist.all_reduce"] = by_hand(lambda a: dist.all_reduce(a, group=w.mesh.dp_group))
    return steps


def allreduce_contenders(args: argparse.Namespace) -> dict[str, Callable[[], object]]:
    """One all-reduce of each size three ways: minidist's ``auto``, bare mpi4py, MPI's built-in."""
    import numpy as np  # noqa: PLC0415
    from collectives import bare_all_reduce  # noqa: PLC0415
    from mpi4py import MPI  # noqa: PLC0415

    import minidist.distributed as dist  # noqa: PLC0415

    world = dist.init()
    comm = world.mpi.Dup()  # MPI's own messages on a communicator of their own
    calls: dict[str, Callable[[], object]] = {}
    for kib in args.sizes:
        arrays = [np.ones(kib * 256, dtype=np.float32) for _ in range(3)]
        calls[f"{kib} KiB auto"] = lambda a=arrays[0]: dist.all_reduce(a)
        calls[f"{kib} KiB bare"] = bare_all_reduce(world, arrays[1])
        calls[f"{kib} KiB mpi"] = lambda a=arrays[2]: comm.Allreduce(MPI.IN_PLACE, a)
    return calls


def make_workload(args: argparse.Namespace):  # noqa: ANN201
    from small_mlp import SIZES  # noqa: PLC0415
    from small_mlp import make_workload as make  # noqa: PLC0415

    return make(args, TINY if args.model == "tiny" else SIZES)


def worker(args: argparse.Namespace) -> None:
    """Warm up every contender, then run each for ``--calls`` calls between two ``time.sleep(0)``s."""
    import minidist.distributed as dist  # noqa: PLC0415

    contenders = step_contenders(args) if args.what == "step" else allreduce_contenders(args)
    world = dist.init()
    for fn in contenders.values():
        for _ in range(3):
            fn()
    for fn in contenders.values():
        world.mpi.Barrier()
        time.sleep(0)  # callgrind dumps here: the window of this contender starts
        for _ in range(args.calls):
            fn()
        time.sleep(0)  # and ends here (the next window holds only the barrier)
    if world.rank == 0 and args.names_file:
        args.names_file.write_text("".join(f"{name}\n" for name in contenders))


# -- tables ----------------------------------------------------------------------------------------------
def print_step_table(c: dict[str, tuple[float, float]], dp: int, pp: int) -> None:
    out = {name: v[0] for name, v in c.items()}
    print(f"instructions per step outside the MPI library, mean over ranks (dp {dp}, pp {pp}):")
    for name, value in out.items():
        print(f"  {name:38s} {value:12,.0f}   (in MPI, load-dependent: {c[name][1]:,.0f})")
    if "minidist" in out:
        graph_at_all = out["minimal autograd"] - out["reference"]
        print(f"  minimal autograd - reference (the cost of having a graph at all): {graph_at_all:+,.0f}")
        print(f"  minidist - reference: {out['minidist'] - out['reference']:+,.0f}")
    if pp > 1:
        executor = out["pipeline train_step (no SGD)"] - out["the same loop by hand (no SGD)"]
        print(f"  of which the pipeline executor: {executor:+,.0f} ({executor / 4:+,.0f} per microbatch)")
        return
    # Each phase: (minidist's contender after it, before it, the reference's after, before); "" counts 0.
    phases = [
        ("forward: modules and ops, no graph", "minidist forward, no graph", "", "reference forward", ""),
        ("forward: building the graph", "minidist forward", "minidist forward, no graph", "", ""),
        ("backward (walk, checks, zero_grad)", "minidist forward + backward", "minidist forward",
         "reference forward + backward", "reference forward"),
        ("optimizer (SGD.step vs p -= lr*g)", "minidist, no all-reduce", "minidist forward + backward",
         "reference, no all-reduce", "reference forward + backward"),
    ]  # fmt: skip
    if dp > 1:
        phases += [
            ("pack, mpi4py Allreduce, unpack vs the reference's", "by hand, mpi4py Allreduce",
             "minidist, no all-reduce", "reference", "reference, no all-reduce"),
            ("dist.all_reduce's Python path vs mpi4py Allreduce", "by hand, dist.all_reduce",
             "by hand, mpi4py Allreduce", "", ""),
            ("DDP's bookkeeping (hooks, buckets, flags, checks)", "minidist", "by hand, dist.all_reduce",
             "", ""),
        ]  # fmt: skip
    out[""] = 0.0
    rows = [(label, out[a] - out[b] - (out[c] - out[d])) for label, a, b, c, d in phases]
    print("  split of minidist - reference:")
    for label, value in rows:
        print(f"    {label:52s} {value:+12,.0f}")
    print(f"    {'(sum of the rows)':52s} {sum(v for _, v in rows):+12,.0f}")


def print_allreduce_table(c: dict[str, tuple[float, float]], n: int, sizes: list[int]) -> None:
    print(f"instructions per all-reduce call, mean over {n} ranks: outside MPI | in MPI (load-dependent)")
    print(f"  {'size':>8s} {'auto':>20s} {'bare mpi4py':>20s} {'MPI Allreduce':>20s}")
    for kib in sizes:
        cells = [c[f"{kib} KiB {k}"] for k in ("auto", "bare", "mpi")]
        print(f"  {kib:>5d}KiB " + " ".join(f"{o:>9,.0f} | {i:>8,.0f}" for o, i in cells))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("step", "allreduce"))
    parser.add_argument("--dp", type=int, default=1, help="step: data-parallel ranks")
    parser.add_argument("--pp", type=int, default=1, help="step: pipeline stages (GPipe, 4 microbatches)")
    parser.add_argument("-n", type=int, default=2, help="allreduce: ranks (a power of two)")
    parser.add_argument("--sizes", type=int, nargs="+", default=[4, 16, 64, 256], help="allreduce: KiB")
    parser.add_argument(
        "--model",
        choices=("tiny", "small"),
        default="tiny",
        help="step: MLP 8-8-8-4, "
        f"batch {TINY_BATCH} (fixed costs; default), or small_mlp.py's 64-256-256-10, batch 128",
    )
    parser.add_argument("--calls", type=int, default=None, help="calls per contender (default 20 / 50)")
    parser.add_argument(
        "--executor-only",
        action="store_true",
        help="step with --pp > 1: count only the pipeline executor's pair (train_step, the loop by hand)",
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--names-file", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--microbatches", type=int, default=4, help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--lr", type=float, default=0.05, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.executor_only and (args.what != "step" or args.pp < 2):
        parser.error("--executor-only counts the pipeline executor: use it with step --pp 2 or more")
    args.calls = args.calls or (20 if args.what == "step" else 50)
    args.batch = args.batch or (TINY_BATCH if args.model == "tiny" else 128)
    if args.worker:
        worker(args)
        return
    shared = (
        ["--sizes", *map(str, args.sizes)]
        if args.what == "allreduce"
        else ["--dp", str(args.dp), "--pp", str(args.pp), "--model", args.model]
        + (["--executor-only"] if args.executor_only else [])
    )
    world = args.n if args.what == "allreduce" else args.dp * args.pp
    counts = count(world, [args.what, *shared], args.calls)
    print(f"load average {os.getloadavg()[0]:.2f} (does not change the counts outside MPI)")
    if args.what == "step":
        print_step_table(counts, args.dp, args.pp)
    else:
        print_allreduce_table(counts, args.n, args.sizes)


if __name__ == "__main__":
    main()
