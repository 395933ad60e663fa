"""The pieces of benchmarks/gpu_check.py that run in their own processes (one per piece, so a crash or a
hang in one is that piece's failure, bounded by its own timeout, and the rest still run).

    python benchmarks/gpu_check_parts.py env OUT.json                    # versions, GPU, MPI
    [mpiexec -n R] python benchmarks/gpu_check_parts.py mlp OUT.npz      # 5 DDP steps of a float64 MLP
    python benchmarks/gpu_check_parts.py step OUT.json --n-layer 6 ...   # a GPT step: minidist vs torch
    mpiexec -n 2 python benchmarks/gpu_check_parts.py comm OUT.json --sizes 4096 ...  # all_reduce times

The device is ``MINIDIST_DEVICE`` (``cuda`` on the GPU; ``cpu`` in the dry run). Every piece writes its
result file on rank 0 and prints one progress line per item, flushed, so a timeout still shows how far
it got.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before NumPy loads its BLAS: ranks share the CPU cores
sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/: torch_gpt
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository: minidist

import numpy as np  # noqa: E402

import minidist as md  # noqa: E402
from minidist import backend  # noqa: E402


def say(*parts: Any) -> None:
    print(*parts, flush=True)


def synchronize() -> None:
    """Wait for the GPU's queued work (device work is asynchronous: a host clock read before this measures
    only the launches). A no-op on the CPU backend."""
    if backend.xp() is not np:
        backend.xp().cuda.Device().synchronize()


def environment() -> dict[str, Any]:
    """Versions and capabilities; every probe is guarded, so a missing piece is a recorded answer."""
    info: dict[str, Any] = {"python": sys.version.split()[0], "platform": platform.platform()}
    info["numpy"] = np.__version__
    try:
        import cupy  # noqa: PLC0415

        runtime = cupy.cuda.runtime
        info["cupy"] = cupy.__version__
        info["cuda_runtime"] = runtime.runtimeGetVersion()
        info["cuda_driver"] = runtime.driverGetVersion()
        props = runtime.getDeviceProperties(0)
        name = props["name"]
        info["gpu"] = name.decode() if isinstance(name, bytes) else str(name)
        info["gpu_memory_gib"] = round(props["totalGlobalMem"] / 2**30, 1)
    except Exception as error:  # no CuPy, or no GPU: the answer, not a failure of this probe
        info["cupy"] = f"not available ({type(error).__name__}: {error})"
    try:
        import torch  # noqa: PLC0415

        info["torch"] = torch.__version__
        info["torch_cuda"] = torch.cuda.is_available()
    except Exception as error:
        info["torch"] = f"not available ({type(error).__name__}: {error})"
    try:
        import mpi4py  # noqa: PLC0415
        from mpi4py import MPI  # noqa: PLC0415

        from minidist.distributed import mpi_is_cuda_aware  # noqa: PLC0415

        info["mpi4py"] = mpi4py.__version__
        info["mpi_library"] = MPI.Get_library_version().strip().splitlines()[0]
        info["mpi_cuda_aware"] = mpi_is_cuda_aware()
        if not info["mpi_cuda_aware"]:
            info["mpi_cuda_aware_reason"] = (
                "cannot be asked (mpi4py has no MPI.Query_cuda_support), so minidist stages through the host"
                if not hasattr(MPI, "Query_cuda_support")
                else "the MPI library says it cannot read GPU memory (MPIX_Query_cuda_support() is false; "
                "the pip mpich wheel is built without CUDA)"
            )
    except Exception as error:
        info["mpi4py"] = f"not available ({type(error).__name__}: {error})"
        info["mpi_cuda_aware"] = False
        info["mpi_cuda_aware_reason"] = "no MPI"
    try:
        from minidist_tools.mpiexec import mpiexec_path  # noqa: PLC0415

        info["mpiexec"] = mpiexec_path()
    except Exception as error:
        info["mpiexec"] = f"not available ({error})"
    return info


def train_mlp(out: str) -> None:
    """Five AdamW steps of a float64 MLP with GELU (tests/workers/training/gpu_train.py's model and data),
    data-parallel over the ranks when there are several: each rank takes its slice of the 32 rows, so any
    number of ranks computes the same average gradient as one process."""
    world = None
    if "PMI_RANK" in os.environ or "OMPI_COMM_WORLD_RANK" in os.environ:  # under mpiexec
        import minidist.distributed as dist  # noqa: PLC0415

        world = dist.init()
    rank, size = (world.rank, world.size) if world else (0, 1)
    md.manual_seed(0)
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((32, 8)), rng.integers(0, 3, 32)
    model = md.nn.Sequential(
        md.nn.Linear(8, 16, dtype=np.float64), md.nn.GELU(), md.nn.Linear(16, 3, dtype=np.float64)
    )
    if world and size > 1:
        from minidist.parallel import DistributedDataParallel  # noqa: PLC0415

        model = DistributedDataParallel(model)
    opt = md.optim.AdamW(model.parameters(), lr=0.01)
    rows = slice(rank * 32 // size, (rank + 1) * 32 // size)
    losses = []
    for _ in range(5):
        loss = md.nn.functional.cross_entropy(model(md.tensor(x[rows], dtype=np.float64)), y[rows])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    if world and size > 1:  # the mean of the ranks' losses: one process's loss over all 32 rows
        import minidist.distributed as dist  # noqa: PLC0415

        losses = list(dist.all_reduce(np.array(losses), op="avg"))
    state = {k.removeprefix("module."): backend.to_numpy(v) for k, v in model.state_dict().items()}
    if rank == 0:
        np.savez(out, losses=np.array(losses), **state)
        say(f"mlp on {backend.device()}, {size} rank(s): final loss {losses[-1]:.6f}")


def _median_step_seconds(step: Any, warmup: int, steps: int) -> list[float]:
    for _ in range(warmup):
        step()
    synchronize()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        synchronize()  # the step's kernels finished: the clock now measures them
        times.append(time.perf_counter() - start)
    return times


def _minidist_step(cfg: dict, tokens: tuple[np.ndarray, np.ndarray], precision: str) -> Any:
    """One training step of minidist's GPT (AdamW) as a closure; ``precision`` "float32", or "bfloat16"
    / "float16" under ``minidist.autocast`` (absent in an older checkout: ValueError)."""
    import contextlib  # noqa: PLC0415

    from minidist.models import GPT, GPTConfig  # noqa: PLC0415

    md.manual_seed(0)
    model = GPT(GPTConfig(**cfg, dropout=0.0))
    opt = md.optim.AdamW(model.parameters(), lr=1e-4)
    x, y = tokens
    if precision != "float32" and not hasattr(md, "autocast"):
        raise ValueError("minidist has no autocast (mixed precision) in this version")

    def step() -> None:
        scope = md.autocast(dtype=precision) if precision != "float32" else contextlib.nullcontext()
        with scope:
            logits = model(x)
        loss = md.nn.functional.cross_entropy(logits.reshape(-1, cfg["vocab_size"]), y.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad()

    return step


def _torch_step(cfg: dict, tokens: tuple[np.ndarray, np.ndarray], precision: str) -> Any:
    """The same step of benchmarks/torch_gpt.py's TorchGPT, on the GPU when torch sees one."""
    import torch  # noqa: PLC0415
    from torch_gpt import TorchGPT  # noqa: PLC0415

    where = "cuda" if backend.xp() is not np and torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    model = TorchGPT(cfg["vocab_size"], cfg["block_size"], cfg["n_layer"], cfg["n_head"], cfg["n_embd"])
    model = model.to(where)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x, y = (torch.from_numpy(t).to(where) for t in tokens)
    dtype = {"float32": None, "bfloat16": torch.bfloat16, "float16": torch.float16}[precision]

    def step() -> None:
        with torch.autocast(where, dtype=dtype, enabled=dtype is not None):
            logits = model(x)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, cfg["vocab_size"]).float(), y.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad()
        if where == "cuda":
            torch.cuda.synchronize()  # minidist's side synchronises CuPy's stream; this is torch's

    return step


