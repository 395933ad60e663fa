"""MPI worker for A5: PipelineParallel (GPipe / 1F1B) over all ranks vs. one device, in plain words.

Config (OUT_DIR/config.json): ``{"runs": [{"schedule": "1f1b", "m": 4, "seed": 0}, ...]}``. For each
run every rank builds the same float64 model, the pipeline keeps its stage; two training steps (batch
2m, then 3m: the activation shape changes between steps) compare the mean loss and this stage's
gradients with one process computing the whole batch, and the most activations the stage held with
1F1B's bound min(p - s, m). float64: pipelining only changes the order of the per-microbatch gradient
sums (a few ulp), so rtol 1e-10; a lost, doubled or misrouted microbatch is off by O(1/m).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import gradelib  # noqa: E402
import rules  # noqa: E402

import minidist as md  # noqa: E402
from minidist import nn  # noqa: E402
from minidist.parallel.pipeline import PipelineParallel  # noqa: E402

F64 = np.float64


# The handout's "Not allowed": non-blocking messages or threads to dodge a deadlock (the schedule must
# be deadlock-free as data, run with blocking calls).
RULE = rules.Rule(
    files=("minidist.parallel.pipeline.executor", "minidist.parallel.pipeline.messaging"),
    why="the handout asks for blocking messages (a deadlock-free schedule needs no non-blocking ones), "
    "and no threads",
    mpi_methods=("Isend", "Irecv", "Issend", "Ibsend", "Irsend", "Isendrecv", "isend", "irecv", "issend"),
    functions=("threading:Thread.start",),
    through=("minidist.distributed.p2p_batch",),
    tasks={"BlockingMessaging.run": "A5.2"},
)


def build(seed: int) -> nn.Sequential:
    md.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(5, 8, dtype=F64),
        nn.Tanh(),
        nn.Linear(8, 8, dtype=F64),
        nn.Tanh(),
        nn.Linear(8, 6, dtype=F64),
        nn.Tanh(),
        nn.Linear(6, 3, dtype=F64),
    )


def body(world, config: dict) -> list[str]:
    p, s = world.size, world.rank
    failures: list[str] = []
    for run in config["runs"]:
        m, seed, schedule = run["m"], run["seed"], run["schedule"]
        where = f"PipelineParallel(schedule={schedule!r}, {p} stages, m={m} microbatches), stage {s}"
        pipe = PipelineParallel(build(seed), world, microbatches=m, schedule=schedule)
        reference = build(seed)
        ref_params = dict(reference.named_parameters())
        rng = np.random.default_rng([seed, 3])
        for step, batch in enumerate((2 * m, 3 * m)):
            x, y = rng.standard_normal((batch, 5)), rng.integers(0, 3, batch)
            reference.zero_grad()
            ref_loss = nn.functional.cross_entropy(reference(md.tensor(x, dtype=F64)), y)
            ref_loss.backward()
            pipe.zero_grad()
            loss = pipe.train_step(md.tensor(x, dtype=F64), y, nn.functional.cross_entropy)
            at = f"{where}, step {step + 1} (batch {batch})"
            if not np.isclose(loss, ref_loss.item(), rtol=1e-10, atol=1e-12):
                failures.append(f"{at}: the mean loss is {loss!r}, one device gives {ref_loss.item()!r}")
                break
            for name, param in pipe.named_parameters():
                want = ref_params[name].grad
                if param.grad is None or not np.allclose(param.grad, want, rtol=1e-10, atol=1e-12):
                    got = "None" if param.grad is None else gradelib.show(param.grad)
                    failures.append(
                        f"{at}: the gradient of {name!r} is {got}, one device gives "
                        f"{gradelib.show(want)}: a microbatch's backward ran with the wrong "
                        "gradient, twice, or not at all"
                    )
                    break
            held, bound = pipe.stats.peak_activations, min(p - s, m)
            if not failures and schedule == "1f1b" and held > bound:
                failures.append(
                    f"{at}: this stage held {held} microbatches' activations at once; 1F1B holds "
                    f"at most min(p - s, m) = {bound}: run the program's steps in order, one "
                    "at a time"
                )
            if failures:
                break
    return failures


if __name__ == "__main__":
    gradelib.worker_main(body, RULE)
