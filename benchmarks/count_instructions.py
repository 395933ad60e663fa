"""Instructions per training step of a tiny MLP: minidist's fixed cost per step, free of timing noise.

On a shared machine, step times of a few hundred microseconds move by 2x with the load; the number of
instructions a step executes does not. With a tiny model (8-8-8-4, batch 4) the kernels are nearly
free, so instructions per step measure the fixed work around them: Python bytecode, the graph, the
NumPy call overhead. Count them with valgrind's callgrind (an optional system tool, not a pip
dependency), as the difference between N steps and 0 steps divided by N:

    valgrind --tool=callgrind --callgrind-out-file=/dev/null python benchmarks/count_instructions.py 300
    valgrind --tool=callgrind --callgrind-out-file=/dev/null python benchmarks/count_instructions.py 0
    (add --reference to count the hand-written NumPy reference, benchmarks/numpy_reference.py, instead)

and read the "Collected :" line of each. Figures: benchmarks/README.md, "Cuts: the autograd core".
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402
from numpy_reference import ReferenceStage, dp_step  # noqa: E402

import minidist as md  # noqa: E402
from minidist import nn, optim  # noqa: E402
from minidist.models import MLP  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("steps", type=int, help="training steps to run (0: only the setup)")
    parser.add_argument("--reference", action="store_true", help="run the NumPy reference's step instead")
    args = parser.parse_args()
    md.manual_seed(0)
    model = MLP(8, [8, 8], 4)
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((4, 8), dtype=np.float32), rng.integers(0, 4, 4)
    if args.reference:
        stage = ReferenceStage([p.data.copy() for p in model.parameters()], head=True)

        def step() -> None:
            dp_step(stage, x, y, 0.05, None)
    else:
        xt, opt = md.tensor(x), optim.SGD(model.parameters(), lr=0.05)

        def step() -> None:
            opt.zero_grad()
            nn.functional.cross_entropy(model(xt), y).backward()
            opt.step()

    for _ in range(args.steps):
        step()


if __name__ == "__main__":
    main()
