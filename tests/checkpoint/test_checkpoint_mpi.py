"""Checkpoints across real ranks: killed ranks, bit-exact resume, resharding to other meshes, errors.

Every run trains the float64 MLP of ``workers/checkpoint/ckpt_train.py`` with SGD (momentum) and AdamW in one
launch. "Bit-exact" compares with ``assert_array_equal``: the same layout resumes the very same
sequence of floating-point operations (restored parameters, optimizer state, sampler position and
both RNG streams). After resharding, reductions run in another order (other dp/tp group sizes), so
parameters agree to rounding only: after a few steps in float64 that is ~1e-14 relative; rtol 1e-9
leaves room for AdamW's m / sqrt(v), which amplifies rounding where v is tiny.

Starting 4 or 8 Python ranks on 2 cores costs more than training this model, so the runs that no test
kills are made by the module fixture ``runs`` (the table ``RUNS``): one launch per world size, each
rank running its runs one after another (``ckpt_train.py ... --then ...``); the tests compare them.
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


def spec(out: Path, ckpt: Path, mesh: str, *extra: str | Path) -> list[str]:
    """One run's arguments for ``ckpt_train.py``."""
    out.mkdir(parents=True, exist_ok=True)
    return [str(out), str(ckpt), "--mesh", mesh, *map(str, extra)]


def train_in_one_launch(specs: list[list[str]]) -> None:
    """Several runs one after another in ONE launch; their meshes all have the same size."""
    (n,) = {mesh_size(s[3]) for s in specs}
    args = [a for i, s in enumerate(specs) for a in ["--then"] * (i > 0) + s]
    run_mpi(n, "checkpoint/ckpt_train.py", *args, timeout=120 + 30 * len(specs))


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


