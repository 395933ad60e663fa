"""Lesson 12 source (percent format); `python lessons/build.py` turns it into 12_network_bottleneck.ipynb."""
# ruff: noqa: E402, F811

# %% [markdown]
# # Lesson 12 — The network as the bottleneck
#
# **Learning goals.** After this lesson you can
# 1. start a cluster of "machines" on one laptop (network namespaces joined by links) and train with
#    DDP across them, the bytes really crossing a TCP link;
# 2. read one training step's timeline across nodes, and see where the ranks wait for the network;
# 3. slow the link down (100 Mbit/s, 1 Gbit/s) and find, with `minidist.perfmodel`, the number of nodes
#    past which adding more stops paying off;
# 4. count the bytes a flat ring and a hierarchical all-reduce put on each node's link;
# 5. count what gradient compression (fp16, PowerSGD) saves, and say what it costs.
#
# Until now every message went through shared memory: all ranks lived on one machine. Real training
# spans machines ("nodes"), each with a few GPUs joined by a fast link inside (NVLink: hundreds of
# GB/s) and a much slower network between them (Ethernet or InfiniBand: 1-50 GB/s). This lesson builds
# such a cluster in a box and watches what the slow link does to a training step.

# %%
import contextlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

from minidist import perfmodel, trace
from minidist.cluster import Cluster, cluster_available
from minidist.notebook import checks, mpiexec_path

available, reason = cluster_available()
print("a cluster of network namespaces:", "available" if available else f"not available: {reason}")

# %% [markdown]
# ## 1. A cluster in a box
#
# `minidist.cluster` makes each node a Linux **network namespace**: a separate network stack with its
# own interface, address and (in a UTS namespace) host name. A virtual Ethernet cable (a *veth* pair)
# joins each node to a bridge, the box's switch. MPI's launcher starts the ranks inside the namespaces
# (`mpiexec -launcher rsh` with a small script that enters them), and `UCX_TLS=tcp,self` makes ranks
# of different nodes talk over TCP through the veth links; ranks of the same node still use shared
# memory, as on a real machine. From a shell:
#
# ```
# sudo python -m minidist.cluster up --nodes 2 --ranks-per-node 2 --bandwidth 1gbit
# sudo python -m minidist.cluster run -- python examples/train_mlp.py     # 4 ranks, 2 per node
# sudo python -m minidist.cluster status                                  # nodes, links, bytes sent
# sudo python -m minidist.cluster down
# ```
#
# Namespaces need root (the `CAP_NET_ADMIN` capability). Without it, this lesson runs its ranks on this
# machine and *pretends* blocks of 2 ranks are nodes (`MINIDIST_RANKS_PER_NODE=2`: minidist's node
# topology treats ranks 0-1 as one node, 2-3 as another). The node-aware algorithms then behave as on
# a cluster, but every byte goes through shared memory: the cells that need a real link say so, and show
# the model's prediction instead of a measurement.

# %%
stack = contextlib.ExitStack()  # leaving it (the last cell, or the kernel's exit) removes the cluster
cluster = stack.enter_context(Cluster.up(nodes=2, ranks_per_node=2)) if available else None
if cluster:
    print(f"nodes {cluster.nodes}, {cluster.world_size} ranks; every run starts with")
    print("  " + " ".join(cluster.mpiexec_command()))
else:
    print(f"no cluster ({reason.split(':')[0]}): 4 ranks on this machine, 2 per simulated node")

# %% [markdown]
# `scripts/network_step.py` measures, in one launch (starting ranks costs seconds), what this lesson
# needs: all-reduces of 0.5 and 2 MiB with two algorithms, then three steps of DDP training of an MLP
# (3 hidden layers of 512: 0.8 M parameters, 3.2 MB of float32 gradients) with each communication
# hook asked for, the last step traced. `measure` runs it on the cluster's 4 ranks (or on 4 local
# ranks) and also reads how many bytes left each node through its link.

# %%
python, OUT = sys.executable, Path(tempfile.mkdtemp(prefix="minidist_lesson12_"))
MEASURE = ["--mb", 0.5, 2, "--algorithms", "ring", "hierarchical", "--hooks", "none", "fp16", "powersgd"]


