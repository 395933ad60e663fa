"""Lesson 14 source (percent format); `python lessons/build.py` turns it into 14_memory.ipynb."""
# ruff: noqa: E402, F811

# %% [markdown]
# # Lesson 14 — Models too big for one device
#
# **Learning goals.** After this lesson you can
# 1. measure where one training step's memory goes on a rank: parameters, gradients, optimizer state,
#    activations, gathered parameters, communication buffers, current and peak;
# 2. count the activation bytes one GPT block keeps for backward, op by op, and say where this engine
#    differs from the count of Korthikanti et al. (2022);
# 3. give a rank a memory budget, watch a GPT go out of memory on one rank, and train it under the same
#    budget on 4 ranks with fully sharded data parallelism (FSDP, ZeRO stage 3).
#
# Lesson 05 sharded the optimizer state and the gradients (ZeRO stages 1 and 2) and measured the model
# states. This lesson measures *everything* a step holds, activations included, with
# `minidist.memory.MemoryTracker`: it walks the model and the optimizer for the first three categories,
# and the autograd engine reports every array an op keeps for its backward (counted once per buffer,
# however many ops or views share it) and subtracts it when backward releases the op.

# %%
import os
import subprocess
import sys

import numpy as np

import minidist as md
from minidist import memory, nn, optim
from minidist.models import GPT, GPTConfig
from minidist_course.notebook import checks, mpiexec_path
from minidist_tools.perfmodel.memory import gpt_layer_activation_bytes

CE = nn.functional.cross_entropy

# %% [markdown]
# ## 1. Where one step's memory goes
#
# A GPT of 3 blocks of width 96 (343 k parameters) trains 2 AdamW steps on batches of 8 windows of 16
# characters, inside a tracker. `table()` shows, per category, what is held now, its own peak, and what
# it held at the moment of the *total's* peak.


# %%
def make_gpt():
    md.manual_seed(3)
    return GPT(GPTConfig(vocab_size=65, block_size=16, n_layer=3, n_head=2, n_embd=96))


def train(model, opt, steps=2):
    rng = np.random.default_rng(3)
    for _ in range(steps):
        idx, targets = rng.integers(0, 65, (2, 8, 16))
        CE(model(idx).reshape(-1, 65), targets.reshape(-1)).backward()
        opt.step()
        opt.zero_grad()


model = make_gpt()
opt = optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
with memory.MemoryTracker(model, opt) as tracker:
    train(model, opt)
print(tracker.table())
one_rank_peak = tracker.report()["total"]["peak"]

# %% [markdown]
# Read the last column: the peak comes at the end of a forward pass, when every activation is held and
# the AdamW state (two values per parameter) already exists, but no gradient does yet (gradients appear
# during backward, as the activations are freed). Activations are the largest part here; the model
# states (parameters, gradients, AdamW's 8 bytes per parameter) are 16 bytes per parameter.
#
# ## 2. Counting a block's activations
#
# Which arrays does one GPT block (dropout 0) keep until its backward? In minidist an op keeps the
# arrays it saved *and* its input tensors, until its backward releases them. With s the sequence
# length, b the batch, h the width and a the heads, in values:
#
# - each LayerNorm (two per block): its input and the normalised x-hat, s b h each; 1/std, s b values;
#   and the weight divided by h, h values;
# - the attention's input projection `c_attn`: its input, s b h; its output q, k, v together, 3 s b h;
# - attention: q times the scale, s b h; the softmax probabilities, a s² b;
# - its output, s b h, and the copy that joins the heads side by side again, s b h (a transpose then a
#   reshape: a copy whenever there is more than one head);
# - the projection `c_proj`'s output, s b h (the input of the residual addition);
# - the MLP: `c_fc`'s input, s b h; GELU's input and its saved tanh, 4 s b h each; GELU's output, the
#   input of the MLP's `c_proj`, 4 s b h; that projection's output, s b h.
#
# The block's own output is the next block's input: count it there, not here.
#
# **Your turn:** write `block_activation_bytes(s, b, h, a, itemsize)`, the bytes one block keeps
# (`itemsize` bytes per value: 4 in float32). The check compares with the library's count, which the
# tracker's measurements match to the byte in minidist's tests.


# %% [exercise block]
def block_activation_bytes(s, b, h, a, itemsize):
    raise NotImplementedError  # your code here: bytes one block keeps for backward


# %% [check block]
checks.block_activation_bytes(block_activation_bytes)

