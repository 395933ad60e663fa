"""On 2 real MPI ranks: a replayed DDP step (its bucket all-reduces run from the recorded leaves' hooks)
equals eager DDP bit for bit; ZeRO, FSDP, tensor and pipeline parallelism run eagerly, each with a
one-line reason."""

from __future__ import annotations

import json

from mpi_utils import run_mpi


def test_ddp_replays_bit_identically_and_other_layouts_fall_back(tmp_path):
    run_mpi(2, "compile/replay_ddp.py", str(tmp_path), timeout=180)
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["same"] and result["replays"] == 4
    reasons = result["reasons"]
    assert "running eagerly: ZeroRedundancyOptimizer: ZeRO's optimizer exchanges" in reasons["zero"]
    assert "FullyShardedDataParallel: FSDP gathers" in reasons["fsdp"]
    assert "tensor parallelism communicates inside" in reasons["tensor"]
    assert reasons["pipeline"].startswith("PipelineParallel is not a Module")  # refused when built
    assert all("\n" not in r for r in reasons.values())
