"""FSDP checkpoints: the same files as every other layout, so they reshard both ways.

One 4-rank launch of ``workers/checkpoint/ckpt_fsdp.py`` (see its docstring) trains a tiny float64 GPT
(tied embeddings, one FSDP unit per block) on FSDP-4, FSDP-2, DDP-2, ZeRO-2 and one process, saving and
loading across them. What must hold:

* same layout (FSDP-2 -> FSDP-2, asynchronous save, ``load_latest``): bit-identical to uninterrupted
  training (docs/design.md, property 4: resume): the same arrays go through the same arithmetic;
* FSDP-4 -> FSDP-2 / DDP-2 / ZeRO-2 / one process: what each loaded and saved again is *exactly* the
  FSDP-4 checkpoint (copies only), and the 2 steps each then trains end where FSDP-4's own 2 further
  steps end; DDP-2 -> FSDP-4 likewise.

Tolerance for runs on different layouts: 1e-10 relative (float64). Only the order of floating-point sums
differs between the layouts (gradients averaged over 1, 2 or 4 ranks by an all-reduce or a
reduce-scatter, the loss's mean over the rows of each rank); each differs by a few ulps (~1e-16) and
2-4 AdamW steps keep a relative error relative (m / sqrt(v) is scale-free). 1e-10 is far above that
and far below a real mistake (a wrong slice moves an update by ~lr = 0.05); measured: <= 3e-13.
``atol = 1e-11`` covers the attention's key bias, whose exact gradient is 0 (test_train_gpt_example.py's
docstring): its computed gradient is rounding noise that AdamW, dividing by sqrt(v) + eps with eps =
1e-8, turns into weights of ~1e-13 at this lr (measured: differences <= 6e-13 between layouts), so
the relative tolerance means nothing there; 1e-11 is 20x that and still 9 orders below a mistake.

The train_gpt.py composition of FSDP with tensor parallelism (dp 2 x tp 2 equal to one process) is
tested in test_train_gpt_layouts.py with the other layouts.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from launch_utils import checkpoint_tensors
from mpi_utils import run_mpi

RTOL, ATOL = 1e-10, 1e-11  # see the module docstring


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("fsdp_ckpt")
    (root / "out").mkdir()
    run_mpi(4, "checkpoint/ckpt_fsdp.py", root / "ckpt", root / "out", timeout=240)
    return root


def weights(run, name: str) -> dict[str, np.ndarray]:
    return dict(np.load(run / "out" / f"{name}.npz"))


def assert_close(got: dict, expected: dict) -> None:
    assert sorted(got) == sorted(expected)
    for key, want in expected.items():
        np.testing.assert_allclose(got[key], want, rtol=RTOL, atol=ATOL, err_msg=key)


@pytest.mark.mpi
def test_fsdp_resume_on_the_same_layout_is_bit_identical(run):
    # async_save + load_latest into a model with other initial weights, then 2 more steps
    resumed, uninterrupted = weights(run, "f2_resumed_s4"), weights(run, "f2_s4")
    assert sorted(resumed) == sorted(uninterrupted)
    for key in uninterrupted:
        np.testing.assert_array_equal(resumed[key], uninterrupted[key], key)
    assert (run / "ckpt" / "f2" / "latest").read_text().strip() == "step_000000002"


@pytest.mark.mpi
@pytest.mark.parametrize("kind", ["fsdp", "ddp", "zero", "one"])
def test_fsdp4_checkpoint_loads_exactly_on_other_layouts_and_trains_on(run, kind):
    step, saved = checkpoint_tensors(run / "ckpt" / "f4" / "step_000000002")
    assert step == 2 and "optim/h.1.mlp.c_fc.weight/exp_avg_sq" in saved  # (a parameter of a unit)
    # Loaded on `kind` and saved again there: the same tensors, bit for bit (parameters and AdamW state).
    again_step, again = checkpoint_tensors(run / "ckpt" / f"{kind}_from_f4" / "step_000000002")
    assert again_step == 2 and sorted(again) == sorted(saved)
    for key in saved:
        np.testing.assert_array_equal(again[key], saved[key], key)
    assert_close(weights(run, f"{kind}_from_f4_s4"), weights(run, "f4_s4"))


@pytest.mark.mpi
def test_fsdp_trains_like_one_process_and_ddp_checkpoints_resume_under_fsdp(run):
    assert_close(weights(run, "f4_s4"), weights(run, "one_s4"))
    assert_close(weights(run, "d2_s4"), weights(run, "one_s4"))
    assert_close(weights(run, "f4_from_d2_s4"), weights(run, "d2_s4"))


@pytest.mark.mpi
def test_an_optimizer_over_the_wrong_tensors_is_an_error_on_every_rank(run):
    info = json.loads((run / "out" / "info.json").read_text())
    for r in range(4):
        for what in ("wrong", "wrong_load"):  # save: a CheckpointError; load: a ValueError, before changes
            message = info[f"{what}_{r}"]
            assert message is not None, (what, r)
            assert "is not a shard tensor" in message and "fsdp.parameters()" in message
        assert info[f"unchanged_{r}"], r
        # Over the wrapped model's own parameters the optimizer itself refuses (else it trains nothing,
        # silently: FSDP leaves empty arrays there), naming what to pass instead.
        built = info[f"wrong_build_{r}"]
        assert built is not None and "sharded by FullyShardedDataParallel" in built, built
        assert "fsdp.shard_param_groups(groups)" in built, built
    assert not (run / "ckpt" / "wrong").exists() or not any((run / "ckpt" / "wrong").glob("step_*"))


@pytest.mark.mpi
def test_the_tensor_parallel_clip_is_fsdps_own_without_tensor_parallelism(run):
    # (with tp 2 it is tested by train_gpt --fsdp --tp 2 against one process: test_train_gpt_layouts.py)
    info = json.loads((run / "out" / "info.json").read_text())
    for p in ("2.0", "inf"):
        norms = [info[f"clip_{p}_{r}"] for r in range(4)]
        assert norms[0][0] > 0 and all(n == norms[0] for n in norms), norms  # the same on every rank
        assert norms[0][0] == pytest.approx(norms[0][1], rel=1e-12), p  # float64 sums in another order
