"""Checkpoint save/load in one process: round trips, atomicity, every corruption case, the CLI.

The multi-rank cases (DP/TP/PP resharding, killed ranks) are in test_checkpoint_mpi.py; the layout
logic they rely on (who writes which shard, TP slicing) is unit-tested here without MPI.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import safetensors.numpy
import strategies as S
from hypothesis import given
from hypothesis import strategies as st

import minidist as md
from minidist import checkpoint, nn, optim
from minidist.checkpoint import CheckpointError, atomic
from minidist.checkpoint.layout import Layout, assign_writers, local_piece, needed_shards
from minidist.data import DistributedSampler
from minidist.parallel.tensor_parallel.split import shard_index
from minidist_cli import main as cli_main


def make(seed: int = 0, hidden: int = 8, dropout: float = 0.0, optimizer: str = "adamw"):
    md.manual_seed(seed)
    layers = [nn.Linear(4, hidden, dtype=np.float64), nn.Tanh()]
    layers += [nn.Dropout(dropout)] if dropout else []
    model = nn.Sequential(*layers, nn.Linear(hidden, 3, dtype=np.float64))
    if optimizer == "sgd":
        return model, optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3)
    return model, optim.AdamW(model.parameters(), lr=0.01)


X = np.random.default_rng(1).standard_normal((6, 4))


def train(model, opt, steps: int) -> None:
    for _ in range(steps):
        opt.zero_grad()
        (model(md.tensor(X, dtype=np.float64)) ** 2).mean().backward()
        opt.step()


def params(model) -> dict[str, np.ndarray]:
    return {n: p.data.copy() for n, p in model.named_parameters()}


@pytest.mark.parametrize("optimizer", S.OPTIMIZERS)
def test_resume_is_bit_exact(tmp_path, optimizer):
    # Dropout makes the generator state matter: it must be restored for the masks to match.
    model, opt = make(dropout=0.3, optimizer=optimizer)
    train(model, opt, 3)
    checkpoint.save(tmp_path, model, opt, step=3, extra={"note": "hi"})
    train(model, opt, 2)
    reference = params(model)

    model2, opt2 = make(seed=7, dropout=0.3, optimizer=optimizer)  # other weights, then overwritten
    md.manual_seed(99)  # another generator state, restored by load
    info = checkpoint.load(tmp_path, model2, opt2)  # the root: follows 'latest'
    assert info["step"] == 3 and info["extra"] == {"note": "hi"} and not info["resharded"]
    train(model2, opt2, 2)
    for name, value in params(model2).items():
        np.testing.assert_array_equal(value, reference[name])  # bit for bit, not allclose
    assert opt2.step_count == opt.step_count


def test_layout_and_names_on_disk(tmp_path):
    model, opt = make()
    train(model, opt, 1)
    final = checkpoint.save(tmp_path, model, opt, step=12)
    assert final == tmp_path / "step_000000012"
    assert (tmp_path / "latest").read_text().strip() == "step_000000012"
    manifest = json.loads((final / "manifest.json").read_text())
    assert manifest["format_version"] == 2 and manifest["mesh"]["world_size"] == 1
    assert manifest["tensors"]["model/0.weight"]["global_shape"] == [8, 4]
    assert manifest["optimizer"]["scalars"]["0.weight"] == {"step": 1}
    assert len(manifest["ranks"]) == 1 and "state" in manifest["ranks"][0]["rng"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp")]
    # Never pickle: shard files are real safetensors files (read here by the safetensors library).
    for name in manifest["files"]:
        arrays = safetensors.numpy.load_file(final / name)
        np.testing.assert_array_equal(arrays["model/0.weight"], model[0].weight.data)
        np.testing.assert_array_equal(arrays["optim/0.weight/exp_avg"], opt.state[0]["exp_avg"])


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_every_file_of_a_checkpoint_has_the_mode_open_gives(tmp_path, umask):
    # The shards were 0o600 (the safetensors library's temporary file) while manifest.json and latest
    # were 0o644: another account could list a checkpoint but not load it.
    model, opt = make()
    previous = os.umask(umask)
    try:
        folder = checkpoint.save(tmp_path, model, opt, step=1)
    finally:
        os.umask(previous)
    files = [tmp_path / "latest", *folder.iterdir()]
    assert any(f.suffix == ".safetensors" for f in files)
    modes = {f.name: oct(os.stat(f).st_mode & 0o777) for f in files}
    assert modes == dict.fromkeys(modes, oct(0o666 & ~umask)), modes


def test_keep_last_and_no_overwrite(tmp_path):
    model, opt = make()
    for step in (1, 2, 3):
        train(model, opt, 1)
        checkpoint.save(tmp_path, model, opt, step=step, keep_last=2)
    assert [p.name for _, p in atomic.list_checkpoints(tmp_path)] == ["step_000000002", "step_000000003"]
    before = (tmp_path / "step_000000003" / "manifest.json").read_bytes()
    with pytest.raises(CheckpointError, match="already exists"):
        checkpoint.save(tmp_path, model, opt, step=3)
    assert (tmp_path / "step_000000003" / "manifest.json").read_bytes() == before


@pytest.mark.parametrize("where", ["write_shard", "write_durable", "commit_dir", "write_latest"])
def test_crash_during_save_leaves_previous_loadable(tmp_path, monkeypatch, where):
    model, opt = make()
    train(model, opt, 1)
    checkpoint.save(tmp_path, model, opt, step=1)
    saved = params(model)
    train(model, opt, 1)

    class Crash(BaseException):  # like a kill: not an OSError, so save() cannot clean up
        pass

    def crash(*args, **kwargs):
        raise Crash

    monkeypatch.setattr(atomic, where, crash)
    with pytest.raises(Crash):
        checkpoint.save(tmp_path, model, opt, step=2, keep_last=1)
    monkeypatch.undo()
    model2, opt2 = make(seed=3)
    info = checkpoint.load_latest(tmp_path, model2, opt2)
    # Killed after the rename, before 'latest' was replaced: step 2 is complete, and the newest.
    assert info["step"] == (2 if where == "write_latest" else 1)
    if where != "write_latest":
        for name, value in params(model2).items():
            np.testing.assert_array_equal(value, saved[name])
    # The next save cleans the crashed temporary folder (step_2 may exist if only 'latest' failed).
    checkpoint.save(tmp_path, model, opt, step=3)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp")]


def corrupt_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))


def shard(folder: Path) -> Path:
    return next(folder.glob("*.safetensors"))


CORRUPTIONS = {
    "flipped byte": (lambda f: corrupt_byte(shard(f)), "checksum"),
    "truncated": (lambda f: shard(f).write_bytes(shard(f).read_bytes()[:-10]), "truncated"),
    "missing shard": (lambda f: shard(f).unlink(), "missing"),
    "missing manifest": (lambda f: (f / "manifest.json").unlink(), "manifest"),
    "manifest not json": (lambda f: (f / "manifest.json").write_text('{"format": '), "JSON"),
    "newer format": (
        lambda f: (f / "manifest.json").write_text(
            json.dumps({**json.loads((f / "manifest.json").read_text()), "format_version": 99})
        ),
        "newer",
    ),
}


@pytest.mark.parametrize("case", sorted(CORRUPTIONS))
def test_corruption_raises_and_fallback_finds_older(tmp_path, case):
    damage, message = CORRUPTIONS[case]
    model, opt = make()
    train(model, opt, 1)
    checkpoint.save(tmp_path, model, opt, step=1)
    good = params(model)
    train(model, opt, 1)
    bad = checkpoint.save(tmp_path, model, opt, step=2)
    damage(bad)
    listing = sorted(p.name for p in bad.iterdir())

    model2, opt2 = make(seed=5)
    untouched = params(model2)
    with pytest.raises(CheckpointError, match=message) as err:
        checkpoint.load(tmp_path, model2, opt2)
    assert "step_000000002" in str(err.value)  # names the file or folder at fault
    for name, value in params(model2).items():  # nothing was changed
        np.testing.assert_array_equal(value, untouched[name])
    info = checkpoint.load_latest(tmp_path, model2, opt2, fallback=True)
    assert info["step"] == 1
    for name, value in params(model2).items():
        np.testing.assert_array_equal(value, good[name])
    assert sorted(p.name for p in bad.iterdir()) == listing  # nothing deleted or rewritten
    assert cli_main(["checkpoint", "info", str(bad), "--verify"]) == 1


def test_incompatible_model_and_optimizer(tmp_path):
    model, opt = make()
    train(model, opt, 1)
    checkpoint.save(tmp_path, model, opt, step=1)
    wider, wider_opt = make(hidden=9)
    with pytest.raises(CheckpointError, match="incompatible model.*0.weight"):
        checkpoint.load(tmp_path, wider, wider_opt)
    deeper = nn.Sequential(nn.Linear(4, 8, dtype=np.float64), nn.Tanh(), nn.Linear(8, 3, dtype=np.float64))
    deeper.extra = nn.Linear(3, 3, dtype=np.float64)
    with pytest.raises(CheckpointError, match="no parameter 'extra.weight'"):
        checkpoint.load(tmp_path, deeper)
    sgd_model, sgd = make(optimizer="sgd")
    with pytest.raises(CheckpointError, match="AdamW state, but the optimizer here is SGD"):
        checkpoint.load(tmp_path, sgd_model, sgd)
    with pytest.raises(CheckpointError, match="no checkpoint here"):
        checkpoint.load(tmp_path / "nothing", model, opt)
    assert checkpoint.load_latest(tmp_path / "nothing", model, opt, missing_ok=True) is None


def test_cli_info(tmp_path, capsys):
    model, opt = make()
    train(model, opt, 1)
    checkpoint.save(tmp_path, model, opt, step=4, extra={"lr": 0.01})
    assert cli_main(["checkpoint", "info", str(tmp_path), "--verify"]) == 0
    out = capsys.readouterr().out
    assert "step_000000004" in out and "model/0.weight" in out and "8x4" in out and "AdamW" in out
    assert "all files match" in out


def test_sampler_state_roundtrip(tmp_path):
    sampler = DistributedSampler(40, num_replicas=1, rank=0, batch_size=4, seed=3)
    sampler.set_epoch(2)
    it = iter(sampler)
    first = [next(it) for _ in range(8)]
    model, opt = make()
    checkpoint.save(tmp_path, model, opt, step=2, sampler=sampler)
    rest = list(it)
    resumed = DistributedSampler(40, num_replicas=1, rank=0, batch_size=4, seed=3)
    checkpoint.load(tmp_path, model, opt, sampler=resumed)
    assert (resumed.epoch, resumed.position) == (2, 8)
    assert list(resumed) == rest and first + rest == sampler.indices().tolist()
    # Global-batch mode carries the position to another number of replicas (2 global batches done).
    two = DistributedSampler(40, num_replicas=2, rank=1, batch_size=4, seed=3)
    two.load_state_dict(sampler.state_dict() | {"position": 8})
    assert two.position == 4


# -- the layout logic of the multi-rank cases ------------------------------------------------------
@given(
    mesh=S.meshes(max_tp=3, min_pp=2, max_pp=2), sizes=st.lists(st.integers(1, 100), min_size=1, max_size=8)
)
def test_every_shard_written_once_by_a_holder(mesh, sizes):
    dp, tp, pp = mesh
    items = [(f"t{i}", n, None if i % 2 else 0) for i, n in enumerate(sizes)]
    expected = {(k, None) if d is None else (k, t) for k, _, d in items for t in range(tp)}
    for pp_rank in range(pp):
        writers = assign_writers(items, Layout(0, dp * tp * pp, dp, tp, pp, 0, 0, pp_rank))
        assert set(writers) == expected
        for (_key, t), rank in writers.items():
            assert rank // (dp * tp) == pp_rank  # a rank of this stage
            assert t is None or rank % tp == t  # a tp-sharded piece by a rank holding that piece
        # Balanced: no writer exceeds the ideal share by more than the largest item.
        loads = {}
        for (key, _t), rank in writers.items():
            loads[rank] = loads.get(rank, 0) + dict((k, n) for k, n, _ in items)[key]
        assert max(loads.values()) <= sum(n * (tp if int(k[1:]) % 2 == 0 else 1) for k, n, _ in items) / (
            dp * tp
        ) + max(sizes)


@given(
    old_tp=S.tp_sizes, new_tp=S.tp_sizes, old_stride=st.sampled_from([1, 3]), stride=st.sampled_from([1, 3]),
    rows=st.sampled_from([6, 9, 12]), dims=st.sampled_from([0, 1, None]),
)  # fmt: skip
def test_reshard_cuts_the_global_tensor_by_the_split_rule(old_tp, new_tp, old_stride, stride, rows, dims):
    # Uneven (9 rows over 2: 5 + 4) and strided ([q; k; v] blocks) pieces, saved on one tp and loaded
    # on another: every rank gets split.py's piece of the full tensor, whatever the two splits.
    full = np.arange(rows * 4, dtype=np.float64).reshape(rows, 4)
    shards = [full[shard_index(full.shape, 0, old_tp, t, old_stride)] for t in range(old_tp)]
    entry = {
        "tp_dim": 0,
        "tp_stride": old_stride,
        "global_shape": [rows, 4],
        "shards": [{"file": f"f{t}", "tp_rank": t, "shape": list(s.shape)} for t, s in enumerate(shards)],
    }
    new_dim = dims
    new_stride = stride if new_dim == 0 else 1
    for tp_rank in range(new_tp):
        records = needed_shards(entry, new_tp, tp_rank, new_dim, new_stride)
        if new_dim == 0 and new_tp == old_tp and new_stride == old_stride:  # unchanged: own shard only
            assert [r["tp_rank"] for r in records] == [tp_rank]
        arrays = [shards[r["tp_rank"]] for r in records]
        got = local_piece("w", entry, arrays, new_tp, tp_rank, new_dim, new_stride)
        want = (
            full if new_dim is None else full[shard_index(full.shape, new_dim, new_tp, tp_rank, new_stride)]
        )
        np.testing.assert_array_equal(got, want)
    with pytest.raises(CheckpointError, match="cannot be cut into"):  # 4 columns are not 3 equal blocks
        local_piece("w", entry, shards, 2, 0, 1, 3)
    if old_tp > 1:  # a piece of the wrong size: the manifest does not describe these arrays
        with pytest.raises(CheckpointError, match="do not assemble"):
            local_piece("w", entry, [np.zeros((len(shards[0]) + 1, 4)), *shards[1:]], 1, 0, None)


def test_atomic_helpers_leave_no_partial_files(tmp_path):
    atomic.write_latest(tmp_path, "step_000000001")
    atomic.write_latest(tmp_path, "step_000000002")
    assert atomic.read_latest(tmp_path) == "step_000000002"
    assert sorted(os.listdir(tmp_path)) == ["latest"]


def test_a_checkpoint_of_the_naive_data_parallel_wrapper_resumes_under_ddp(tmp_path):
    # Both wrappers hold the model as .module: a checkpoint stores the model's own names, so training
    # moves from the lesson's wrapper to the real one (one rank here; the names do not depend on it).
    from minidist.parallel.data_parallel import DataParallelNaive, DistributedDataParallel

    model, opt = make(seed=3)
    naive = DataParallelNaive(model)
    train(naive, opt, 2)
    checkpoint.save(tmp_path, naive, opt, step=2)
    other, other_opt = make(seed=4)
    ddp = DistributedDataParallel(other)
    assert checkpoint.load(tmp_path, ddp, other_opt)["step"] == 2
    for name, value in params(model).items():
        np.testing.assert_array_equal(params(other)[name], value, err_msg=name)
