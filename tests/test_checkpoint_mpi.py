"""Checkpoints across real ranks: killed ranks, bit-exact resume, resharding to other meshes, errors.

Every run trains the float64 MLP of ``workers/checkpoint/ckpt_train.py`` with SGD (momentum) and AdamW in one
launch. "Bit-exact" compares with ``assert_array_equal``: the same layout resumes the very same
sequence of floating-point operations (restored parameters, optimizer state, sampler position and
both RNG streams). After resharding, reductions run in another order (other dp/tp group sizes), so
parameters agree to rounding only: after a few steps in float64 that is ~1e-14 relative; rtol 1e-9
leaves room for AdamW's m / sqrt(v), which amplifies rounding where v is tiny.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from mpi_utils import run_mpi

pytestmark = pytest.mark.mpi
OPTIMS = ("sgd", "adamw")
STEPS, EVERY = 7, 4  # 5 steps per epoch: the checkpoint at step 4 is mid-epoch, resume crosses an epoch


def mesh_size(mesh: str) -> int:
    return int(np.prod([int(v) for v in mesh.split(",")]))


def train(out: Path, ckpt: Path, mesh: str, *extra: str, env: dict | None = None, check: bool = True):
    out.mkdir(parents=True, exist_ok=True)
    return run_mpi(mesh_size(mesh), "checkpoint/ckpt_train.py", out, ckpt, "--mesh", mesh, *extra, env=env,
                   check=check, timeout=180)  # fmt: skip


def final(out: Path) -> dict[str, dict[str, np.ndarray]]:
    return {o: dict(np.load(out / f"{o}.npz")) for o in OPTIMS}


def assert_same(a: dict, b: dict, exact: bool) -> None:
    for o in OPTIMS:
        assert a[o].keys() == b[o].keys()
        for name in a[o]:
            if exact:
                np.testing.assert_array_equal(a[o][name], b[o][name], err_msg=f"{o} {name}")
            else:
                np.testing.assert_allclose(
                    a[o][name], b[o][name], rtol=1e-9, atol=1e-12, err_msg=f"{o} {name}"
                )


@pytest.fixture(scope="module")
def dp4_reference(tmp_path_factory):
    """An uninterrupted dp=4 run, no dropout: checkpoints at step 4; final parameters."""
    root = tmp_path_factory.mktemp("dp4")
    train(root / "out", root / "ckpt", "4,1,1", "--steps", str(STEPS), "--every", str(EVERY))
    return root


# -- killed ranks ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kill, latest_after_kill",
    [("1:7:train", 6), ("2:6:save", 3), ("0:6:commit", 3), ("0:6:latest", 3)],
    ids=["mid-training", "mid-save", "before-commit", "after-rename-before-latest"],
)
def test_killed_rank_then_resume_is_bit_exact(tmp_path, kill, latest_after_kill):
    args = ("--steps", "8", "--every", "3", "--dropout", "0.3")  # dropout: RNG state must be restored
    train(tmp_path / "ref", tmp_path / "ref_ckpt", "4,1,1", *args)
    killed = train(tmp_path / "run", tmp_path / "ckpt", "4,1,1", *args, env={"CKPT_KILL": kill}, check=False)
    assert killed.returncode != 0, "the SIGKILLed job should have failed"
    for o in OPTIMS[:1]:  # the kill hits the first optimizer's run
        latest = (tmp_path / "ckpt" / o / "latest").read_text().strip()
        assert latest == f"step_{latest_after_kill:09d}"
    if kill.endswith("latest"):  # issue 14 item 5: the newer folder is complete; 'latest' lags behind
        assert (tmp_path / "ckpt" / "sgd" / "step_000000006" / "manifest.json").exists()
    resumed = train(tmp_path / "run", tmp_path / "ckpt", "4,1,1", *args, "--resume")
    if kill.endswith("latest"):  # resumed from step 6, not 3 (which would fail to save step 6 again)
        assert "'latest' names step_000000003 but step_000000006 is newer" in resumed.stdout
    assert_same(final(tmp_path / "run"), final(tmp_path / "ref"), exact=True)
    leftovers = [p.name for p in (tmp_path / "ckpt" / "sgd").iterdir() if p.name.startswith(".tmp")]
    assert leftovers == []  # the crashed save's temporary folder was cleaned by a later save


# -- same layout: bit-exact -----------------------------------------------------------------------------
@pytest.mark.parametrize("mesh", ["2,2,1", "2,1,2", "2,2,2"], ids=["dp2xtp2", "dp2xpp2", "3d"])
def test_resume_on_the_same_mesh_is_bit_exact(tmp_path, mesh):
    args = ("--steps", str(STEPS), "--dropout", "0.3")  # TP dropout draws from the TP RNG tracker
    train(tmp_path / "ref", tmp_path / "ckpt", mesh, *args, "--every", str(EVERY))
    train(tmp_path / "resumed", tmp_path / "unused", mesh, *args, "--resume-from", tmp_path / "ckpt")
    assert_same(final(tmp_path / "resumed"), final(tmp_path / "ref"), exact=True)


# -- another layout: allclose ---------------------------------------------------------------------------
@pytest.mark.parametrize("mesh", ["2,1,1", "1,1,1", "2,2,1", "2,1,2", "1,2,2"])
def test_resume_on_another_mesh_matches(tmp_path, dp4_reference, mesh):
    saved = dp4_reference / "ckpt"
    latest = {o: (saved / o / "latest").read_text().strip() for o in OPTIMS}
    assert set(latest.values()) == {f"step_{EVERY:09d}"}
    train(tmp_path / "out", tmp_path / "ckpt", mesh, "--steps", str(STEPS), "--resume-from", saved)
    assert_same(final(tmp_path / "out"), final(dp4_reference / "out"), exact=False)


def test_3d_checkpoint_resumes_on_data_parallel_only(tmp_path, dp4_reference):
    train(tmp_path / "ref", tmp_path / "ckpt", "2,2,2", "--steps", str(STEPS), "--every", str(EVERY))
    train(tmp_path / "out", tmp_path / "unused", "4,1,1", "--steps", str(STEPS), "--resume-from",
          tmp_path / "ckpt")  # fmt: skip
    assert_same(final(tmp_path / "out"), final(tmp_path / "ref"), exact=False)
    assert_same(final(tmp_path / "out"), final(dp4_reference / "out"), exact=False)


def test_zero_checkpoint_resumes_exactly_and_at_another_size(tmp_path):
    args = ("--steps", str(STEPS), "--zero")
    train(tmp_path / "ref", tmp_path / "ckpt", "4,1,1", *args, "--every", str(EVERY))
    train(tmp_path / "same", tmp_path / "unused", "4,1,1", *args, "--resume-from", tmp_path / "ckpt")
    assert_same(final(tmp_path / "same"), final(tmp_path / "ref"), exact=True)
    train(tmp_path / "two", tmp_path / "unused2", "2,1,1", *args, "--resume-from", tmp_path / "ckpt")
    assert_same(final(tmp_path / "two"), final(tmp_path / "ref"), exact=False)


# -- errors on every rank -------------------------------------------------------------------------------
def test_corrupt_shard_raises_on_every_rank(tmp_path, dp4_reference):
    broken = tmp_path / "ckpt"
    shutil.copytree(dp4_reference / "ckpt", broken)
    victim = sorted((broken / "sgd" / f"step_{EVERY:09d}").glob("*.safetensors"))[-1]
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 1
    victim.write_bytes(bytes(data))
    before = {p: p.read_bytes() for p in broken.rglob("*") if p.is_file()}
    train(
        tmp_path / "out",
        broken,
        "2,1,1",
        "--steps",
        str(STEPS),
        "--resume",
        "--expect-error",
        "--optims",
        "sgd",
    )
    for rank in range(2):
        message = json.loads((tmp_path / "out" / f"error_{rank}.json").read_text())["error"]
        assert victim.name in message and "checksum" in message
    assert {p: p.read_bytes() for p in broken.rglob("*") if p.is_file()} == before  # nothing changed


# -- issue 14 item 1: the ordinary loop resumes bit-exactly at every position of an epoch ----------------
@pytest.mark.parametrize("ranks", [2, 3])  # 3 ranks: global batch 8 splits 3 + 3 + 2
def test_ordinary_loop_resumes_bit_exactly_at_every_epoch_position(tmp_path, ranks):
    """``for x, y in loader: ... checkpoint.save(..., sampler=sampler)`` with no position bookkeeping:
    resumed after the first, a middle or the last batch of an epoch, at the epoch boundary, or with
    ``sampler=loader``, the final parameters equal the uninterrupted run's bit for bit."""
    run_mpi(ranks, "checkpoint/ckpt_loop.py", tmp_path, timeout=180)
    steps = json.loads((tmp_path / "steps.json").read_text())
    assert steps["full"] == 15
    # [saved step, epoch and position restored on rank 0, final step]
    local = steps["first"][2]
    assert local == (8 + ranks - 1) // ranks  # rank 0's share of one global batch: one batch done
    assert steps["first"][:3] == [1, 0, local]
    assert steps["middle"][:3] == [3, 0, 3 * local]
    assert steps["last"][:3] == [5, 0, 5 * local]  # the epoch's batches are all done ...
    assert steps["boundary"][:3] == [5, 0, 5 * local]  # ... so both resume with epoch 1's first batch
    assert steps["loader"][:3] == [8, 1, 3 * local]
    full = dict(np.load(tmp_path / "full.npz"))
    for case in ("first", "middle", "last", "boundary", "loader"):
        assert steps[case][3] == 15, case
        got = dict(np.load(tmp_path / f"{case}.npz"))
        for name in full:
            assert np.array_equal(got[name], full[name]), f"resumed at '{case}': {name} differs"


