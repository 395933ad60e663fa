"""Lesson 08 source (percent format); `python lessons/build.py` turns it into 08_checkpoints.ipynb."""
# ruff: noqa: E402, F811

# %% [markdown]
# # Lesson 08 — Checkpoints and failures
#
# **Learning goals.** After this lesson you can
# 1. say what a checkpoint must hold for a run to continue *bit-exactly*, and how it is committed so
#    that a crash at any moment leaves a loadable one;
# 2. kill a rank in the middle of training and resume from the last checkpoint, bit for bit;
# 3. load a checkpoint on another mesh (other dp, tp or pp) and say which shards each rank reads;
# 4. trade compute for memory with activation recomputation, and measure the trade.
#
# On a thousand GPUs, something fails every few hours: a node, a link, a disk. A job that cannot resume
# loses everything since it started; one that resumes *approximately* (a different data order, a reset
# optimizer) trains a different model. The code is `minidist/checkpoint/`: `atomic.py` (the commit
# protocol) → `format.py` (manifest and shard files) → `layout.py` (who writes and who reads each
# shard) → `save.py` → `load.py`, with the checks apart in `checks.py` (every rank raises the same
# error) and `file_checks.py` (sizes and sha256); activation recomputation is `minidist/nn/recompute.py`.

# %%
import json
import os
import subprocess
import sys
import tempfile
import tracemalloc
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

from minidist_course.notebook import checks, mpiexec_path

mpiexec, python = mpiexec_path(), sys.executable
work = Path(tempfile.mkdtemp(prefix="minidist_lesson08_"))


def train(out, *flags, show=True):
    """Run scripts/ckpt_train.py on 2 ranks; print its output; return its exit code."""
    cmd = [mpiexec, "-n", "2", python, "scripts/ckpt_train.py", str(work / out), *map(str, flags)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=dict(os.environ))
    if show:
        print(done.stdout + done.stderr[-600:])
    return done.returncode


# %% [markdown]
# ## 1. What a checkpoint holds, and how it is committed
#
# To continue as if nothing had happened, a run needs more than the weights: the optimizer state (Adam's
# two moments and its step count), where the data sampler was (epoch and position: which samples come
# next), and the random generators (dropout masks). `checkpoint.save` writes all of it, sharded: each
# rank writes the tensors it holds (each distinct shard once: data-parallel replicas share the work),
# and rank 0 writes a `manifest.json` that names every tensor by its *global* name and shape, and lists
# every file with its sha256. On disk:
#
# ```
# DIR/latest                               text: the name of the newest complete checkpoint
# DIR/step_000000008/manifest.json
# DIR/step_000000008/rank00000.safetensors ...
# ```
#
# The commit protocol (`atomic.py`) makes a crash at any moment harmless:
#
# 1. every rank writes its shard into a temporary folder `DIR/.tmp-step_000000008-<id>/` and fsyncs it;
# 2. the ranks compare notes (an error anywhere aborts the save everywhere); rank 0 writes the
#    manifest, fsyncs it, and *renames* the folder to `step_000000008` (atomic on POSIX);
# 3. only then does rank 0 replace `latest` (write `latest.tmp`, fsync, rename over `latest`).
#
# Before step 2 the new checkpoint does not exist under its name; before step 3 `latest` still names
# the previous one. A folder `.tmp-...` is never loaded, and is cleaned up by the next save.
#
# ## 2. Kill a rank, resume bit-exactly
#
# `scripts/ckpt_train.py` trains a tiny two-block tensor-parallel MLP (`ParallelMLP`, float64) with AdamW
# on 2 ranks, any mesh `dp,tp,pp`. First a reference run of 16 steps, uninterrupted:

# %%
assert train("reference.npz", "--ckpt", work / "unused", "--steps", 16) == 0  # exit code 0: it finished

# %% [markdown]
# Now the same run saving every 4 steps — but rank 1 "crashes" (SIGKILL, no clean-up) just before step
# 10. MPI's launcher then tears down the whole job, as a real cluster scheduler would:

# %%
ckpt = work / "ckpt"
code = train("crashed.npz", "--ckpt", ckpt, "--steps", 16, "--every", 4, "--kill", "1:9")
print("exit code", code)

# %% [markdown]
# What survived? `minidist checkpoint info DIR` lists the checkpoints (`*` marks `latest`) and
# describes the newest: its mesh, files, and every tensor with its global shape, `tp_dim` (the axis
# along which it is split over the tensor-parallel ranks; `-` = replicated) and number of shards.

