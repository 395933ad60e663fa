"""Lesson 09 source (percent format); `python lessons/build.py` turns it into 09_scaling.ipynb."""
# ruff: noqa: E402, F811

# %% [markdown]
# # Lesson 09 — Putting it together: the 3D mesh, and why not 256x on 256 GPUs?
#
# **Learning goals.** After this lesson you can
# 1. lay out `dp x tp x pp` ranks on a `ProcessMesh`, compute a rank from its coordinates, and name the
#    ranks of each group;
# 2. train the MLP on 8 ranks with all three kinds of parallelism at once, and say what each group
#    communicates, and how often;
# 3. predict a training step's time from compute, communication and the pipeline bubble, with the
#    formulas of lessons 03-07 (`minidist_tools/perfmodel/step.py`);
# 4. calibrate that model on your own machine and check it against measured steps;
# 5. plot speedup against the number of GPUs and find where adding GPUs stops paying off.

# %%
import json
import subprocess
import sys
from pathlib import Path

import matplotlib.pyplot as plt

import minidist
from minidist.parallel.mesh import draw_grid, mesh_coords
from minidist_course.notebook import checks, mpiexec_path
from minidist_tools.perfmodel import step as perfmodel

# %% [markdown]
# ## Part A — the 3D mesh
#
# Lessons 04-07 each split one thing: the batch (data parallelism, dp), each layer (tensor
# parallelism, tp), the stack of layers (pipeline parallelism, pp). Large models use all three at
# once (Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters Using
# Megatron-LM", SC 2021, §3). Every rank gets three coordinates `(dp_rank, tp_rank, pp_rank)`, and for
# each axis a communicator: the ranks that differ *only* in that coordinate
# (`minidist/parallel/mesh.py`, `ProcessMesh`).
#
# ### A1. Which rank sits where
#
# minidist follows Megatron-LM's order: tp varies fastest, then dp, then pp. Launchers place
# consecutive ranks on the same machine, so a tp group — which all-reduces activations in every layer,
# the most frequent traffic — stays inside a node.

# %%
dp, tp, pp = 2, 2, 2
print(draw_grid(dp, tp, pp))

fig, axes = plt.subplots(1, 3, figsize=(12, 2.8))
for ax, (axis, index) in zip(axes, [("tp", 1), ("dp", 0), ("pp", 2)]):
    for rank in range(dp * tp * pp):
        coords = mesh_coords(rank, dp, tp, pp)  # (dp_rank, tp_rank, pp_rank)
        others = tuple(c for i, c in enumerate(coords) if i != index)  # equal others = same group
        group = others[0] * 2 + others[1]
        col, row = coords[2] * (tp + 1) + coords[1], coords[0]  # stages side by side, dp rows, tp columns
        ax.add_patch(plt.Rectangle((col, -row), 0.9, 0.9, color=plt.cm.Set2(group)))
        ax.text(col + 0.45, -row + 0.45, str(rank), ha="center", va="center")
    for stage in range(pp):
        ax.text(stage * (tp + 1) + tp / 2 - 0.05, 1.1, f"stage {stage}", ha="center")
    ax.set_xlim(-0.2, pp * (tp + 1) - 0.8)
    ax.set_ylim(-dp + 0.8, 1.5)
    ax.set_title(f"{axis} groups (one colour each)")
    ax.axis("off")
plt.tight_layout()
plt.show()

# %% [markdown]
# In each picture a pipeline stage is a block of `dp` rows by `tp` columns. The tp groups are
# neighbouring ranks ({0,1}, {2,3}, ...), the dp groups are `tp` apart ({0,2}, {1,3}, ...), the pp
# groups `dp x tp` apart ({0,4}, {1,5}, ...).
#
# **Your turn.** Write `mesh_rank(dp_rank, tp_rank, pp_rank, dp, tp)`: the world rank at those
# coordinates (the inverse of `mesh_coords`).


# %% [exercise rank]
def mesh_rank(dp_rank, tp_rank, pp_rank, dp, tp):
    raise NotImplementedError  # your code here


# %% [check rank]
checks.mesh_rank(mesh_rank)

