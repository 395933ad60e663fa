"""Checkpoints against hostile input: damaged or hand-edited files, bad arguments, mismatched ranks.

Single-process cases here; ``test_multi_rank_misuse_raises_on_every_rank`` runs the cases that need
two ranks (different arguments per rank) in one launch of ``workers/checkpoint/ckpt_errors.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mpi_utils import run_mpi

from minidist import checkpoint
from minidist.checkpoint import CheckpointError, atomic
from minidist.data import DistributedSampler
from minidist_cli import main as cli_main
from tests.checkpoint.test_checkpoint import make, params, train


def save_three(root: Path, every: int = 4) -> dict[int, dict[str, np.ndarray]]:
    """Save steps every, 2*every, 3*every of one run (AdamW); the parameters at each."""
    model, opt = make()
    saved = {}
    for step in (every, 2 * every, 3 * every):
        train(model, opt, every)
        checkpoint.save(root, model, opt, step=step, keep_last=3)
        saved[step] = params(model)
    return saved


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# -- finding 2: a resumed run must get past a damaged checkpoint of a step it retrains ----------------
def test_resume_past_a_truncated_checkpoint_moves_it_aside_and_saves_anew(tmp_path):
    saved = save_three(tmp_path)
    bad = tmp_path / "step_000000012"
    shard = next(bad.glob("*.safetensors"))
    shard.write_bytes(shard.read_bytes()[:100])  # `truncate -s 100`
    damaged = tree(bad)

    model, opt = make(seed=9)
    info = checkpoint.load_latest(tmp_path, model, opt, fallback=True)  # skips 12, loads 8
    assert info["step"] == 8 and tree(bad) == damaged  # loading never changes the files
    train(model, opt, 4)  # retrain steps 9..12: the same arithmetic as the first run
    with pytest.warns(UserWarning, match=r"step_000000012 failed verification.*moved aside to .*\.corrupt-"):
        checkpoint.save(tmp_path, model, opt, step=12, keep_last=3)
    aside = [p for p in tmp_path.iterdir() if p.name.startswith(".corrupt-step_000000012-")]
    assert len(aside) == 1 and tree(aside[0]) == damaged  # kept byte for byte, not deleted
    assert atomic.read_latest(tmp_path) == "step_000000012"
    assert [s for s, _ in atomic.list_checkpoints(tmp_path)] == [4, 8, 12]  # prune ignores .corrupt-

    fresh, fresh_opt = make(seed=5)
    assert checkpoint.load_latest(tmp_path, fresh, fresh_opt)["step"] == 12
    for name, value in params(fresh).items():
        np.testing.assert_array_equal(value, saved[12][name])  # the retrained step 12 is the lost one
    # A checkpoint that verifies is still never overwritten, and says so.
    with pytest.raises(CheckpointError, match="already exists and verifies"):
        checkpoint.save(tmp_path, fresh, fresh_opt, step=12)


def test_save_never_moves_aside_a_checkpoint_of_a_newer_format(tmp_path):
    model, opt = make()
    final = checkpoint.save(tmp_path, model, opt, step=1)
    manifest = json.loads((final / "manifest.json").read_text())
    (final / "manifest.json").write_text(json.dumps({**manifest, "format_version": 99}))
    before = tree(tmp_path)
    with pytest.raises(CheckpointError, match="newer minidist"):
        checkpoint.save(tmp_path, model, opt, step=1)
    assert tree(tmp_path) == before


# -- findings 3, 12, 13: every damaged or malformed input is a CheckpointError, and fallback steps back --
def non_utf8_manifest(f: Path) -> None:
    (f / "manifest.json").write_bytes(b"\xbf\xff" + (f / "manifest.json").read_bytes())


def edit(change):
    def apply(f: Path) -> None:
        manifest = json.loads((f / "manifest.json").read_text())
        change(manifest)
        (f / "manifest.json").write_text(json.dumps(manifest))

    return apply


def first_tensor(m: dict) -> dict:
    return m["tensors"]["model/0.weight"]


MALFORMED = {
    "not utf-8": (non_utf8_manifest, "not UTF-8"),
    "tensors a list": (edit(lambda m: m.update(tensors=[])), "'tensors' must be an object"),
    "no shards": (edit(lambda m: first_tensor(m).update(shards=[])), "non-empty list"),
    "no ranks": (edit(lambda m: m.update(ranks=[])), "'ranks' must be a list of 1"),
    "shard shape": (edit(lambda m: first_tensor(m)["shards"][0].update(shape=[8, 4, 9])), "must be 2 ints"),
    "global shape": (edit(lambda m: first_tensor(m).update(global_shape=[8, 5])), "one shard of the global"),
    "version a string": (edit(lambda m: m.update(format_version="1")), "must be an int >= 1, got '1'"),
    "step a string": (edit(lambda m: m.update(step="x")), "'step' must be an int >= 0, got 'x'"),
    # a resumed run would otherwise count steps (and draw batches) from the edited number
    "step edited": (edit(lambda m: m.update(step=7)), "'step' is 7, but the folder is step_000000003"),
    "file name escapes": (edit(lambda m: m.update(files={"../x": {}})), "plain file name"),
    "dtype": (edit(lambda m: first_tensor(m).update(dtype="complex128")), "int/float dtype"),
    "rng state": (edit(lambda m: m["ranks"][0]["rng"].update(state="zzz")), "malformed random-gen"),
    "lr a string": (edit(lambda m: m["optimizer"]["defaults"].update(lr="x")), "numbers"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_manifest_is_a_checkpoint_error_and_fallback_steps_back(tmp_path, case):
    damage, message = MALFORMED[case]
    saved = save_three(tmp_path, every=1)
    damage(tmp_path / "step_000000003")
    model, opt = make(seed=5)
    untouched = params(model)
    with pytest.raises(CheckpointError, match=message):
        checkpoint.load(tmp_path, model, opt)
    for name, value in params(model).items():
        np.testing.assert_array_equal(value, untouched[name])  # nothing changed before the error
    assert checkpoint.load_latest(tmp_path, model, opt, fallback=True)["step"] == 2
    for name, value in params(model).items():
        np.testing.assert_array_equal(value, saved[2][name])
    assert cli_main(["checkpoint", "info", str(tmp_path / "step_000000003")]) == 1


def test_file_edited_consistently_is_caught_against_the_file(tmp_path):
    """A manifest edited to a shape the file does not hold (checksums still match): caught before use."""
    model, _ = make()
    final = checkpoint.save(tmp_path, model, step=1)

    def transpose(m):
        first_tensor(m).update(global_shape=[4, 8])
        first_tensor(m)["shards"][0]["shape"] = [4, 8]

    edit(transpose)(final)
    other, _ = make()
    other[0].weight.data = np.zeros((4, 8))  # a model that matches the edited manifest
    with pytest.raises(
        CheckpointError, match=r"'model/0.weight' is \[8, 4\] float64 in the file but \[4, 8\]"
    ):
        checkpoint.load(tmp_path, other)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 10**20) | st.floats(allow_nan=False) | st.text(max_size=3),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=6,
)


def paths(node, prefix=()):
    """Every (path) to a value inside a JSON tree."""
    yield prefix
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else []
    for k, v in items:
        yield from paths(v, (*prefix, k))


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_any_edit_of_the_manifest_is_refused_or_harmless(tmp_path_factory, data):
    """Replace or delete any one field: load raises CheckpointError, or loads the saved numbers exactly."""
    root = tmp_path_factory.mktemp("ck")
    model, opt = make()
    train(model, opt, 1)
    sampler = DistributedSampler(12, num_replicas=1, rank=0, batch_size=4, seed=1)
    final = checkpoint.save(root, model, opt, step=1, sampler=sampler)
    saved = params(model)
    manifest = json.loads((final / "manifest.json").read_text())
    where = data.draw(st.sampled_from(sorted((p for p in paths(manifest) if p), key=str)), label="field")
    parent = manifest
    for k in where[:-1]:
        parent = parent[k]
    if data.draw(st.booleans(), label="delete") and isinstance(parent, dict):
        del parent[where[-1]]
    else:
        parent[where[-1]] = data.draw(JSON, label="value")
    (final / "manifest.json").write_text(json.dumps(manifest))
    other, other_opt = make(seed=4)
    try:
        checkpoint.load(root, other, other_opt, sampler=DistributedSampler(12, 1, 0, seed=1, batch_size=4))
    except CheckpointError:
        return
    for name, value in params(other).items():  # the numbers come from checksummed files
        np.testing.assert_array_equal(value, saved[name])


def test_non_utf8_latest_and_file_paths(tmp_path):
    save_three(tmp_path, every=1)
    (tmp_path / "latest").write_bytes(b"step_000000003\xff\n")
    model, opt = make()
    with pytest.raises(CheckpointError, match="'latest' pointer is not UTF-8"):
        checkpoint.load(tmp_path, model, opt)
    assert checkpoint.load_latest(tmp_path, model, opt, fallback=True)["step"] == 3
    (tmp_path / "latest").write_text("../elsewhere\n")
    with pytest.raises(CheckpointError, match="not a checkpoint folder"):
        checkpoint.load(tmp_path, model, opt)
    assert cli_main(["checkpoint", "info", str(tmp_path)]) == 1
    a_file = tmp_path / "step_000000003" / "manifest.json"
    with pytest.raises(CheckpointError, match="this is a file"):
        checkpoint.load(a_file, model, opt)
    with pytest.raises(CheckpointError, match="this is a file"):
        checkpoint.load_latest(a_file, model, opt, fallback=True, missing_ok=True)
    assert cli_main(["checkpoint", "info", str(a_file)]) == 1


# -- findings 8, 9: the sampler's seed, and keep_last=True ---------------------------------------------
def test_resume_with_another_seed_or_data_is_refused_before_anything_changes(tmp_path):
    sampler = DistributedSampler(40, num_replicas=1, rank=0, batch_size=4, seed=3)
    next(iter(sampler))
    sampler.position = 4  # mid-epoch
    model, opt = make()
    checkpoint.save(tmp_path, model, opt, step=1, sampler=sampler)
    for kwargs, field in (
        ({"seed": 4}, "seed=3.*seed=4"),
        ({"shuffle": False}, "shuffle"),
        ({}, "dataset_len"),
    ):
        other = DistributedSampler(41 if not kwargs else 40, 1, 0, batch_size=4, **({"seed": 3} | kwargs))
        fresh, fresh_opt = make(seed=8)
        untouched = params(fresh)
        with pytest.raises(CheckpointError, match=field):
            checkpoint.load(tmp_path, fresh, fresh_opt, sampler=other)
        assert other.position == 0 and all(np.array_equal(v, untouched[n]) for n, v in params(fresh).items())
    with pytest.raises(ValueError, match="seed=3 but this DistributedSampler has seed=5"):
        DistributedSampler(40, 1, 0, batch_size=4, seed=5).load_state_dict(sampler.state_dict())
    old_format = {
        k: v for k, v in sampler.state_dict().items() if k not in ("seed", "shuffle", "dataset_len")
    }
    DistributedSampler(40, 1, 0, batch_size=4, seed=5).load_state_dict(old_format)  # not recorded: trusted


def test_keep_last_rejects_bools_and_accepts_numpy_ints(tmp_path):
    model, opt = make()
    for step in (1, 2, 3):
        checkpoint.save(tmp_path, model, opt, step=step)
    with pytest.raises(ValueError, match="keep_last must be None or an int >= 1, got True"):
        checkpoint.save(tmp_path, model, opt, step=4, keep_last=True)
    assert len(atomic.list_checkpoints(tmp_path)) == 3  # nothing pruned
    checkpoint.save(tmp_path, model, opt, step=4, keep_last=np.int64(2))
    assert [s for s, _ in atomic.list_checkpoints(tmp_path)] == [3, 4]


# -- findings 6, 7, 10 and 2 across real ranks ---------------------------------------------------------
@pytest.mark.mpi
def test_multi_rank_misuse_raises_on_every_rank(tmp_path):
    run_mpi(2, "checkpoint/ckpt_errors.py", tmp_path, timeout=120)
    seen = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    expected = {
        "step differs": ("ValueError", "different values: step (5 on rank 0; 6 on rank 1)"),
        "bad step on rank 1": ("TypeError", "step must be an int >= 0, got -1"),
        "keep_last 0 on rank 1": ("ValueError", "keep_last must be None or an int >= 1, got 0"),
        "directory differs (save)": ("CheckpointError", "does not see the folder"),
        "disk full on rank 1": ("CheckpointError", "writing this rank's shard failed (SafetensorError: I/O"),
        "folder differs (load)": ("CheckpointError", "resolved different checkpoints: folder"),
        "directory differs (load_latest)": ("ValueError", "different values: directory"),
        "manifest edited to another shape": ("CheckpointError", "in the file but [4, 8]"),
        "sampler seed differs on rank 1": (
            "CheckpointError",
            "seed=0 but this DistributedSampler has seed=1",
        ),
    }
    for case, (kind, words) in expected.items():
        for r in range(2):
            assert seen[r][case][0] == kind and words in seen[r][case][1], (r, case, seen[r][case])
    for r in range(2):
        assert seen[r]["still loads"] == 1  # the previous checkpoint, on every rank
        assert seen[r]["nothing written"] == [] and seen[r]["warned"] and seen[r]["resumed step"] == 3
        assert seen[r]["moved aside"].startswith(".corrupt-step_000000003-")
    assert seen[0]["after disk full"] == ["latest", "step_000000001"]  # rank 0 removed the temporary folder
    assert seen[0]["left in mine0"] == []  # rank 0 removed its temporary folder (rank 1 may look too early)


# -- every failure inside a save is a CheckpointError on every rank -----------------------------------------
@pytest.mark.mpi
@pytest.mark.parametrize("mode", ["sync", "async"])  # async: the failures happen on the save's thread
def test_a_loop_that_catches_save_errors_carries_on(tmp_path, mode):
    """File-size limits (shard on rank 1, manifest on rank 0), a full disk writing 'latest', an fsync
    error after the rename, a sampler state that is not JSON, a failing keep_last deletion, an
    optimizer over another model on one rank: each is
    the same CheckpointError on both ranks, naming the rank, the file and the cause; nothing
    half-written is left; the loop's next DDP step and save work (no rank waits forever)."""
    run_mpi(2, "checkpoint/ckpt_save_failures.py", tmp_path, mode, timeout=120)
    seen = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    expected = {
        "2": ("rank 1 of the world", "rank00001.safetensors", "writing this rank's shard failed"),
        "3": ("rank 0 of the world", "manifest.json", "writing the manifest failed (OSError: [Errno 27]"),
        "4": ("rank 0 of the world", "latest", "replacing the 'latest' pointer failed (OSError: [Errno 28]"),
        "5": (
            "rank 0 of the world",
            "step_000000005",
            "renaming the folder into place failed (OSError: [Errno 5]",
        ),
        "6": (
            "rank 1 of the world",
            "",
            "recording this rank's generator and sampler states failed (TypeError",
        ),
    }
    for step, words in expected.items():
        assert seen[0][step][1] == seen[1][step][1], step  # the same error on both ranks
        assert seen[0][step][0] == "CheckpointError" and all(w in seen[0][step][1] for w in words), seen[0][
            step
        ]
        # Nothing half-written: no temporary folder, no latest.tmp, no step folder; 'latest' unchanged.
        assert seen[0][step][2] == ["latest", "step_000000001"], (step, seen[0][step][2])
        assert seen[0][step][3] == "step_000000001"
    prune = seen[0]["7"]
    assert prune[0] == "CheckpointError" and "rank 0 of the world" in prune[1]
    assert (
        "deleting old checkpoints (keep_last=2) after committing step_000000007 failed (PermissionError"
        in prune[1]
    )
    assert prune[2:] == [["latest", "step_000000001", "step_000000007"], "step_000000007"]  # committed
    assert seen[0]["8"][:3] == ["ok", "", ["latest", "step_000000007", "step_000000008"]]
    gathering = seen[0]["9"]  # rank 1's optimizer is over another model: rank 0 used to wait forever
    assert (
        gathering[1] == seen[1]["9"][1]
        and "rank 1 of the world: collecting this rank's model and " in gathering[1]
    )
    assert (
        "failed (ValueError: optimizer parameter 0 (shape (8, 4)) is not a parameter of the model"
        in gathering[1]
    )
    assert gathering[2:] == [["latest", "step_000000007", "step_000000008"], "step_000000008"]
    assert seen[0]["resumed step"] == seen[1]["resumed step"] == 8