# %%
# !{python} -m minidist_cli checkpoint info {ckpt}

# %% [markdown]
# **Your turn.** Rank 0 switches `latest` only when a set of files exists, durably, in the committed
# folder. Write `files_before_latest(step, writers)`: the set of paths (relative to `DIR`, like
# `"step_000000008/manifest.json"`) that must exist, for a checkpoint of `step` whose shard files were
# written by the ranks in `writers`. The cell after the check compares your answer with what is on disk.


# %% [exercise files]
def files_before_latest(step, writers):
    raise NotImplementedError  # your code here: a set of relative paths


# %% [check files]
checks.files_before_latest(files_before_latest)

# %%
on_disk = {str(p.relative_to(ckpt)) for p in (ckpt / "step_000000008").iterdir()}
print("on disk:", sorted(on_disk))
try:
    print("your answer matches the disk:", files_before_latest(8, [0, 1]) == on_disk)
except NotImplementedError:
    print("(write files_before_latest above to compare)")

# %% [markdown]
# Resume on the same mesh. `checkpoint.load_latest` first verifies *everything* (manifest, every file's
# size and sha256, the model's names and shapes) on every rank, and only then changes the model,
# the optimizer, the sampler and the generators. Steps 9 to 16 are trained again:

# %%
train("resumed.npz", "--ckpt", ckpt, "--steps", 16, "--resume")
reference, resumed = np.load(work / "reference.npz"), np.load(work / "resumed.npz")
same = all(np.array_equal(reference[k], resumed[k]) for k in reference.files)
print(f"{len(reference.files)} parameters, bit-for-bit equal to the uninterrupted run: {same}")

# %% [markdown]
# Bit-for-bit, not "close": the same numbers went through the same operations in the same order. Try
# removing the sampler from the checkpoint in your head — the resumed run would see the batches of a
# new epoch, and the losses above would differ from step 9 on.
#
# ## 3. Resume on another mesh
#
# The replacement nodes may not be the same, or you may want more tensor parallelism. Because the
# manifest names tensors by global name and global shape, a checkpoint loads on any mesh whose model
# has the same global parameters (resharding, in `layout.py`):
#
# - **dp** changes need nothing: replicas are copies;
# - **pp** changes need nothing either: a stage reads the global names it now owns;
# - **tp** changes: a rank needs slice `tp_rank` of `tp'` equal slices of the global tensor along
#   `tp_dim`, assembled from the saved shards.
#
# We resume the dp=2 checkpoint of step 8 as tp=2 (2 tensor-parallel ranks), train to step 12 and save;
# then resume *that* checkpoint as pp=2 (2 pipeline stages) and finish the 16 steps.

# %%
train("tp.npz", "--ckpt", ckpt, "--mesh", "1,2,1", "--steps", 12, "--every", 4, "--resume")
train("pp.npz", "--ckpt", ckpt, "--mesh", "1,1,2", "--steps", 16, "--resume")
pipeline = np.load(work / "pp.npz")
error = max(np.max(np.abs(reference[k] - pipeline[k])) for k in reference.files)
print(f"dp=2 -> tp=2 -> pp=2: max |difference| from the uninterrupted run = {error:.1e}")

# %% [markdown]
# Not bit-exact any more, and it cannot be: with tp=2 the row-parallel layer adds two partial sums
# where one device computed one matmul — the same numbers in another order, so rounding differs in the
# last bit (float64: ~1e-16). The training is the same.
#
# The step-12 checkpoint was written by the tp=2 run: its tensor-parallel tensors now have 2 shards.

# %%
manifest = json.loads((ckpt / "step_000000012" / "manifest.json").read_text())
print("saved mesh:", manifest["mesh"])
for key in ["model/0.fc1.weight", "model/0.fc2.weight", "model/0.fc2.bias"]:
    t = manifest["tensors"][key]
    shards = [(s["file"], s["tp_rank"], s["shape"]) for s in t["shards"]]
    print(f"{key:20} global {t['global_shape']}, tp_dim {t['tp_dim']}: {shards}")

# %% [markdown]
# **Your turn.** A tensor of `size` rows (along `tp_dim`) was saved as `saved_tp` equal shards. Rank
# `r` of a run with `new_tp` ranks needs rows `[r*size/new_tp, (r+1)*size/new_tp)`. Write
# `shards_needed(size, saved_tp, new_tp, r)`: a list of `(saved_shard, lo, hi)`, meaning rows `lo:hi` of
# saved shard `saved_shard` (rows *local* to that shard), in order, touching only the shards that
# overlap. For example, `model/0.fc1.weight` above (16 rows, 2 shards) on tp=4, rank 1 needs rows 4-7:
# `[(0, 4, 8)]`. (minidist's `layout.needed_shards` simply reads all shards when tp changes, which is
# simpler and fine at this size; at 1,000 GPUs you read only what you need.)


