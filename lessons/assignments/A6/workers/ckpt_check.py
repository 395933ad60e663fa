"""MPI worker for A6: watch every file-system step of ``checkpoint.save``; load damaged checkpoints.

Config (OUT_DIR/config.json)::

    {"mode": "commit", "steps": [1, 2, 3], "keep_last": null}   # save these steps, watching the commit
    {"mode": "corrupt"}                                          # damage a shard, load must refuse

``commit``: ``os.rename``, ``os.replace`` and ``os.fsync`` are wrapped in every rank's process. Before
and after each rename/replace (the only moments the committed state changes) rank 0 checks what a
crash right there would leave: ``DIR/latest`` must name a committed ``step_`` folder whose manifest
lists files that exist with the right sha256 and size. It also checks the fsyncs the commit relies
on (Pillai et al., OSDI 2014): manifest and folder before the rename, the parent folder after it,
``latest.tmp`` before it replaces ``latest``, and the parent folder after that.
``corrupt``: every rank saves, rank 0 flips one bit of a shard, ``load`` must raise CheckpointError
on every rank and leave the parameters unchanged.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import gradelib  # noqa: E402

import minidist as md  # noqa: E402
from minidist import checkpoint, nn  # noqa: E402
from minidist.checkpoint import CheckpointError  # noqa: E402

F64 = np.float64


def build(seed: int) -> nn.Sequential:
    md.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 6, dtype=F64), nn.Tanh(), nn.Linear(6, 3, dtype=F64))


def inode(path_or_fd) -> tuple[int, int] | None:
    try:
        st = os.fstat(path_or_fd) if isinstance(path_or_fd, int) else os.stat(path_or_fd)
    except OSError:
        return None
    return st.st_dev, st.st_ino


class Watch:
    """Records fsyncs (by inode) and checks the crash state around every rename/replace."""

    def __init__(self, root: Path, rank: int):
        self.root, self.rank, self.fsynced, self.events = root, rank, [], []
        self.failures: list[str] = []
        self.real = os.fsync, os.rename, os.replace
        os.fsync, os.rename, os.replace = self.fsync, self.rename, self.replace

    def close(self) -> None:
        os.fsync, os.rename, os.replace = self.real

    def synced_after(self, key, event_index: int) -> bool:
        return any(k == key and i >= event_index for i, k in self.fsynced)

    def fsync(self, fd):
        self.real[0](fd)
        self.fsynced.append((len(self.events), inode(fd)))

    def rename(self, src, dst, *args, **kwargs):
        return self._move("rename", src, dst, self.real[1], *args, **kwargs)

    def replace(self, src, dst, *args, **kwargs):
        return self._move("replace", src, dst, self.real[2], *args, **kwargs)

    def _move(self, how, src, dst, real, *args, **kwargs):
        src, dst = Path(src), Path(dst)
        if self.rank == 0 and not self.failures:
            self.before(how, src, dst)
            self.crash_state(f"a crash just before os.{how}({src.name!r}, {dst.name!r})")
        real(src, dst, *args, **kwargs)
        self.events.append((how, src, dst))
        if self.rank == 0 and not self.failures:
            self.crash_state(f"a crash just after os.{how}({src.name!r}, {dst.name!r})")
        return None

    def before(self, how: str, src: Path, dst: Path) -> None:
        if dst.parent == self.root and dst.name.startswith("step_") and src.is_dir():
            manifest = src / "manifest.json"
            if not manifest.exists():
                self.failures.append(
                    f"the folder was renamed to {dst.name} before manifest.json was written into "
                    "it: a crash now leaves a committed-looking checkpoint without a manifest"
                )
            elif not any(k == inode(manifest) for _, k in self.fsynced):
                self.failures.append(
                    f"manifest.json was not fsynced before its folder was renamed to {dst.name}: "
                    "after a power cut the committed folder could hold an empty manifest"
                )
            elif not any(k == inode(src) for _, k in self.fsynced):
                self.failures.append(
                    f"the temporary folder was not fsynced before it was renamed to {dst.name}: "
                    "the names of the files in it may not be durable yet"
                )
        if dst == self.root / "latest":
            last_commit = max(
                (i for i, e in enumerate(self.events) if e[2].name.startswith("step_")), default=-1
            )
            if not any(k == inode(src) for _, k in self.fsynced):
                self.failures.append(
                    f"{src.name} was not fsynced before os.{how} made it 'latest': after a power "
                    "cut 'latest' could be empty"
                )
            elif last_commit >= 0 and not self.synced_after(inode(self.root), last_commit + 1):
                self.failures.append(
                    "the checkpoint root was not fsynced after the folder was renamed into place "
                    "and before 'latest' was switched: the rename may not be durable yet"
                )

    def crash_state(self, moment: str) -> None:
        try:
            name = (self.root / "latest").read_text().strip()
        except FileNotFoundError:
            if any(e[2].name == "latest" for e in self.events):
                self.failures.append(f"{moment}: 'latest' is gone")
            return
        folder = self.root / name
        if not name.startswith("step_") or not folder.is_dir():
            self.failures.append(
                f"{moment} would leave 'latest' naming {name!r}, which is not a committed "
                "checkpoint folder yet: 'latest' was switched before the new folder was "
                "complete and renamed into place"
            )
            return
        try:
            manifest = json.loads((folder / "manifest.json").read_text())
        except (OSError, ValueError):
            self.failures.append(
                f"{moment} would leave 'latest' naming {name}, whose manifest.json is missing or "
                "incomplete: write (and fsync) the manifest before committing the folder"
            )
            return
        for file, info in manifest["files"].items():
            path = folder / file
            data = path.read_bytes() if path.exists() else b""
            if len(data) != info["bytes"] or hashlib.sha256(data).hexdigest() != info["sha256"]:
                self.failures.append(
                    f"{moment} would leave 'latest' naming {name}, whose shard {file} is missing "
                    "or incomplete"
                )
                return


def commit(world, config: dict, root: Path) -> list[str]:
    model = build(0)
    watch = Watch(root, world.rank)
    try:
        for step in config["steps"]:
            for p in model.parameters():
                p.data += 0.5  # every checkpoint differs
            start = len(watch.events)
            checkpoint.save(root, model, step=step, keep_last=config.get("keep_last"))
            if world.rank != 0 or watch.failures:
                continue
            name = f"step_{step:09d}"
            mine = [e for e in watch.events[start:] if e[2] == root / "latest"]
            latest = (root / "latest").read_text().strip() if (root / "latest").exists() else None
            if latest != name:
                watch.failures.append(f"after save(step={step}) 'latest' names {latest!r}, expected {name!r}")
            elif not mine:
                watch.failures.append(
                    "'latest' was written in place instead of atomically replaced: a crash in the "
                    "middle leaves a torn pointer. Write latest.tmp, fsync it, os.replace it"
                )
            elif not watch.synced_after(inode(root), watch.events.index(mine[-1]) + 1):
                watch.failures.append(
                    "the checkpoint root was not fsynced after 'latest' was replaced: the new "
                    "pointer may not survive a power cut"
                )
            elif any(c.name.startswith(".tmp-") or c.name == "latest.tmp" for c in root.iterdir()):
                watch.failures.append(
                    f"after save(step={step}) temporary files are left: "
                    f"{sorted(c.name for c in root.iterdir())}"
                )
    finally:
        watch.close()
    if not any(world.mpi.allgather(bool(watch.failures))):  # load is collective: all ranks or none
        fresh = build(1)
        info = checkpoint.load_latest(root, fresh)
        if info["step"] != config["steps"][-1] or not all(
            np.array_equal(a.data, b.data) for a, b in zip(fresh.parameters(), model.parameters())
        ):
            watch.failures.append("load_latest did not restore the last saved model")
    return watch.failures


def corrupt(world, config: dict, root: Path) -> list[str]:
    model = build(0)
    checkpoint.save(root, model, step=1)
    folder = root / "step_000000001"
    if world.rank == 0:
        shard = sorted(folder.glob("*.safetensors"))[0]
        data = bytearray(shard.read_bytes())
        data[-2] ^= 0x01  # one bit of a weight: the file still parses
        shard.write_bytes(bytes(data))
    world.mpi.Barrier()
    target = build(1)
    before = [p.data.copy() for p in target.parameters()]
    try:
        checkpoint.load(root, target)
    except CheckpointError as err:
        if not all(np.array_equal(a, p.data) for a, p in zip(before, target.parameters())):
            return ["load raised CheckpointError but had already changed the model's parameters"]
        if "corrupt" not in str(err) and "checksum" not in str(err):
            return [f"load raised CheckpointError, but without saying the file is corrupt: {err}"]
        return []
    return [
        f"rank {world.rank}: load accepted a checkpoint whose shard was corrupted (one bit flipped; its "
        "sha256 differs from the manifest's): verify the checksum before returning any array"
    ]


def body(world, config: dict) -> list[str]:
    root = Path(sys.argv[1]) / "ckpt"
    return {"commit": commit, "corrupt": corrupt}[config["mode"]](world, config, root)


if __name__ == "__main__":
    gradelib.worker_main(body)
