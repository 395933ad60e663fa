"""Lesson 02 source (percent format); `python lessons/build.py` turns it into 02_mpi.ipynb."""
# ruff: noqa: E402, F811

# %% [markdown]
# # Lesson 02 — MPI in five minutes
#
# **Learning goals.** After this lesson you can
# 1. start N processes (*ranks*) that run the same program, and tell them apart by `rank`;
# 2. move an array from one rank to another with `send` / `recv`;
# 3. recognise the classic deadlock (everybody sends first) and avoid it with `sendrecv`;
# 4. use the collectives every distributed trainer is built from: `all_reduce`, `broadcast`,
#    `reduce_scatter`, `all_gather`.
#
# **How this notebook runs ranks.** `start_cluster(2)` launches `mpiexec -n 2` *engines* (ipyparallel
# over MPI): two real processes, ranks 0 and 1 of one MPI job. A cell that starts with `%%px` runs
# on every engine at once; other cells run here in the notebook's own process. Where a whole script
# fits better, a `!mpiexec ...` cell launches one. Two ranks suit a 2-core laptop; try 4 if you have
# the cores (MPICH also runs more ranks than cores, just slower).

# %%
import sys

import matplotlib.pyplot as plt
import numpy as np

from minidist_course.notebook import checks, mpiexec_path, start_cluster, stop_cluster

rc = start_cluster(2)  # about 5-10 s: two Python processes start and import MPI
print(f"{len(rc.ids)} engines ready")

# %% [markdown]
# ## 1. Ranks
#
# Every engine runs the same code; only `rank` differs. `dist.init()` wraps MPI's world
# communicator (all processes of the job).

# %%
# %%px
import os

import numpy as np

import minidist.distributed as dist

world = dist.init()
print(f"I am rank {world.rank} of {world.size}, process id {os.getpid()}")

# %% [markdown]
# ## 2. Point to point: `send` and `recv`
#
# A message goes from one rank to one other. The receiver names the sender and provides the buffer;
# minidist checks that the lengths match (a mismatch raises `DistributedError` instead of silently
# truncating).

# %%
# %%px
if world.rank == 0:
    message = np.arange(5, dtype=np.float64)
    world.send(message, 1)
    print("rank 0 sent", message)
else:
    inbox = np.empty(5)
    world.recv(inbox, 0)
    print("rank 1 received", inbox)

# %% [markdown]
# ## 3. A deadlock, and how to avoid it
#
# Suppose both ranks want to *swap* arrays. The obvious code is `send(mine); recv(theirs)` on both.
# For a small message this works: MPI copies it into a buffer ("eager" protocol) and `send` returns.
# For a large one MPI waits until the receiver is ready ("rendezvous") — and the receiver is itself
# stuck in `send`. Nobody ever reaches `recv`. Let us watch both cases in a real script
# (`scripts/deadlock.py`). `MINIDIST_TIMEOUT=3` turns the hang into an error after 3 s.

# %%
mpiexec, python = mpiexec_path(), sys.executable
env = "MINIDIST_TIMEOUT=3 MINIDIST_ABORT_GRACE=0.2"
print("--- 1 kB: fits in MPI's eager buffer")
# !{env} {mpiexec} -n 2 {python} scripts/deadlock.py --nbytes 1000
print("--- 1 MB: rendezvous, both ranks wait in send()")
# !{env} {mpiexec} -n 2 {python} scripts/deadlock.py --nbytes 1000000 2>&1 | grep -m1 Timeout

# %% [markdown]
# Code that works only for small messages is the worst kind: it passes the tests and hangs in
# production. Three ways out: order the calls (even ranks send first, odd ranks receive first); use
# non-blocking `Isend`/`Irecv` and wait for both; or `sendrecv`, which does the latter for you:

# %%
# !{mpiexec} -n 2 {python} scripts/deadlock.py --nbytes 1000000 --fix

