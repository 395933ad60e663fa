"""Lesson 10 source (percent format); `python lessons/build.py` turns it into 10_transformer.ipynb."""
# ruff: noqa: E402, F811

# %% [markdown]
# # Lesson 10 — A transformer from the ops up
#
# **Learning goals.** After this lesson you can
# 1. write attention as three matrix products and give the shape of every array on the way;
# 2. say what the causal mask prevents, and show it: a later token changes nothing before it;
# 3. explain why the softmax subtracts each row's maximum first (float32 overflows without it);
# 4. derive LayerNorm's backward and check it against finite differences and minidist's op;
# 5. count a GPT's parameters and its training FLOPs per token from its config;
# 6. train a tiny GPT, sample text from it, and train it data-parallel on 2 real ranks with the same
#    losses as on one;
# 7. say where an eager training step's time goes, and what recording the step once and replaying it
#    (what `torch.compile`, CUDA graphs and tinygrad's `TinyJit` do) removes and what it cannot.
#
# Lessons 01-09 trained a small MLP. The models that distributed training exists for are transformers
# (Vaswani et al. 2017, "Attention Is All You Need"); `minidist.models.GPT` is the decoder-only kind
# (Radford et al. 2018, 2019). Everything in it is an op you can read in `minidist/ops/` with its
# backward beside it: `embedding.py`, `layer_norm.py`, `attention.py`, `linear.py`.

# %%
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import matplotlib.pyplot as plt
import numpy as np

import minidist as md
from minidist.data import CharTokenizer, RandomWindows, load_shakespeare, train_val_split
from minidist.models import GPT, GPTConfig
from minidist.nn import functional as F
from minidist_course.notebook import checks, mpiexec_path

rng = np.random.default_rng(0)

# %% [markdown]
# ## 1. Attention is three matrix products
#
# A sequence of T tokens arrives as T vectors of width d. Each position asks a *query* q, offers a
# *key* k and carries a *value* v (three linear maps of its vector). Position i's output is a weighted
# average of all values, with weights from how well its query matches each key:
#
# ```
#   scores  = q @ k.T / sqrt(d)     (T, d) @ (d, T) -> (T, T)   row i: query i against every key
#   weights = softmax(scores)       (T, T), each row sums to 1  (along the keys)
#   out     = weights @ v           (T, T) @ (T, d) -> (T, d)   row i: a mix of the values
# ```
#
# In a GPT the same happens for every sequence of the batch and every head at once: the arrays are
# (B, heads, T, d) and `@` multiplies the last two axes. Let us do it by hand and compare with
# `F.scaled_dot_product_attention` (minidist's name and semantics are PyTorch's).

# %%
T, d = 6, 4
q, k, v = (rng.standard_normal((T, d)) for _ in range(3))
scores = q @ k.T / math.sqrt(d)
weights = np.exp(scores) / np.exp(scores).sum(axis=-1, keepdims=True)
out = weights @ v
print(f"q {q.shape} @ k.T {k.T.shape} -> scores {scores.shape}; weights @ v {v.shape} -> out {out.shape}")
print("each row of weights sums to", weights.sum(axis=-1).round(12))
ours = F.scaled_dot_product_attention(*(md.tensor(a, dtype=np.float64) for a in (q, k, v)))
print("max |by hand - minidist| =", np.max(np.abs(out - ours.data)))

# %% [markdown]
# **Why divide by sqrt(d)?** If q and k have independent entries of variance 1, their dot product is a
# sum of d terms of variance 1: its standard deviation grows like sqrt(d). Wide heads would give huge
# scores, a softmax that puts all its weight on one key, and gradients near zero (Vaswani et al., §3.2.1,
# footnote 4). Dividing by sqrt(d) keeps the scores' spread near 1 at any width:

# %%
for width in (4, 64, 1024):
    a, b = rng.standard_normal((2, 2000, width))
    dots = np.einsum("nd,nd->n", a, b)
    spread = dots.std()
    print(f"d = {width:4d}: std of q.k = {spread:6.2f}, after / sqrt(d): {spread / math.sqrt(width):.2f}")

# %% [markdown]
# ## 2. The causal mask
#
# A language model is trained to predict token t + 1 from tokens 0..t, at every position of a window
# at once. If position t could attend to position t + 1, it would read the answer. The causal mask
# sets the scores above the diagonal to -inf before the softmax, so their weights are exactly 0:
# query i sees keys 0..i only (`is_causal=True`).

