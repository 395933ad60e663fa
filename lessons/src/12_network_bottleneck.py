"""Lesson 12 source (percent format); `python lessons/build.py` turns it into 12_network_bottleneck.ipynb."""
# ruff: noqa: E402, F811

# %% [markdown]
# # Lesson 12 — The network as the bottleneck
#
# **Learning goals.** After this lesson you can
# 1. start a cluster of "machines" on one laptop (network namespaces joined by links) and train with
#    DDP across them, the bytes really crossing a TCP link;
# 2. read one training step's timeline across nodes, and see where the ranks wait for the network;
# 3. slow the link down (100 Mbit/s, 1 Gbit/s) and find, with `minidist_tools.perfmodel.network`, the
#    number of nodes past which adding more stops paying off;
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
import timeit
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

from minidist_course.notebook import checks, mpiexec_path
from minidist_tools import timeline
from minidist_tools.cluster import Cluster, cluster_available
from minidist_tools.perfmodel import network as pn
from minidist_tools.perfmodel import step as perfmodel

available, reason = cluster_available()
print("a cluster of network namespaces:", "available" if available else f"not available: {reason}")

# %% [markdown]
# ## 1. A cluster in a box
#
# `minidist_tools.cluster` makes each node a Linux **network namespace**: a separate network stack with its
# own interface, address and (in a UTS namespace) host name. A virtual Ethernet cable (a *veth* pair)
# joins each node to a bridge, the box's switch. MPI's launcher starts the ranks inside the namespaces
# (`mpiexec -launcher rsh` with a small script that enters them), and `UCX_TLS=tcp,self` makes ranks
# of different nodes talk over TCP through the veth links; ranks of the same node still use shared
# memory, as on a real machine. From a shell:
#
# ```
# sudo minidist cluster up --nodes 2 --ranks-per-node 2 --bandwidth 1gbit
# sudo minidist cluster run -- python examples/train_mlp.py     # 4 ranks, 2 per node
# sudo minidist cluster status                                  # nodes, links, bytes sent
# sudo minidist cluster down
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