# %% [exercise shards]
def shards_needed(size, saved_tp, new_tp, r):
    raise NotImplementedError  # your code here: [(saved_shard, lo, hi), ...]


# %% [check shards]
checks.shards_needed(shards_needed)

# %% [markdown]
# ## 4. Activation recomputation
#
# Checkpoints save *state* across failures; activation recomputation (also called "gradient
# checkpointing") saves *memory* inside one step. Backward needs every layer's activations, so a plain
# forward keeps them all. `recompute(fn, x)` (`minidist/nn/recompute.py`; Chen et al., "Training Deep
# Nets with Sublinear Memory Cost", 2016, §3) runs a segment `fn` without recording its graph, keeps only
# its input `x`, and runs it again in backward. With `n` layers in segments of `k`, a step stores about
# `n / k` segment inputs plus, during backward, one segment's `k` activations: least near `k = sqrt(n)`,
# for the price of one extra forward.
#
# We measure with `tracemalloc` (NumPy reports its allocations to it): bytes held after the forward
# (what the graph keeps) and the peak during backward, for 32 layers (16 x Linear(256, 256) + Tanh,
# batch 512, float64), and check that the gradients do not change.

# %%
import minidist as md
from minidist import nn
from minidist.nn.recompute import recompute

md.manual_seed(0)
layers = []
for _ in range(16):
    layers += [nn.Linear(256, 256, dtype=np.float64), nn.Tanh()]
x = md.tensor(np.random.default_rng(0).standard_normal((512, 256)), dtype=np.float64)


def segment(start, stop):
    def run(h):
        for layer in layers[start:stop]:
            h = layer(h)
        return h

    return run


results, reference_grads = {}, None
for k in [None, 1, 2, 4, 8, 16, 32]:  # None: no recomputation
    for layer in layers:
        layer.zero_grad()
    tracemalloc.start()
    h = x
    for start in range(0, len(layers), k or len(layers)):
        run = segment(start, start + (k or len(layers)))
        h = run(h) if k is None else recompute(run, h)
    loss = (h * h).mean()
    held = tracemalloc.get_traced_memory()[0]
    tracemalloc.reset_peak()
    loss.backward()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    grads = [p.grad.copy() for layer in layers for p in layer.parameters()]
    reference_grads = reference_grads or grads
    same = all(np.array_equal(a, b) for a, b in zip(grads, reference_grads))
    results[k] = (held / 2**20, peak / 2**20)
    label = "no recomputation" if k is None else f"segments of {k:2d} layers"
    print(f"{label:>20}: held {held / 2**20:5.1f} MiB, peak {peak / 2**20:5.1f} MiB, same grads: {same}")

ks = [k for k in results if k is not None]
fig, ax = plt.subplots(figsize=(6.5, 3.4))
ax.plot(ks, [results[k][0] for k in ks], "o-", label="held after forward")
ax.plot(ks, [results[k][1] for k in ks], "s-", label="peak during backward")
ax.axhline(results[None][1], color="gray", ls="--", label="peak without recomputation")
ax.set_xscale("log", base=2)
ax.set_xlabel("layers per recomputed segment (k)")
ax.set_ylabel("MiB")
ax.legend(fontsize=8)
plt.tight_layout()
plt.show()

# %% [markdown]
# The peak includes the gradients (8 MiB of parameters' worth) and is lowest for segments of a few
# layers, near `sqrt(32) ≈ 6`. Very long segments bring the memory back: the one being recomputed holds
# all its activations at once. `examples/train_mlp.py --recompute` recomputes each hidden block this way;
# Megatron-LM recomputes selectively, only the activations that are cheap to recompute but large to
# store (Korthikanti et al. 2022).
#
# ## Summary
# - A bit-exact resume needs weights, optimizer state, sampler position and generator states; a commit
#   order (shards → manifest → rename → `latest`) makes every crash leave a loadable checkpoint.
# - Global names and shapes in the manifest let any mesh load any checkpoint: dp and pp need nothing,
#   tp assembles and re-slices along `tp_dim`.
# - Recomputation stores segment inputs only: memory about `n/k + k` layers' worth for one extra forward.
#
# Next: [lesson 09](09_scaling.ipynb) puts dp, tp and pp together on one mesh.