# %% [markdown]
# ### A2. A dp x tp x pp run on 8 ranks
#
# `examples/train_mlp.py` builds the mesh with `ProcessMesh(dp, tp, pp)`, an MLP whose linear layers
# are column/row-parallel over `mesh.tp_group` (lesson 06), cuts it into stages over `mesh.pp_group`
# with `PipelineParallel(mlp, mesh, microbatches=4, schedule="1f1b")` (lesson 07), which also averages
# each stage's gradients over `mesh.dp_group` after the pipeline flush (lesson 04). The core of it:
#
# ```python
# mesh = ProcessMesh(dp=2, tp=2, pp=2)                       # collective: every rank, same sizes
# model_parallel_manual_seed(seed, group=mesh.tp_group)      # same weights; dropout streams per tp rank
# mlp = MLP(64, [64, 64], 10, mesh=mesh)                     # tensor-parallel layers over mesh.tp_group
# model = PipelineParallel(mlp, mesh, microbatches=4, schedule="1f1b")   # stages, and dp averaging
# ```
#
# 8 ranks on 2 cores: slow per rank, but it runs. First the 3D run, then the same training on one
# process, for comparison (a small model: hidden layers of 64, 3 epochs of the bundled digits).

# %%
mpiexec, python = mpiexec_path(), sys.executable
# The clone minidist is installed from (`pip install -e .`), wherever this notebook runs: your copy of
# the lessons holds the lessons, the repository holds examples/ and benchmarks/.
REPO = Path(minidist.__file__).resolve().parent.parent
train_mlp = REPO / "examples" / "train_mlp.py"
assert train_mlp.exists(), f"no {train_mlp}: install minidist from your clone with pip install -e ."
flags = "--epochs 3 --hidden 64 64 --batch-size 128"
mesh = "--dp 2 --tp 2 --pp 2 --microbatches 4 --schedule 1f1b"
no_bars = "2>&1 | tr '\\r' '\\n' | sed 's/train:[^]]*]//g' | grep -v '^ *$'"  # drop progress bars
# !{mpiexec} -n 8 {python} {train_mlp} {mesh} {flags} {no_bars}
print("--- the same training on 1 process:")
# !{mpiexec} -n 1 {python} {train_mlp} {flags} {no_bars}

# %% [markdown]
# The same model, up to float32 rounding: the accuracies agree (the losses in the last digits at
# most). Eight ranks compute what one computes — only spread out.
#
# ### A3. What each group communicates
#
# - **tp** groups {0,1} {2,3} {4,5} {6,7}: all-reduce *activations* — g after each row-parallel
#   layer in forward, f before each column-parallel layer in backward. Every tensor-parallel block,
#   every microbatch, both directions; messages of microbatch x features.
# - **pp** groups {0,4} {1,5} {2,6} {3,7}: point-to-point — activations down to the next stage, their
#   gradients back up. Every microbatch, at every stage boundary; microbatch x features.
# - **dp** groups {0,2} {1,3} {4,6} {5,7}: all-reduce of this rank's *gradients*, once per step, after
#   the pipeline flush; as large as this rank's parameters, `1/(tp x pp)` of the model.
#
# So tp traffic is the most frequent and sits on the critical path (the next layer waits for it):
# keep tp inside a node. pp traffic is point-to-point and small. dp traffic is large but happens once
# per step and can overlap with compute — the dp group can span the slowest links. Each rank holds
# `1/(tp x pp)` of the weights; dp does not reduce it (ZeRO, lesson 05, would).
#
# Part B asks what this costs in time, and where adding GPUs stops paying off.
#
# ## Part B — the scaling model
#
# The model, per step, on `dp x tp x pp` devices:
#
# - compute `6 x params x tokens / (devices x FLOP/s)` (Kaplan et al. 2020: 2 FLOPs per parameter per
#   token forward, 4 backward);
# - the pipeline bubble, a fraction `(p-1)/(m+p-1)` of the pipeline time (lesson 07);
# - the data-parallel ring all-reduce of the gradients, `2(n-1) alpha + 2(n-1)/n N beta` (lesson 03),
#   minus what overlap hides behind backward (lesson 04);
# - tensor-parallel all-reduces of activations, 4 per transformer layer (Megatron-LM §3, lesson 06).

# %% [markdown]
# ### B1. Calibrate on this machine, and check
#
# `benchmarks/perfmodel_check.py` launches real MPI jobs: each measures this machine's FLOP/s (a
# timed matmul), alpha and beta (ping-pongs) and gamma (a timed add), then times DDP training steps of
# an MLP (4 x 1024 x 1024, global batch 256) and compares with `perfmodel.predict`.

