"""Lesson 09 source (percent format); `python lessons/build.py` turns it into 09_scaling.ipynb."""
# ruff: noqa: E402, F811

# %% [markdown]
# # Lesson 09 — Putting it together: why not 256x on 256 GPUs?
#
# **Learning goals.** After this lesson you can
# 1. predict a training step's time from compute, communication and the pipeline bubble, with the
#    formulas of lessons 03-07 (`minidist/perfmodel.py`);
# 2. calibrate that model on your own machine and check it against measured steps;
# 3. plot speedup against the number of GPUs and find where adding GPUs stops paying off.
#
# The model, per step, on `dp x tp x pp` devices:
#
# - compute `6 x params x tokens / (devices x FLOP/s)` (Kaplan et al. 2020: 2 FLOPs per parameter per
#   token forward, 4 backward);
# - the pipeline bubble, a fraction `(p-1)/(m+p-1)` of the pipeline time (lesson 07);
# - the data-parallel ring all-reduce of the gradients, `2(n-1) alpha + 2(n-1)/n N beta` (lesson 03),
#   minus what overlap hides behind backward (lesson 04);
# - tensor-parallel all-reduces of activations, 4 per transformer layer (Megatron-LM §3, lesson 06).

# %%
import json
import subprocess
import sys

import checks
import matplotlib.pyplot as plt

from minidist import perfmodel

# %% [markdown]
# ## 1. Calibrate on this machine, and check
#
# `benchmarks/perfmodel_check.py` launches real MPI jobs: each measures this machine's FLOP/s (a
# timed matmul), alpha and beta (ping-pongs) and gamma (a timed add), then times DDP training steps of
# an MLP (4 x 1024 x 1024, global batch 256) and compares with `perfmodel.predict`.

# %%
cmd = [sys.executable, "../benchmarks/perfmodel_check.py", "--ranks", "1", "2", "--steps", "3", "--json"]
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
# ## 2. Your turn: the data-parallel speedup
#
# One GPU takes `T(1) = C / F` for `C` FLOPs at `F` FLOP/s. On G GPUs with the same global batch
# (strong scaling) each computes `C / G`, then all-reduces N bytes of gradients with the ring:
#
# $$T(G) = \frac{C}{G F} + 2(G-1)\alpha + \frac{2(G-1)}{G} N \beta, \qquad \text{speedup}(G) = T(1) / T(G).$$
#
# Write `dp_speedup(flops_per_step, gpus, grad_bytes, flops, alpha, beta)`.


# %% [exercise speedup]
def dp_speedup(flops_per_step, gpus, grad_bytes, flops, alpha, beta):
    raise NotImplementedError  # your code here


# %% [check speedup]
checks.dp_speedup(dp_speedup)

# %% [markdown]
# ## 3. Speedup from 1 to 1,024 GPUs
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
# ## 4. Where does the time go?
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
# - Step time = compute / G + communication that does not shrink with G (+ bubble, + TP traffic).
# - Speedup flattens where communication catches up with compute: the sweet spot depends on the model
#   size, the batch and the network, and a few lines of arithmetic find it before you rent 1,024 GPUs.
# - Measure, then model: the calibration above is how you trust the arithmetic.
