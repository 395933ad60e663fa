"""Lesson 07 source (percent format); `python lessons/build.py` turns it into 07_pipeline_parallel.ipynb."""
# ruff: noqa: E402, F811

# %% [markdown]
# # Lesson 07 — Pipeline parallelism: GPipe, 1F1B and the bubble
#
# **Learning goals.** After this lesson you can
# 1. run one GPipe step with plain blocking sends and receives (`naive.py`), and say why it is slow;
# 2. read a pipeline schedule as a list of instructions per stage, and draw it as a Gantt chart;
# 3. derive the bubble fraction of a step and check it against a simulation and real ranks;
# 4. explain why 1F1B holds far fewer activations than GPipe for the same bubble.
#
# Tensor parallelism (lesson 06) splits each layer; pipeline parallelism splits the model *by layers*:
# stage s (one rank) holds a run of consecutive layers, sends its activations to stage s+1 and receives
# gradients back. One batch would keep only one stage busy at a time, so it is cut into `m`
# *microbatches* that follow each other down the pipe. The code is `minidist/parallel/pipeline/`:
# `naive.py` (the whole idea in one function, read first) → `schedules.py` (what each stage does, as
# plain data) → `simulate.py` (run it on paper; `minidist_tools/gantt.py` prints and draws it) →
# `executor.py` and `messaging.py` (run it over MPI) → `pipeline_parallel.py` (`PipelineParallel`).

# %%
import inspect
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt

from minidist.parallel.pipeline import (
    gpipe,
    naive_gpipe_step,
    one_f_one_b,
    peak_activations,
    simulate,
)
from minidist_course.notebook import checks, mpiexec_path
from minidist_tools.gantt import draw_gantt, text_grid, timeline_from_trace
from minidist_tools.perfmodel import step as perfmodel

# %% [markdown]
# ## 1. The simplest pipeline: a naive GPipe step
#
# First the whole idea in one function, `naive_gpipe_step` (`minidist/parallel/pipeline/naive.py`,
# the first file to read in the folder). Every rank holds one stage. For each microbatch in turn, a
# stage receives its input from the previous stage (stage 0 takes the data), runs its layers, keeps
# the output with its autograd graph and sends the output on; then, for each microbatch, it receives
# the gradient of that output from the next stage (the last stage starts from the loss), runs backward
# and sends its input's gradient back. Nothing but blocking `send` and `recv`:

# %%
print(inspect.getsource(naive_gpipe_step))

# %% [markdown]
# It is correct: `scripts/naive_gpipe.py` trains the same model with it and with minidist's
# `PipelineParallel`, whose GPipe and 1F1B schedules give the same numbers bit for bit (the tests use
# the naive step as their reference).

# %%
mpiexec, python = mpiexec_path(), sys.executable
# !OMP_NUM_THREADS=1 {mpiexec} -n 2 {python} scripts/naive_gpipe.py

# %% [markdown]
# But it is slow, in two ways the rest of this lesson measures. While stage 0 runs its forwards, stage 1
# has nothing to do, and while stage 1 runs its last backwards stage 0 waits: the time a stage idles is
# the **bubble** (section 4). And every stage keeps the graphs of all `m` microbatches until their
# backwards, which costs activation memory (section 6). The order of the steps is fixed in the code, so
# trying another order means writing another function; minidist instead writes the order down as
# data: a *schedule*.
#
# ## 2. A schedule is a list of instructions
#
# `F3` = forward of microbatch 3, `B3` = its backward, `sA`/`rA` = send/receive activations (to and
# from the next/previous stage), `sG`/`rG` = the same for gradients. `sA2+rG0` is one `sendrecv`: two
# neighbours that would both send at once exchange in one call, which is how the executor avoids the
# deadlock of lesson 02.

# %%
print(gpipe(3, 4))
print()
print(one_f_one_b(3, 4))

# %% [markdown]
# **GPipe** (Huang et al. 2019, §2.2) runs all forwards, then all backwards. **1F1B** (PipeDream-Flush,
# Narayanan et al. 2021, §2.2.1): stage s runs `p - s - 1` warm-up forwards, then alternates one
# forward and one backward, then drains. `simulate` runs the programs with blocking messages (a send
# waits for its receive), forward time 1, backward time 2, and `text_grid` prints the timeline:
# `..` is a stage waiting — the **bubble**.