@pytest.mark.parametrize("mode", ["strided", "global"])
def test_a_save_between_epochs_resumes_on_another_number_of_ranks_at_the_next_epoch(tmp_path, mode):
    """Saved after epoch 0's inner loop on 2 ranks, loaded on 3 (in global-batch mode with another
    global batch size too): the finished epoch stays finished, and epoch 1 reads every sample once.
    A position saved mid-epoch cannot carry over in these cases, but a finished epoch can, as the
    error for the mid-epoch case itself advises ("resume at an epoch boundary")."""
    root, first, second = tmp_path / "ckpt", tmp_path / "first", tmp_path / "second"
    first.mkdir(), second.mkdir()
    run_mpi(2, "checkpoint/ckpt_boundary_reshard.py", mode, root, first, timeout=120)
    saved = [json.loads((first / f"rank{r}.json").read_text()) for r in range(2)]
    assert all(s["error"] is None for s in saved), saved
    assert sorted(saved[0]["seen"]["0"] + saved[1]["seen"]["0"]) == list(range(20))
    run_mpi(3, "checkpoint/ckpt_boundary_reshard.py", mode, root, second, timeout=120)
    resumed = [json.loads((second / f"rank{r}.json").read_text()) for r in range(3)]
    for r in resumed:
        assert r["error"] is None, r["error"]
        assert set(r["seen"]) == {"1"}, "epoch 0 was finished when saved: nothing of it is read again"
    assert sorted(sum((r["seen"]["1"] for r in resumed), [])) == list(range(20))