SAVE = ("--steps", str(STEPS), "--every", str(EVERY))  # an uninterrupted run: checkpoints at step 4
DROPOUT = ("--dropout", "0.3")  # TP dropout draws from the TP RNG tracker: its state must be restored
KILL_ARGS = ("--steps", "8", "--every", "3", "--dropout", "0.3")  # dropout: RNG state must be restored
DAMAGED_ARGS = ("--steps", "8", "--every", "3", "--optims", "sgd")
# name: (mesh, flags, the run whose checkpoint at step 4 it resumes from). Each run writes its final
# parameters to <name>/out and its checkpoints to <name>/ckpt; the tests below say which they compare.
RUNS: dict[str, tuple[str, tuple[str, ...], str | None]] = {
    # 8 ranks (launched first: a 4-rank run resumes from "3d")
    "3d": ("2,2,2", SAVE, None),
    "3d dropout": ("2,2,2", SAVE + DROPOUT, None),
    "3d dropout resumed": ("2,2,2", ("--steps", str(STEPS), *DROPOUT), "3d dropout"),
    # 4 ranks
    "dp4": ("4,1,1", SAVE, None),  # the uninterrupted dp=4 run, no dropout
    "dp2xtp2 dropout": ("2,2,1", SAVE + DROPOUT, None),
    "dp2xtp2 dropout resumed": ("2,2,1", ("--steps", str(STEPS), *DROPOUT), "dp2xtp2 dropout"),
    "dp2xpp2 dropout": ("2,1,2", SAVE + DROPOUT, None),
    "dp2xpp2 dropout resumed": ("2,1,2", ("--steps", str(STEPS), *DROPOUT), "dp2xpp2 dropout"),
    "zero": ("4,1,1", (*SAVE, "--zero"), None),
    "zero resumed": ("4,1,1", ("--steps", str(STEPS), "--zero"), "zero"),
    "2,2,1 from dp4": ("2,2,1", ("--steps", str(STEPS)), "dp4"),
    "2,1,2 from dp4": ("2,1,2", ("--steps", str(STEPS)), "dp4"),
    "1,2,2 from dp4": ("1,2,2", ("--steps", str(STEPS)), "dp4"),
    "dp4 from 3d": ("4,1,1", ("--steps", str(STEPS)), "3d"),
    # 2 ranks and 1
    "2,1,1 from dp4": ("2,1,1", ("--steps", str(STEPS)), "dp4"),
    "zero resumed on 2 ranks": ("2,1,1", ("--steps", str(STEPS), "--zero"), "zero"),
    "damaged reference": ("2,1,1", DAMAGED_ARGS, None),
    "killed reference": ("2,1,1", KILL_ARGS, None),
    "1,1,1 from dp4": ("1,1,1", ("--steps", str(STEPS)), "dp4"),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """Every run of ``RUNS``, in one launch per world size (largest first); name -> its folder."""
    root = tmp_path_factory.mktemp("runs")
    folders = {name: root / name.replace(" ", "_").replace(",", "") for name in RUNS}
    done: set[str] = set()
    for size in sorted({mesh_size(mesh) for mesh, _, _ in RUNS.values()}, reverse=True):
        specs = []
        for name, (mesh, flags, source) in RUNS.items():
            if mesh_size(mesh) != size:
                continue
            assert source is None or source in done, f"{name!r} resumes from {source!r}, not run before it"
            resume = () if source is None else ("--resume-from", folders[source] / "ckpt")
            specs.append(spec(folders[name] / "out", folders[name] / "ckpt", mesh, *flags, *resume))
            done.add(name)
        train_in_one_launch(specs)
    return folders


# -- killed ranks ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kill, latest_after_kill",
    [("1:7:train", 6), ("1:6:save", 3), ("0:6:commit", 3), ("0:6:latest", 3)],
    ids=["mid-training", "mid-save", "before-commit", "after-rename-before-latest"],
)
def test_killed_rank_then_resume_is_bit_exact(tmp_path, runs, kill, latest_after_kill):
    # On 2 ranks (it was 4): rank 0 or another rank dies at each point of a save, and the survivor is left
    # waiting, as with 4; each kill costs two launches: 10-12 s of CPU on 4 ranks, 4.4 on 2.
    args = KILL_ARGS
    killed = train(tmp_path / "run", tmp_path / "ckpt", "2,1,1", *args, env={"CKPT_KILL": kill}, check=False)
    assert killed.returncode != 0, "the SIGKILLed job should have failed"
    for o in OPTIMS[:1]:  # the kill hits the first optimizer's run
        latest = (tmp_path / "ckpt" / o / "latest").read_text().strip()
        assert latest == f"step_{latest_after_kill:09d}"
    if kill.endswith("latest"):  # killed before 'latest' moved: the newer folder is complete, 'latest' lags
        assert (tmp_path / "ckpt" / "sgd" / "step_000000006" / "manifest.json").exists()
    resumed = train(tmp_path / "run", tmp_path / "ckpt", "2,1,1", *args, "--resume")
    if kill.endswith("latest"):  # resumed from step 6, not 3 (which would fail to save step 6 again)
        assert "'latest' names step_000000003 but step_000000006 is newer" in resumed.stdout
    assert_same(final(tmp_path / "run"), final(runs["killed reference"] / "out"), exact=True)
    leftovers = [p.name for p in (tmp_path / "ckpt" / "sgd").iterdir() if p.name.startswith(".tmp")]
    assert leftovers == []  # the crashed save's temporary folder was cleaned by a later save


# -- same layout: bit-exact -----------------------------------------------------------------------------
@pytest.mark.parametrize("mesh", ["dp2xtp2", "dp2xpp2", "3d"])
def test_resume_on_the_same_mesh_is_bit_exact(runs, mesh):
    ref, resumed = runs[f"{mesh} dropout"], runs[f"{mesh} dropout resumed"]
    assert_same(final(resumed / "out"), final(ref / "out"), exact=True)


# -- another layout: allclose ---------------------------------------------------------------------------
@pytest.mark.parametrize("mesh", ["2,1,1", "1,1,1", "2,2,1", "2,1,2", "1,2,2"])
def test_resume_on_another_mesh_matches(runs, mesh):
    saved = runs["dp4"] / "ckpt"
    latest = {o: (saved / o / "latest").read_text().strip() for o in OPTIMS}
    assert set(latest.values()) == {f"step_{EVERY:09d}"}
    assert_same(final(runs[f"{mesh} from dp4"] / "out"), final(runs["dp4"] / "out"), exact=False)


def test_3d_checkpoint_resumes_on_data_parallel_only(runs):
    assert_same(final(runs["dp4 from 3d"] / "out"), final(runs["3d"] / "out"), exact=False)
    assert_same(final(runs["dp4 from 3d"] / "out"), final(runs["dp4"] / "out"), exact=False)


