"""Lesson 04 source (percent format); `python lessons/build.py` turns it into 04_data_parallel.ipynb."""
# ruff: noqa: E402, F811

# %% [markdown]
# # Lesson 04 — Data parallelism
#
# **Learning goals.** After this lesson you can
# 1. write data parallelism by hand: split the batch, all-reduce the gradients, step;
# 2. say exactly when N ranks train *the same model* as one process (averaging and uneven batches);
# 3. accumulate gradients over microbatches, with and without communication (`no_sync`);
# 4. read a timeline of `DistributedDataParallel` and see bucketing and overlap at work.
#
# Every rank holds the whole model and a slice of each global batch. The gradient of the mean loss
# over the global batch is the average of the ranks' gradients *if* every rank's slice is equally
# large — one all-reduce with `op="avg"` per step restores identical replicas.

# %%
import json
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt

from minidist_course.notebook import checks, start_cluster, stop_cluster
from minidist_tools import timeline

rc = start_cluster(2)

# %% [markdown]
# ## 1. Naive data parallelism, by hand
#
# Each engine builds the same model (same seed), sees the same global batch of 32 samples, and keeps
# its half. After `backward`, one `all_reduce(op="avg")` per parameter. We compare with the gradient
# one process computes on the whole batch, in float64 so that only rounding (1e-16) separates them.

# %%
# %%px
import numpy as np

import minidist as md
import minidist.distributed as dist
from minidist import nn

world = dist.init()


def make_model():
    md.manual_seed(0)  # identical initial weights on every rank
    model = nn.Sequential(nn.Linear(16, 32, dtype=np.float64), nn.Tanh(), nn.Linear(32, 4, dtype=np.float64))
    return model


rng = np.random.default_rng(0)  # the same global batch on every rank
X, Y = rng.standard_normal((32, 16)), rng.integers(0, 4, 32)


def grads_of(model, x, y, scale=1.0):
    for p in model.parameters():
        p.grad = None
    loss = nn.functional.cross_entropy(model(md.tensor(x, dtype=np.float64)), y) * scale
    loss.backward()
    return [p.grad.copy() for p in model.parameters()]


reference = grads_of(make_model(), X, Y)  # one process, whole batch

mine = np.array_split(np.arange(len(X)), world.size)[world.rank]  # this rank's slice of the batch
model = make_model()
local = grads_of(model, X[mine], Y[mine])
for p in model.parameters():
    dist.all_reduce(p.grad, op="avg")  # naive: one collective per parameter, after backward
error = max(np.max(np.abs(p.grad - r)) for p, r in zip(model.parameters(), reference))
print(f"rank {world.rank}: {len(mine)} samples, max |DP grad - single-process grad| = {error:.1e}")

# %% [markdown]
# The same two rules as a wrapper: `DataParallelNaive` (`minidist/parallel/data_parallel/naive.py`, a
# page: read it). Wrapping broadcasts rank 0's parameters, so the replicas start identical even from
# different seeds; a hook on every parameter all-reduces its gradient with `op="avg"` the moment
# backward has finished it, so `loss.backward()` returns with averaged gradients and the training loop
# stays the one-process loop.

# %%
# %%px
from minidist.parallel.data_parallel import DataParallelNaive

naive = DataParallelNaive(make_model())  # collective: every rank wraps its model together
grads = grads_of(naive, X[mine], Y[mine])  # the hooks average each gradient during backward
error = max(np.max(np.abs(g - r)) for g, r in zip(grads, reference))
print(f"rank {world.rank}: DataParallelNaive, max |grad - single-process grad| = {error:.1e}")

# %% [markdown]
# ## 2. When the batch does not split evenly
#
# With 31 samples on 2 ranks, the slices hold 16 and 15. Each rank's loss is a mean over *its*
# samples, so averaging the two gradients weights a sample on rank 1 more than one on rank 0: the
# result is no longer the full-batch gradient. The fix is to scale each rank's loss by a factor that
# makes every sample count `1 / B` again (`examples/train_mlp.py` does this; the cell below uses it,
# and section 3 asks you to derive the same kind of factor for gradient accumulation).