fast = measure("fast", *MEASURE)
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
                    color = COLORS.get(e["cat"], "tab:purple")
                    ax.broken_barh([span], (y - 0.35, 0.7), color=color, edgecolor="white", lw=0.5)
    ax.set_yticks(range(len(rows)), rows, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("time since the step's barrier (ms)")
    ax.set_title(title)


fig, ax = plt.subplots(figsize=(11, 3.2))
where = "link unshaped" if cluster else "simulated nodes, shared memory"
draw_step(fast["ddp"][0], fast["hosts"], ax, f"one DDP step on 2 nodes x 2 ranks, {where}")
ax.legend(
    handles=[plt.Rectangle((0, 0), 1, 1, color=c) for c in COLORS.values()],
    labels=list(COLORS),
    fontsize=8,
    loc="upper left",
    bbox_to_anchor=(1.0, 1.0),  # beside the chart, not over the last row
)
plt.tight_layout()
plt.show()
path = OUT / "step_trace.json"
timeline.save_chrome_trace(path, fast["ddp"][0]["events"])
print(f"open {path} in https://ui.perfetto.dev to zoom into single spans")

# %% [markdown]
# **Reading it.** The red boxes on the comm rows are the buckets' all-reduces (`bucket_cap_mb=1`: six
# buckets, the last layer's gradients first). They start inside backward, the overlap of lesson 04, but
# this MLP's backward takes a few milliseconds and its all-reduces tens: almost all of the
# communication is exposed. The gray "wait for gradients" box is the main thread waiting for the
# communication thread; the last bucket (the first layer's gradients, ready only when backward ends) is
# then all-reduced on the main thread, the red box on a main row. An all-reduce ends at about the same
# moment on all four ranks: it is one collective, and the slowest link sets the pace for everyone,
# ranks that share a node included.
#
# ## 3. Slow the link down
#
# `cluster.set_bandwidth("100mbit")` shapes both directions of each node's link with Linux's token
# bucket filter (`tc ... tbf`): a node may send at most 100 Mbit/s = 12.5 MB/s, as over an old Ethernet.
# We repeat the measurement at 100 Mbit/s and 1 Gbit/s (the link above was unshaped: as fast as the
# kernel copies, several GB/s).

# %%
LINKS = {"100mbit": 100e6, "1gbit": 1e9}  # bits per second
runs = {"unshaped" if cluster else "shared memory": fast}  # without a cluster: no link at all
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
# gradients must cross each node's link at 12.5 MB/s, a quarter of a second at the very least. The
# compute did not change; only the wait did. The slow step's timeline shows it (without a cluster,
# the same unshaped step again):

# %%
slowest_link = "100mbit" if "100mbit" in runs else next(iter(runs))
fig, ax = plt.subplots(figsize=(11, 3.2))
draw_step(runs[slowest_link]["ddp"][0], fast["hosts"], ax, f"the same step, link {slowest_link}")
plt.tight_layout()
plt.show()

# %% [markdown]
# ## 4. The sweet spot: how many nodes?
#
# `minidist_tools.perfmodel.network` prices a **two-level network**: inside a node, messages go through
# shared memory or NVLink (`intra_alpha`, `intra_beta`); between nodes, through one link per node
# (`inter_alpha`: seconds per message, `inter_beta`: seconds per byte). A ring all-reduce over ranks in
# blocks has one edge leaving each node, and each of its steps waits for the slowest edge: a link, as
# soon as there are two nodes.
#
# First, fit each link's `alpha` and `beta` to the ring all-reduces measured above (0.5 and 2 MiB): a
# ring step moves a quarter of the message over the link, and `perfmodel.fit_alpha_beta` fits
# `t = alpha + beta x bytes` to the steps' times (weighting the points by 1/t). Then compare the
# model with every measured point.


# %%
def fit_link(run):
    """(alpha, beta) of the link from the ring all-reduces of one run on 2 nodes x 2 ranks."""
    ring = [r for r in run["allreduce"] if r["algorithm"] == "ring"]
    n = len(run["hosts"])
    nbytes = np.array([r["nbytes"] for r in ring], dtype=float)
    seconds = np.array([min(r["seconds"]) for r in ring])  # the fastest sample: the least disturbed
    alpha, beta = perfmodel.fit_alpha_beta(nbytes / n, seconds / (2 * (n - 1)))  # per ring step
    if beta <= 0:  # a loaded machine slowed the small message more than the large: no slope to fit
        alpha, beta = 0.0, seconds[-1] / (2 * (n - 1)) / (nbytes[-1] / n)  # all of it bandwidth
    return alpha, beta


links = {}
for name, r in runs.items():
    if cluster:
        alpha, beta = fit_link(r)
        net = pn.Network(0.0, 0.0, alpha, beta, name=name)
        ring = [a for a in r["allreduce"] if a["algorithm"] == "ring"]
        model = [pn.flat_all_reduce_time(a["nbytes"], 2, 2, net) for a in ring]
        errors = pn.relative_errors(model, [min(a["seconds"]) for a in ring])
        print(
            f"{name:>9}: alpha {alpha * 1e6:5.0f} us, {1 / beta / 1e6:7.1f} MB/s; model vs measured "
            + ", ".join(f"{a['nbytes'] / 2**20:g} MiB {e:+.0%}" for a, e in zip(ring, errors))
        )
        links[name] = (alpha, beta)
for name in ("100mbit", "1gbit", "10gbit"):
    links.setdefault(name, (50e-6, pn.link_beta(name)))  # not measured: nominal speed, TCP-like latency
print("links for the model:", {k: f"{8 / v[1] / 1e9:g} Gbit/s" for k, v in links.items()})

# %% [markdown]
# With two points per link a line goes through both (errors of 0 %), unless the fitted latency came
# out negative and was clipped to 0: then the small message shows the error (`benchmarks/scaling.py`
# fits more points and reports the model's error on each). What matters is the fitted bandwidth: close
# to the shaped rate (12.5 MB/s for 100 Mbit/s, 125 MB/s for 1 Gbit/s), a little above it when a
# message fits in the filter's burst (the token bucket lets a burst through at full speed), a little
# below it for the frames' headers. The fitted latency is noisy: two points on a shared machine. The
# unshaped link is the kernel copying memory: a few GB/s.
#
# Now lesson 09's question for these links: GPT-2 small (125 M parameters, gradients in bf16: 0.25 GB)
# with GPT-3's batch for that size (Brown et al. 2020, Table 2.1: 0.5 M tokens, here 512 sequences of
# 1,024), on nodes of 8 GPUs of 100 TFLOP/s joined inside by NVLink (5 us, 100 GB/s).
# `pn.predict_nodes` prices one DDP step on `nodes x 8` GPUs with the hierarchical all-reduce;
# `perfmodel.sweet_spot` picks the most nodes that still run at 75 % efficiency or better (the star).

# %%
work = perfmodel.Workload(params=125e6, global_batch=512, tokens_per_sample=1024, bytes_per_value=2)
node_counts = [1, 2, 4, 8, 16, 32, 64]


def plot_scaling(ax, title, networks, compression=None):
    """Speedup over one GPU against nodes of 8 GPUs, one line per network; a star at the sweet spot."""
    for net in networks:
        curve = [
            pn.predict_nodes(work, 1e14, net, k, 8, algorithm="hierarchical", compression=compression)
            for k in node_counts
        ]
        line = ax.loglog(node_counts, [p.speedup for p in curve], "o-", label=f"link {net.name}")[0]
        best = perfmodel.sweet_spot(curve, min_efficiency=0.75)
        ax.plot(best.devices / 8, best.speedup, "*", ms=16, color=line.get_color())
        print(f"{title}, link {net.name:>8}: sweet spot {best.devices // 8:>2} node(s), {best.speedup:5.1f}x")
    ax.loglog(node_counts, [8 * k for k in node_counts], "k:", label="ideal")
    ax.set_xlabel("nodes of 8 GPUs")
    ax.set_title(title)
    ax.legend(fontsize=8)


# The links' bandwidths as fitted, but a latency of 50 us for all: what we measured as alpha is mostly
# Python and MPI on a shared CPU, not the wire (a GPU cluster's NICs start a message in microseconds).
networks = [
    pn.Network(5e-6, 1 / 100e9, 50e-6, beta, name=name)
    for name, (_, beta) in sorted(links.items(), key=lambda kv: -kv[1][1])  # slowest first
]
fig, ax = plt.subplots(figsize=(7, 4))
plot_scaling(ax, "GPT-2 small, plain DDP", networks)
ax.set_ylabel("speedup over 1 GPU")
plt.tight_layout()
plt.show()

# %% [markdown]
# On a slow link, adding nodes makes the step *slower*: each GPU computes less, but every node's link
# carries about as many bytes per step however many nodes there are, and the ring's latencies grow
# with every node. At 1 Gbit/s two nodes are several times slower than one (the gradients take about
# two seconds to cross, the compute of 8 GPUs half a second); even at 10 Gbit/s the curve stays flat,
# and the sweet spot is one node. Only a fast fabric (InfiniBand, 100-400 Gbit/s per GPU) lets
# hundreds of GPUs help. Without faster hardware, two levers remain: put fewer bytes on the link
# (section 5), and send fewer bytes at all (section 6).
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
# the leaders). Bytes inside a node do not count. Below the check, your counts sit beside the 2 MiB
# all-reduces measured above. (`tests/course/test_lessons.py` checks the reference answer against the bytes
# minidist's all-reduces send, and against a cluster's link counters.)


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
bytes_per_node = checks.yours_or_minidists(inter_node_bytes)
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
# instead of 262,144, the 10 x 512 output layer 2,088 instead of 5,120, and its biases go whole.

# %%
count = checks.yours_or_minidists(powersgd_values)
shapes = [(512, 512)] * 3 + [(512,)] * 3 + [(10, 512), (10,)]
plain, compressed = sum(int(np.prod(s)) for s in shapes), count(shapes, 4, 2)
ratio = plain / compressed
print(f"the lesson's MLP: {plain:,} values; PowerSGD of rank 4 sends {compressed:,} ({ratio:.0f}x less)")
for name, r in runs.items():
    line = ", ".join(
        f"{d['hook']} {median_ms(d['step_s']):6.1f} ms ({np.mean(d['payload_per_step']) / 1e6:.2f} MB)"
        for d in r["ddp"]
    )
    print(f"{name:>9}, DDP step (and the bytes all-reduced per step): {line}")

# %% [markdown]
# The bytes all-reduced per step (`ddp.comm_stats`, DDP's account of its buckets' communication)
# follow the counts: fp16 halves them, PowerSGD sends a few percent. PowerSGD pays on the slow link,
# where the bytes were most of the step; on the unshaped one (or on one machine) its extra work (two
# matrix products per matrix, an orthogonalisation) can cost more than it saves.
#
# fp16 gains little here, and is often *slower* than plain DDP, even on the slow link. Its all-reduce
# adds the halves in float16, and NumPy has no fast path for that on a CPU:

# %%
for dtype in (np.float32, np.float16):
    a = np.ones(2**18, dtype=dtype)  # 256 Ki values, a quarter of one of the MLP's buckets
    seconds = min(timeit.repeat("np.add(a, a, out=a)", globals={"np": np, "a": a}, number=5, repeat=3)) / 5
    print(f"adding 256 Ki {np.dtype(dtype).name} values: {seconds * 1e3:7.3f} ms")

# %% [markdown]
# A GPU adds halves at full speed (NCCL reduces float16 natively), so there fp16 halves the time on
# the wire at almost no cost; here the adds eat the saving. Measure before you compress.
#
# And on GPUs, what does compression do to the sweet spot? GPT-2 small's tensors, compressed at rank
# 4, in the model of section 4 (`pn.powersgd_compression` counts the values as your function does, and
# adds the matrix products' time and the extra all-reduce rounds; fp16 costs nothing but two casts):

# %%
C, V, T, L = 768, 50257, 1024, 12  # width, vocabulary, context, layers of GPT-2 small
layer = [(3 * C, C), (3 * C,), (C, C), (C,), (4 * C, C), (4 * C,), (C, 4 * C), (C,)] + [(C,)] * 4  # + LNs
gpt2 = [(V, C), (T, C)] + layer * L + [(C,), (C,)]
print(f"GPT-2 small: {sum(int(np.prod(s)) for s in gpt2) / 1e6:.0f} M values, PowerSGD rank 4 sends", end=" ")
print(f"{count(gpt2, 4, 2) / 1e6:.2f} M")
hooks = {
    "fp16": pn.fp16_compression(work.params * work.bytes_per_value),
    "PowerSGD rank 4": pn.powersgd_compression(gpt2, 4, flops=1e14),
}
fig, axes = plt.subplots(1, 2, figsize=(12, 4), sharey=True)
for ax, (name, compression) in zip(axes, hooks.items()):
    plot_scaling(ax, f"GPT-2 small, {name}", networks, compression)
axes[0].set_ylabel("speedup over 1 GPU")
plt.tight_layout()
plt.show()

# %% [markdown]
# Halving the bytes helps little where the link was the whole problem: the sweet spot stays at one
# node. Dividing them by a hundred moves it to a few nodes at 1 Gbit/s and to more than ten at
# 10 Gbit/s, though the step now also pays for PowerSGD's matrix products and a third round of
# all-reduces (P, Q, and the tensors it leaves whole).
#
# The price is accuracy. fp16 rounds every gradient to 11 significant bits (bf16: 8, with float32's
# range). PowerSGD keeps only a rank-r approximation; error feedback adds what it dropped to the next
# step, so the drop is delayed rather than lost, but training still converges somewhat more slowly, and
# the rank trades bytes for accuracy. `benchmarks/README.md` (section "Gradient compression")
# measures the final accuracy and loss of `train_mlp.py` and `train_gpt.py` with each hook.
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
