"""GPU arrays go through host staging in every collective (checked with a stand-in for CuPy).

Without a GPU we cannot run CuPy, but we can check the staging logic: the worker replaces ``cupy`` with
arrays that MPI cannot read and that count their copies, then runs every collective and send/recv on 3
ranks. On a machine with a GPU, the same collectives run on real CuPy arrays.
"""

from __future__ import annotations

import json

import pytest
from mpi_utils import run_mpi


@pytest.mark.mpi
def test_cupy_arrays_are_staged_through_the_host(tmp_path):
    run_mpi(3, "distributed/dist_fake_cupy.py", tmp_path, timeout=60)
    for rank in range(3):
        report = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert report["failures"] == [], "\n".join(report["failures"])