# %%
print(text_grid(gpipe(3, 4), formula=False))  # formula=False: the bubble's formula is yours to derive
print()
print(text_grid(one_f_one_b(3, 4), formula=False))

# %% [markdown]
# ## 3. Gantt charts
#
# The same with 4 stages and 8 microbatches, drawn with `draw_gantt` (blue: forward, orange: backward).

# %%
fig, axes = plt.subplots(2, 1, figsize=(11, 5), sharex=True)
for ax, schedule in zip(axes, [gpipe(4, 8), one_f_one_b(4, 8)]):
    draw_gantt(schedule, ax=ax)
plt.tight_layout()
plt.show()

# %% [markdown]
# Both steps take the same time: the white triangles at the start (the pipe filling) and at the end
# (draining) are as large in both. What differs is the *order* in between.
#
# ## 4. Your turn: the bubble fraction
#
# Give every stage the same forward time `t_f` and backward time `t_b` per microbatch, and measure
# time in *slots* of `t_f + t_b`. Derive, for p stages and m microbatches:
#
# 1. how many slots one stage spends computing in a step;
# 2. how many slots the whole step lasts: when can the last microbatch enter stage 0, and what must it
#    still do after that? (Check your count on the text grids of section 2, p = 3, m = 4.)
#
# Then write `bubble_fraction(p, m)`: the share of the *step* a stage is idle.


# %% [exercise bubble]
def bubble_fraction(p, m):
    raise NotImplementedError  # your code here


# %% [check bubble]
checks.bubble_fraction(bubble_fraction)

# %% [markdown reveal]
# **The answer.** Try first; then open this cell (click it, or the bar at its left).
#
# A stage computes in m slots; the last microbatch enters stage 0 after
# `m - 1` others and then needs p stages forward and back, so the step lasts `m + p - 1` slots and
#
# $$\text{bubble fraction} = \frac{p - 1}{m + p - 1}$$
#
# for GPipe and 1F1B alike (Huang et al. 2019, §2.3). More microbatches shrink the bubble; more stages
# grow it.

# %% [markdown]
# The simulation agrees with the formula (`perfmodel.bubble_fraction`) for every `m` (the check above
# compared them; here they are plotted for p = 2, 4, 8):

# %%
ms = list(range(1, 33))
fig, ax = plt.subplots(figsize=(6.5, 3.5))
for p in (2, 4, 8):
    simulated = [simulate(one_f_one_b(p, m)).bubble_fraction() for m in ms]
    ax.plot(ms, simulated, "o", ms=3, label=f"simulated, p={p}")
    ax.plot(ms, [perfmodel.bubble_fraction(p, m) for m in ms], "-", lw=1, color=ax.lines[-1].get_color())
ax.set_xlabel("microbatches m")
ax.set_ylabel("bubble fraction")
ax.set_title("lines: the formula (perfmodel.bubble_fraction)")
ax.legend(fontsize=8)
plt.tight_layout()
plt.show()

# %% [markdown]
# ## 5. Measure it on real ranks
#
# `scripts/pipeline_trace.py` trains one step of a 4-block MLP cut into p = 2 stages with
# `PipelineParallel`, with `minidist.trace` on: the executor records one span per forward and backward.
# `timeline_from_trace` turns the spans into the same `Timeline` that `simulate` makes, so the same
# Gantt chart and `bubble_fraction` serve for theory and measurement. (`MINIDIST_TIMEOUT` makes a
# waiting rank sleep rather than spin, leaving the core to the busy one.)
#
# The formula counts only compute. A real step also waits for things the formula leaves out: a message
# to reach the next stage, a rank that has just received one to be *woken up* by the operating
# system, a core to become free when other programs (or more ranks than cores) share the machine, and
# Python's overhead per microbatch. Each is a millisecond or so, often more on a busy laptop. A
# measurement shows the theory only when a stage's work per microbatch is much longer than that noise.
# So we first give every stage *synthetic* work: `--stage-ms 40` makes each stage's forward of a
# microbatch take 40 ms more and its backward 80 ms more (a sleep, as a rank does while its GPU
# computes; a sleeping rank needs no core). Then the noise is a few percent of a slot, and we expect
# the measured bubble within **0.05** of `(p-1)/(m+p-1)`.

