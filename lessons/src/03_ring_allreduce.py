"""Lesson 03 source (percent format); `python lessons/build.py` turns it into 03_ring_allreduce.ipynb."""
# ruff: noqa: E402, F811

# %% [markdown]
# # Lesson 03 — The ring all-reduce, step by step
#
# **Learning goals.** After this lesson you can
# 1. trace which chunk every rank sends and holds at every step of a ring all-reduce;
# 2. derive its cost in the alpha-beta model, and explain why it is *bandwidth-optimal*;
# 3. measure it against MPI's built-in `MPI_Allreduce` on real ranks;
# 4. explain why recursive doubling wins for small messages.
#
# Data parallelism all-reduces every gradient every step, so this one collective decides how well
# training scales (Patarasuk & Yuan, "Bandwidth optimal all-reduce algorithms for clusters of
# workstations", JPDC 2009; the algorithm behind Horovod and NCCL).

# %%
import matplotlib.pyplot as plt
import numpy as np

from minidist_course.notebook import checks, start_cluster, stop_cluster
from minidist_tools.perfmodel import step as perfmodel

# %% [markdown]
# ## 1. Simulate the ring on paper
#
# Each of n ranks holds a vector, cut into n chunks. **Reduce-scatter** (n-1 steps): in step s,
# rank r sends one chunk to its right neighbour, which adds it to its own copy of that chunk. After
# n-1 steps each rank holds one chunk that is the *full* sum. **All-gather** (n-1 more steps): the
# complete chunks travel around the ring, overwriting instead of adding.
#
# We simulate it with plain NumPy: `count[r][c]` = how many ranks' contributions chunk c on rank r
# already contains. The rule each rank follows is simple: in the first step send chunk `rank - 1`
# (mod n: rank 0 sends the last chunk); after that, always pass on the chunk you have just received
# (added to your own copy). This is the schedule of `minidist/distributed/algorithms/ring.py`, and it ends
# with rank r holding the complete chunk r.


# %%
def simulate_ring(n):
    """Run the ring on n virtual ranks; return (title, count matrix) after every step."""
    count = np.ones((n, n), dtype=int)  # every rank starts with its own contribution to every chunk
    history = [("start", count.copy())]
    outgoing = [(r - 1) % n for r in range(n)]  # the chunk each rank sends next
    for phase in ("reduce-scatter", "all-gather"):
        for s in range(n - 1):
            new = count.copy()
            for r in range(n):  # all ranks send at once to the right neighbour, which...
                right, c = (r + 1) % n, outgoing[r]
                # ...adds it (reduce-scatter) or stores the complete chunk (all-gather)
                new[right, c] = count[right, c] + count[r, c] if phase == "reduce-scatter" else count[r, c]
            outgoing = [outgoing[(r - 1) % n] for r in range(n)]  # pass on what just arrived
            count = new
            history.append((f"{phase} {s + 1}", count.copy()))
    return history


def draw_ring(history, n):
    fig, axes = plt.subplots(1, len(history), figsize=(2.0 * len(history), 2.3))
    for ax, (title, count) in zip(axes, history):
        ax.imshow(count, cmap="Blues", vmin=0, vmax=n)
        for (r, c), v in np.ndenumerate(count):
            ax.text(c, r, str(v), ha="center", va="center", color="white" if v == n else "black")
        ax.set_title(title, fontsize=8)
        ax.set_xticks(range(n), [f"c{c}" for c in range(n)], fontsize=7)
        ax.set_yticks(range(n), [f"rank {r}" for r in range(n)], fontsize=7)
    plt.suptitle(f"ring all-reduce on {n} ranks: contributions summed in each chunk (n = complete)")
    plt.tight_layout()
    plt.show()


draw_ring(simulate_ring(4), 4)

# %% [markdown]
# Read the picture column by column: after reduce-scatter step 3, rank r holds the complete chunk
# `r` (the dark cell of each row); the all-gather steps then spread those complete chunks
# until every cell is dark.
#
# ## 2. Your turn: which chunk does rank r send at step s?
#
# "Pass on what you just received" needs memory. Write it as a formula instead:
# `send_chunk(rank, step, n)` for the reduce-scatter phase (steps 0 .. n-2), as the real code in
# `minidist/distributed/algorithms/ring.py` computes it. Hint: compare consecutive panels: which cell of each
# row grew?


# %% [exercise sendchunk]
def send_chunk(rank, step, n):
    raise NotImplementedError  # your code here


# %% [check sendchunk]
checks.reduce_scatter_send_chunk(send_chunk)

# %% [markdown]
# ## 3. What does it cost?
#
# Model one message of m bytes as `alpha + m * beta` seconds: `alpha` is the latency (software
# overhead, wire), `beta` the time per byte (1 / bandwidth). Section 1 gave you the rest: how many
# steps each phase takes, and how large the one chunk is that a rank sends in a step when the vector
# of N bytes is cut into n chunks. All ranks send at the same time, on their own links.
#
# **Your turn:** derive the time of the whole all-reduce, `ring_time(nbytes, n, alpha, beta)`, and
# write it as a function. (Count the steps of both phases; what does one step cost?)


# %% [exercise ringtime]
def ring_time(nbytes, n, alpha, beta):
    raise NotImplementedError  # your code here


# %% [check ringtime]
checks.ring_time(ring_time)