def test_a_damaged_folder_newer_than_latest_resumes_from_latest_without_fallback(tmp_path):
    """Killed after step 6's rename, before 'latest' moved on from step 3; then step 6's folder is damaged
    (a disk fault): ``load_latest`` without ``fallback`` resumes from step 3, which 'latest' still
    names, instead of failing on step 6 at every restart. The run saves step 6 anew (the damaged
    folder is moved aside) and ends bit-exact with the uninterrupted run."""
    args = ("--steps", "8", "--every", "3")
    train(tmp_path / "ref", tmp_path / "ref_ckpt", "2,1,1", *args, "--optims", "sgd")
    killed = train(
        tmp_path / "run", tmp_path / "ckpt", "2,1,1", *args, "--optims", "sgd",
        env={"CKPT_KILL": "0:6:latest"}, check=False,
    )  # fmt: skip
    assert killed.returncode != 0
    newer = tmp_path / "ckpt" / "sgd" / "step_000000006"
    shard = sorted(newer.glob("*.safetensors"))[0]
    shard.write_bytes(shard.read_bytes()[:-8])  # truncated
    resumed = train(tmp_path / "run", tmp_path / "ckpt", "2,1,1", *args, "--optims", "sgd", "--resume")
    assert "skipping a checkpoint that does not load" in resumed.stdout and "truncated" in resumed.stdout
    assert [p.name[:24] for p in newer.parent.iterdir() if p.name.startswith(".corrupt")] == [
        ".corrupt-step_000000006-"
    ]
    a, b = dict(np.load(tmp_path / "run" / "sgd.npz")), dict(np.load(tmp_path / "ref" / "sgd.npz"))
    assert a.keys() == b.keys()
    for name in b:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)
