"""PipelineParallel misuse raises the same error on all ranks and never hangs (docs/design.md, property 5)."""

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
        r"pipeline group passed different values: microbatches \(2 on rank 0; 3 on rank 1\)",
    ),
    "not_sequential_on_rank_0": ("TypeError", "rank 0 of the pipeline group: .*nn.Sequential"),
    "unknown_schedule": ("ValueError", "unknown pipeline schedule 'zigzag'"),
    "bad_cuts": ("ValueError", "cut points must be strictly increasing"),
    "mismatched_mesh": ("ValueError", "mismatched mesh: mesh.pp=4 but its pp_group has 2 ranks"),
    "not_a_group": ("TypeError", "Communicator, None .* or a ProcessMesh, got str"),
    "dp_replica_fails": (
        "ValueError",
        "rank 0 of the data-parallel group: train_step: batch size 10 is not divisible by microbatches=4",
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
        r"virtual_stages \(1 on rank 0; 2 on rank 1\)",
    ),
    "interleaved_predict_without_inputs": ("ValueError", r"predict: the first stage \(rank 0"),
    "loss_returns_vector": (
        "TypeError",
        r"rank 1 of the pipeline group: loss_fn must return a one-element minidist Tensor .*"
        r"got Tensor of shape \(4,\) on microbatch 0",
    ),
    "loss_returns_float_gpipe": (
        "TypeError",
        "loss_fn must return a one-element .* got float on microbatch 0",
    ),
    "targets_out_of_range": (
        "ValueError",
        r"rank 1 of the pipeline group: loss_fn\(output, targets\) failed on microbatch 0: ValueError: "
        r"cross_entropy: targets must lie in \[0, 4\).* output has shape \(4, 4\)",
    ),
    "targets_bad_in_microbatch_1_gpipe": ("ValueError", "failed on microbatch 1: ValueError: cross_entropy"),
    "targets_bad_in_microbatch_1_interleaved": ("ValueError", "failed on microbatch 1: ValueError: cross"),
    "loss_returns_vector_interleaved": ("TypeError", r"got Tensor of shape \(4,\) on microbatch 0"),
    "loss_fn_not_callable_on_rank_1": ("TypeError", r"loss_fn must be callable .* ranks \[1\] passed"),
    "dp_replica_loss_fails": (
        "ValueError",
        r"rank 1 of the data-parallel group: "
        r"loss_fn\(output, targets\) failed on microbatch 0",
    ),
    "predict_while_other_trains": (
        "ValueError",
        r"called different operations \(rank 0: predict; rank 1: train_step\)",
    ),
}


def test_every_rank_raises_the_same_clear_error(tmp_path):
    run_mpi(2, "pipeline/pp_errors.py", tmp_path, timeout=60)
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
    # a failed loss leaves nothing behind: the same pipeline then trains exactly like a fresh one
    for r in range(2):
        retried, fresh = ranks[r]["recovers_after_a_failed_loss"]
        assert retried == fresh > 0, ranks[r]["recovers_after_a_failed_loss"]
    assert ranks[0]["numpy_counts"] == ranks[1]["numpy_counts"] > 0  # np.int64 microbatches accepted