# %%
check_script = REPO / "benchmarks" / "perfmodel_check.py"
cmd = [sys.executable, str(check_script), "--ranks", "1", "2", "--steps", "3", "--json"]
rows = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=300).stdout)
for r in rows:
    print(
        f"{r['ranks']} rank(s): {r['flops'] / 1e9:.0f} GFLOP/s per rank, "
        f"measured {r['measured_s'] * 1e3:.1f} ms, "
        f"predicted {r['predicted_s'] * 1e3:.1f} ms ({r['error']:+.0%})"
    )

# %% [markdown]
# The model under-predicts: it counts only the matmuls and the all-reduce, not the element-wise work
# (activations, softmax, the optimizer update), Python's overhead per op, nor the CPU time the
# all-reduce's copies and additions take from the ranks' own cores. On a quiet machine that is 10-30 %
# (`benchmarks/README.md`, "Performance model"); when other programs share the 2 cores, the 2-rank
# measurement suffers most — re-run the cell and watch it move. For a large model on GPUs the matmuls
# dominate even more. A model that is
# right within some tens of percent is good enough for what we use it for next: *trends*.
#
# ### B2. Your turn: the data-parallel speedup
#
# One GPU takes `T(1) = C / F` for a step of `C` FLOPs at `F` FLOP/s. On G GPUs with the same global
# batch (strong scaling) each GPU does a G-th of the work, then the G GPUs all-reduce the N bytes of
# gradients with the ring of lesson 03 (your `ring_time`), without overlap. Derive the step time
# `T(G)` and the speedup `T(1) / T(G)`, and write
# `dp_speedup(flops_per_step, gpus, grad_bytes, flops, alpha, beta)`.


# %% [exercise speedup]
def dp_speedup(flops_per_step, gpus, grad_bytes, flops, alpha, beta):
    raise NotImplementedError  # your code here


# %% [check speedup]
checks.dp_speedup(dp_speedup)

# %% [markdown reveal]
# **The answer.** Try first; then open this cell (click it, or the bar at its left).
#
# $$T(G) = \frac{C}{G F} + 2(G-1)\alpha + \frac{2(G-1)}{G} N \beta, \qquad \text{speedup}(G) = T(1) / T(G).$$
#
# The compute term shrinks with G, the all-reduce does not: its bandwidth term tends to `2 N beta` and
# its latency term grows. That is the whole story of the curves below.

# %% [markdown]
# ### B3. Speedup from 1 to 1,024 GPUs
#
# Now the real thing: models of 125 M, 1.3 B and 13 B parameters with the global batches GPT-3 used for
# them (Brown et al. 2020, Table 2.1: 0.5 M, 1 M and 2 M tokens, sequences of 2,048 tokens), gradients
# in bf16 (2 bytes), on GPUs that sustain 120 TFLOP/s, over
# two networks: 100 Gb/s Ethernet-class (alpha = 20 us, 12.5 GB/s) and one 400 Gb/s InfiniBand link
# per GPU (alpha = 5 us, 50 GB/s). Data parallelism only, no overlap.

# %%
gpus = [2**k for k in range(11)]  # 1 .. 1024
networks = {
    "Ethernet 100 Gb/s": perfmodel.Hardware(flops=1.2e14, alpha=20e-6, beta=1 / 12.5e9),
    "InfiniBand, 50 GB/s per GPU": perfmodel.Hardware(flops=1.2e14, alpha=5e-6, beta=1 / 50e9),
}
models = {"125 M": (125e6, 256), "1.3 B": (1.3e9, 512), "13 B": (13e9, 1024)}  # (parameters, sequences)
fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
for ax, (net, hw) in zip(axes, networks.items()):
    ax.loglog(gpus, gpus, "k:", label="ideal (G x)")
    for name, (params, batch) in models.items():
        work = perfmodel.Workload(params, global_batch=batch, tokens_per_sample=2048, bytes_per_value=2)
        usable = [g for g in gpus if g <= batch]  # data parallelism needs >= 1 sequence per GPU
        curve = perfmodel.scaling_curve(work, hw, usable)
        line = ax.loglog(usable, [p.speedup for p in curve], "o-", label=f"{name} parameters")[0]
        best = perfmodel.sweet_spot(curve, min_efficiency=0.75)
        ax.plot(best.devices, best.speedup, "*", ms=16, color=line.get_color())
    ax.set_title(net)
    ax.set_xlabel("GPUs (data parallel)")
    ax.grid(True, which="both", alpha=0.3)
