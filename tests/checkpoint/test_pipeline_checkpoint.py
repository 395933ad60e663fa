"""Checkpoints of an interleaved pipeline resume training exactly (docs/design.md, property 4: resume).

With ``virtual_stages=2`` a rank holds non-consecutive layers (``PipelineChunks``); its
``stage_module`` still names them as the full model does, which is all ``minidist.checkpoint`` needs:
a run resumed from step 2 must equal the uninterrupted run bit for bit, and loading the same
checkpoint into a 1F1B pipeline (other layers on each rank) must give the same parameters too.
"""

from __future__ import annotations

import json

import numpy as np
import pp_common  # noqa: E402
import pytest
from mpi_utils import run_mpi

pytestmark = pytest.mark.mpi


def test_interleaved_checkpoint_resumes_exactly_and_loads_into_1f1b(tmp_path):
    run_mpi(2, "pipeline/pp_checkpoint.py", tmp_path, timeout=60)
    ref_params, ref_losses, _ = pp_common.single_process(7, 3, "adamw", model="deep")
    infos = [json.loads((tmp_path / f"info_rank{r}.json").read_text()) for r in range(2)]
    # rank r holds chunks r and r + 2 of 4: the deep model's first and third quarter on rank 0
    assert "0.weight" in infos[0]["names"] and "0.weight" not in infos[1]["names"]
    assert sorted(infos[0]["names"] + infos[1]["names"]) == sorted(ref_params)
    runs = {}
    for run in ("straight", "resumed", "resumed_1f1b"):
        runs[run] = {}
        for r, info in enumerate(infos):
            runs[run].update(np.load(tmp_path / f"{run}_rank{r}.npz"))
            if run != "straight":
                assert info[f"{run}_step"] == 2
                # the same state and the same arithmetic after the load: exactly the same loss
                assert info[run] == info["straight"], (run, r)
        assert sorted(runs[run]) == sorted(ref_params)
        for name, value in runs[run].items():
            if run == "resumed":  # interleaved again: bit-exact
                np.testing.assert_array_equal(value, runs["straight"][name], err_msg=name)
            # float64: only the summation order differs from one process (test_pipeline_equivalence)
            np.testing.assert_allclose(value, ref_params[name], rtol=1e-10, atol=1e-12, err_msg=(run, name))
    for info in infos:
        np.testing.assert_allclose(info["losses"] + info["straight"], ref_losses, rtol=1e-10)