# %%
x = rng.standard_normal((T, d))
wq, wk, wv = (rng.standard_normal((d, d)) / math.sqrt(d) for _ in range(3))  # entries of q ~ x's


def self_attention(x, is_causal):
    """One head of self-attention over the rows of x (T, d): q, k and v are linear maps of x."""
    q, k, v = (md.tensor(x @ w, dtype=np.float64) for w in (wq, wk, wv))
    return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal).data


causal_weights = np.where(np.tri(T, dtype=bool), 1.0, 0.0)  # 1 where query i may see key j
fig, ax = plt.subplots(figsize=(3.2, 3))
ax.imshow(causal_weights, cmap="Blues")
ax.set_xlabel("key j")
ax.set_ylabel("query i")
ax.set_title("causal mask: i sees j <= i")
plt.show()

# Change the token at position 4 only (a "future" token for positions 0..3) and compare the outputs.
changed = x.copy()
changed[4] = rng.standard_normal(d)
for is_causal in (True, False):
    moved = np.abs(self_attention(changed, is_causal) - self_attention(x, is_causal)).max(axis=-1)
    print(
        f"is_causal={is_causal!s:5}: change of each position's output:", np.array2string(moved, precision=3)
    )

# %% [markdown]
# With the mask, positions 0..3 do not move at all (exactly 0.0): nothing after a position can change
# its output, so the prediction at t is honest. Without it, every position moves. (Position 5 moves in
# both cases: it may read position 4.)
#
# ## 3. Why the softmax subtracts the row's maximum
#
# softmax(s)_j = e^(s_j) / sum_k e^(s_k). In float32, e^s overflows to `inf` for s > 88.7, and then
# `inf / inf` is `nan`. Scores of 100 are not exotic in training (a sharp head, a large learning rate).
# Subtracting any constant c from a row changes nothing, since e^(s_j - c) / sum_k e^(s_k - c) has
# e^(-c) above and below; with c = max(s) every exponent is <= 0, so nothing overflows, and the
# largest term is exactly e^0 = 1, so the sum is never 0 either.

# %%
row = np.array([100.0, 90.0, 80.0], dtype=np.float32)
with np.errstate(over="ignore", invalid="ignore"):
    naive = np.exp(row) / np.exp(row).sum()
shifted = np.exp(row - row.max()) / np.exp(row - row.max()).sum()
exact = np.exp(row.astype(np.float64) - 100) / np.exp(row.astype(np.float64) - 100).sum()
print("float32, as written:  ", naive)
print("float32, shifted:     ", shifted)
print("float64 reference:    ", exact)
print("minidist (float32):   ", F.softmax(md.tensor(row), dim=-1).data)

# %% [markdown]
# minidist's attention op does this in place on its own (L, S) scores (`minidist/ops/attention.py`):
# subtract the row maximum, exponentiate, divide by the sum. The masked entries are -inf and become
# exactly 0.
#
# ## 4. LayerNorm, forward and backward
#
# Before each sublayer a GPT normalises every position's vector of n = C values (Ba, Kiros & Hinton
# 2016, §3): subtract the mean, divide by the standard deviation, then scale and shift per feature.


# %%
def layer_norm_forward(x, gamma, beta, eps=1e-5):
    mu = x.mean(-1, keepdims=True)
    sigma = np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + eps)
    return (x - mu) / sigma * gamma + beta


n = 8
xs, gamma, beta = rng.standard_normal((3, n)) * 4 + 2, rng.uniform(0.5, 1.5, n), rng.standard_normal(n)
y = layer_norm_forward(xs, gamma, beta)
ln = md.nn.LayerNorm(n, dtype=np.float64)
ln.weight.data[...], ln.bias.data[...] = gamma, beta
print("max |ours - nn.LayerNorm| =", np.abs(y - ln(md.tensor(xs, dtype=np.float64)).data).max())
print("per row, before gamma and beta: mean", ((y - beta) / gamma).mean(-1).round(12) + 0.0,
      "std", ((y - beta) / gamma).std(-1).round(4))  # fmt: skip