# %%
# %%px
X31, Y31 = X[:31], Y[:31]
mine31 = np.array_split(np.arange(31), world.size)[world.rank]
reference31 = grads_of(make_model(), X31, Y31)
errors = {}
for name, scale in [("plain average", 1.0), ("scaled", world.size * len(mine31) / 31)]:
    model = make_model()
    grads_of(model, X31[mine31], Y31[mine31], scale)
    for p in model.parameters():
        dist.all_reduce(p.grad, op="avg")
    errors[name] = max(np.max(np.abs(p.grad - r)) for p, r in zip(model.parameters(), reference31))
print(f"rank {world.rank}: " + ", ".join(f"{k}: error {v:.1e}" for k, v in errors.items()))

# %% [markdown]
# ## 3. Your turn: gradient accumulation
#
# A batch too large for memory is processed as k *microbatches* one after another, calling
# `backward()` on each; gradients **accumulate** (add up) in `.grad`. By what factor must microbatch
# i's mean loss be multiplied so that the accumulated gradient equals the gradient of the mean loss
# over all `B = sum(sizes)` samples? Mind the uneven case.


# %% [exercise accum]
def microbatch_weight(sizes, i):
    raise NotImplementedError  # your code here: the factor for microbatch i


# %% [check accum]
checks.microbatch_weight(microbatch_weight)

# %% [markdown]
# ## 4. `DistributedDataParallel`: buckets and overlap
#
# The naive versions have two costs. They launch one collective per parameter (many small messages:
# alpha dominates, lesson 03), and nothing computes while they communicate: the loop waits until
# backward has finished before communicating at all, the wrapper stops backward for every all-reduce.
# `DistributedDataParallel` (Li et al., "PyTorch Distributed", VLDB 2020, §3.2) fixes both:
#
# - **bucketing**: gradients are packed into buckets of about `bucket_cap_mb`, one all-reduce each;
# - **overlap**: a hook fires when a parameter's gradient is final; when a bucket is full its
#   all-reduce starts at once, on a communication thread, while backward goes on with earlier layers.
#
# We trace three steps of a wider MLP with `minidist.trace` and draw each rank's timeline.

# %%
# %%px
from minidist import optim, trace
from minidist.parallel import DistributedDataParallel
from minidist_tools import timeline

md.manual_seed(0)
layers = []
for _ in range(4):
    layers += [nn.Linear(512, 512), nn.ReLU()]
# small_bucket_bytes=0: show every bucket overlapping. By default DDP all-reduces buckets under 1 MiB on
# the main thread after backward: handing such a bucket to the thread costs more than it can hide.
ddp = DistributedDataParallel(
    nn.Sequential(*layers[:-1]), bucket_cap_mb=1, overlap=True, small_bucket_bytes=0
)
opt = optim.SGD(ddp.parameters(), lr=1e-3)
xb = md.tensor(np.random.default_rng(world.rank).standard_normal((128, 512)), dtype=np.float32)
yb = np.random.default_rng(world.rank).integers(0, 512, 128)


def train_step():
    with trace.span("forward", "forward"):
        loss = nn.functional.cross_entropy(ddp(xb), yb)
    opt.zero_grad()
    with trace.span("backward", trace.BACKWARD):
        loss.backward()  # returns with averaged gradients: DDP waited for its buckets
    with trace.span("optimizer", "optimizer"):
        opt.step()


train_step()  # warm-up
dist.barrier()
trace.enable()  # right after a barrier: both ranks' clocks start together
for _ in range(3):
    train_step()
trace.disable()
events = trace.events()
hidden = timeline.overlap_fraction(events)
buckets = sum(e["name"].startswith("allreduce bucket") for e in events) // 3
print(f"rank {world.rank}: {buckets} buckets per step, {hidden:.0%} of communication hidden behind backward")

