"""The minimal autograd engine's GPipe step against the hand-written reference's, on 2 real stages.

    mpiexec -n 2 python minimal_gpipe.py OUT_DIR

Both run 3 steps of MLP 8-16-16-4 (stage 0: Linear 8-16 + ReLU; stage 1: Linear 16-16, ReLU, Linear
16-4), batch 16 in 4 microbatches, from the same weights. Writes OUT_DIR/rank{r}.npz: "ref{k}" and
"tape{k}" (this stage's parameter k after the steps, each way), "start{k}" (before) and "losses"
(reference then tape per step; nan on stage 0).
"""

import sys
from pathlib import Path

import numpy as np
from dist_worker_utils import run_worker
from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))
from minimal_autograd import minimal_gpipe_step  # noqa: E402
from numpy_reference import ReferenceStage, gpipe_step  # noqa: E402

SIZES, BATCH, MICROBATCHES, LR = (8, 16, 16, 4), 16, 4, 0.1


def main(out: Path) -> None:
    pp = MPI.COMM_WORLD
    rng = np.random.default_rng(0)  # the same draws on both ranks: one model, one batch
    params = []
    for k in range(len(SIZES) - 1):
        params += [rng.standard_normal((SIZES[k + 1], SIZES[k]), dtype=np.float32) * 0.3,
                   rng.standard_normal(SIZES[k + 1], dtype=np.float32) * 0.1]  # fmt: skip
    x = rng.standard_normal((BATCH, SIZES[0]), dtype=np.float32)
    y = rng.integers(0, SIZES[-1], BATCH)
    mine = params[:2] if pp.rank == 0 else params[2:]  # layer 0 | layers 1 and 2
    ref, tape = ReferenceStage(mine, head=pp.rank == 1), ReferenceStage(mine, head=pp.rank == 1)
    losses = []
    for _ in range(3):
        losses.append(gpipe_step(ref, x, y, LR, MICROBATCHES, pp))
        losses.append(minimal_gpipe_step(tape, x, y, LR, MICROBATCHES, pp, lambda flat: None))
    arrays = {"losses": np.array(losses)}
    for k, (a, b, c) in enumerate(zip(ref.params, tape.params, mine)):
        arrays.update({f"ref{k}": a, f"tape{k}": b, f"start{k}": c})
    np.savez(out / f"rank{pp.rank}.npz", **arrays)


if __name__ == "__main__":
    run_worker(main, Path(sys.argv[1]))
