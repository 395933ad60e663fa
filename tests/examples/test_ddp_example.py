"""examples/train_mlp.py's DDP flags: bucket size, overlap and gradient accumulation do not change the
result, and --trace writes a Perfetto-loadable timeline and prints the overlap fraction."""

from __future__ import annotations

import json
import re

import pytest
from mpi_utils import REPO, run_mpi

EXAMPLE = REPO / "examples" / "train_mlp.py"
SMALL = ("--epochs", "2", "--hidden", "32", "--batch-size", "64")


def epoch_lines(output: str) -> list[str]:
    lines = re.findall(r"^epoch .*$", output, re.MULTILINE)
    assert lines, output
    return lines


@pytest.mark.mpi
def test_grad_accum_buckets_and_overlap_give_the_same_training(tmp_path):
    # Losses and accuracies are printed to 4 decimals: float32 rounding differences from summing the
    # micro-batches separately stay far below that over 2 epochs (checked: ~1e-7 relative).
    reference = epoch_lines(run_mpi(2, EXAMPLE, *SMALL, timeout=120).stdout)
    accumulated = run_mpi(2, EXAMPLE, *SMALL, "--grad-accum", "3", "--bucket-cap-mb", "0.001", timeout=120)
    assert epoch_lines(accumulated.stdout) == reference
    trace_file = tmp_path / "trace.json"
    traced = run_mpi(2, EXAMPLE, *SMALL, "--no-overlap", "--trace", trace_file, timeout=120)
    assert epoch_lines(traced.stdout) == reference
    assert re.search(r"communication hidden behind backward: \d+\.\d% \(mean over ranks", traced.stdout)
    events = json.loads(trace_file.read_text())["traceEvents"]
    assert {e["pid"] for e in events} == {0, 1}
    assert {"forward", "backward", "optimizer step", "allreduce bucket 0"} <= {e["name"] for e in events}


@pytest.mark.mpi
def test_grad_accum_larger_than_the_local_batch_is_an_error_on_every_rank():
    result = run_mpi(2, EXAMPLE, "--batch-size", "8", "--grad-accum", "5", timeout=60, check=False)
    assert result.returncode == 2
    # every rank raised it; printed once for both
    assert result.stderr.startswith("error on ranks 0-1: --grad-accum 5 needs that many samples per rank")