# %% [markdown]
# **The backward.** Write xhat = (x - mu) / sigma, with mu = mean(x) and sigma = sqrt(mean((x - mu)^2)
# + eps) over one row, and y = gamma * xhat + beta. Given dy = dL/dy for one row:
#
# - dL/dbeta and dL/dgamma are sums over the rows (beta and gamma are shared by all rows): dy, and dy
#   times xhat.
# - The gradient reaching xhat is g = dy times gamma.
# - Each xhat_i depends on x_j three ways: directly (only when i = j, with slope 1/sigma), through mu
#   and through sigma. The two statistics' slopes:
#   - d mu / d x_j = 1/n;
#   - sigma^2 = mean((x - mu)^2) + eps gives 2 sigma d sigma / d x_j = (2/n) (x_j - mu) (the term
#     from mu drops out, since the (x_i - mu) sum to 0), so d sigma / d x_j = xhat_j / n.
#
# Combine them with the quotient rule on (x_i - mu) / sigma and sum over i: dL/dx_j = sum_i g_i d xhat_i
# / d x_j. The result is short; write it with means over the row.
#
# **Your turn:** `layer_norm_backward(x, gamma, dy, eps)` for x and dy of shape (N, n) and gamma (n,):
# return `(dx, dgamma, dbeta)`. The check compares with central finite differences and with minidist's
# op (`minidist/ops/layer_norm.py`; reading it before trying spoils the exercise).


# %% [exercise layernorm]
def layer_norm_backward(x, gamma, dy, eps=1e-5):
    raise NotImplementedError  # your code here: return dx, dgamma, dbeta


# %% [check layernorm]
checks.layer_norm_backward(layer_norm_backward)

# %% [markdown reveal]
# **The answer.** Try first; then open this cell (click it, or the bar at its left).
#
# d xhat_i / d x_j = (1/sigma) (delta_ij - 1/n - xhat_i xhat_j / n). Summed against g_i:
#
#     dL/dx = (1/sigma) * (g - mean(g) - xhat * mean(g * xhat)),   g = dy * gamma
#
# The two subtracted terms remove the parts of g along the directions that normalisation takes out: a
# shift of the whole row (which changes neither xhat nor y, so each row of dx sums to 0) and a scaling
# of it (so dx is orthogonal to xhat too, up to the tiny eps). Forgetting the second, the
# `mean(g * xhat)` term, is the classic mistake: it treats sigma as a constant. minidist's op computes
# exactly this, in one pass that keeps only xhat and 1/sigma from the forward.

# %% [markdown]
# ## 5. Counting a GPT's parameters and FLOPs
#
# `GPT(config)` is: a token embedding (V, C) and a position embedding (T, C), then L blocks, then a
# final LayerNorm and a head that maps C back to V scores. The head *is* the token embedding's table
# (weight tying, Press & Wolf 2017): the same parameter reads a token in and writes it out. One block:

# %%
md.manual_seed(0)
tiny = GPT(GPTConfig(vocab_size=65, block_size=16, n_layer=1, n_head=2, n_embd=8))
for name, p in tiny.named_parameters():
    print(f"{name:22s} {str(p.shape):10s} {p.data.size:5d}")
print("total:", tiny.num_parameters())

# %% [markdown]
# **Your turn (1):** `count_parameters(config)`: the parameters of `GPT(config)` from the config's
# fields (`vocab_size`, `block_size`, `n_layer`, `n_head`, `n_embd`), for configs with biases and the
# tied head (the defaults). The check compares with `num_parameters()` of models it builds, and with
# GPT-2 small (Radford et al. 2019: V = 50257, T = 1024, L = 12, C = 768, 124 M parameters).


# %% [exercise params]
def count_parameters(config):
    raise NotImplementedError  # your code here


# %% [check params]
checks.count_parameters(count_parameters)

# %% [markdown reveal]
# **The answer.** Try first; then open this cell (click it, or the bar at its left).
#
# Per block: two LayerNorms (2 x 2C), c_attn (3C^2 + 3C), attention's c_proj (C^2 + C), the MLP's c_fc
# (4C^2 + 4C) and c_proj (4C^2 + C): 12 C^2 + 13 C. In all, V C + T C + L (12 C^2 + 13 C) + 2 C. The
# heads only split the width C, so their number changes nothing. For wide models the 12 L C^2 of the
# blocks dominates, which is where "parameters ~ 12 L C^2" comes from.

# %% [markdown]
# **Your turn (2):** `count_flops(config)`: the matrix-multiply FLOPs to *train* on one token, the
# quantity behind the MFU (model-FLOPs utilisation) that `examples/train_gpt.py` prints (PaLM,
# Chowdhery et al. 2022, appendix B). Conventions, as `GPT.flops_per_token()`:
# - a multiply-add counts as 2 FLOPs, and only matrix products count (softmax, LayerNorm, GELU do not);
# - backward costs twice the forward (a product's gradient needs two products of the same size);
# - attention's two products (scores, and weights times values) are counted over all T keys, the full
#   T x T square, although the mask zeroes half of it;
# - the head's product with the (V, C) table counts, although its weights are the embedding's.