# %% [markdown]
# ## 4. Your turn: pass a token around a ring
#
# Ranks in a *ring* each talk to two neighbours: receive from the left, send to the right. Lesson 03's
# all-reduce is built on exactly this. Write `ring_neighbors(rank, size)` returning `(left, right)`.


# %% [exercise ring]
def ring_neighbors(rank, size):
    raise NotImplementedError  # your code here: return (left, right)


# %% [check ring]
checks.ring_neighbors(ring_neighbors)

# %% [markdown]
# Now every rank sends its own rank number to the right and receives its left neighbour's, with one
# `sendrecv` (so it cannot deadlock, whatever the message size). We ship your function to the engines
# with `push`.

# %%
rc[:].push({"ring_neighbors": ring_neighbors})

# %%
# %%px
try:
    left, right = ring_neighbors(world.rank, world.size)
except NotImplementedError:
    received = None  # the exercise is not done yet
else:
    token, received = np.array([float(world.rank)]), np.empty(1)
    world.sendrecv(token, right, received, left)
    print(f"rank {world.rank} got the token of rank {int(received[0])}")

# %% [check ring]
checks.ring_pass(rc[:]["received"])

# %% [markdown]
# ## 5. Collectives
#
# A *collective* is a call every rank of a group makes together. The four that training needs:
#
# | call | before (rank r holds) | after |
# |---|---|---|
# | `all_reduce(a)` | its own `a` | every rank: the elementwise sum over ranks |
# | `broadcast(a, src)` | `a` on `src` | every rank: `src`'s `a` |
# | `reduce_scatter(a)` | its own `a` | rank r: chunk r of the sum |
# | `all_gather(chunk)` | its own chunk | every rank: all chunks, concatenated in rank order |
#
# `reduce_scatter` followed by `all_gather` is an `all_reduce` — that is how the ring does it (lesson 03).

# %%
# %%px
a = np.array([1.0, 2.0, 3.0, 4.0]) * (world.rank + 1)
before = a.copy()
summed = dist.all_reduce(a.copy())  # in place; returns the array
chunk = dist.reduce_scatter(before)  # a new array: this rank's chunk of the sum
gathered = dist.all_gather(chunk)
root = dist.broadcast(before.copy(), src=0)
print(
    f"rank {world.rank}: before {before}  all_reduce {summed}  reduce_scatter {chunk}  all_gather {gathered}"
)

# %%
results = {k: rc[:][k] for k in ("before", "summed", "chunk", "gathered", "root")}
titles = ["before", "all_reduce", "reduce_scatter", "all_gather", "broadcast(src=0)"]
fig, axes = plt.subplots(1, 5, figsize=(13, 1.9))
for ax, key, title in zip(axes, results, titles):
    rows = results[key]
    width = max(len(r) for r in rows)
    grid = np.full((len(rows), width), np.nan)
    for i, r in enumerate(rows):
        grid[i, : len(r)] = r
    ax.imshow(grid, cmap="YlGn", vmin=0, vmax=14)
    for (i, j), v in np.ndenumerate(grid):
        if not np.isnan(v):
            ax.text(j, i, f"{v:g}", ha="center", va="center", fontsize=8)
    ax.set_yticks(range(len(rows)), [f"rank {i}" for i in range(len(rows))])
    ax.set_xticks([])
    ax.set_title(title, fontsize=9)
plt.tight_layout()
plt.show()
assert np.allclose(results["summed"][0], sum(results["before"]))

# %% [markdown]
# ## Summary
# - MPI runs the same program N times; `rank` tells the copies apart.
# - Blocking `send` before `recv` on both sides deadlocks once messages get large; `sendrecv` does not.
# - Collectives are the vocabulary of distributed training: data parallelism all-reduces gradients,
#   ZeRO reduce-scatters them and all-gathers parameters.
#
# Next: [lesson 03](03_ring_allreduce.ipynb) builds `all_reduce` out of `sendrecv` steps.

# %%
stop_cluster()