# %%
events_per_rank = rc[:]["events"]
colors = {
    "forward": "tab:blue",
    "backward": "tab:orange",
    "optimizer": "tab:green",
    "comm": "tab:red",
    "wait": "tab:gray",
    "launch": "black",
}
fig, ax = plt.subplots(figsize=(11, 2.8))
rows = []
for rank, events in enumerate(events_per_rank):
    for thread in sorted({e["thread"] for e in events}, key=lambda t: t != "MainThread"):
        y = len(rows)
        rows.append(f"rank {rank} {'main' if thread == 'MainThread' else 'comm'}")
        # long spans first, so that the short ones inside them (waits, launches) are drawn on top
        for e in sorted(events, key=lambda e: e["start"] - e["end"]):
            if e["thread"] == thread:
                start, width = e["start"] * 1e3, (e["end"] - e["start"]) * 1e3
                color = colors.get(e["cat"], "tab:purple")
                ax.broken_barh([(start, width)], (y - 0.35, 0.7), color=color, edgecolor="white", lw=0.5)
ax.set_yticks(range(len(rows)), rows)
ax.set_xlabel("time (ms)")
ax.legend(
    handles=[plt.Rectangle((0, 0), 1, 1, color=c) for c in colors.values()],
    labels=list(colors),
    ncol=6,
    fontsize=8,
    loc="upper center",
    bbox_to_anchor=(0.5, 1.3),
)
plt.tight_layout()
plt.show()
path = Path(tempfile.gettempdir()) / "minidist_lesson04_trace.json"
timeline.save_chrome_trace(path, events_per_rank)
print(f"Chrome trace: {path} ({len(json.loads(path.read_text())['traceEvents'])} events)")

# %% [markdown]
# **Reading the trace.** Each red box on a "comm" row is one bucket's all-reduce. Buckets start in
# reverse layer order (backward finishes the last layer first), *inside* the orange backward box of
# the main thread: that is the overlap. The last bucket (the first layer's gradients) is ready only
# when backward ends, so nothing is left to hide it behind: the main thread all-reduces it itself,
# the red box on its own row at the end of backward. A gray "wait for gradients" box is time the main
# thread could not hide. Open the JSON file in https://ui.perfetto.dev (or
# chrome://tracing) to zoom into single spans. On a 2-core laptop with 2 ranks, the cores are busy
# computing, so hiding communication saves less than it would on a GPU, where a separate engine moves
# the bytes (`benchmarks/README.md`, section "DDP", discusses the numbers).
#
# ## 5. Accumulation without communication: `no_sync`
#
# With gradient accumulation, all-reducing after every microbatch wastes bandwidth: only the sum
# matters. Inside `with ddp.no_sync():` backward only accumulates locally; the last microbatch, outside
# it, all-reduces the accumulated sum once. Same result, a fraction of the traffic:

# %%
# %%px
model = DistributedDataParallel(make_model())
halves = np.array_split(mine, 2)  # two microbatches of this rank's slice
for p in model.parameters():
    p.grad = None


def microbatch_loss(rows):
    x = md.tensor(X[rows], dtype=np.float64)
    return nn.functional.cross_entropy(model(x), Y[rows]) * (len(rows) / len(mine))  # weight b_i / b


with model.no_sync():
    microbatch_loss(halves[0]).backward()  # local accumulation only
microbatch_loss(halves[1]).backward()  # accumulates, then all-reduces the sum once
error = max(np.max(np.abs(p.grad - r)) for p, r in zip(model.parameters(), reference))
print(f"rank {world.rank}: accumulated with no_sync, max error vs single process = {error:.1e}")

# %% [markdown]
# ## Summary
# - Data parallelism = identical replicas + averaged gradients; exact equivalence to one process needs
#   equal shares or loss scaling by `n * b_i / B`.
# - Accumulation weights microbatch losses by `b_i / B`; `no_sync` skips the intermediate all-reduces.
# - `DataParallelNaive` does it with one all-reduce per gradient: correct, but it pays the latency once
#   per parameter and waits for each; DDP buckets gradients (fewer, larger messages) and overlaps their
#   all-reduce with backward.
#
# Next: [lesson 05](05_zero.ipynb) stops every rank from storing all the optimizer state.

# %%
stop_cluster()