# %% [exercise flops]
def count_flops(config):
    raise NotImplementedError  # your code here


# %% [check flops]
checks.count_flops(count_flops)

# %% [markdown reveal]
# **The answer.** Try first; then open this cell (click it, or the bar at its left).
#
# Forward, per token: each block's q, k, v and output projections (2 x 4 C^2), its MLP (2 x 8 C^2), and
# attention's two products against T keys of width C (2 x 2 T C): 24 C^2 + 4 T C; then the head's
# 2 C V. Training: 3 x (L (24 C^2 + 4 T C) + 2 C V). Without the attention and embedding terms this is
# 6 x (12 L C^2), about 6 FLOPs per parameter per token: the "C ~ 6 N D" of Kaplan et al. 2020.

# %%
for name, config in [
    ("this lesson's tiny model", GPTConfig(vocab_size=65, block_size=32, n_layer=2, n_head=2, n_embd=32)),
    ("train_gpt.py's default", GPTConfig()),
    ("GPT-2 small", GPTConfig(vocab_size=50257, block_size=1024, n_layer=12, n_head=12, n_embd=768)),
]:
    per_token = GPT.flops_per_token(SimpleNamespace(config=config))  # sizes only: no 124 M weights built
    print(f"{name:25s} {per_token / 1e6:10.1f} MFLOP per token trained")

# %% [markdown]
# ## 6. Train a tiny GPT and let it write
#
# Characters of Shakespeare (bundled with minidist), a 2-layer model of width 32, 32 characters of
# context: a few seconds of training on a laptop. The target of position t is the character at t + 1
# (`RandomWindows` cuts the windows; lesson 04's data parallelism will split them over ranks).

# %%
text = load_shakespeare()
tokenizer = CharTokenizer(text)
train_ids, val_ids = train_val_split(tokenizer.encode(text))
config = GPTConfig(vocab_size=tokenizer.vocab_size, block_size=32, n_layer=2, n_head=2, n_embd=32)
md.manual_seed(1337)
gpt = GPT(config)
print(f"{len(text):,} characters, vocabulary of {tokenizer.vocab_size}; {gpt.num_parameters():,} parameters")
prompt = np.array([tokenizer.encode("\n")])
sample = gpt.generate(prompt, 120, generator=np.random.default_rng(0))
print("--- untrained ---\n" + tokenizer.decode(sample[0]))

# %%
STEPS = 120  # a few seconds; try 2000 (a minute or two): names, line breaks and words appear
windows = RandomWindows(train_ids, config.block_size, 16, seed=0, rank=0, world_size=1)
optimizer = md.optim.AdamW(gpt.parameters(), lr=1e-2)
losses, start = [], time.perf_counter()
for _ in range(STEPS):
    xb, yb = windows.next()  # (16, 32) ids, and the same windows shifted by one character
    loss = F.cross_entropy(gpt(xb).reshape(-1, config.vocab_size), yb.reshape(-1))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    losses.append(loss.item())
seconds = time.perf_counter() - start
print(
    f"{STEPS} steps in {seconds:.1f} s; loss {losses[0]:.2f} -> {np.mean(losses[-10:]):.2f} (last 10 steps)"
)
print(
    f"(a model that knows nothing scores ln({tokenizer.vocab_size}) = {math.log(tokenizer.vocab_size):.2f})"
)
sample = gpt.generate(prompt, 200, temperature=0.8, generator=np.random.default_rng(0))
print("--- after training ---\n" + tokenizer.decode(sample[0]))

# %% [markdown]
# The model learns the character statistics first: spaces, common letter pairs, capitals after line
# breaks. `generate` feeds its own output back in, one character at a time; `temperature` < 1 sharpens
# the softmax, `top_k` keeps only the k likeliest characters. `examples/train_gpt.py` trains a 4-layer
# model of width 128 for longer, data-parallel; its docstring says what each flag costs and buys.
#
# ## 7. The same model, data-parallel on real ranks
#
# `scripts/gpt_dp.py` trains a smaller GPT for 6 steps with `DistributedDataParallel` and AdamW, in
# float64: each step every rank draws the same global batch of 8 windows and keeps its slice, and DDP
# averages the gradients during backward. We run it on 1 rank and on 2 and compare every loss and every
# final weight.

