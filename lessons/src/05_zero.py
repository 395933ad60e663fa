"""Lesson 05 source (percent format); `python lessons/build.py` turns it into 05_zero.ipynb."""
# ruff: noqa: E402, F811

# %% [markdown]
# # Lesson 05 — ZeRO: stop storing N copies of everything
#
# **Learning goals.** After this lesson you can
# 1. count the bytes a data-parallel rank holds: parameters, gradients, optimizer state;
# 2. say what ZeRO stages 1, 2 and 3 shard, and write the memory per rank for each;
# 3. measure it on real ranks with `ZeroRedundancyOptimizer.memory_report()` and compare.
#
# In plain data parallelism every one of N ranks keeps a full copy of the parameters, the gradients
# and the optimizer state. For Adam the state alone is twice the parameters. ZeRO (Rajbhandari et al.,
# "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models", SC 2020, §5) gives each rank
# 1/N of it, at no extra communication for stages 1 and 2: reduce-scatter + all-gather move the same
# bytes as one all-reduce (lesson 03).

# %%
import matplotlib.pyplot as plt
import numpy as np

from minidist_course.notebook import checks, start_cluster, stop_cluster

rc = start_cluster(2)

# %% [markdown]
# ## 1. The formula
#
# Call Ψ the number of parameters, b the bytes of one parameter (and of one gradient), K the bytes of
# optimizer state per parameter. A plain data-parallel rank holds `b Ψ + b Ψ + K Ψ`: parameters,
# gradients, optimizer state. ZeRO's stages shard, on N ranks (each rank keeps a 1/N slice of what
# is sharded):
#
# | stage | shards |
# |---|---|
# | 0 (plain DP) | nothing |
# | 1 (P_os) | optimizer state |
# | 2 (P_os+g) | + gradients |
# | 3 (P_os+g+p) | + parameters |
#
# The paper's example uses mixed-precision Adam: fp16 parameters and gradients (b = 2) and K = 12
# (an fp32 master copy of the weights, momentum and variance). minidist trains in one dtype with no
# master copy: float32 AdamW has b = 4, K = 8.
#
# **Your turn:** derive the bytes per rank of each stage and write `zero_bytes(psi, n, stage, b, k)`.
# The check compares with the paper's Figure 1 (7.5 B parameters on 64 GPUs: 120 GB, 31.4 GB,
# 16.6 GB, 1.9 GB).


# %% [exercise zero]
def zero_bytes(psi, n, stage, b, k):
    raise NotImplementedError  # your code here: bytes per rank


# %% [check zero]
checks.zero_bytes(zero_bytes)

# %% [markdown reveal]
# **The answer.** Try first; then open this cell (click it, or the bar at its left).
#
# Bytes per rank by stage (ZeRO §5, Figure 1):
#
# | stage | bytes per rank |
# |---|---|
# | 0 | b Ψ + b Ψ + K Ψ |
# | 1 | b Ψ + b Ψ + K Ψ / N |
# | 2 | b Ψ + (b + K) Ψ / N |
# | 3 | (b + b + K) Ψ / N |

# %% [markdown]
# ## 2. Measure it
#
# Two ranks train one step of an MLP with 4 layers of 256 x 256 (263 k parameters) under float32
# AdamW: plain (stage 0), then `ZeroRedundancyOptimizer` stages 1 and 2. `memory_report()` counts the
# bytes of the live buffers (views are charged to the array they view); for stage 0 we count the same
# way by hand.

# %%
# %%px
import numpy as np

import minidist as md
import minidist.distributed as dist
from minidist import nn, optim
from minidist.parallel import ZeroRedundancyOptimizer

world = dist.init()


