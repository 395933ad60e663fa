"""The GPU path proven: one command that checks minidist on a CUDA GPU against the CPU.

    python benchmarks/gpu_check.py                 # on a machine with a CUDA GPU and CuPy (~5 min on an H200)
    python benchmarks/gpu_check.py --dry-run       # the same logic on the CPU, tiny sizes (the test suite's)
    bash benchmarks/gpu_check.sh                   # the same, after installing wheels carried in .whl/

Steps, in this order, each in its own process with its own timeout (a crash or hang is that step's
failure; the next steps still run), all inside ``--budget`` seconds (a step the budget has no time left
for is a failure too: "not started"), with progress printed as it goes:

1. ``env``: GPU, CUDA runtime and driver, CuPy, PyTorch, mpi4py and the MPI library, CUDA-awareness.
2. ``gpu-tests``: ``pytest -m gpu`` on the GPU test files (the dry run only collects them).
3. ``mlp-<R>rank`` / ``gpt-<R>rank``: the float64 MLP (benchmarks/gpu_check_parts.py ``mlp``) and
   examples/train_gpt.py (float32, 50 steps) on ``MINIDIST_DEVICE=cuda`` and on the CPU, same seed and
   data, on 1 and 2 ranks (2 ranks share the one GPU), compared by benchmarks/gpu_check_compare.py.
4. ``gpt-step``: median seconds of a training step of a GPT of 6 layers x 384 wide, block 256, batch 32,
   in minidist on CuPy and in PyTorch (benchmarks/torch_gpt.py) on the GPU; in bfloat16 and float16 too
   where ``minidist.autocast`` exists (else "not measured"). Figures; float32 failing on either side fails.
5. ``all-reduce``: 2 ranks, float32 GPU arrays of 4 KiB..64 MiB, through minidist's host staging, next to
   host arrays of the same size, and device buffers straight to MPI where MPI is CUDA-aware (else the
   reason it is not available).
6. ``stand-in-tests``: the CuPy stand-in tests (tests/helpers/cupy_stand_in.py; CPU only, so last; not in the
   dry run).

Writes ``summary.json``, ``summary.md`` and ``log.txt`` to ``--out`` (default ``$OUT`` if set, else
``./gpu_check_out``). Exit status: 0 all checks passed, 1 a check failed, 77 no CUDA GPU / CuPy here
(one line says so; nothing else runs; ``--dry-run`` needs neither).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
from gpu_check_compare import GPT_FLOAT32, MLP_FLOAT64, compare_runs  # noqa: E402
from gpu_check_report import write_summary  # noqa: E402

NO_GPU = 77  # the exit status of "skipped" for automake-style test drivers
GPU_TEST_FILES = [
    "tests/backend/test_gpu.py",
    "tests/ops/test_transformer_ops.py",
]  # the files with gpu-marked tests
STAND_IN_TESTS = [
    "tests/backend/test_gpt_on_gpu_stand_in.py",
    "tests/distributed/test_dist_staging.py",
    "tests/backend/test_gpu_stand_in_paths.py",
]
# (full, dry run) sizes: the dry run exercises every code path with models that train in a second
GPT_ARGS = {
    "full": "--max-iters 50 --eval-interval 50 --eval-iters 5".split(),
    "dry": "--max-iters 3 --eval-interval 3 --eval-iters 2 --n-layer 1 --n-embd 16 --n-head 2 "
    "--block-size 16 --batch-size 4".split(),
}
STEP_ARGS = {  # the full run's model: gpu_check_parts.py's defaults (6 x 384, block 256, batch 32)
    "full": "--warmup 3 --steps 10 --precisions float32 bfloat16 float16".split(),
    "dry": "--n-layer 1 --n-head 2 --n-embd 16 --block-size 16 --batch-size 2 --warmup 1 --steps 2 "
    "--precisions float32 bfloat16".split(),
}
STEPS = ["tests", "mlp", "gpt", "step", "comm"]  # what --skip can leave out
COMM_SIZES = {"full": [4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20], "dry": [4 << 10, 64 << 10]}


def gpu_present() -> bool:
    """CuPy imports and sees at least one GPU (minidist.backend's test, without choosing the backend)."""
    try:
        import cupy  # noqa: PLC0415

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # no CuPy, or a CUDA driver error on a machine without a GPU
        return False


class Runner:
    """Runs the steps as subprocesses inside one time budget, logging their output to ``log.txt``."""

    def __init__(self, out: Path, budget_s: float) -> None:
        self.out, self.deadline = out, time.monotonic() + budget_s
        self.log = (out / "log.txt").open("w")
        self.checks: list[dict[str, Any]] = []

    def env(self, device: str) -> dict[str, str]:
        env = dict(os.environ, MINIDIST_DEVICE=device, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
        return env

    def run(self, name: str, cmd: list[str], timeout: float, device: str = "cpu") -> tuple[int, str]:
        """Run ``cmd``; returns (exit status, output). 124 for a timeout (the whole process group killed,
        so no rank of an mpiexec is left behind), 125 when the budget had no time left for it."""
        timeout = min(timeout, self.deadline - time.monotonic())
        if timeout < 5:
            return 125, f"not started: the script's time budget is spent ({name})"
        print(f"[gpu_check] {name}: {' '.join(cmd)} (timeout {timeout:.0f} s)", flush=True)
        self.log.write(f"\n===== {name}: {' '.join(cmd)}\n")
        proc = subprocess.Popen(
            cmd,
            cwd=REPO,
            env=self.env(device),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        try:
            output, _ = proc.communicate(timeout=timeout)
            status = proc.returncode
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            output, _ = proc.communicate()
            status, output = 124, (output or "") + f"\n[gpu_check] killed after {timeout:.0f} s\n"
        self.log.write(output)
        self.log.flush()
        return status, output

    def record(self, name: str, status: str, detail: str = "", seconds: float = 0.0, **data: Any) -> None:
        self.checks.append(
            {"name": name, "status": status, "detail": detail, "seconds": round(seconds, 1), **data}
        )
        print(f"[gpu_check] {name}: {status.upper()} {detail}".rstrip(), flush=True)


def tail(text: str, lines: int = 3) -> str:
    return " | ".join(text.strip().splitlines()[-lines:])


def python_or_mpi(ranks: int, script: list[str]) -> list[str]:
    """``python script`` for one rank, ``mpiexec -n R python script`` for several."""
    if ranks == 1:
        return [sys.executable, *script]
    sys.path.insert(0, str(REPO))
    from minidist_tools.mpiexec import mpiexec_path  # noqa: PLC0415  (imports no MPI)

    try:
        return [mpiexec_path(), "-n", str(ranks), sys.executable, *script]
    except RuntimeError as error:  # no mpiexec here: the step fails with the reason, the script goes on
        return [sys.executable, "-c", f"import sys; sys.exit({str(error)!r})"]


def run_tests(runner: Runner, name: str, dry: bool) -> None:
    """``gpu-tests`` (only collected in the dry run) or ``stand-in-tests`` (not in the dry run: the
    suite runs them on every CPU anyway; on the GPU machine they run last, on what the budget leaves)."""
    pytest = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    if name == "gpu-tests":
        cmd, timeout = [*pytest, "-m", "gpu", *(["--collect-only"] if dry else []), *GPU_TEST_FILES], 300
    else:
        cmd, timeout = [*pytest, *STAND_IN_TESTS], 240
    start = time.monotonic()
    status, output = runner.run(name, cmd, timeout)
    ok = status == 0
    runner.record(name, "pass" if ok else "fail", tail(output, 1 if ok else 4), time.monotonic() - start)


def train_and_compare(
    runner: Runner, dry: bool, ranks_list: list[int], skip: list[str], scratch: Path, device: str
) -> None:
    """Each workload on ``device`` and on the CPU, same seed and data; compared (gpu_check_compare.py)."""
    size = "dry" if dry else "full"
    workloads = {
        "mlp": (lambda out: ["benchmarks/gpu_check_parts.py", "mlp", str(out)], MLP_FLOAT64, 120),
        "gpt": (
            lambda out: ["examples/train_gpt.py", *GPT_ARGS[size], "--sample-tokens", "0", "--out", str(out)],
            GPT_FLOAT32,
            300,
        ),
    }
    for workload, (script, tolerance, timeout) in workloads.items():
        for ranks in [] if workload in skip else ranks_list:
            name, start, runs = f"{workload}-{ranks}rank", time.monotonic(), {}
            for side in ("device", "cpu"):
                out = scratch / f"{name}-{side}.npz"
                cmd = python_or_mpi(ranks, script(out))
                status, output = runner.run(
                    f"{name} on {device if side == 'device' else 'cpu'}",
                    cmd,
                    timeout,
                    device if side == "device" else "cpu",
                )
                if status != 0 or not out.exists():
                    runner.record(
                        name,
                        "fail",
                        f"the {side} run failed ({status}): {tail(output, 4)}",
                        time.monotonic() - start,
                    )
                    break
                with np.load(out) as saved:
                    runs[side] = dict(saved)
            else:
                result = compare_runs(runs["device"], runs["cpu"], tolerance)
                worst = max(result["worst"].items(), key=lambda kv: kv[1], default=("-", 0.0))
                detail = (
                    f"{device} vs cpu: largest difference {worst[1]:.2e} ({worst[0]})"
                    if result["ok"]
                    else "; ".join(result["problems"][:3])
                )
                runner.record(
                    name,
                    "pass" if result["ok"] else "fail",
                    detail,
                    time.monotonic() - start,
                    worst=result["worst"],
                    problems=result["problems"],
                )


def measure(runner: Runner, dry: bool, skip: list[str], scratch: Path, device: str) -> dict[str, Any]:
    """The GPT step times and the all-reduce times, as figures (a step that fails is a failed check)."""
    size, figures = "dry" if dry else "full", {}
    sizes = [str(s) for s in COMM_SIZES[size]]
    parts = {
        "gpt-step": (
            [sys.executable, "benchmarks/gpu_check_parts.py", "step", "{out}", *STEP_ARGS[size]],
            300,
        ),
        "all-reduce": (
            python_or_mpi(2, ["benchmarks/gpu_check_parts.py", "comm", "{out}", "--sizes", *sizes]),
            180,
        ),
    }
    for name, (cmd, timeout) in parts.items():
        if {"gpt-step": "step", "all-reduce": "comm"}[name] in skip:
            continue
        out, start = scratch / f"{name}.json", time.monotonic()
        status, output = runner.run(name, [c.replace("{out}", str(out)) for c in cmd], timeout, device)
        if status == 0 and out.exists():
            figures[name] = json.loads(out.read_text())
            # float32 must run on both sides; a missing mixed precision, or PyTorch not installed (it is an
            # optional oracle: the `bench` extra), is "not measured", not a failure
            broken = [
                f"{k}: {v['error']}"
                for k, v in figures[name].items()
                if k.endswith("float32") and "error" in v and "ModuleNotFoundError" not in v["error"]
            ]
            detail = "; ".join(broken) or "figures in summary.md"
            runner.record(name, "fail" if broken else "pass", detail, time.monotonic() - start)
        else:
            runner.record(name, "fail", f"exit {status}: {tail(output, 4)}", time.monotonic() - start)
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="the CPU, tiny sizes: the script's logic only")
    parser.add_argument("--out", default=None, help="output folder (default: $OUT, else ./gpu_check_out)")
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2], help="ranks of the training checks")
    parser.add_argument("--skip", nargs="*", default=[], choices=STEPS, help="steps to leave out")
    parser.add_argument("--budget", type=float, default=480, help="seconds for all steps")
    args = parser.parse_args(argv)
    if not args.dry_run and not gpu_present():
        print(
            "no CUDA GPU / CuPy: nothing to check (python benchmarks/gpu_check.py --dry-run runs the "
            "script's logic on the CPU)",
            flush=True,
        )
        return NO_GPU
    out = Path(args.out or os.environ.get("OUT") or "gpu_check_out")
    out.mkdir(parents=True, exist_ok=True)
    device = "cpu" if args.dry_run else "cuda"
    runner = Runner(out, args.budget)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gpu_check_") as tmp:
        scratch = Path(tmp)
        status, output = runner.run(
            "env",
            [sys.executable, "benchmarks/gpu_check_parts.py", "env", str(scratch / "env.json")],
            120,
            device,
        )
        env = json.loads((scratch / "env.json").read_text()) if status == 0 else {"error": tail(output, 4)}
        print(f"[gpu_check] environment: {json.dumps(env)}", flush=True)
        if "tests" not in args.skip:
            run_tests(runner, "gpu-tests", args.dry_run)
        train_and_compare(runner, args.dry_run, args.ranks, args.skip, scratch, device)
        figures = measure(runner, args.dry_run, args.skip, scratch, device)
        if "tests" not in args.skip and not args.dry_run:
            run_tests(runner, "stand-in-tests", args.dry_run)
    runner.log.close()
    summary = {
        "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "dry_run": args.dry_run,
        "device": device,
        "seconds": round(time.monotonic() - started, 1),
        "environment": env,
        "checks": runner.checks,
        "figures": figures,
        "passed": all(c["status"] == "pass" for c in runner.checks) and "error" not in env,
    }
    write_summary(out, summary)
    print((out / "summary.md").read_text(), flush=True)
    return 0 if summary["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