# %%
mpiexec, python = mpiexec_path(), sys.executable
work = Path(tempfile.mkdtemp(prefix="minidist_lesson10_"))
runs = {}
for n in (1, 2):
    cmd = [mpiexec, "-n", str(n), python, "scripts/gpt_dp.py", str(work / f"ranks{n}.npz")]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=dict(os.environ))
    print(done.stdout.strip() or done.stderr[-800:])
    runs[n] = np.load(work / f"ranks{n}.npz")
print("losses, 1 rank: ", runs[1]["losses"].round(6))
print("losses, 2 ranks:", runs[2]["losses"].round(6))
print(f"max |loss difference| = {np.abs(runs[1]['losses'] - runs[2]['losses']).max():.1e}")
print(f"max |weight difference| after training = {np.abs(runs[1]['params'] - runs[2]['params']).max():.1e}")

# %% [markdown]
# The same to about 1e-15 (losses) and 1e-14 (weights): only the order of the additions differs (two
# half-batch means averaged instead of one mean over the whole batch), and float64 rounds at 1e-16 per
# operation. The same script in float32 (measured over 20 steps) gives losses that differ by about 1e-7
# and weights that end about 1e-4 apart: AdamW divides each update by the gradient's running size, so
# the smallest gradients' rounding differences become full-size steps. That is why minidist's
# equivalence tests compare in float64.
#
# ## 8. Where an eager step's time goes, and a step recorded once and replayed
#
# Every op of an eager step pays for what makes eager friendly: `Function.apply` makes a `Tensor`,
# records the op in the graph and its inputs' versions, the functions check their arguments, and
# `backward()` counts each tensor's consumers, walks the graph and checks every gradient an op returns.
# None of it is arithmetic. A compiler records the step once and afterwards runs only the arithmetic:
# `torch.compile` (Ansel et al. 2024) captures a graph guarded by the inputs' shapes, CUDA graphs
# relaunch the recorded kernels with one call, tinygrad's `TinyJit` replays the kernels of a function's
# second call.
#
# `md.compile.Replay` does this for a minidist step. Its first two calls run eagerly with a recorder on:
# `Function.apply` reports each op, the graph walk reports the order in which it ran each backward and
# set each `.grad`. From the third call it replays: the same `forward` and `backward` methods on bare
# arrays, in the recorded order, so every number comes out with the same bits as eagerly. First, the
# recorded program of our tiny GPT:

# %%
from minidist.compile import Replay


def loss_of(x, y):
    return F.cross_entropy(gpt(x).reshape(-1, config.vocab_size), y.reshape(-1))


def eager_step(x, y):
    loss = loss_of(x, y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()


replayed_step = Replay(gpt, optimizer, loss_of)
batches = [windows.next() for _ in range(4)]
for xb, yb in batches[:2]:  # calls 1 and 2: eager, recorded
    replayed_step(xb, yb)
program = repr(replayed_step.program).splitlines()
ops = 1 + len(replayed_step.program.sources)  # the header line, then one line per source
backward = program.index(next(line for line in program if line.startswith("backward from")))
shown = program[:4] + ["..."] + program[ops : ops + 8] + ["..."] + program[backward : backward + 6]
print("\n".join(shown + ["..."]))

# %% [markdown]
# `%n` is a slot: an array the replay fills. Sources first (the parameters; a step input that an op
# takes as an option, as the token ids, shows as `input0` in that op's line), then one line per op
# (`ReplayGELU` is GELU with fewer temporaries, the same bits: `minidist/compile/kernels.py`), then the
# backward as a fixed list. Now the time per step, eager against replayed, one step of each in turn so
# that both see the same load (CPU time, medians), and PyTorch's eager twin of the same model where it is
# installed (`benchmarks/torch_gpt.py` beside a checkout of minidist):


# %%
def cpu_seconds(step, xb, yb):
    start = time.process_time()
    step(xb, yb)
    return time.process_time() - start


contenders = {"eager minidist": eager_step, "replayed minidist": replayed_step}
bench = Path(md.__file__).resolve().parents[1] / "benchmarks"
try:
    import torch

    sys.path.insert(0, str(bench))
    from torch_gpt import TorchGPT, load_minidist

    torch.set_num_threads(1)
    twin = TorchGPT(config.vocab_size, config.block_size, config.n_layer, config.n_head, config.n_embd)
    load_minidist(twin, {name: p.numpy() for name, p in gpt.named_parameters()})
    twin_opt = torch.optim.AdamW(twin.parameters(), lr=1e-2, foreach=False)

    def torch_step(x, y):
        logits = twin(torch.from_numpy(x))
        targets = torch.from_numpy(y).reshape(-1)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, config.vocab_size), targets)
        loss.backward()
        twin_opt.step()
        twin_opt.zero_grad()

    contenders["PyTorch eager"] = torch_step
