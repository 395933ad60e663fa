"""Asynchronous checkpoints (``save(..., async_save=True)``, ``checkpoint/background.py``).

One process: the handle, the copy that keeps later training out of the checkpoint, one save at a time,
errors from ``wait()`` or the next save. Real ranks (``workers/checkpoint/ckpt_async.py``, one
launch): async files equal sync files byte for byte while DDP trains on, bit-exact resume, errors on
every rank. A rank SIGKILLed during a background write (``ckpt_train.py --async-save``): the previous
checkpoint stays ``latest`` and the run resumes bit-exactly. The failure matrix of
``test_checkpoint_robust.py::test_a_loop_that_catches_save_errors_carries_on`` also runs in async mode.
"""

from __future__ import annotations

import errno
import json
import threading
from pathlib import Path

import numpy as np
import pytest
from cupy_stand_in import DeviceArray, install
from mpi_utils import run_mpi

from minidist import checkpoint
from minidist.checkpoint import CheckpointError, atomic
from tests.checkpoint.test_checkpoint import make, params, train


def files(folder: Path) -> dict[str, bytes]:
    """Every file of a checkpoint, the manifest without its creation time (the only field that differs)."""
    out = {}
    for p in sorted(folder.iterdir()):
        data = p.read_bytes()
        if p.name == atomic.MANIFEST:
            manifest = json.loads(data)
            manifest.pop("created")
            data = json.dumps(manifest, sort_keys=True).encode()
        out[p.name] = data
    return out


@pytest.fixture
def held_writes(monkeypatch):
    """Hold every background shard write (a synchronous save's is not held) until the test calls the
    function this fixture gives."""
    gate = threading.Event()
    real = atomic.write_shard

    def write(path, arrays):
        if threading.current_thread() is not threading.main_thread():
            assert gate.wait(timeout=30), "the test never released the write"
        return real(path, arrays)

    monkeypatch.setattr(atomic, "write_shard", write)
    yield gate.set
    gate.set()
    checkpoint.wait_pending()


def test_async_save_writes_the_same_files_and_later_training_does_not_leak(tmp_path, held_writes):
    model, opt = make(dropout=0.3)  # dropout: the generator state is part of the checkpoint
    train(model, opt, 3)
    snapshot = params(model)
    sync = checkpoint.save(tmp_path / "sync", model, opt, step=3, extra={"note": [1, 2]})
    extra = {"note": [1, 2]}
    handle = checkpoint.save(tmp_path / "async2", model, opt, step=3, extra=extra, async_save=True)
    assert isinstance(handle, checkpoint.SaveHandle) and not handle.done()
    train(model, opt, 2)  # in place: every parameter and optimizer state changes under the held write
    for p in model.parameters():
        p.data[...] = np.nan
    extra["note"].append(3)
    assert not (tmp_path / "async2" / "step_000000003").exists()  # not committed yet: no folder, ...
    assert atomic.read_latest(tmp_path / "async2") is None  # ... no 'latest'
    held_writes()
    assert handle.wait() == tmp_path / "async2" / "step_000000003" and handle.done()
    assert files(handle.wait()) == files(sync)  # byte for byte (the manifest less its time)
    fresh, fresh_opt = make(seed=5, dropout=0.3)
    checkpoint.load(tmp_path / "async2", fresh, fresh_opt)
    for name, value in params(fresh).items():
        np.testing.assert_array_equal(value, snapshot[name])  # the values at save(), not after


def test_the_next_save_waits_for_the_pending_one_and_prunes_after_it(tmp_path, held_writes):
    model, opt = make()
    first = checkpoint.save(tmp_path, model, opt, step=1, async_save=True)
    done = []
    waiter = threading.Thread(target=lambda: done.append(checkpoint.wait_pending()))
    waiter.start()
    waiter.join(timeout=0.3)
    assert waiter.is_alive() and not first.done()  # wait_pending blocks while the write is held
    held_writes()
    waiter.join(timeout=30)
    assert done == [tmp_path / "step_000000001"]
    for step in (2, 3):
        train(model, opt, 1)
        checkpoint.save(tmp_path, model, opt, step=step, keep_last=2, async_save=True)
    checkpoint.save(tmp_path, model, opt, step=4, keep_last=2)  # sync: waits for step 3 first
    assert [s for s, _ in atomic.list_checkpoints(tmp_path)] == [3, 4]
    assert atomic.read_latest(tmp_path) == "step_000000004"


def test_a_failed_background_write_is_raised_by_wait_or_else_by_the_next_save(tmp_path, monkeypatch):
    model, opt = make()
    checkpoint.save(tmp_path, model, opt, step=1)
    real = atomic.write_shard

    def full_disk(path, arrays):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(atomic, "write_shard", full_disk)
    handle = checkpoint.save(tmp_path, model, opt, step=2, async_save=True)
    for _ in range(2):  # every wait() raises it, as Future.result() does
        with pytest.raises(CheckpointError, match=r"writing this rank's shard failed \(OSError: .*No space"):
            handle.wait()
    assert checkpoint.wait_pending() is None  # raised already by wait(): not again
    checkpoint.save(tmp_path, model, opt, step=3, async_save=True)  # nobody waits for this one
    monkeypatch.setattr(atomic, "write_shard", real)
    with pytest.raises(CheckpointError, match="No space left"):
        checkpoint.save(tmp_path, model, opt, step=4)  # raises step 3's error, saves nothing
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step_000000001"]  # nothing half-done
    final = checkpoint.save(tmp_path, model, opt, step=4, async_save=True).wait()
    assert final == tmp_path / "step_000000004"
    assert atomic.read_latest(tmp_path) == "step_000000004"


