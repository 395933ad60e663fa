"""Lesson 11 source (percent format); `python lessons/build.py` makes 11_transformer_parallelism.ipynb."""
# ruff: noqa: E402, F811

# %% [markdown]
# # Lesson 11 — Transformer parallelism in four dimensions
#
# **Learning goals.** After this lesson you can
# 1. say which of a GPT's matrices tensor parallelism splits, along which axis, and where f and g go;
# 2. compute the cross-entropy over a vocabulary split across ranks without gathering the logits;
# 3. explain sequence parallelism with the identity all-reduce = reduce-scatter + all-gather, and
#    compute the activation memory it saves (Korthikanti et al. 2022);
# 4. combine attention over key/value blocks with an online softmax (ring attention), and balance the
#    causal work across a context-parallel group;
# 5. place a rank in the dp x tp x pp x cp mesh, and count the bytes each group moves per step.
#
# Lesson 06 split one MLP block; lesson 10 built the GPT. Here the GPT is split the way Megatron-LM
# splits frontier models. The arithmetic lives in `minidist_tools/perfmodel/transformer.py`.

# %%
import matplotlib.pyplot as plt
import numpy as np

import minidist as md
from minidist.models import GPT, GPTConfig
from minidist.models.gpt.transformer import CausalSelfAttention
from minidist.nn import functional as F
from minidist.parallel.context_parallel.split import context_parallel_positions
from minidist.parallel.mesh import draw_grid
from minidist.parallel.tensor_parallel.split import shard_bounds, shard_rows
from minidist_course.notebook import checks, start_cluster, stop_cluster
from minidist_tools.perfmodel import transformer as pt

rc = start_cluster(2)  # two MPI ranks for the %%px cells

# %% [markdown]
# ## 1. Tensor parallelism inside a transformer layer
#
# Shoeybi et al. ("Megatron-LM", 2019, §3) split each of the two blocks of a layer as a column-then-row
# pair (lesson 06), so each block needs one all-reduce forward and one backward:
#
# | GPT matrix | shape | split | why |
# |---|---|---|---|
# | `attn.c_attn` (q, k, v) | (3C, C) | rows, by **heads** (stride 3) | a rank runs its own heads |
# | `attn.c_proj` | (C, C) | columns (row parallel) | its heads' outputs in, a partial sum out (g) |
# | `mlp.c_fc` | (4C, C) | rows (column parallel) | GELU acts on each rank's slice of the 4C features |
# | `mlp.c_proj` | (C, 4C) | columns (row parallel) | partial sums, added by g |
# | `wte` (and the tied head) | (V, C) | rows, by **vocabulary** | section 2 |
#
# `c_attn`'s rows are `[q; k; v]`, three blocks of C. A rank must hold *its heads'* rows of each block:
# the strided split of `minidist/parallel/tensor_parallel/split.py`. With C = 8, 2 heads, tp = 2:

# %%
C, heads, tp, T = 8, 2, 2, 5
for r in range(tp):
    print(f"rank {r} holds rows {shard_rows(3 * C, tp, r, stride=3).tolist()} of c_attn")

# %% [markdown]
# Now one attention block on 2 simulated ranks in NumPy, against minidist's single-process
# `CausalSelfAttention` with the same weights: each rank runs its heads; c_proj's partial sums are
# added (that is g, an all-reduce on real ranks) and the bias added once.