def one_step(stage):
    md.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(256, 256) for _ in range(4)])
    rng = np.random.default_rng(world.rank)
    x, y = md.tensor(rng.standard_normal((32, 256)), dtype=np.float32), rng.integers(0, 256, 32)
    if stage == 0:
        opt = optim.AdamW(model.parameters(), lr=1e-3)
    else:
        opt = ZeroRedundancyOptimizer(model.parameters(), optim.AdamW, stage=stage, lr=1e-3)
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    if stage > 0:
        return opt.memory_report()
    params = list(model.parameters())
    state = [v for s in opt.state.values() for v in s.values() if hasattr(v, "nbytes")]
    report = {
        "parameters": sum(p.data.nbytes for p in params),
        "gradients": sum(p.grad.nbytes for p in params),
        "optimizer_state": sum(v.nbytes for v in state),
    }
    report["total"] = sum(report.values())
    report["psi"] = sum(p.size for p in params)
    return report


reports = {stage: one_step(stage) for stage in (0, 1, 2)}
print(f"rank {world.rank}: " + ", ".join(f"stage {s}: {r['total'] / 1e6:.2f} MB" for s, r in reports.items()))

# %%
measured = rc[:]["reports"]
psi, n = measured[0][0]["psi"], len(measured)
try:
    formula = [zero_bytes(psi, n, stage, 4, 8) for stage in (0, 1, 2)]
except NotImplementedError:
    formula = None  # the plot shows only the measurements until the exercise is done
fig, ax = plt.subplots(figsize=(7, 3.5))
parts, bottom = ("parameters", "gradients", "optimizer_state"), np.zeros(3)
for part, color in zip(parts, ("tab:blue", "tab:orange", "tab:green")):
    heights = np.array([max(r[stage][part] for r in measured) for stage in (0, 1, 2)]) / 1e6
    ax.bar(range(3), heights, 0.5, bottom=bottom, color=color, label=f"measured: {part}")
    bottom += heights
if formula is not None:
    ax.plot(range(3), np.array(formula) / 1e6, "k_", markersize=40, mew=2, label="your formula")
ax.set_xticks(range(3), ["stage 0 (plain)", "stage 1", "stage 2"])
ax.set_ylabel("MB per rank (largest rank)")
ax.set_title(f"float32 AdamW, {psi:,} parameters, {n} ranks")
ax.legend(fontsize=8)
plt.show()

# %% [markdown]
# The measured bars match the formula: stage 1 halves the green part (2 ranks), stage 2 also the
# orange one. (`step()` also needs two transient buffers of Ψ elements, not shown: the memory *between*
# steps is what stays.)
#
# ## 3. What it buys at scale
#
# The formula for the paper's 7.5 B-parameter model as the number of data-parallel ranks grows, with an
# 80 GB GPU for reference. Plain data parallelism never fits, whatever N; stage 3 keeps shrinking.

# %%
ranks = np.array([1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024])
plt.figure(figsize=(6.5, 3.8))
try:
    for stage in (0, 1, 2, 3):
        plt.loglog(
            ranks,
            [zero_bytes(7.5e9, int(r), stage, 2, 12) / 1e9 for r in ranks],
            "o-",
            label=f"stage {stage}",
        )
except NotImplementedError:
    plt.text(0.5, 0.5, "do the exercise above to see this plot", ha="center", transform=plt.gca().transAxes)
plt.axhline(80, color="gray", ls=":", label="80 GB GPU")
plt.xlabel("data-parallel ranks N")
plt.ylabel("GB per rank")
plt.title("7.5 B parameters, mixed-precision Adam (ZeRO Figure 1)")
plt.legend(fontsize=8)
plt.grid(True, which="both", alpha=0.3)
plt.show()

# %% [markdown]
# ## Summary
# - A rank holds parameters, gradients and optimizer state; for Adam the state dominates.
# - ZeRO stage 1 shards the optimizer state, stage 2 the gradients too, stage 3 the parameters too;
#   stages 1 and 2 communicate as much as plain data parallelism, stage 3 adds an all-gather of the
#   parameters in forward and backward (1.5x).
# - Activations are not covered: for those, see activation recomputation in lesson 08.
#
# Next: lesson 06 splits single layers across ranks (tensor parallelism).

# %%
stop_cluster()
