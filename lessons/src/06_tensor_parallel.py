"""Lesson 06 source (percent format); `python lessons/build.py` turns it into 06_tensor_parallel.ipynb."""
# ruff: noqa: E402, F811

# %% [markdown]
# # Lesson 06 — Tensor parallelism: one layer on several ranks
#
# **Learning goals.** After this lesson you can
# 1. split a linear layer's weight by columns or by rows and say what each rank computes;
# 2. explain Megatron-LM's two operators f and g: what each does forward and backward, and where
#    they go in an MLP block;
# 3. check on real ranks that a tensor-parallel MLP computes the same outputs and gradients as one
#    device, and that `clip_grad_norm_` finds the same global norm;
# 4. count what tensor parallelism costs: one all-reduce of activations per block, each way.
#
# Data parallelism (lessons 04-05) copies the whole model to every rank. When one layer no longer fits,
# or is too slow, on one device, we split *the layer itself*. Megatron-LM (Shoeybi et al., "Training
# Multi-Billion Parameter Language Models Using Model Parallelism", 2019, §3) does it with two layer
# kinds and two communication operators; the code is `minidist/parallel/tensor_parallel/`.

# %%
import matplotlib.pyplot as plt
import numpy as np

from minidist_course.notebook import checks, start_cluster, stop_cluster

rc = start_cluster(2)

# %% [markdown]
# ## 1. Two ways to split `y = x W^T`
#
# A linear layer has `W` of shape `(out_features, in_features)`. With n ranks:
#
# - **column parallel** (`ColumnParallelLinear`): rank r keeps the r-th block of rows of `W` (a split
#   on the *output* axis). It needs the whole input `x` and computes its own slice of the output features,
#   `y_r = x W_r^T + b_r`. Concatenating the slices gives `y`.
# - **row parallel** (`RowParallelLinear`): rank r keeps `W` split on the *input* axis. It takes its
#   slice `x_r` of the input features and computes a *partial* output `x_r W_r^T` of full width. Summing
#   the partials gives `y` (the bias is added once, after the sum).
#
# First on one process, with NumPy, to see that both really compute `x W^T`:

# %%
rng = np.random.default_rng(0)
x, W = rng.standard_normal((3, 6)), rng.standard_normal((4, 6))  # batch 3, in 6, out 4
n = 2
column_outputs = [x @ Wr.T for Wr in np.split(W, n, axis=0)]  # each (3, 2): slices of y
row_partials = [xr @ Wr.T for xr, Wr in zip(np.split(x, n, axis=1), np.split(W, n, axis=1))]  # each (3, 4)
print("column parallel: concatenate ->", np.allclose(np.concatenate(column_outputs, axis=1), x @ W.T))
print("row parallel:    sum         ->", np.allclose(sum(row_partials), x @ W.T))