# %%
mpiexec, python = mpiexec_path(), sys.executable
out = Path(tempfile.mkdtemp(prefix="minidist_lesson07_"))
TOLERANCE = 0.05  # |measured - formula| with 40 ms stages, even on a 2-core laptop under load


def measure(runs, *flags):
    """Run scripts/pipeline_trace.py once on 2 ranks for every (schedule, m) of ``runs``; return
    ``{(schedule, m): its JSON with the measured Timeline added}``."""
    path = out / f"runs_{len(list(out.iterdir()))}.json"
    cmd = [mpiexec, "-n", "2", python, "scripts/pipeline_trace.py", str(path), "--runs"]
    cmd += [f"{schedule}:{m}" for schedule, m in runs]
    env = dict(os.environ, MINIDIST_TIMEOUT="60", OMP_NUM_THREADS="1")
    subprocess.run([*cmd, *map(str, flags)], check=True, timeout=180, env=env, capture_output=True)
    results = {}
    for r in json.loads(path.read_text()):
        schedule, m = r["schedule"], r["m"]
        r["timeline"] = timeline_from_trace((one_f_one_b if schedule == "1f1b" else gpipe)(2, m), r["events"])
        results[schedule, m] = r
    return results


RUNS = [("gpipe", 4), ("1f1b", 1), ("1f1b", 2), ("1f1b", 4), ("1f1b", 8)]
synthetic = measure(RUNS, "--width", 64, "--batch", 256, "--stage-ms", 40)
print("schedule   m   formula  measured  difference")
for (schedule, m), r in synthetic.items():
    theory, measured = 1 / (m + 1), r["timeline"].bubble_fraction()
    verdict = "ok" if abs(measured - theory) <= TOLERANCE else "outside the tolerance: is the machine busy?"
    print(f"{schedule:8} {m:2}   {theory:7.3f}  {measured:8.3f}  {measured - theory:+10.3f}  {verdict}")

# %% [markdown]
# With stages of 40 ms the measurement follows the formula (the small excess is the noise: mostly the
# time a rank takes to wake up when its message arrives). Now the same pipeline doing its *real* work
# only: width 512 and a batch of 2,048, a few milliseconds per microbatch and stage.

# %%
runs = measure(RUNS, "--width", 512, "--batch", 2048)
for (schedule, m), r in runs.items():
    print(
        f"{schedule:5} m={m}: step {r['timeline'].total * 1e3:5.0f} ms, measured bubble "
        f"{r['timeline'].bubble_fraction():.2f}, formula {1 / (m + 1):.2f}"
    )

# %%
ms = [1, 2, 4, 8]
fig, axes = plt.subplots(1, 3, figsize=(13, 3.4), gridspec_kw={"width_ratios": [1, 1.4, 1.4]})
theory = [1 / (m + 1) for m in ms]
axes[0].plot(ms, theory, "k-", label="(p-1)/(m+p-1)")
axes[0].fill_between(
    ms, [t - TOLERANCE for t in theory], [t + TOLERANCE for t in theory], color="k", alpha=0.1
)
axes[0].plot(ms, [synthetic["1f1b", m]["timeline"].bubble_fraction() for m in ms], "o", label="40 ms stages")
axes[0].plot(ms, [runs["1f1b", m]["timeline"].bubble_fraction() for m in ms], "s", label="real work only")
axes[0].set_xlabel("microbatches m (1F1B, p = 2)")
axes[0].set_ylabel("bubble fraction")
axes[0].legend(fontsize=8)
for ax, (name, r) in zip(axes[1:], [("40 ms stages", synthetic["1f1b", 4]), ("real work", runs["1f1b", 4])]):
    t = r["timeline"]
    draw_gantt(t, ax=ax, title=f"measured 1F1B, m=4, {name}: bubble {t.bubble_fraction():.2f}")
    ax.set_xlabel("time (s)")