def time_gpt_step(out: str, args: argparse.Namespace) -> None:
    """Median seconds per training step of the same GPT in minidist and in PyTorch, per precision."""
    cfg = {
        "vocab_size": 65,
        "block_size": args.block_size,
        "n_layer": args.n_layer,
        "n_head": args.n_head,
        "n_embd": args.n_embd,
    }
    rng = np.random.default_rng(0)
    shape = (args.batch_size, args.block_size)
    tokens = (rng.integers(0, 65, shape), rng.integers(0, 65, shape))
    result: dict[str, Any] = {"config": {**cfg, "batch_size": args.batch_size}, "device": backend.device()}
    for precision in args.precisions:
        for name, make in (("minidist", _minidist_step), ("torch", _torch_step)):
            key = f"{name}_{precision}"
            try:
                times = _median_step_seconds(make(cfg, tokens, precision), args.warmup, args.steps)
            except Exception as error:  # not available (no autocast, no torch): recorded, not fatal
                result[key] = {"error": f"{type(error).__name__}: {error}"}
                say(f"{key}: not measured ({type(error).__name__}: {error})")
                continue
            median = statistics.median(times)
            result[key] = {
                "median_s": median,
                "min_s": min(times),
                "max_s": max(times),
                "steps": len(times),
                "tokens_per_s": args.batch_size * args.block_size / median,
            }
            say(f"{key}: {median * 1e3:.2f} ms per step (median of {len(times)})")
    Path(out).write_text(json.dumps(result, indent=1))