def test_zero_checkpoint_resumes_exactly_and_at_another_size(runs):
    ref = final(runs["zero"] / "out")
    assert_same(final(runs["zero resumed"] / "out"), ref, exact=True)
    assert_same(final(runs["zero resumed on 2 ranks"] / "out"), ref, exact=False)


# -- errors on every rank -------------------------------------------------------------------------------
def test_corrupt_shard_raises_on_every_rank(tmp_path, runs):
    broken = tmp_path / "ckpt"
    shutil.copytree(runs["dp4"] / "ckpt", broken)
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


# -- the ordinary loop resumes bit-exactly at every position of an epoch ----------------------------------
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


MODES = ("strided", "global")


@pytest.fixture(scope="module")
def boundary_runs(tmp_path_factory) -> Path:
    """Both modes of ``ckpt_boundary_reshard.py``: saved on 2 ranks (one launch), loaded on 3 (another)."""
    tmp = tmp_path_factory.mktemp("boundary")
    for ranks, out in ((2, "first"), (3, "second")):
        args = []
        for mode in MODES:
            (tmp / mode / out).mkdir(parents=True)
            args += [mode, tmp / mode / "ckpt", tmp / mode / out]
        run_mpi(ranks, "checkpoint/ckpt_boundary_reshard.py", *args, timeout=120)
    return tmp


@pytest.mark.parametrize("mode", MODES)
def test_a_save_between_epochs_resumes_on_another_number_of_ranks_at_the_next_epoch(boundary_runs, mode):
    """Saved after epoch 0's inner loop on 2 ranks, loaded on 3 (in global-batch mode with another
    global batch size too): the finished epoch stays finished, and epoch 1 reads every sample once.
    A position saved mid-epoch cannot carry over in these cases, but a finished epoch can, as the
    error for the mid-epoch case itself advises ("resume at an epoch boundary")."""
    first, second = boundary_runs / mode / "first", boundary_runs / mode / "second"
    saved = [json.loads((first / f"rank{r}.json").read_text()) for r in range(2)]
    assert all(s["error"] is None for s in saved), saved
    assert sorted(saved[0]["seen"]["0"] + saved[1]["seen"]["0"]) == list(range(20))
    resumed = [json.loads((second / f"rank{r}.json").read_text()) for r in range(3)]
    for r in resumed:
        assert r["error"] is None, r["error"]
        assert set(r["seen"]) == {"1"}, "epoch 0 was finished when saved: nothing of it is read again"
    assert sorted(sum((r["seen"]["1"] for r in resumed), [])) == list(range(20))


def test_a_damaged_folder_newer_than_latest_resumes_from_latest_without_fallback(tmp_path, runs):
    """Killed after step 6's rename, before 'latest' moved on from step 3; then step 6's folder is damaged
    (a disk fault): ``load_latest`` without ``fallback`` resumes from step 3, which 'latest' still
    names, instead of failing on step 6 at every restart. The run saves step 6 anew (the damaged
    folder is moved aside) and ends bit-exact with the uninterrupted run."""
    args = DAMAGED_ARGS
    killed = train(tmp_path / "run", tmp_path / "ckpt", "2,1,1", *args, env={"CKPT_KILL": "0:6:latest"},
                   check=False)  # fmt: skip
    assert killed.returncode != 0
    newer = tmp_path / "ckpt" / "sgd" / "step_000000006"
    shard = sorted(newer.glob("*.safetensors"))[0]
    shard.write_bytes(shard.read_bytes()[:-8])  # truncated
    resumed = train(tmp_path / "run", tmp_path / "ckpt", "2,1,1", *args, "--resume")
    assert "skipping a checkpoint that does not load" in resumed.stdout and "truncated" in resumed.stdout
    assert [p.name[:24] for p in newer.parent.iterdir() if p.name.startswith(".corrupt")] == [
        ".corrupt-step_000000006-"
    ]
    a, b = (
        dict(np.load(tmp_path / "run" / "sgd.npz")),
        dict(np.load(runs["damaged reference"] / "out" / "sgd.npz")),
    )
    assert a.keys() == b.keys()
    for name in b:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)