fig, axes = plt.subplots(1, 2, figsize=(8, 2.6))
splits = [("column parallel: split out (axis 0)", 0), ("row parallel: split in (axis 1)", 1)]
for ax, (name, axis) in zip(axes, splits):
    rank_of = np.repeat(np.arange(n), W.shape[axis] // n)  # which rank holds each row (or column)
    owner = np.broadcast_to(rank_of[:, None] if axis == 0 else rank_of[None, :], W.shape)
    ax.imshow(owner, cmap="Pastel1", vmin=0, vmax=8)
    for (i, j), r in np.ndenumerate(owner):
        ax.text(j, i, f"r{int(r)}", ha="center", va="center", fontsize=8)
    ax.set_title(name, fontsize=10)
    ax.set_xlabel("in_features")
    ax.set_ylabel("out_features")
plt.tight_layout()
plt.show()

# %% [markdown]
# **Your turn.** Write `shard_shape(out_features, in_features, tp, kind)`: the shape of the weight a
# rank holds, for `kind` `"column"` or `"row"`.


# %% [exercise shard]
def shard_shape(out_features, in_features, tp, kind):
    raise NotImplementedError  # your code here: a tuple (rows, columns)


# %% [check shard]
checks.tp_shard_shape(shard_shape)

# %% [markdown]
# ## 2. The layers on real ranks
#
# Each engine builds a `ColumnParallelLinear(6, 8)` and a `RowParallelLinear(8, 4)` over the world (2
# ranks). Every rank draws the *full* weight from the seeded generator, exactly as `nn.Linear` would,
# and keeps its slice: so tensor-parallel and one-device models start identical.

# %%
# %%px
import numpy as np

import minidist as md
import minidist.distributed as dist
from minidist import nn
from minidist.parallel.tensor_parallel import ColumnParallelLinear, RowParallelLinear

world = dist.init()
md.manual_seed(0)
column = ColumnParallelLinear(6, 8, dtype=np.float64)
md.manual_seed(0)
dense = nn.Linear(6, 8, dtype=np.float64)  # the same draws
rows = slice(4 * world.rank, 4 * world.rank + 4)
same = np.array_equal(column.weight.data, dense.weight.data[rows])
row_layer = RowParallelLinear(8, 4, dtype=np.float64)
print(f"rank {world.rank}: column weight {column.weight.shape} = dense rows {rows.start}:{rows.stop}? {same}")
print(f"rank {world.rank}: row weight {row_layer.weight.shape}, bias {row_layer.bias.shape} (replicated)")

# %% [markdown]
# ## 3. f and g
#
# Chain a column layer and a row layer (`ParallelMLP`): the column layer's output slice is exactly the
# input slice the row layer wants, and an elementwise activation in between needs no communication.
# Communication is needed only at the two ends, and Megatron-LM packs it in two operators
# (`mappings.py`):
#
# | operator | forward | backward | where |
# |---|---|---|---|
# | **f** | identity: `y = x` | all-reduce (sum) of `dL/dx` | before the column layer |
# | **g** | all-reduce (sum) of the partials | identity | after the row layer |
#
# ```
# x (same on all ranks) --f--> [x A_r^T] --ReLU--> [h_r B_r^T] --g--> + b --> y (same on all ranks)
#                              column parallel      row parallel
# ```
#
# Why does f all-reduce in backward? Every rank used the *same* `x` for a *different* slice of the
# output, so the loss depends on `x` through all ranks: `dL/dx` is the sum of the ranks' contributions.
#
# **Your turn.** Which operator goes before a column layer's input (`"f"` or `"g"`)? And write its
# backward, `f_backward(grads)`: given each rank's local gradient `dL/dx` (a list, one array per rank),
# return what each rank ends up with. The check plugs it into a simulated column layer and compares
# with the one-device gradient.

# %% [exercise fg]
OPERATOR_BEFORE_COLUMN = None  # "f" or "g"


def f_backward(grads):
    raise NotImplementedError  # your code here: one array per rank


# %% [check fg]
checks.f_and_g(OPERATOR_BEFORE_COLUMN, f_backward)

# %% [markdown]
# ## 4. Equivalent to one device
#
# Now the real thing on two ranks: a `ParallelMLP(16, 32, 8)` against the dense pair
# `Linear(16, 32)`, `ReLU`, `Linear(32, 8)` built from the same seed, in float64. Same input, same
# loss: the outputs must agree, and each rank's gradient shards must be slices of the dense gradients.
# Then `clip_grad_norm_` (`minidist/parallel/clip_grad.py`): sharded gradients' squares are summed
# over the tp group, replicated ones (the row layer's bias) counted once.

# %%
# %%px
from minidist.nn.utils import clip_grad_norm_ as dense_clip
from minidist.parallel.clip_grad import clip_grad_norm_
from minidist.parallel.tensor_parallel import ParallelMLP, model_parallel_manual_seed

model_parallel_manual_seed(0)  # md.manual_seed(0) on every rank + the tracker's per-rank stream
tp_mlp = ParallelMLP(16, 32, 8, dtype=np.float64)
md.manual_seed(0)
dense_mlp = nn.Sequential(nn.Linear(16, 32, dtype=np.float64), nn.ReLU(), nn.Linear(32, 8, dtype=np.float64))
data = np.random.default_rng(1)
xb, yb = data.standard_normal((10, 16)), data.integers(0, 8, 10)
losses = []
for m in (tp_mlp, dense_mlp):
    loss = nn.functional.cross_entropy(m(md.tensor(xb, dtype=np.float64)), yb)
    loss.backward()
    losses.append(loss.item())
half = lambda a, axis: np.split(a, world.size, axis=axis)[world.rank]  # noqa: E731
pairs = [
    (tp_mlp.fc1.weight.grad, half(dense_mlp[0].weight.grad, 0)),  # column: rows of the dense gradient
    (tp_mlp.fc1.bias.grad, half(dense_mlp[0].bias.grad, 0)),
    (tp_mlp.fc2.weight.grad, half(dense_mlp[2].weight.grad, 1)),  # row: columns
    (tp_mlp.fc2.bias.grad, dense_mlp[2].bias.grad),  # replicated
]
grad_error = max(np.max(np.abs(a - b)) for a, b in pairs)
norms = (clip_grad_norm_(tp_mlp.parameters(), 1e9), dense_clip(dense_mlp.parameters(), 1e9))
print(
    f"rank {world.rank}: loss tp {losses[0]:.15f} vs dense {losses[1]:.15f}; "
    f"max grad error {grad_error:.1e}; grad norm tp {norms[0]:.12f} vs dense {norms[1]:.12f}"
)

# %% [markdown]
# The differences are rounding (1e-16): the row layer's all-reduce adds the two partial sums in another
# order than one matmul would. That is what "equivalent" means here, and why the tests use float64.
#
# ## 5. Dropout: the RNG tracker
#
# Dropout on *replicated* activations must drop the same units on every rank (or the replicas drift
# apart); on *sharded* activations (between the column and the row layer) each rank's slice needs its
# own mask. `model_parallel_manual_seed(seed)` seeds both: the default generator with `seed` everywhere,
# and the tracker's generator with `seed + 2718 + tp_rank` (`random.py`); `ParallelMLP` draws its
# hidden dropout inside `get_rng_tracker().fork()`.

# %%
# %%px
from minidist.nn import functional as F
from minidist.parallel.tensor_parallel import get_rng_tracker

ones = md.tensor(np.ones((1, 8), dtype=np.float32))
replicated_mask = F.dropout(ones, 0.5, True).numpy().astype(int).ravel() // 2
with get_rng_tracker().fork():
    sharded_mask = F.dropout(ones, 0.5, True).numpy().astype(int).ravel() // 2
print(f"rank {world.rank}: replicated mask {replicated_mask}, sharded mask {sharded_mask}")

# %% [markdown]
# The replicated masks agree across the ranks, the sharded ones differ.
#
# ## 6. What it costs
#
# Per `ParallelMLP` block and microbatch: one all-reduce of `batch x out_features` values forward (g)
# and one of `batch x in_features` backward (f). A transformer layer has two such blocks (attention and
# MLP): 4 all-reduces per layer per step. They sit on the critical path — the next layer needs their
# result — so tensor parallelism is kept inside a node, on fast links (NVLink), usually tp ≤ 8. In
# exchange, each rank stores `1/tp` of the layer's weights (and gradients, and optimizer state):

# %%
hidden, tokens, bytes_per = 12288, 2048, 2  # a GPT-3-sized MLP block (d=12288, 4d inside), bf16
tps = [1, 2, 4, 8, 16]
weights = [2 * hidden * 4 * hidden * bytes_per / tp / 2**30 for tp in tps]
traffic = [0 if tp == 1 else 2 * 2 * (tp - 1) / tp * tokens * hidden * bytes_per / 2**20 for tp in tps]
fig, ax = plt.subplots(figsize=(6.5, 3.2))
ax.plot(tps, weights, "o-", label="weights per rank (GiB)")
ax.plot(tps, traffic, "s-", label="ring all-reduce bytes sent per rank per sequence (MiB)")
ax.set_xscale("log", base=2)
ax.set_xlabel("tp (ranks sharing the block)")
ax.legend(fontsize=8)
ax.set_title("one MLP block: memory shrinks as 1/tp, traffic does not")
plt.tight_layout()
plt.show()

# %% [markdown]
# ## Summary
# - Column parallel splits `W` on the output axis (whole input in, output slice out); row parallel on
#   the input axis (input slice in, partial sums out). Column then row needs no communication between.
# - f (identity / all-reduce) enters the parallel region, g (all-reduce / identity) leaves it: one
#   all-reduce each way per block.
# - Built from the same seed, tp ranks compute what one device computes, up to rounding; gradient
#   clipping needs the global norm (sharded parts summed over the group, replicated ones once).
#
# Next: [lesson 07](07_pipeline_parallel.ipynb) splits the model the other way: by layers.

# %%
stop_cluster()
