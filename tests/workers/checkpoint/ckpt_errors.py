"""MPI worker (2 ranks): checkpoint misuse that differs between ranks is raised on every rank, nobody hangs.

Usage: ``mpiexec -n 2 python ckpt_errors.py OUT``. Each rank writes ``OUT/rank<r>.json``:
``{case: [exception type, message]}`` for every misuse case, plus the outcome of resuming past a
damaged checkpoint (findings 2, 6, 7, 10 of the adversarial review).
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import numpy as np
from dist_worker_utils import run_worker, write_json
from safetensors import SafetensorError

import minidist as md
import minidist.distributed as dist
from minidist import checkpoint, nn, optim
from minidist.data import DistributedSampler


def make(seed: int = 0):
    md.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 8, dtype=np.float64), nn.Tanh(), nn.Linear(8, 3, dtype=np.float64))
    return model, optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def main(out_dir: str) -> None:
    world = dist.init()
    r = world.rank
    out = Path(out_dir)
    seen: dict[str, object] = {}

    def attempt(case: str, call) -> None:
        try:
            call()
            seen[case] = ["no error", ""]
        except Exception as e:  # noqa: BLE001  (every type is recorded and checked by the test)
            seen[case] = [type(e).__name__, str(e)]

    model, opt = make()
    d = out / "ck"
    attempt("step differs", lambda: checkpoint.save(d, model, opt, step=5 if r == 0 else 6))
    attempt("bad step on rank 1", lambda: checkpoint.save(d, model, opt, step=5 if r == 0 else -1))
    attempt(
        "keep_last 0 on rank 1", lambda: checkpoint.save(d, model, opt, step=5, keep_last=1 if r == 0 else 0)
    )
    seen["nothing written"] = sorted(p.name for p in d.iterdir()) if d.exists() else []

    # A full disk or a file-size limit on rank 1 only: safetensors raises its own SafetensorError (no
    # OSError). Every rank must raise, the temporary folder must go, the previous checkpoint must load.
    f = out / "full"
    checkpoint.save(f, model, opt, step=1)
    real_write = checkpoint.atomic.write_shard

    def full_disk(*args, **kwargs):
        raise SafetensorError("I/O error: File too large (os error 27)")

    if r == 1:
        checkpoint.atomic.write_shard = full_disk
    attempt("disk full on rank 1", lambda: checkpoint.save(f, model, opt, step=2))
    checkpoint.atomic.write_shard = real_write
    seen["after disk full"] = sorted(p.name for p in f.iterdir())
    seen["still loads"] = checkpoint.load_latest(f, model, opt)["step"]
    attempt("directory differs (save)", lambda: checkpoint.save(out / f"mine{r}", model, opt, step=1))
    seen["left in mine0"] = sorted(p.name for p in (out / "mine0").iterdir())  # rank 0's own root

    checkpoint.save(out / "a", model, opt, step=1)
    checkpoint.save(out / "b", model, opt, step=1)
    attempt("folder differs (load)", lambda: checkpoint.load(out / ("a" if r == 0 else "b"), model, opt))
    attempt("directory differs (load_latest)", lambda: checkpoint.load_latest(out / "ab"[r], model, opt))

    # A manifest edited to a shape the (checksummed) file does not hold: rank 0 reads the shared file
    # and would broadcast it; the check against the file must come before that collective.
    if r == 0:
        path = out / "a" / "step_000000001" / "manifest.json"
        manifest = json.loads(path.read_text())
        entry = manifest["tensors"]["model/0.weight"]
        entry["global_shape"] = entry["shards"][0]["shape"] = [4, 8]
        path.write_text(json.dumps(manifest))
    world.barrier()
    other, _ = make()
    other[0].weight.data = np.zeros((4, 8))
    attempt("manifest edited to another shape", lambda: checkpoint.load(out / "a", other))

    sampler = DistributedSampler(40, num_replicas=2, rank=r, batch_size=4, seed=0)
    sampler.position = 2
    checkpoint.save(out / "s", model, opt, step=1, sampler=sampler)
    wrong = DistributedSampler(40, num_replicas=2, rank=r, batch_size=4, seed=r)
    attempt("sampler seed differs on rank 1", lambda: checkpoint.load(out / "s", model, opt, sampler=wrong))

    # Finding 2 across ranks: resume past a truncated checkpoint, then save that step again.
    e = out / "e"
    for step in (1, 2, 3):
        checkpoint.save(e, model, opt, step=step)
    if r == 0:
        shard = next((e / "step_000000003").glob("*.safetensors"))
        shard.write_bytes(shard.read_bytes()[:100])
    world.barrier()
    assert checkpoint.load_latest(e, model, opt, fallback=True)["step"] == 2
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        checkpoint.save(e, model, opt, step=3)
    seen["warned"] = any("moved aside" in str(w.message) for w in caught)
    seen["moved aside"] = next(p.name for p in e.iterdir() if p.name.startswith(".corrupt-"))
    seen["resumed step"] = checkpoint.load_latest(e, model, opt)["step"]
    write_json(out, f"rank{r}.json", seen)


if __name__ == "__main__":
    run_worker(main, sys.argv[1])