def measure(name, *flags):
    """Run scripts/network_step.py on 4 ranks; return its results, with "link_bytes": {node: bytes sent}."""
    out = OUT / f"{name}.json"
    command = [python, "scripts/network_step.py", str(out), *map(str, flags)]
    if cluster:
        before = cluster.link_bytes()
        proc = cluster.run(command, timeout=300)
        sent = {node: rx - before[node][0] for node, (rx, _) in cluster.link_bytes().items()}
    else:
        env = dict(os.environ, MINIDIST_RANKS_PER_NODE="2", OMP_NUM_THREADS="1")
        cmd = [mpiexec_path(), "-n", "4", *command]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        sent = None  # shared memory: no link to count on
    if proc.returncode != 0:
        raise RuntimeError(f"network_step.py failed:\n{proc.stdout}\n{proc.stderr}")
    print(proc.stdout.strip())
    return json.loads(out.read_text()) | {"link_bytes": sent}


fast = measure("unshaped", *MEASURE)
print("\nhost of each rank:", fast["hosts"], " node of each rank:", fast["node_of_rank"])
if fast["link_bytes"]:
    for node, sent in fast["link_bytes"].items():
        print(f"{node} sent {sent / 1e6:.1f} MB through its link")

# %% [markdown]
# Each rank reports the host it runs on: on the cluster, the namespace's name. `node_of_rank` is what
# `minidist.distributed.topology.node_layout()` found (an MPI shared-memory split: ranks that can share
# memory are on one node), and what DDP, `ProcessMesh` and the hierarchical all-reduce build on. The
# link counters are the proof that the bytes went over TCP: tens of megabytes for a few all-reduces
# and training steps.
#
# ## 2. One step, across nodes
#
# The last DDP step of each run was traced (`minidist.trace`, lesson 04): forward, backward and the
# optimizer on each rank's main thread, and each bucket's all-reduce on DDP's communication thread.
# Rows are grouped by node.

# %%
COLORS = {"forward": "tab:blue", "backward": "tab:orange", "optimizer": "tab:green", "comm": "tab:red"}
COLORS |= {"wait": "tab:gray", "launch": "black"}


