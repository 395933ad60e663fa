"""Command-line entry point: ``python -m minidist info``, ``python -m minidist checkpoint info DIR`` and
``python -m minidist checkpoint interval ...``."""

from __future__ import annotations

import argparse
import platform
import sys


def info() -> str:
    """A report of versions, the MPI library, the array backend and whether MPI is CUDA-aware."""
    import numpy as np
    from mpi4py import MPI

    import minidist
    from minidist import backend
    from minidist.distributed.staging import mpi_is_cuda_aware

    try:
        import cupy

        cupy_version = cupy.__version__
    except Exception:
        cupy_version = "not installed"
    import mpi4py

    major, minor = MPI.Get_version()
    cuda_aware = mpi_is_cuda_aware()
    mpi_library = MPI.Get_library_version().strip().splitlines()[0]
    lines = [
        f"minidist        {minidist.__version__}",
        f"python          {platform.python_version()} ({sys.executable})",
        f"numpy           {np.__version__}",
        f"mpi4py          {mpi4py.__version__}",
        f"cupy            {cupy_version}",
        f"MPI library     {mpi_library}",
        f"MPI standard    {major}.{minor}",
        f"backend         {backend.xp().__name__} on {backend.device()}",
        f"CUDA-aware MPI  {'yes' if cuda_aware else 'no (GPU arrays are staged through host memory)'}",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m minidist", description="minidist command-line tools")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="print versions, the MPI library, the backend and CUDA-awareness")
    from minidist import checkpoint_interval  # noqa: PLC0415  (no MPI import either)
    from minidist.checkpoint import cli as checkpoint_cli  # noqa: PLC0415  (no MPI import)

    checkpoint_interval.add_parser(checkpoint_cli.add_parser(sub))
    args = parser.parse_args(argv)
    if args.command == "info":
        print(info())
    if args.command == "checkpoint" and args.checkpoint_command == "interval":
        return checkpoint_interval.run(args)
    if args.command == "checkpoint":
        return checkpoint_cli.run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
