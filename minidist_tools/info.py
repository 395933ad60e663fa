"""``minidist info``: the versions, the MPI library, the array backend and whether MPI is CUDA-aware."""

from __future__ import annotations

import argparse
import platform
import sys

DESCRIPTION = "the versions, the MPI library, the array backend and whether MPI is CUDA-aware"


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
    """``minidist info``: print :func:`info`; takes no arguments but ``--help``."""
    argparse.ArgumentParser(prog="minidist info", description="print " + DESCRIPTION).parse_args(argv)
    print(info())
    return 0
