"""PipelineParallel misuse raises the same error on every rank, and never hangs (DESIGN.md §3, property 5)."""

from __future__ import annotations

import json
import re

import pytest
from mpi_utils import run_mpi

pytestmark = pytest.mark.mpi

EXPECTED = {
    "more_stages_than_layers": ("ValueError", r"model with 1 layer\(s\) into 2 pipeline stages"),
    "batch_not_divisible": ("ValueError", "batch size 10 is not divisible by microbatches=4"),
    "batch_differs": ("ValueError", r"same batch size on every rank .* \[\[8, 8\], \[10, 10\]\]"),
    "microbatches_differ": (
        "ValueError",
        "built differently .*rank 0: .*microbatches=2.*rank 1: .*microbatches=3",
    ),
    "not_sequential_on_rank_0": ("TypeError", "on rank 0 of the pipeline group: .*nn.Sequential"),
    "unknown_schedule": ("ValueError", "unknown pipeline schedule 'zigzag'"),
    "bad_cuts": ("ValueError", "cut points must be strictly increasing"),
    "mismatched_mesh": ("ValueError", "mismatched mesh: mesh.pp=4 but its pp_group has 2 ranks"),
    "not_a_group": ("TypeError", "Communicator, None .* or a ProcessMesh, got str"),
    "dp_replica_fails": (
        "ValueError",
        "on rank 0 of the data-parallel group: train_step: batch size 10 is not divisible by microbatches=4",
    ),
    "predict_without_inputs": (
        "ValueError",
        r"predict: the first stage \(rank 0 of the pipeline group\) got no",
    ),
    "interleaved_m_not_multiple_of_p": (
        "ValueError",
        r"microbatches m=3 to be a multiple of the number of stages p=2 .* use m=2 or 4",
    ),
    "interleaved_too_few_layers": (
        "ValueError",
        r"model with 7 layer\(s\) into p\*v = 8 chunks \(2 stages x 4 virtual stages\)",
    ),
    "virtual_stages_below_1": ("ValueError", "virtual_stages .* must be an integer >= 1, got 0"),
    "virtual_stages_without_interleaved": ("ValueError", "virtual_stages=2 needs schedule='interleaved'"),
    "virtual_stages_differ": (
        "ValueError",
        "built differently .*rank 0: .*virtual_stages=1.*rank 1: .*virtual_stages=2",
    ),
    "interleaved_predict_without_inputs": ("ValueError", r"predict: the first stage \(rank 0"),
}


def test_every_rank_raises_the_same_clear_error(tmp_path):
    run_mpi(2, "pp_errors.py", tmp_path, timeout=60)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for case, (kind, pattern) in EXPECTED.items():
        for r, results in enumerate(ranks):
            got_kind, message = results[case]
            assert got_kind == kind, (case, r, results[case])
            assert re.search(pattern, message), (case, r, message)
        assert ranks[0][case] == ranks[1][case], case
    # after all that, the group still trains: no error left a message or a collective half done
    assert ranks[0]["after"] == ranks[1]["after"] > 0
    assert ranks[0]["after_interleaved"] == ranks[1]["after_interleaved"] > 0
