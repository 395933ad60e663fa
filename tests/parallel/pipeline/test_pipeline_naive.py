"""The naive GPipe step (``naive.py``) as the oracle of PipelineParallel's GPipe and 1F1B.

On 2 and 4 real ranks, float64, the same model, seed and batches trained for a few steps with
``naive_gpipe_step`` and with ``PipelineParallel(schedule="gpipe")`` and ``"1f1b"`` must give the same
losses and parameters on every stage; and the naive step itself the numbers of one process on the
whole batch.
"""

from __future__ import annotations

import json

import numpy as np
import pp_common
import pytest
from mpi_utils import run_mpi

import minidist as md
import minidist.distributed as dist
from minidist import nn
from minidist.parallel.pipeline import naive_gpipe_step

pytestmark = pytest.mark.mpi

# Bit for bit: the naive step and the executor do the same arithmetic in the same order. Both cut the
# batch into the same slices and run the same layers on each; both seed the last stage's backward with
# an array of 1/m and accumulate each parameter's gradient over microbatches 0, 1, ..., m-1 in that
# order (GPipe and 1F1B both run their backwards in microbatch order; 1F1B only moves forwards between
# them, which read the parameters and never write them); both sum loss_i / m in that order and then
# all-reduce it with zeros from the other stages. So any difference is a change of arithmetic, not of
# rounding, and nothing looser than equality is needed.
CONFIGS = [
    {"m": 4, "seed": 0, "steps": 3, "opt": "sgd"},
    {"m": 3, "seed": 1, "steps": 2, "opt": "adamw"},
    {"m": 1, "seed": 2, "steps": 2, "opt": "sgd"},
]
# Against one process the order of the sums differs (per microbatch, then over microbatches): a few ulp
# per step, as test_pipeline_equivalence.py allows.
TOL = dict(rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("ranks", [2, 4])
def test_naive_gpipe_is_the_oracle_of_gpipe_and_1f1b(tmp_path, ranks):
    run_mpi(ranks, "pipeline/pp_naive.py", tmp_path, json.dumps(CONFIGS), timeout=180)
    for k, cfg in enumerate(CONFIGS):
        ref_params, ref_losses, _ = pp_common.single_process(cfg["seed"], cfg["steps"], cfg["opt"])
        for r in range(ranks):
            naive = dict(np.load(tmp_path / f"{k}_naive_rank{r}.npz"))
            np.testing.assert_allclose(naive["losses"], ref_losses, **TOL, err_msg=f"{cfg}, rank {r}")
            for name, value in naive.items():
                if name != "losses":
                    np.testing.assert_allclose(value, ref_params[name], **TOL, err_msg=f"{cfg}: {name}")
            for way in ("gpipe", "1f1b"):
                got = dict(np.load(tmp_path / f"{k}_{way}_rank{r}.npz"))
                assert sorted(got) == sorted(naive), (cfg, way, r)  # the same stage: the same names
                for name, value in naive.items():  # the losses and every parameter
                    np.testing.assert_array_equal(got[name], value, err_msg=f"{cfg}, {way}: {name}, rank {r}")


@pytest.mark.parametrize("m", [3, 0])
def test_a_batch_that_does_not_cut_into_m_equal_microbatches_is_refused(m):
    # One stage (a world of one rank) holds both the inputs and the targets; a remainder of 10 % 3
    # samples would otherwise drop out of the loss without a word.
    stage = nn.Linear(2, 1, dtype=np.float64)
    inputs, targets = md.tensor(np.ones((10, 2))), md.tensor(np.ones((10, 1)))
    with pytest.raises(ValueError, match=f"a batch of 10 cannot be cut into m={m} equal microbatches"):
        naive_gpipe_step(stage, dist.init(), inputs, targets, lambda out, y: ((out - y) ** 2).mean(), m)
