"""A stage whose output changes shape between microbatches: the same clear error on every rank, no hang.

The next stage sizes its receive buffers from the step's first activation (``messages.py``), so a
later microbatch of another shape used to end the job with a bare point-to-point length error on the
receiving rank alone (issue 14, item 8).
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


def test_a_stage_changing_shape_between_microbatches_raises_on_every_rank(tmp_path):
    run_mpi(2, "pipeline/pp_shapes.py", tmp_path, timeout=90)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for case, pattern in EXPECTED.items():
        for r, results in enumerate(ranks):
            kind, message = results[case]
            assert kind == "ValueError", (case, r, results[case])
            assert re.search(pattern, message), (case, r, message)
    # the group still trains afterwards: no case left a message in flight
    assert ranks[0]["after"] == ranks[1]["after"] > 0
