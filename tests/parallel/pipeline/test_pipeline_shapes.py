"""A stage whose output changes shape between microbatches, or whose layers fail in forward: the same
clear error on every rank, no hang.

The next stage sizes its receive buffers from the step's first activation (``messages.py``), so a
later microbatch of another shape used to end the job with a bare point-to-point length error on the
receiving rank alone.
"""

from __future__ import annotations

import json
import re

import pytest
from mpi_utils import run_mpi

pytestmark = pytest.mark.mpi

ROWS = r"produced an activation of shape \(3, 16\) \(float64\) for microbatch 1, but of shape \(4, 16\) " + (
    r"\(float64\) for microbatch 0: every microbatch must leave a stage with the same shape"
)
EXPECTED = {
    "rows_1f1b": r"rank 0 of the pipeline group: pipeline stage 0 " + ROWS,
    "rows_gpipe": r"rank 0 of the pipeline group: pipeline stage 0 " + ROWS,
    "rows_interleaved": r"rank 0 of the pipeline group: pipeline stage 0 \(model chunk 0, virtual stage 0\) "
    + ROWS,
    "rows_interleaved_rank_1": r"rank 1 of the pipeline group: pipeline stage 1 \(model chunk 0, virtual "
    r"stage 1\) " + ROWS,
}
TOO_WIDE = (
    r"rank 1 of the pipeline group: pipeline stage 1 failed in forward on microbatch 0: ValueError: "
    r"Linear\(12, 4\) got input of shape \(4, 16\).* \(its input, from stage 0, has shape \(4, 16\) "
    r"and dtype float64\); check that stage 0's output fits this stage's first layer"
)
FAILED = {
    "too_wide_1f1b": ("ValueError", TOO_WIDE),
    "too_wide_gpipe": ("ValueError", TOO_WIDE),
    "fails_on_microbatch_1": (
        "RuntimeError",
        r"rank 0 of the pipeline group: pipeline stage 0 failed in forward on microbatch 1: KeyError: "
        r"'no such token' \(its input, from the batch, has shape \(4, 6\)",
    ),
    "fails_on_microbatch_0_then_stage_1": (
        "RuntimeError",
        r"pipeline stage 0 failed in forward on microbatch 0",
    ),
    # rank 0 fails too, on the stand-in rank 1 sent: the first failure in the data flow is reported
    "interleaved_first_failure_wins": (
        "RuntimeError",
        r"rank 1 of the pipeline group: pipeline stage 1 \(model chunk 0, virtual stage 1\) failed in "
        r"forward on microbatch 0: KeyError",
    ),
    "backward_fails_stage_0": (
        "RuntimeError",
        r"rank 0 of the pipeline group: pipeline stage 0 failed in backward on microbatch 0: "
        r"ArithmeticError: derivative not implemented \(its output has shape \(4, 16\)\)",
    ),
    "backward_fails_last_stage_gpipe": (
        "RuntimeError",
        r"rank 1 of the pipeline group: pipeline stage 1 failed in backward on microbatch 0: ArithmeticError",
    ),
    "backward_fails_interleaved": (
        "RuntimeError",
        r"pipeline stage 0 \(model chunk 0, virtual stage 0\) failed in backward on microbatch 0: "
        r"ArithmeticError",
    ),
    "predict_too_wide": (
        "ValueError",
        r"rank 1 of the pipeline group: pipeline stage 1 failed in forward in predict: ValueError: "
        r"Linear\(12, 4\) got input of shape \(8, 16\).* \(its input, from stage 0, has shape \(8, 16\)",
    ),
    "predict_interleaved_first_failure_wins": (
        "RuntimeError",
        r"rank 1 of the pipeline group: pipeline stage 1 \(model chunk 0, virtual stage 1\) failed in "
        r"forward in predict: KeyError",
    ),
}


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("pp_shapes")
    run_mpi(2, "pipeline/pp_shapes.py", out, timeout=120)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


def test_a_stage_changing_shape_between_microbatches_raises_on_every_rank(ranks):
    for case, pattern in EXPECTED.items():
        for r, results in enumerate(ranks):
            kind, message = results[case]
            assert kind == "ValueError", (case, r, results[case])
            assert re.search(pattern, message), (case, r, message)
    # the group still trains afterwards: no case left a message in flight
    assert ranks[0]["after"] == ranks[1]["after"] > 0


def test_a_stage_failing_in_forward_raises_on_every_rank_naming_stage_microbatch_and_shape(ranks):
    """E.g. a stage whose output does not fit the next stage's first layer: that layer's error used to
    end the job from one rank (or, caught there, leave the others waiting)."""
    for case, (kind, pattern) in FAILED.items():
        assert ranks[0][case] == ranks[1][case], case
        assert ranks[0][case][0] == kind and re.search(pattern, ranks[0][case][1]), (case, ranks[0][case])