def draw_step(run, hosts, ax, title):
    """A Gantt chart of one traced step: a row per rank and thread, in ms since the step's barrier."""
    rows = []
    for rank, events in enumerate(run["events"]):
        for thread in sorted({e["thread"] for e in events}, key=lambda t: t != "MainThread"):
            y = len(rows)
            rows.append(f"{hosts[rank]} rank {rank} {'main' if thread == 'MainThread' else 'comm'}")
            for e in sorted(events, key=lambda e: e["start"] - e["end"]):  # long spans first, short on top
                if e["thread"] == thread:
                    span = (e["start"] * 1e3, (e["end"] - e["start"]) * 1e3)
                    ax.broken_barh([span], (y - 0.35, 0.7), color=COLORS.get(e["cat"], "tab:purple"))
    ax.set_yticks(range(len(rows)), rows, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("time since the step's barrier (ms)")
    ax.set_title(title)


fig, ax = plt.subplots(figsize=(11, 3.2))
draw_step(fast["ddp"][0], fast["hosts"], ax, "one DDP step on 2 nodes x 2 ranks, link unshaped")
ax.legend(
    handles=[plt.Rectangle((0, 0), 1, 1, color=c) for c in COLORS.values()],
    labels=list(COLORS),
    ncol=6,
    fontsize=8,
    loc="lower right",
)
plt.tight_layout()
plt.show()
path = OUT / "step_trace.json"
trace.save_chrome_trace(path, fast["ddp"][0]["events"])
print(f"open {path} in https://ui.perfetto.dev to zoom into single spans")

# %% [markdown]
# **Reading it.** The red boxes on the comm rows are the bucket all-reduces (4 buckets of about 1 MiB,
# the last layer's first). They start inside backward — the overlap of lesson 04 — and a rank cannot
# finish backward before its last bucket is averaged: the gray "wait" box. An all-reduce ends at the
# same moment on all four ranks, because it is one collective: the slowest link sets the pace for
# everyone, ranks on the fast in-node link included.
#
# ## 3. Slow the link down
#
# `cluster.set_bandwidth("100mbit")` shapes both directions of each node's link with Linux's token
# bucket filter (`tc ... tbf`): a node may send at most 100 Mbit/s = 12.5 MB/s, as over an old Ethernet.
# We repeat the measurement at 100 Mbit/s and 1 Gbit/s (the link above was unshaped: as fast as the
# kernel copies, several GB/s).

# %%
LINKS = {"100mbit": 100e6, "1gbit": 1e9}  # bits per second
runs = {"unshaped": fast}
if cluster:
    for rate in LINKS:
        cluster.set_bandwidth(rate)
        print(f"--- link {rate}:")
        runs[rate] = measure(rate, *MEASURE)
    cluster.set_bandwidth(None)
else:
    print("no cluster: no link to slow down; section 4 predicts these speeds with the model instead")


def median_ms(seconds):
    return float(np.median(seconds)) * 1e3


for name, r in runs.items():
    plain = r["ddp"][0]
    print(f"{name:>9}: DDP step {median_ms(plain['step_s']):7.1f} ms")

# %% [markdown]
# On the cluster, the step at 100 Mbit/s takes several times as long as unshaped: the 3.2 MB of
# gradients must cross the link, at 12.5 MB/s. The compute did not change; only the wait did. The
# slow step's timeline shows it:

# %%
slowest_link = "100mbit" if "100mbit" in runs else "unshaped"
fig, ax = plt.subplots(figsize=(11, 3.2))
draw_step(runs[slowest_link]["ddp"][0], fast["hosts"], ax, f"the same step, link {slowest_link}")
plt.tight_layout()
plt.show()

# %% [markdown]
# ## 4. The sweet spot: how many nodes?
#
# Lesson 09's model, with the network as its only link: a step is `compute / G` plus the ring
# all-reduce of the gradients over the G ranks. First, fit the link's `alpha` (seconds per message) and
# `beta` (seconds per byte) to the measured ring all-reduces: a ring of n ranks takes
# `2(n-1) alpha + 2(n-1)/n N beta` (lesson 03), linear in the message size N.


# %%
def fit_link(run):
    """(alpha, beta) of the link from the ring all-reduces of one run (4 ranks)."""
    ring = [r for r in run["allreduce"] if r["algorithm"] == "ring"]
    n = len(run["hosts"])
    x = np.array([2 * (n - 1) / n * r["nbytes"] for r in ring])  # bytes each rank sends
    t = np.array([min(r["seconds"]) for r in ring]) / (2 * (n - 1))  # time per ring step, x per step
    alpha, beta = perfmodel.fit_alpha_beta(x / (2 * (n - 1)), t)
    return alpha, beta


links = {}
for name, r in runs.items():
    links[name] = fit_link(r)
for name, bps in LINKS.items():
    links.setdefault(name, (50e-6, 8 / bps))  # no cluster: the nominal speed, a typical TCP latency
for name, (alpha, beta) in links.items():
    print(f"{name:>9}: alpha {alpha * 1e6:6.0f} us, {1 / beta / 1e6:8.1f} MB/s")

# %% [markdown]
# Now the question of lesson 09 for these links: a model of 125 M parameters (GPT-2 small; gradients in
# float32, 0.5 GB), a global batch of 512 sequences of 1,024 tokens, on nodes of 8 GPUs that sustain
# 100 TFLOP/s each. The gradients cross the slow link; the model counts every rank of the ring on it.

# %%
work = perfmodel.Workload(params=125e6, global_batch=512, tokens_per_sample=1024, bytes_per_value=4)
nodes = [1, 2, 4, 8, 16, 32, 64]
fig, ax = plt.subplots(figsize=(7, 4))
for name, (alpha, beta) in sorted(links.items(), key=lambda kv: -kv[1][1]):
    hw = perfmodel.Hardware(flops=1e14, alpha=alpha, beta=beta)
    curve = perfmodel.scaling_curve(work, hw, [8 * k for k in nodes])
    line = ax.loglog(nodes, [p.speedup for p in curve], "o-", label=f"link {name}")[0]
    best = max(curve, key=lambda p: p.speedup)
    ax.plot(best.devices / 8, best.speedup, "*", ms=16, color=line.get_color())
ax.loglog(nodes, [8 * k for k in nodes], "k:", label="ideal")
ax.set_xlabel("nodes of 8 GPUs")
ax.set_ylabel("speedup over 1 GPU")
ax.set_title("125 M parameters, data parallel (star: the fastest)")
ax.legend(fontsize=8)
plt.tight_layout()
plt.show()

# %% [markdown]
# On a slow link, adding nodes can make the step *slower*: each rank computes less, but the ring's
# all-reduce does not shrink (each rank still sends about twice the gradients), and its latency term
# grows with every rank. Two levers remain: send the slow link fewer bytes (section 5), and send fewer
# bytes at all (section 6).
#
# ## 5. Hierarchy: keep the ring off the slow link
#
# The ring of lesson 03 runs over all ranks in order; with ranks placed in blocks per node (ranks 0-1
# on node 0, 2-3 on node 1), some of its edges stay inside a node and some cross. The
# **hierarchical** all-reduce (`algorithm="hierarchical"`; Horovod's hierarchical allreduce, Sergeev &
# Del Balso 2018; NCCL's trees) does it in three phases:
#
# 1. reduce inside each node, to the node's *leader* (its local rank 0), over the fast link;
# 2. all-reduce among the leaders only (one per node), across the slow link;
# 3. broadcast the result inside each node.
#
# **Your turn.** Write `inter_node_bytes(nbytes, nodes, ranks_per_node, algorithm)`: the bytes that
# leave *one node* through its link during one all-reduce of `nbytes`, for `algorithm="ring"` (one ring
# over all `nodes x ranks_per_node` ranks, in blocks per node) and `"hierarchical"` (phase 2 a ring over
# the leaders). Bytes inside a node do not count. Then compare with what the cluster's link counters
# said, below the check.


# %% [exercise linkbytes]
def inter_node_bytes(nbytes, nodes, ranks_per_node, algorithm):
    raise NotImplementedError  # your code here: bytes one node sends to other nodes


# %% [check linkbytes]
checks.inter_node_bytes(inter_node_bytes)

# %% [markdown reveal]
# **The answer.** Try first; then open this cell (click it, or the bar at its left).
#
# In a ring over G = nodes x ranks_per_node ranks in blocks, exactly one edge leaves each node (the
# node's last rank sends to the next node's first), and over a whole all-reduce each edge carries what
# one rank sends: `2(G-1)/G x nbytes`. Hierarchical: the leaders' ring has `nodes` members, so
# `2(nodes-1)/nodes x nbytes`. Both are 0 on one node. With 8 ranks per node and 2 nodes, 1.875 x nbytes
# against 1 x nbytes; and the ring's `2(G-1)` latencies on the slow link become `2(nodes-1)`.

# %%
bytes_per_node = checks.stand_in("inter_node_bytes")  # your function, once it passes, gives the same
for name, r in runs.items():
    times = {a["algorithm"]: min(a["seconds"]) for a in r["allreduce"] if a["nbytes"] == 2 * 2**20}
    print(
        f"{name:>9}: 2 MiB all-reduce ring {times['ring'] * 1e3:7.1f} ms, "
        f"hierarchical {times['hierarchical'] * 1e3:7.1f} ms; bytes out of each node predicted: ring "
        f"{bytes_per_node(2 * 2**20, 2, 2, 'ring') / 1e6:.2f} MB, "
        f"hierarchical {bytes_per_node(2 * 2**20, 2, 2, 'hierarchical') / 1e6:.2f} MB"
    )

# %% [markdown]
# On a slow link the hierarchical all-reduce wins by about the ratio of the bytes each node sends; on
# the unshaped link (or on one machine) its extra phases cost more than they save, which is why
# `algorithm="auto"` picks it only when the group spans nodes and its tuning table says it is faster
# (`minidist/distributed/tuning.py`). Real clusters place ranks exactly as here: `mpiexec` fills a node
# before the next one, and `ProcessMesh` keeps each tensor-parallel group inside a node (it warns with
# a `PlacementWarning` when a layout cannot).
#
# ## 6. Compression: send fewer bytes
#
# DDP lets a **communication hook** replace the all-reduce of each bucket (PyTorch's
# `register_comm_hook`): `fp16_compress_hook` casts the gradients to 16 bits for the all-reduce (half
# the bytes), `powerSGD_hook` sends a low-rank approximation (Vogels, Karimireddy & Jaggi, "PowerSGD",
# NeurIPS 2019). PowerSGD writes each m x n gradient matrix M as P Q^T with P of shape m x r and Q of
# shape n x r (r small, the *rank*): it all-reduces P, then Q, instead of M. What it drops is kept
# on each rank (*error feedback*) and added to the next step's gradient, so nothing is lost for good,
# only delayed. Like PyTorch, minidist sends a tensor uncompressed when that is not at least
# `min_compression_rate` times more (biases, small matrices).
#
# **Your turn.** Write `powersgd_values(shapes, rank, min_compression_rate)`: how many values PowerSGD
# all-reduces in one step for parameters of the given shapes (a list of tuples). A tensor of more than
# two dimensions is flattened to a matrix of its first dimension by all the others.


# %% [exercise powersgd]
def powersgd_values(shapes, rank, min_compression_rate):
    raise NotImplementedError  # your code here: values all-reduced per step


# %% [check powersgd]
checks.powersgd_values(powersgd_values)

# %% [markdown reveal]
# **The answer.** Try first; then open this cell (click it, or the bar at its left).
#
# For each tensor: if it has at least 2 dimensions, with m its first dimension and n the product of the
# others, and `(m + n) r x min_compression_rate < m n`, it sends P and Q: `(m + n) r` values; otherwise
# all its `m n` values. The MLP above at rank 4: its three 512 x 512 matrices send 4,096 values each
# instead of 262,144; its biases and the 10 x 512 output layer go whole.

# %%
count = checks.stand_in("powersgd_values")
shapes = [(512, 512)] * 3 + [(512,)] * 3 + [(10, 512), (10,)]
plain, compressed = sum(int(np.prod(s)) for s in shapes), count(shapes, 4, 2)
ratio = plain / compressed
print(f"the lesson's MLP: {plain:,} values; PowerSGD of rank 4 sends {compressed:,} ({ratio:.0f}x less)")
for name, r in runs.items():
    line = ", ".join(
        f"{d['hook']} {median_ms(d['step_s']):6.1f} ms ({np.mean(d['bytes_per_step']) / 1e6:.2f} MB sent)"
        for d in r["ddp"]
    )
    print(f"{name:>9}: DDP step with hook {line}")

# %% [markdown]
# The bytes each rank sends per step follow the counts: fp16 halves them, PowerSGD sends a few
# percent. On the slow link that is most of the step; on the fast one, compression's extra work (two
# small matrix products per matrix, an orthogonalisation, the casts) can cost more than it saves.
# The price is accuracy: fp16 rounds every gradient (11 significant bits), and PowerSGD's
# approximation, even with error feedback, slows convergence somewhat; rank 1-4 is often enough for
# large models, and the loss of the rest is measured in `benchmarks/README.md` ("Gradient
# compression (issue 19)").
#
# ## Summary
# - Across machines, every step waits for the slowest link: the all-reduce of the gradients over the
#   network, not the compute, sets the step time when the link is slow.
# - Past the sweet spot, adding nodes slows training down: compute shrinks with G, the ring's bytes per
#   rank do not, and its latency grows.
# - Keep the big traffic inside a node: the hierarchical all-reduce puts one ring of leaders on the slow
#   link; tensor parallelism stays inside a node.
# - Send fewer bytes: fp16 halves them, PowerSGD divides them by a hundred, at some cost in accuracy.

# %%
stack.close()  # removes the namespaces, links and bridge of the cluster