axes[0].set_ylabel("speedup over 1 GPU")
axes[1].legend(fontsize=8, title="star: last point with >= 75% efficiency")
plt.tight_layout()
plt.show()

# %% [markdown]
# The 125 M curve stops at 256 GPUs: its batch has only 256 sequences, one per GPU.
#
# Why do the larger models scale further? Not because they are larger: compute grows as
# `params x tokens`, gradient bytes as `params`, so their ratio depends only on the **tokens each GPU
# processes per step**. The larger models here train with larger batches, so each GPU computes longer
# between two all-reduces.
#
# ### B4. Where does the time go?
#
# At 256 GPUs the 13 B model on InfiniBand gets about 210x, not 256x. The reason is visible when the
# step is split into its parts:

# %%
work = perfmodel.Workload(params=13e9, global_batch=1024, tokens_per_sample=2048, bytes_per_value=2)
hw = networks["InfiniBand, 50 GB/s per GPU"]
table = [perfmodel.predict(work, hw, dp=g) for g in (1, 16, 64, 256, 1024)]
for p in table:
    print(
        f"{p.devices:>5} GPUs: compute {p.compute:8.3f} s + all-reduce {p.dp_comm:6.3f} s "
        f"= step {p.step:8.3f} s  -> speedup {p.speedup:6.1f}x, efficiency {p.efficiency:.0%}"
    )
with_overlap = perfmodel.predict(work, hw, dp=256, overlap=1.0)
print(f"\nall-reduce fully overlapped with backward (lesson 04): {with_overlap.speedup:.0f}x on 256 GPUs")

# %% [markdown]
# The compute per GPU shrinks as 1/G, but the all-reduce does not: a ring moves about 2N bytes per GPU
# whatever G is (lesson 03), and its latency term even grows with G. With 1,024 GPUs each computes one
# sequence per step, and communication is almost half of the step. Hence the *sweet spot*: beyond it, each
# added GPU buys less than 3/4 of a GPU of speed. The ways out are the subject of the whole course:
#
# - **overlap** the all-reduce with backward (lesson 04) — the printed line above;
# - a **bigger model per GPU-second**: more compute per byte of gradient (the 13 B curve scales further);
# - **fewer gradient bytes per GPU**: tensor and pipeline parallelism (lessons 06-07) split the
#   parameters, so each data-parallel all-reduce is smaller — at the price of their own communication
#   and the bubble. `perfmodel.predict(..., tp=4, pp=2, microbatches=16)` puts numbers on the trade.
#
# Below, with *one* network for all traffic as this model assumes, tensor parallelism loses: its
# all-reduces of activations sit on the critical path and nothing hides them. That is why Megatron-LM
# keeps the tp group inside one node, on NVLink with about ten times the bandwidth, and spreads only
# data and pipeline parallelism over the network.

# %%
for layout in [dict(dp=256), dict(dp=64, tp=4), dict(dp=32, tp=4, pp=2, microbatches=16)]:
    work13 = perfmodel.Workload(
        params=13e9, global_batch=1024, tokens_per_sample=2048, layers=40, hidden=5120, bytes_per_value=2
    )
    p = perfmodel.predict(work13, hw, **layout)
    print(
        f"13 B on 256 GPUs {layout}: step {p.step:.2f} s = compute {p.compute:.2f} "
        f"+ bubble {p.bubble:.2f} + tp {p.tp_comm:.2f} + pp {p.pp_comm:.2f} "
        f"+ dp {p.dp_comm_exposed:.2f}; efficiency {p.efficiency:.0%}"
    )

# %% [markdown]
# ## Summary
# - A `ProcessMesh` gives each rank `(dp_rank, tp_rank, pp_rank)` with tp fastest; each axis has its
#   own group and its own traffic: tp all-reduces activations per block, pp sends activations and
#   gradients per microbatch, dp all-reduces gradients once per step.
# - Step time = compute / G + communication that does not shrink with G (+ bubble, + TP traffic).
# - Speedup flattens where communication catches up with compute: the sweet spot depends on the model
#   size, the batch and the network, and a few lines of arithmetic find it before you rent 1,024 GPUs.
# - Measure, then model: the calibration above is how you trust the arithmetic.