plt.tight_layout()
plt.show()

# %% [markdown]
# With real work only, the measured bubble can sit well above the formula, and move when you re-run
# the cell: the stage's compute per microbatch is about as short as a message and a wake-up, so the
# waits the formula ignores are a large share of the step; a busy machine adds its own delays (a rank
# waits for a core, not for its neighbour). Smaller microbatches also make each matmul less efficient:
# m cannot grow for free. On GPUs a microbatch's compute is long compared with a message and the
# formula is a good guide, which is why it is the one used to choose m.
#
# ## 6. Activation memory: where 1F1B wins
#
# A stage must keep a microbatch's activations (its autograd graph) from that microbatch's forward to
# its backward. GPipe runs all `m` forwards first, so every stage holds `m` microbatches at the turn.
# 1F1B starts backwards as soon as the first microbatch comes back, and holds far fewer.
#
# **Your turn.** Write `peak_activations_1f1b(p, m, s)`: the most microbatches stage s of a 1F1B
# schedule holds at once. (Read the warm-up rule in section 2 — and mind `m < p`.)


# %% [exercise peak]
def peak_activations_1f1b(p, m, s):
    raise NotImplementedError  # your code here


# %% [check peak]
checks.peak_activations_1f1b(peak_activations_1f1b)

# %% [markdown]
# `peak_activations(schedule)` counts it from the instruction lists; the executor counts it on real
# ranks (`pipe.stats.peak_activations`). All three agree:

# %%
p, m = 4, 8
fig, ax = plt.subplots(figsize=(6, 3))
for offset, (name, schedule) in zip((-0.2, 0.2), [("GPipe", gpipe(p, m)), ("1F1B", one_f_one_b(p, m))]):
    ax.bar([s + offset for s in range(p)], peak_activations(schedule), width=0.4, label=name)
ax.set_xticks(range(p), [f"stage {s}" for s in range(p)])
ax.set_ylabel("microbatches held at once")
ax.set_title(f"peak activations, p={p}, m={m}")
ax.legend()
plt.tight_layout()
plt.show()
for key in [("gpipe", 4), ("1f1b", 4)]:
    held = [s["peak_activations"] for s in runs[key]["stats"]]
    print(f"measured on 2 ranks, {key[0]}, m=4: stages hold {held} microbatches at most")

# %% [markdown]
# So with 1F1B, more microbatches shrink the bubble *without* costing activation memory: stage 0 holds
# `p` microbatches whatever `m` is. That is why Megatron-LM uses it. (Its interleaved variant gives each
# rank several smaller chunks of the model and shrinks the bubble further, for more messages:
# `schedule="interleaved"` in `PipelineParallel`.)
#
# ## 7. `PipelineParallel` in your own code
#
# ```python
# pipe = PipelineParallel(model, group=world, microbatches=4, schedule="1f1b")  # this rank's stage
# opt = optim.SGD(pipe.parameters(), lr=0.1)          # this stage's parameters only
# opt.zero_grad()
# loss = pipe.train_step(x, y, nn.functional.cross_entropy)   # mean loss, on every rank
# opt.step()
# print(pipe.stats)                                   # busy, step time, bubble, peak activations
# logits = pipe.predict(x_test)                       # forward only
# ```
#
# Each rank builds the whole `nn.Sequential` from the same seed and keeps its stage's layers; the last
# stage scales each microbatch's loss by `1/m`, so the accumulated gradients equal one step on the
# whole batch: p stages train the same model as one process
# (`tests/parallel/pipeline/test_pipeline_equivalence.py`).
# ## Summary
# - The naive GPipe step is the whole idea: blocking sends of activations forward, of gradients back.
# - A schedule is data: per stage, an ordered list of forwards, backwards, sends and receives.
# - Bubble fraction `(p-1)/(m+p-1)` for both GPipe and 1F1B: use `m` several times `p`.
# - 1F1B holds at most `p - s` microbatches on stage s instead of `m`: same bubble, far less memory.
#
# Next: [lesson 08](08_checkpoints.ipynb) — what happens when one of these ranks dies.