# %%
md.manual_seed(0)
attn = CausalSelfAttention(C, heads, dtype=np.float64)
x = np.random.default_rng(0).standard_normal((1, T, C))
w_qkv, b_qkv = attn.c_attn.weight.data, attn.c_attn.bias.data
partials = []
for r in range(tp):
    rows = shard_rows(3 * C, tp, r, stride=3)
    qkv = x @ w_qkv[rows].T + b_qkv[rows]  # (1, T, 3 C/tp): this rank's heads only
    q, k, v = (md.tensor(a) for a in qkv.reshape(1, T, 3, heads // tp, C // heads).transpose(2, 0, 3, 1, 4))
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True).numpy()  # (1, heads/tp, T, C/heads)
    cols = slice(*shard_bounds(C, tp, r))  # c_proj's input columns of this rank's heads
    partials.append(y.transpose(0, 2, 1, 3).reshape(1, T, C // tp) @ attn.c_proj.weight.data[:, cols].T)
together = sum(partials) + attn.c_proj.bias.data  # g, then the bias once
print("2 ranks = 1 process:", np.allclose(together, attn(md.tensor(x)).numpy(), rtol=1e-12))

# %% [markdown]
# Per layer: f before each block and g after it, so **2 all-reduces forward, 2 backward**, each of
# the activation `batch x seq x C`. The LayerNorms, residual adds and dropouts outside the blocks run
# whole on every rank (section 3 fixes that).
#
# ## 2. The loss over a split vocabulary
#
# The output head `x @ wte^T` gives logits (B, T, V); with wte split by rows each rank gets only its
# slice of the vocabulary, `V_r` columns (V = 65 on 2 ranks: 33 + 32, numpy.array_split's rule). Gathering
# (B, T, V) logits costs more than the rest of the layer for a large vocabulary; instead the ranks agree
# on three numbers per token with three all-reduces of B x T values:
#
# 1. **max** of the logits (stability: exp of a large logit overflows);
# 2. **sum** of the exponentials, each rank its own slice, measured from that max;
# 3. **sum** of the target's logit: the owner of the target id adds it, the others add 0.
#
# Each rank then knows the loss, and its gradient slice is softmax minus one-hot, both local.
#
# **Your turn.** Write `vocab_parallel_loss(shards, targets)`: `shards` is a list of arrays (N, V_r),
# rank r's logits in rank order; `targets` (N,) are global ids. Return the (N,) losses, combining the
# shards only as the three all-reduces would.


# %% [exercise vocabloss]
def vocab_parallel_loss(shards, targets):
    raise NotImplementedError  # your code here: (N,) losses


# %% [check vocabloss]
checks.vocab_parallel_loss(vocab_parallel_loss)

# %% [markdown reveal]
# **The answer.** Try first; then open this cell (click it, or the bar at its left).
#
# With M the global max, S = the sum over ranks of sum(exp(z - M)) and z_t the target's logit (owner
# r holds id t at column t - start_r, start_r from `shard_bounds`): loss = log S + M - z_t. Forgetting M
# overflows; taking start_r as r x V_r breaks the uneven split. The library's version is in
# `minidist/parallel/tensor_parallel/vocab_parallel_loss.py` (assignment A9).

# %% [markdown]
# The library's version on two real ranks: each holds its slice of the logits (33 and 32 of 65 ids)
# and never sees the other's. The loss, and each rank's slice of the gradient, are what one process
# computes from the whole logits:

# %%
# %%px
import numpy as np

import minidist as md
import minidist.distributed as dist
from minidist.nn import functional as F
from minidist.parallel.tensor_parallel import vocab_parallel_cross_entropy
from minidist.parallel.tensor_parallel.split import shard_bounds

world = dist.init()
data = np.random.default_rng(2)
logits, targets = data.standard_normal((6, 65)) * 5, data.integers(0, 65, 6)  # the same on both ranks
start, stop = shard_bounds(65, world.size, world.rank)
mine = md.tensor(logits[:, start:stop], requires_grad=True)
loss = vocab_parallel_cross_entropy(mine, targets, group=world)
loss.backward()
whole = md.tensor(logits, requires_grad=True)
F.cross_entropy(whole, targets).backward()
print(f"rank {world.rank}: ids {start}-{stop - 1}, loss {loss.item():.15f} vs one process "
      f"{F.cross_entropy(md.tensor(logits), targets).item():.15f}, gradient slice equal: "
      f"{np.allclose(mine.grad, whole.grad[:, start:stop], rtol=1e-12)}")  # fmt: skip

# %% [markdown]
# ## 3. Sequence parallelism: split what tensor parallelism left whole
#
# An all-reduce is a reduce-scatter followed by an all-gather (lesson 03's ring is exactly that). Move
# the all-gather to the *start* of the next tensor-parallel block: between the blocks each rank then
# holds a reduce-scattered slice (B, T/tp, C), a piece of the **sequence**, and LayerNorm, dropout and
# the residual add work on it token by token (Korthikanti et al., "Reducing Activation Recomputation in
# Large Transformer Models", 2022, §4.2.2). Same bytes on the wire, tp times less memory there:

# %%
# %%px
from minidist.parallel.tensor_parallel import (
    gather_from_sequence_parallel_region,
    reduce_from_tensor_parallel_region,
    reduce_scatter_to_sequence_parallel_region,
)

partial = md.tensor(np.random.default_rng(world.rank).standard_normal((2, 4, 3)))  # this rank's g input
mine = reduce_scatter_to_sequence_parallel_region(partial, world)  # summed, this rank's 2 of 4 positions
whole = gather_from_sequence_parallel_region(mine, world)
same = np.allclose(whole.numpy(), reduce_from_tensor_parallel_region(partial, world).numpy(), rtol=1e-12)
print(f"rank {world.rank}: reduce-scatter keeps {mine.shape}; all-gather of it = all-reduce: {same}")

# %%
n = 2**20  # the same bytes on the wire for the identity itself
pair = pt.reduce_scatter_bytes(n, tp) + pt.all_gather_bytes(n, tp)
print(
    f"bytes per rank, 1 MiB on {tp} ranks: all-reduce {pt.all_reduce_bytes(n, tp):.0f}, the pair {pair:.0f}"
)

# %% [markdown]
# The whole GPT this way: `ParallelGPT.from_gpt(gpt, mesh, sequence_parallel=True)` cuts a one-process
# GPT over the tp group (heads, MLP, vocabulary; LayerNorms on sequence slices) and computes its loss,
# in float64 up to the order of the sums:

# %%
# %%px
from minidist.models import GPT, GPTConfig, ParallelGPT
from minidist.parallel import ProcessMesh

mesh = ProcessMesh(dp=1, tp=world.size)
md.manual_seed(0)
gpt = GPT(GPTConfig(vocab_size=65, block_size=8, n_layer=2, n_head=4, n_embd=16, dtype=np.float64))
tp_gpt = ParallelGPT.from_gpt(gpt, mesh, sequence_parallel=True)
ids = np.random.default_rng(0).integers(0, 65, (2, 9))
x, y = ids[:, :-1], ids[:, 1:]
logits = tp_gpt(x)  # (B, T, V_r): this rank's vocabulary slice
one = F.cross_entropy(gpt(x).reshape(-1, 65), y.reshape(-1)).item()
print(f"rank {world.rank}: logits {logits.shape}, loss {tp_gpt.loss(logits, y).item():.15f}, one {one:.15f}")

# %% [markdown]
# The memory, per layer and rank, for a GPT-3 175B layer (s = 2048, h = 12288, a = 96, b = 1, 16-bit,
# Korthikanti et al. §4 eqs. 1-3): `pt.activation_memory_per_layer`.

# %%
s, h, a = 2048, 12288, 96
tps = [1, 2, 4, 8]
curves = {
    "no parallelism": [pt.activation_memory_per_layer(s, 1, h, a) for t in tps],
    "tensor parallel": [pt.activation_memory_per_layer(s, 1, h, a, tp=t) for t in tps],
    "tp + sequence parallel": [pt.activation_memory_per_layer(s, 1, h, a, t, t > 1) for t in tps],
}
for name, mem in curves.items():
    plt.plot(tps, [m / 2**30 for m in mem], "o-", label=name)
    print(f"{name:>24}: " + ", ".join(f"t={t}: {m / 2**30:.2f} GiB" for t, m in zip(tps, mem)))
plt.xlabel("tp")
plt.ylabel("activations per layer per rank (GiB)")
plt.legend()
plt.show()

# %% [markdown]
# Plain tp stops helping: 10 sbh bytes per layer stay whole on every rank. With sequence parallelism
# everything shrinks as 1/t. (`benchmarks/sequence_parallel_memory.py` measures minidist's blocks against it.)
#
# ## 4. Context parallelism: ring attention
#
# For long sequences even B x T x C on one rank is too much. Context parallelism splits the sequence
# over a cp group *for attention too*: each rank keeps its queries and passes its keys and values round
# a ring, cp - 1 hops, computing attention against each block as it arrives (Liu et al., "Ring
# Attention with Blockwise Transformers", 2023). The softmax needs all keys of a row, so it is computed
# **online** (Milakov & Gimelshein 2018): keep a running max, a running sum of exponentials and an
# unnormalised output, and correct them whenever a block raises the max.
#
# **Your turn.** Write `online_attention(q, k_blocks, v_blocks)`: q (L, E), key blocks (S_i, E), value
# blocks (S_i, Ev); scale 1/sqrt(E); return softmax(q K^T scale) V over all the keys, looking at one
# block at a time, as a ring rank does.


# %% [exercise online]
def online_attention(q, k_blocks, v_blocks):
    raise NotImplementedError  # your code here: (L, Ev)


# %% [check online]
checks.online_attention(online_attention)

# %% [markdown reveal]
# **The answer.** Try first; then open this cell.
#
# For each block: m' = max(m, rowmax(scores)); c = exp(m - m'); l = l c + rowsum(exp(scores - m'));
# o = o c + exp(scores - m') V; m = m'. At the end o / l. Without c on o the early blocks keep too
# much weight. Backward runs the ring again with K, V, dK and dV (`ring_attention.py`, assignment A9).
#
# **Causal masking and balance.** Under the causal mask, query i sees keys 0..i. Cut T into cp
# contiguous pieces and rank 0 computes almost nothing (its queries see few keys) while the last rank
# computes the most; fully masked blocks are skipped, so the ranks wait for the slowest. The balanced
# split cuts T into 2 cp chunks and gives rank r chunks r and 2cp-1-r (as Megatron's context
# parallelism): an early and a late chunk each.

# %%
T, cp = 16, 4
for layout in ("contiguous", "balanced"):
    positions = [context_parallel_positions(T, cp, r, layout) for r in range(cp)]
    work = [int(np.sum(p + 1)) for p in positions]  # query i scores i + 1 keys
    print(f"{layout:>10}: positions {[p.tolist() for p in positions]}\n{'':>12}(query, key) pairs {work}")

# %% [markdown]
# The library's `ring_attention` on two real ranks, balanced split, causal: each rank holds 4 of the 8
# tokens (positions 0, 1, 6, 7 and 2, 3, 4, 5) and gets exactly its rows of one process's attention,
# and its rows of the gradients (backward passes K, V and their gradients round the ring again).

# %%
# %%px
from minidist.parallel.context_parallel import ring_attention
from minidist.parallel.context_parallel.split import context_parallel_positions

q, k, v = (np.random.default_rng(s).standard_normal((1, 2, 8, 4)) for s in (5, 6, 7))  # (B, heads, T, hs)
mine = context_parallel_positions(8, world.size, world.rank)
local = [md.tensor(a[:, :, mine], requires_grad=True) for a in (q, k, v)]
out = ring_attention(*local, group=world, is_causal=True)
out.sum().backward()
whole = [md.tensor(a, requires_grad=True) for a in (q, k, v)]
ref = F.scaled_dot_product_attention(*whole, is_causal=True)
ref.sum().backward()
same_out = np.allclose(out.numpy(), ref.numpy()[:, :, mine], rtol=1e-12)
same_grads = all(np.allclose(a.grad, b.grad[:, :, mine], rtol=1e-12) for a, b in zip(local, whole))
print(
    f"rank {world.rank}: positions {mine.tolist()}, one process's rows: {same_out}, gradients: {same_grads}"
)

# %% [markdown]
# ## 5. The 4-D mesh
#
# `ProcessMesh(dp, tp, pp, cp)` orders the ranks as Megatron-LM does by default ("tp-cp-dp-pp"): tp
# varies fastest, then cp, then dp, then pp. tp talks in every layer (keep it in a node), cp in every
# attention, dp once per step. cp ranks hold the same weights, so gradients are averaged over dp x cp
# ranks (`mesh.dp_cp_group`).
#
# **Your turn.** Write `mesh_rank4(dp_rank, tp_rank, pp_rank, cp_rank, dp, tp, cp)`: the world rank.


# %% [exercise rank4]
def mesh_rank4(dp_rank, tp_rank, pp_rank, cp_rank, dp, tp, cp):
    raise NotImplementedError  # your code here


# %% [check rank4]
checks.mesh_rank4(mesh_rank4)

# %%
print(draw_grid(dp=2, tp=2, pp=1, cp=2))

# %% [markdown]
# ## 6. What each group sends per step
#
# Lesson 03: a ring all-reduce of N bytes over n ranks sends 2(n-1)/n N bytes per rank.
#
# **Your turn.** Write `tp_bytes_per_layer(batch, seq, hidden, tp, bytes_per_value)`: the bytes one rank
# sends over its tp group for one transformer layer in one training step (forward and backward).


# %% [exercise tpbytes]
def tp_bytes_per_layer(batch, seq, hidden, tp, bytes_per_value):
    raise NotImplementedError  # your code here


# %% [check tpbytes]
checks.tp_bytes_per_layer(tp_bytes_per_layer)

# %% [markdown reveal]
# **The answer.** Try first; then open this cell.
#
# Four all-reduces (2 forward, 2 backward) of batch x seq x hidden values: 4 x 2(tp-1)/tp x that many
# bytes. Sequence parallelism sends the same (each all-reduce became a reduce-scatter and an all-gather),
# plus 2 all-gathers in backward: the column layers keep only their input's shard and gather it again
# for the weight gradient (Megatron-LM does the same; `regather` in `pt.tensor_parallel_bytes_per_layer`).

# %% [markdown]
# The whole step, per rank and group, for the GPT of `examples/train_gpt.py` (4 layers, C = 128,
# T = 64, 32 sequences, float32, 0.81 M parameters) on 8 ranks (`pt.communication_per_step`):

# %%
config = GPTConfig()  # the example's model: 4 layers, C = 128, T = 64
params = GPT(config).num_parameters()
gpt = dict(layers=config.n_layer, batch=32, seq=config.block_size, hidden=config.n_embd)
layouts = [
    dict(dp=8),
    dict(dp=2, tp=2, pp=2),
    dict(dp=2, tp=2, cp=2),
    dict(dp=2, tp=2, cp=2, sequence_parallel=True),
]
for layout in layouts:
    shard = 4 * params / (layout.get("tp", 1) * layout.get("pp", 1))  # gradient bytes per rank (about)
    per_group = pt.communication_per_step(**gpt, grad_bytes=shard, **layout)
    print(f"{layout}:\n    " + ", ".join(f"{g} {t.total / 2**20:.2f} MiB" for g, t in per_group.items()))

# %% [markdown]
# Tensor parallelism moves the most and sits on the critical path: that is why it stays inside a
# node. These are minidist's own bytes, not only the papers': counted at the collectives of a
# `ParallelGPT` and of `ring_attention` on 2 ranks, they equal the formulas
# (`tests/tools/perfmodel/test_perfmodel_transformer.py`).
#
# ## Summary
# - tp splits attention by heads (c_attn strided, c_proj row) and the MLP column then row: 2
#   all-reduces forward and 2 backward per layer; the vocabulary is split by rows of wte.
# - The split-vocabulary loss needs three all-reduces of B x T values: max, sum of exponentials, target.
# - Sequence parallelism turns each all-reduce into reduce-scatter + all-gather: same bytes (plus a
#   re-gather of the column layers' inputs in backward), and the activations shrink by tp.
# - Ring attention passes K/V blocks round the cp group and combines them with an online softmax; the
#   balanced split gives every rank equal causal work.
# - The mesh orders tp, cp, dp, pp from fastest to slowest; gradients average over dp x cp.

# %%
stop_cluster()