except ImportError:
    print("(PyTorch, or benchmarks/torch_gpt.py beside minidist, is not here: minidist only)")
times = {name: [] for name in contenders}
for r in range(40):  # one step of each in turn: neighbouring steps see the same load
    for name, step in contenders.items():
        times[name].append(cpu_seconds(step, *batches[r % len(batches)]))
eager = np.array(times["eager minidist"])
for name, t in times.items():
    print(f"{name:18s} {1000 * np.median(t):6.2f} ms per step, {np.median(np.array(t) / eager):.2f}x eager")
print(f"replayed steps so far: {replayed_step.replays}")

# %% [markdown]
# And where the eager step's time went: a profile of a few eager steps, each function's own time, split
# into the ops' `forward` and `backward` methods (the arithmetic a replay keeps) and everything else
# (what it removes).

# %%
import cProfile
import pstats

profiler = cProfile.Profile()
profiler.runcall(lambda: [eager_step(xb, yb) for xb, yb in batches])
stats = pstats.Stats(profiler).stats  # (file, line, function) -> (calls, ..., own, total, callers)
# The time inside each op's forward and backward (NumPy's work there included), as called by
# Function.apply and by the graph walk: the arithmetic a replay keeps.
in_ops = sum(
    timing[3]
    for (path, _, fn), v in stats.items()
    if "minidist/ops/" in path and fn in ("forward", "backward")
    for caller, timing in v[4].items()
    if caller[2] in ("apply", "_checked_backward")
)
total = sum(v[2] for v in stats.values())
share = in_ops / total
print(f"the ops' forward and backward: {share:.0%} of the eager step; the other {1 - share:.0%}:")
print("bookkeeping, checks, modules, the optimizer, and NumPy calls made outside the ops. Own time, top 8:")
top = sorted(stats.items(), key=lambda kv: -kv[1][2])[:8]
for (path, line, fn), v in top:
    print(f"  {v[2] / total:6.1%}  {fn:28s} {Path(path).name}:{line}")

# %% [markdown]
# Compare the two measurements. The profile overstates the bookkeeping: cProfile adds a fixed cost to
# every Python call it sees, and bookkeeping is many small calls; the timing is the fair measure. On
# this tiny model (width 32, 512 tokens a step) the NumPy calls themselves are short, so each op's call
# overhead inside its own `forward` and `backward` (a microsecond or so per NumPy call, whatever its
# size) weighs too, and a replay keeps those. On the 4-layer, 128-wide GPT of `benchmarks/gpt.py` the
# replay saves 4-8 % of an eager step (docs/performance.md, "Capture once, replay"). What remains is
# arithmetic NumPy does more slowly than PyTorch's kernels (exact GELU's `erf` leads the profile above;
# elementwise passes a compiler would fuse into one loop): a replay cannot change that without changing
# the numbers. `python benchmarks/replay.py` measures both models against PyTorch.
#
# A replay is valid only while what it recorded holds: the guards compare the inputs' shapes, grad mode,
# every module's `training` flag and the parameters before each call, and run the step eagerly, with a
# one-line `ReplayFallbackWarning`, when one differs. `model.eval()` is such a change (no dropout):

# %%
import warnings

gpt.eval()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    replayed_step(*batches[0])  # runs eagerly, and says why
gpt.train()
print(caught[0].message)

# %% [markdown]
# ## Summary
# - Attention is scores = q k^T / sqrt(d), a row-wise softmax, and a weighted sum of values: three
#   products on (B, heads, T, d) arrays. The causal mask makes position t blind to what follows it.
# - A softmax shifted by the row maximum cannot overflow and gives the same result.
# - LayerNorm's gradient subtracts the mean and the xhat-component of the incoming gradient: derived
#   once, checked with finite differences, written as one fused op.
# - A GPT's parameters and FLOPs follow from four numbers (V, T, L, C); training costs about 6 FLOPs
#   per parameter per token.
# - Data parallelism trains the same transformer as one process: same losses, same weights.
# - An eager step pays per op for bookkeeping; recorded once and replayed (`md.compile.Replay`) it keeps
#   only the arithmetic, with the same bits, while its guards hold. What is left is the kernels' speed.
#
# Next: lesson 11 splits this GPT over tensor, sequence and pipeline parallelism (lessons
# 06 and 07 showed the pieces on an MLP).
