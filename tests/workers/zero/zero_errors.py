"""MPI worker: ZeroRedundancyOptimizer's documented errors are raised on every rank, and nobody hangs.

Usage: ``mpiexec -n N python zero_errors.py MODE [OUT_DIR]``.

* ``caught``: every misuse inside try/except; each rank writes ``rank<r>.json`` with the exception it
  saw per case (type and message), then shows that the group still works: a valid ZeRO on a model
  smaller than the group (P = 2 < N, so some rank owns nothing) trains one step correctly.
* ``uncaught``: rank 1 passes one parameter fewer and nothing catches the error: ``run_worker`` aborts
  the job, so ``mpiexec`` exits non-zero (the test checks it does so quickly).
"""

from __future__ import annotations

import sys

import numpy as np
from dist_worker_utils import run_worker, write_json

import minidist.distributed as dist
from minidist import nn, optim
from minidist.parallel import ZeroRedundancyOptimizer as Zero


def params_of(*shapes, dtype=np.float64) -> list[nn.Parameter]:
    return [nn.Parameter(np.ones(shape, dtype=dtype)) for shape in shapes]


def caught(out_dir: str) -> None:
    world = dist.init()
    r = world.rank
    seen: dict[str, list[str]] = {}

    def attempt(case: str, make) -> None:
        try:
            make()
            seen[case] = ["no error", ""]
        except Exception as e:
            seen[case] = [type(e).__name__, str(e)]

    ok = params_of((3, 2), (4,))
    attempt("stage 3", lambda: Zero(ok, optim.SGD, stage=3, lr=0.1))
    attempt("stage 0", lambda: Zero(ok, optim.SGD, stage=0, lr=0.1))
    attempt("optimizer instance", lambda: Zero(ok, optim.SGD(ok, lr=0.1), lr=0.1))
    attempt("not an optimizer", lambda: Zero(ok, dict, lr=0.1))
    attempt("count differs", lambda: Zero(ok[: 1 if r == 1 else 2], optim.SGD, lr=0.1))
    attempt("total size differs", lambda: Zero(params_of((3, 2), (4 + (r == 2),)), optim.SGD, lr=0.1))
    # Same count and total (10 elements) on every rank, but rank 1 cuts them differently.
    attempt(
        "a size differs",
        lambda: Zero(params_of((2, 3), (4,)) if r == 1 else params_of((9,), (1,)), optim.SGD),
    )
    attempt(
        "dtype differs", lambda: Zero(params_of((6,), dtype=np.float32 if r == 0 else np.float64), optim.SGD)
    )
    attempt("stage 3 on rank 1", lambda: Zero(ok, optim.SGD, stage=3 if r == 1 else 1, lr=0.1))
    attempt("stage 2 on rank 1", lambda: Zero(ok, optim.SGD, stage=2 if r == 1 else 1, lr=0.1))
    attempt("not a tensor on rank 1", lambda: Zero([*ok, "bias"] if r == 1 else ok, optim.SGD, lr=0.1))
    attempt("empty", lambda: Zero([], optim.SGD, lr=0.1))
    attempt("mixed dtypes", lambda: Zero([*ok, *params_of((2,), dtype=np.float32)], optim.SGD))
    # Parameter groups must agree too; a bad group on one rank is an error on every rank.
    a, b = params_of((3, 2), (4,))

    def two_groups(decay: float = 0.1) -> list[dict]:
        return [{"params": [a], "weight_decay": decay}, {"params": [b]}]

    attempt("group value differs", lambda: Zero(two_groups(0.0 if r == 1 else 0.1), optim.AdamW))
    attempt("group count differs", lambda: Zero(two_groups() if r == 1 else [a, b], optim.AdamW))
    swapped = [{"params": [b], "weight_decay": 0.1}, {"params": [a]}]  # same count and values, other split
    attempt("groups split differently", lambda: Zero(swapped if r == 1 else two_groups(), optim.AdamW))
    attempt("parameter in two groups", lambda: Zero([{"params": [a]}, {"params": [a, b]}], optim.AdamW))
    attempt("bad group value on rank 1", lambda: Zero(two_groups(decay=-1.0 if r == 1 else 0.1), optim.AdamW))
    zero = Zero(two_groups(), optim.AdamW, stage=2)
    for p in (a, b):
        p.grad = np.ones(p.shape)
    attempt("max_norm differs", lambda: zero.clip_grad_norm_(1.0 if r == 1 else 2.0))
    attempt("negative max_norm on rank 1", lambda: zero.clip_grad_norm_(-1.0 if r == 1 else 1.0))
    # After the errors the group still clips: 10 gradient elements of 1, norm sqrt(10), on every rank.
    seen["clip norm"] = [repr(zero.clip_grad_norm_(1.0)), repr(float(np.sqrt(10.0)))]
    # Every element was scaled by 1 / (sqrt(10) + 1e-6): the inf-norm (the largest |g|) is that now.
    seen["clip inf norm"] = [
        repr(zero.clip_grad_norm_(5.0, norm_type=np.inf)),
        repr(float(1 / (np.sqrt(10.0) + 1e-6))),
    ]
    # A NaN in one rank's local gradient reaches every rank's norm (whichever rank owns that element).
    zero.zero_grad()
    for p in (a, b):
        p.grad = np.ones(p.shape)
    if r == 1:
        b.grad[2] = np.nan
    seen["clip nan norm"] = [repr(zero.clip_grad_norm_(1.0)), "nan"]
    attempt("non-finite norm", lambda: zero.clip_grad_norm_(1.0, error_if_nonfinite=True))

    zero = Zero(ok, optim.AdamW, stage=2)
    sd = zero.state_dict()
    sd["layout"]["rank"] = (r + 1) % world.size
    attempt("load another rank's state", lambda: zero.load_state_dict(sd))

    # The group still works: P = 2 elements on N ranks, so ranks 2.. own nothing.
    (p,) = params_of((2,))
    zero = Zero([p], optim.SGD, stage=2, lr=0.1)
    p.grad = 2 * p.data  # d/dp sum(p^2), the same on every rank, so the average is the same again
    zero.step()
    seen["tiny model"] = [str(p.data.tolist()), str(zero.layout.shard_numel)]
    write_json(out_dir, f"rank{r}.json", seen)


def uncaught() -> None:
    rank = dist.init().rank
    Zero(params_of((3, 2), (4,))[: 1 if rank == 1 else 2], optim.SGD, lr=0.1)


if __name__ == "__main__":
    if sys.argv[1] == "caught":
        run_worker(caught, sys.argv[2])
    else:
        run_worker(uncaught)