def test_a_bad_argument_is_raised_by_save_itself(tmp_path):
    model, opt = make()
    with pytest.raises(TypeError, match="step must be an int >= 0"):
        checkpoint.save(tmp_path, model, opt, step=-1, async_save=True)
    assert checkpoint.wait_pending() is None


# -- real ranks ------------------------------------------------------------------------------------------
@pytest.mark.mpi
def test_async_saves_beside_ddp_training_equal_sync_saves_and_resume_bit_exactly(tmp_path):
    run_mpi(2, "checkpoint/ckpt_async.py", tmp_path, timeout=120)
    for step in (3, 6):
        name = f"step_{step:09d}"
        assert files(tmp_path / "async" / name) == files(tmp_path / "sync" / name), step
    final = {run: dict(np.load(tmp_path / f"{run}.npz")) for run in ("sync", "async", "resumed")}
    for name, value in final["sync"].items():
        np.testing.assert_array_equal(final["async"][name], value)  # saving never changes training
        np.testing.assert_array_equal(final["resumed"][name], value)  # bit-exact resume from async
    seen = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for r in range(2):
        kind, message = seen[r]["async_save differs"]
        assert kind == "ValueError" and "async_save (True on rank 0; False on rank 1)" in message, message
        kind, message = seen[r]["next save"]
        assert kind == "CheckpointError" and "rank 1 of the world" in message, message
        assert "rank00001.safetensors" in message and "writing this rank's shard failed" in message
    assert seen[0]["next save"] == seen[1]["next save"]  # the same error on both ranks
    assert seen[0]["after"] == []  # the failed save left nothing; the one after committed
    assert seen[0]["then"] == seen[1]["then"] == ["latest", "step_000000004"]


@pytest.mark.mpi
def test_a_rank_killed_during_a_background_write_loses_nothing_committed(tmp_path):
    args = ("--mesh", "2,1,1", "--steps", "8", "--every", "3", "--optims", "sgd", "--dropout", "0.3")
    run, ckpt = tmp_path / "run", tmp_path / "ckpt"
    run.mkdir()
    killed = run_mpi(2, "checkpoint/ckpt_train.py", run, ckpt, *args, "--async-save",
                     env={"CKPT_KILL": "1:6:save"}, check=False, timeout=120)  # fmt: skip
    assert killed.returncode != 0, "the SIGKILLed job should have failed"
    root = ckpt / "sgd"
    assert atomic.read_latest(root) == "step_000000003"  # the save in flight never became latest
    assert [s for s, _ in atomic.list_checkpoints(root)] == [3]  # and no half step_6 folder exists
    reference = tmp_path / "reference"
    reference.mkdir()
    run_mpi(2, "checkpoint/ckpt_train.py", run, ckpt, *args, "--async-save", "--resume",
            "--then", reference, tmp_path / "ref_ckpt", *args, timeout=120)  # fmt: skip
    resumed, uninterrupted = np.load(run / "sgd.npz"), np.load(reference / "sgd.npz")
    for name in uninterrupted.files:
        np.testing.assert_array_equal(resumed[name], uninterrupted[name])
    assert not [p.name for p in root.iterdir() if p.name.startswith(".tmp")]  # cleaned by a later save


def test_device_arrays_are_copied_to_the_host_before_save_returns(tmp_path, monkeypatch, held_writes):
    """With the CuPy stand-in as backend (tests/helpers/cupy_stand_in.py: it refuses an implicit device ->
    host
    conversion, as CuPy does), the staging copy goes through ``.get()`` and the files equal a CPU save's."""
    model, opt = make()
    train(model, opt, 2)
    cpu = checkpoint.save(tmp_path / "cpu", model, opt, step=2)
    install(monkeypatch)
    device, device_opt = make()  # the same seed: the same values, now in device arrays
    train(device, device_opt, 2)
    assert all(isinstance(p.data, DeviceArray) for p in device.parameters())
    handle = checkpoint.save(tmp_path / "device", device, device_opt, step=2, async_save=True)
    train(device, device_opt, 1)  # changes the device arrays while the write is held
    held_writes()
    assert files(handle.wait()) == files(cpu)


@pytest.mark.mpi
def test_a_pending_save_finishes_at_exit_and_an_unwaited_failure_is_printed(tmp_path):
    finished = run_mpi(2, "checkpoint/ckpt_async_exit.py", tmp_path / "finish", "finish", timeout=60)
    assert finished.stdout.count("returned before the save finished") == 2
    assert atomic.read_latest(tmp_path / "finish") == "step_000000005"  # committed after main returned
    failed = run_mpi(1, "checkpoint/ckpt_async_exit.py", tmp_path / "fail", "fail", timeout=60)
    assert "checkpoint.save(async_save=True) of" in failed.stderr and "nothing waited for it" in failed.stderr
    assert "No space left on device" in failed.stderr
    assert sorted(p.name for p in (tmp_path / "fail").iterdir()) == []  # nothing half-written is left