# %% [markdown reveal]
# **The answer.** Try first; then open this cell (click it, or the bar at its left).
#
# `2(n-1)` steps of one `N/n`-byte chunk each,
#
# $$T_{ring} = 2(n-1)\,\alpha + \frac{2(n-1)}{n} N \beta .$$
#
# The bandwidth term hardly grows with n (it tends to `2 N beta`): every rank sends and receives
# about 2N bytes whatever the number of ranks, which is the minimum any all-reduce needs. That is
# what *bandwidth-optimal* means. The latency term, though, grows linearly with n.

# %% [markdown]
# ## 4. Measure it on real ranks
#
# Two engines, each a real MPI rank. We time minidist's ring, recursive doubling, and MPI's built-in
# `MPI_Allreduce` (`algorithm="mpi"`) at a few sizes, and fit alpha and beta from a ping-pong
# (the collectives benchmark, `benchmarks/collectives.py`, does the same over more sizes).

# %%
rc = start_cluster(2)

# %%
# %%px
import time

import numpy as np
from mpi4py import MPI

import minidist.distributed as dist
from minidist_tools.perfmodel import step as perfmodel

world = dist.init()
alpha, beta = perfmodel.measure_alpha_beta(world, iters=5)
sizes = [1 << 10, 1 << 14, 1 << 17, 1 << 20, 1 << 22]  # 1 KiB .. 4 MiB
timings = {}
algorithms = ("ring", "recursive_doubling", "mpi")
for nbytes in sizes:
    a = np.ones(nbytes // 4, dtype=np.float32)
    best = dict.fromkeys(algorithms, float("inf"))
    for _ in range(8):  # interleaved rounds: a burst of load from elsewhere hits every algorithm alike
        for algorithm in algorithms:
            dist.barrier()
            start = time.perf_counter()
            dist.all_reduce(a, algorithm=algorithm)
            best[algorithm] = min(best[algorithm], time.perf_counter() - start)
    for algorithm in algorithms:  # the slowest rank's time is the collective's time
        timings[algorithm, nbytes] = world.mpi.allreduce(best[algorithm], op=MPI.MAX)

# %%
alpha, beta = rc[0]["alpha"], rc[0]["beta"]
timings, sizes = rc[0]["timings"], rc[0]["sizes"]
print(f"fitted: alpha = {alpha * 1e6:.1f} us, 1/beta = {1 / beta / 1e9:.1f} GB/s")
plt.figure(figsize=(6.5, 4))
for algorithm, marker in (("ring", "o"), ("recursive_doubling", "s"), ("mpi", "^")):
    plt.loglog(sizes, [timings[algorithm, s] * 1e6 for s in sizes], marker, label=f"measured: {algorithm}")
model = [perfmodel.ring_all_reduce_time(s, 2, alpha, beta) * 1e6 for s in sizes]
plt.loglog(sizes, model, "k--", label="alpha-beta model, ring")
plt.xlabel("message size (bytes)")
plt.ylabel("time (us)")
plt.title("all_reduce on 2 ranks of this machine")
plt.legend(fontsize=8)
plt.grid(True, which="both", alpha=0.3)
plt.show()

# %% [markdown]
# On one machine the "network" is shared memory, and the model ignores the time to *add* the chunks
# (a third constant, gamma, in `benchmarks/cost_model.py`), so expect agreement within a factor of
# about two, best for large messages. On a shared 2-core laptop the numbers are noisy: re-run the cell.
#
# ## 5. Why recursive doubling wins for small messages
#
# Recursive doubling takes `log2 n` steps: in step k, rank r swaps its *whole* vector with rank
# `r XOR 2^k` and adds. Cost: `log2(n) (alpha + N beta)`. Far fewer messages than the ring's
# `2(n-1)`, but each carries all N bytes. For small N the alpha terms dominate and doubling wins; for
# large N the ring's `2(n-1)/n N beta` wins. The crossover, for n = 64 ranks on a cluster network:

# %%
n, a_net, b_net = 64, 5e-6, 1 / 12.5e9  # 5 us latency, 100 Gb/s
sizes_net = np.logspace(2, 9, 60)
ring = [perfmodel.ring_all_reduce_time(s, n, a_net, b_net) for s in sizes_net]
doubling = [perfmodel.recursive_doubling_time(s, n, a_net, b_net) for s in sizes_net]
cross = sizes_net[np.argmax(np.array(ring) < np.array(doubling))]
plt.figure(figsize=(6.5, 4))
plt.loglog(sizes_net, ring, label="ring: 2(n-1) alpha + 2(n-1)/n N beta")
plt.loglog(sizes_net, doubling, label="recursive doubling: log2(n) (alpha + N beta)")
plt.axvline(cross, color="gray", ls=":", label=f"crossover ~ {cross / 1e3:.0f} kB")
plt.xlabel("message size N (bytes)")
plt.ylabel("predicted time (s)")
plt.title(f"n = {n} ranks, alpha = 5 us, 100 Gb/s")
plt.legend(fontsize=8)
plt.grid(True, which="both", alpha=0.3)
plt.show()

# %% [markdown]
# This is why `algorithm="auto"` (`minidist/distributed/tuning.py`) picks recursive doubling below a size
# threshold and a bandwidth-optimal algorithm above it — as MPICH and NCCL do.
#
# ## Summary
# - Ring all-reduce = reduce-scatter + all-gather, 2(n-1) steps of N/n bytes each.
# - Its bandwidth cost is nearly independent of n; its latency cost grows with n.
# - Small messages want few steps (recursive doubling), large ones want few bytes per rank (ring).
#
# Next: [lesson 04](04_data_parallel.ipynb) uses all-reduce to train one model on many ranks.

# %%
stop_cluster()