def time_all_reduce(out: str, args: argparse.Namespace) -> None:
    """Seconds per ``all_reduce`` of a float32 array on the backend: minidist's staging path (device ->
    host, MPI, host -> device), a host NumPy array of the same size (MPI alone: the difference is what
    staging costs), and device buffers handed straight to MPI where the MPI build is CUDA-aware."""
    import minidist.distributed as dist  # noqa: PLC0415

    world = dist.init()
    xp = backend.xp()
    aware = dist.mpi_is_cuda_aware() and xp is not np
    rows = []
    for nbytes in args.sizes:
        row: dict[str, Any] = {"bytes": nbytes}
        variants = {
            "staged": xp.ones(nbytes // 4, dtype=np.float32),
            "host": np.ones(nbytes // 4, dtype=np.float32),
        }
        if aware:
            variants["cuda_aware"] = xp.ones(nbytes // 4, dtype=np.float32)
        synchronize()  # the fills are done before MPI reads device memory (mpi4py does not wait for them)
        repeats = max(3, min(20, (8 << 20) // nbytes))  # fewer repeats of the big sizes: the time budget
        for name, a in variants.items():
            if name == "cuda_aware":
                from mpi4py import MPI  # noqa: PLC0415

                def run(a: Any = a) -> None:
                    world.mpi.Allreduce(MPI.IN_PLACE, a)  # mpi4py reads __cuda_array_interface__
            else:

                def run(a: Any = a) -> None:
                    dist.all_reduce(a)

            times = []
            for i in range(repeats + 1):
                dist.barrier()
                start = time.perf_counter()
                run()
                synchronize()
                if i:  # the first is the warm-up (allocations, connection set-up)
                    times.append(time.perf_counter() - start)
            times = [float(t) for t in dist.all_reduce(np.array(times), op="max")]  # slowest rank sets it
            row[name + "_s"] = statistics.median(times)
        rows.append(row)
        if world.rank == 0:
            say(", ".join(f"{k} {v * 1e6:.0f} us" if k != "bytes" else f"{v} B" for k, v in row.items()))
    if world.rank == 0:
        reason = None if aware else "the backend is NumPy" if xp is np else "this MPI build is not CUDA-aware"
        result = {
            "ranks": world.size,
            "device": backend.device(),
            "cuda_aware": aware,
            "cuda_aware_reason": reason,
            "rows": rows,
        }
        Path(out).write_text(json.dumps(result, indent=1))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("part", choices=["env", "mlp", "step", "comm"])
    parser.add_argument("out", help="the result file (json; npz for mlp)")
    parser.add_argument("--n-layer", type=int, default=6)
    parser.add_argument("--n-head", type=int, default=6)
    parser.add_argument("--n-embd", type=int, default=384)
    parser.add_argument("--block-size", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--precisions", nargs="+", default=["float32", "bfloat16", "float16"])
    parser.add_argument("--sizes", type=int, nargs="+", default=[4 << 10, 256 << 10, 4 << 20, 64 << 20])
    args = parser.parse_args(argv)
    if args.part == "env":
        Path(args.out).write_text(json.dumps(environment(), indent=1))
    elif args.part == "mlp":
        train_mlp(args.out)
    elif args.part == "step":
        time_gpt_step(args.out, args)
    else:
        time_all_reduce(args.out, args)


if __name__ == "__main__":
    main()