# %% [markdown reveal]
# **The answer.** Try first; then open this cell (click it, or the bar at its left).
#
# Adding the list: the LayerNorms 4 s b h + 2 s b + 2 h, the attention 8 s b h + a s² b, the MLP
# 14 s b h, so `itemsize * (26 s b h + a s² b + 2 s b + 2 h)` bytes per block.
#
# Korthikanti et al. ("Reducing Activation Recomputation in Large Transformer Models", 2022, §4,
# Table 2) count s b h (34 + 5 a s / h) bytes in 16-bit. The differences: our values are float32
# (4 bytes), dropout masks too, and with dropout 0 there are none (the paper has 1-byte masks after
# attention, its probabilities and the MLP); we keep the softmax output only, not the scores; our
# LayerNorm keeps x-hat besides its input; our GELU keeps its tanh besides its input; the heads' join
# is a copy; and an op keeps all its inputs (the residual additions' inputs), where PyTorch keeps only
# what backward reads.

# %% [markdown]
# Measured: one layer is the difference between a 2-block and a 1-block GPT's activations after
# forward.

# %%
held = {}
for layers in (1, 2):
    md.manual_seed(0)
    gpt = GPT(GPTConfig(vocab_size=65, block_size=16, n_layer=layers, n_head=2, n_embd=96))
    with memory.MemoryTracker(gpt) as t:
        logits = gpt(np.zeros((8, 16), dtype=np.int64))
        held[layers] = t.report()["activations"]["current"]
    del logits
s, b, h, a = 16, 8, 96, 2
print(f"one block, measured:           {held[2] - held[1]:,} bytes")
print(f"one block, minidist's count:   {gpt_layer_activation_bytes(b, s, h, a):,} bytes (float32)")
print(f"Korthikanti et al., 16-bit:    {s * b * h * (34 + 5 * a * s / h):,.0f} bytes")
for t in (2, 4):  # tensor parallelism over t ranks, without and with sequence parallelism (per rank)
    tp, sp = gpt_layer_activation_bytes(b, s, h, 4, tp=t), gpt_layer_activation_bytes(b, s, h, 4, t, True)
    print(f"4 heads on t={t}: tensor parallel {tp:,} B, + sequence parallel {sp:,} B per rank")

# %% [markdown]
# Under tensor parallelism (lesson 11) the ranks split the heads and the MLP, but the LayerNorms, the
# residual stream and the row-parallel layers' partial sums stay whole on every rank; sequence
# parallelism splits those along the sequence too, all but the partial sums that minidist's
# reduce-scatter keeps as its input. `tests/memory/test_memory.py` measures all three counts on real ranks.
#
# ## 3. A budget
#
# Give the rank 4 MiB. The tracker checks the total at every allocation it sees and raises
# `memory.OutOfMemoryError` (a `MemoryError`, as PyTorch's `torch.cuda.OutOfMemoryError`), naming the
# budget, what each category holds, its largest owners, and what would make it fit. (On a real GPU the
# allocator raises when memory runs out; here the budget plays the device's size.)

# %%
budget = "4MiB"
model = make_gpt()
opt = optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
try:
    with memory.MemoryTracker(model, opt, budget=budget):
        train(model, opt)
except memory.OutOfMemoryError as error:
    print(error)
print(f"\nthe step needs {memory.format_bytes(one_rank_peak)} on one rank; the budget is {budget}")

# %% [markdown]
# ## 4. The fix: shard everything over 4 ranks (FSDP)
#
# Fully sharded data parallelism (ZeRO stage 3, Rajbhandari et al. 2020, §5.3; PyTorch FSDP, Zhao et
# al. 2023) keeps 1/N of the parameters, gradients and optimizer state on each rank and all-gathers a
# block's parameters just before it computes, freeing them after. Each rank also takes 1/N of the
# batch, so its activations shrink too. `scripts/fsdp_memory.py` trains the same GPT on 4 ranks under
# the same 4 MiB budget and prints every rank's table.

# %%
cmd = [mpiexec_path(), "-n", "4", sys.executable, "scripts/fsdp_memory.py", budget, "--steps", "2"]
done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=dict(os.environ))
print(done.stdout.strip() or done.stderr[-2000:])

# %% [markdown]
# Each rank holds a quarter of the model states (compare parameters and optimizer_state with section 1),
# plus `gathered_parameters`: the root unit (embeddings, the tied head, the final LayerNorm) for the
# whole step and at most two blocks at a time, the one computing and the next one, whose all-gather was
# issued early to overlap with the computation. `communication` is the flat gradient buffers waiting
# for their reduce-scatter. FSDP recomputes each block's forward during backward (it must: an op would
# otherwise keep the gathered weights alive), so between forward and backward only each block's input
# is kept.
#
# ## 5. Where next
#
# Halving every value's bytes is the other lever: bfloat16 or float16 compute with float32 master
# weights (docs/mixed-precision.md). The same tracker shows what it saves: the activations the
# low-precision products keep take 2 bytes a value; the parameters stay float32 (they are the master
# weights: there is no separate copy) and so do their gradients and the optimizer state.
#
# Try it: `python examples/train_gpt.py --memory` prints each rank's table after training, and
# `--memory-budget 2MiB` (or `MINIDIST_MEMORY_BUDGET=2MiB`) ends the job with the out-of-memory message
# on every rank.
