"""Lesson 13 source (percent format); `python lessons/build.py` turns it into 13_failures.ipynb."""
# ruff: noqa: E402, F811

# %% [markdown]
# # Lesson 13 — Failures at scale
#
# **Learning goals.** After this lesson you can
# 1. kill a rank (and, on a cluster, a whole node) in the middle of training and watch
#    `minidist launch` end the job, find the newest checkpoint that verifies and restart it,
#    on fewer nodes if it must;
# 2. find a straggler, the one rank that is consistently slower, and see who pays for it;
# 3. say how often a job on thousands of nodes fails, and choose how often to checkpoint it
#    (Young 1974, Daly 2006), checked against a simulation.
#
# Lesson 08 resumed a run by hand after a kill. At scale nobody is there to do it: Meta's Llama 3 405B
# training had 419 unexpected interruptions in 54 days on 16,384 GPUs (Dubey et al., "The Llama 3 Herd
# of Models", 2024, §3.3.4), one every three hours. The job has to notice a failure, clean up and
# resume by itself, and it has to have saved recently enough that little work is lost.

# %%
import math  # noqa: F401  (for your answers below)
import os
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

import minidist
from minidist_course.notebook import checks, mpiexec_path
from minidist_tools.cluster import Cluster, cluster_available
from minidist_tools.launch import read_log
from minidist_tools.launch.processes import kill_job, rank_pids
from minidist_tools.perfmodel import failures as pf

python, WORK = sys.executable, Path(tempfile.mkdtemp(prefix="minidist_lesson13_"))
REPO = Path(minidist.__file__).resolve().parent.parent  # the clone that holds examples/
available, reason = cluster_available()
print("a cluster of network namespaces:", "available" if available else f"not available: {reason}")

# %% [markdown]
# ## 1. Kill a rank and watch the job recover
#
# `minidist launch` is minidist's `torchrun --max-restarts`: it runs a training command under
# `mpiexec` and watches it. When a rank dies (or, on a cluster, a node), it ends every process of the
# job that is left, checks which checkpoint is the newest that *verifies* (every file's sha256, lesson
# 08), and starts the command again, with `MINIDIST_RESTART_COUNT=1` in every rank's environment;
# `examples/train_mlp.py` reads that as `--resume`. Nothing in the training script deals with failures.
#
# The job below trains the MLP of lesson 04 on 2 ranks for 6 epochs (66 steps), saving every 5 steps.
# Once step 10 is saved, this notebook kills rank 1 with `SIGKILL`, as the
# kernel's out-of-memory killer or a crashed GPU driver would. On a cluster of namespaces (lesson 12;
# it needs root) the job runs on 2 nodes, and once the restarted job has saved again the notebook pulls
# node 1's cable (its link goes down): the launcher sees the node is dead and goes on with the one
# node left (`--nodes 1:2`); the script loads the checkpoint resharded from 2 ranks to 1.

# %%
stack = ExitStack()  # leaving it (the last cell, or the kernel's exit) removes the cluster
cluster = stack.enter_context(Cluster.up(nodes=2, ranks_per_node=1)) if available else None
print(f"cluster {cluster.name}: nodes {cluster.nodes}" if cluster else f"no cluster ({reason.split(':')[0]})")


def start_job(name, *launcher_flags):
    """Start `minidist launch` in the background; returns (process, log file, output file)."""
    folder = WORK / name
    folder.mkdir()
    train = [python, str(REPO / "examples" / "train_mlp.py"), "--epochs", "6", "--hidden", "64", "64"]
    train += ["--checkpoint-dir", str(folder / "ckpt"), "--checkpoint-every", "5"]
    log, out = folder / "launch.log", folder / "output.txt"
    launcher = [python, "-m", "minidist_tools.launch", "--max-restarts", "2", "--monitor-interval", "0.2"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    with open(out, "w") as sink:
        proc = subprocess.Popen(
            [*launcher, "--log", str(log), *launcher_flags, "--", *train],
            stdout=sink, stderr=subprocess.STDOUT, env=env, start_new_session=True,
        )  # fmt: skip
    return proc, log, out


def wait_for(log, proc, predicate, timeout=240):
    """The first event of the launcher's log for which predicate(event) holds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [e for e in (read_log(log) if log.exists() else []) if predicate(e)]
        if found:
            return found[0]
        if proc.poll() is not None:
            raise RuntimeError(f"the launcher ended (exit {proc.returncode}) before that event")
        time.sleep(0.05)
    raise TimeoutError("no such event in the launcher's log")


# %%
flags = ["-n", "2"] + (["--cluster", cluster.name, "--nodes", "1:2"] if cluster else [])
proc, log, out = start_job("job", *flags)
run_id = None
try:
    run_id = wait_for(log, proc, lambda e: e["event"] == "start")["run_id"]
    wait_for(log, proc, lambda e: e["event"] == "checkpoint" and e["step"] >= 10)
    pid = rank_pids(run_id, restart=0)[1]
    os.kill(pid, signal.SIGKILL)
    print(f"killed rank 1 (pid {pid}) after step 10 was saved")
    if cluster:
        restarted = wait_for(log, proc, lambda e: e["event"] == "restart")["time"]
        wait_for(log, proc, lambda e: e["event"] == "checkpoint" and e["time"] > restarted)
        node = cluster.nodes[1]
        subprocess.run(["ip", "link", "set", cluster.links[node], "down"], check=True)
        print(f"pulled the cable of {node} (its link {cluster.links[node]} is down)")
    returncode = proc.wait(timeout=300)
finally:  # whatever happened, leave no process of the job behind
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    if run_id:
        kill_job(run_id)
events = read_log(log)
print(f"the launcher exited with {returncode}; its log:")
start = events[0]["time"]
for e in events:
    if e["event"] != "checkpoint" or e["step"] % 20 == 0:  # most checkpoints left out
        print(f"{e['time'] - start:6.1f} s  {e['event']:<10} {e['message'][:110]}")
output = out.read_text()
print("\nfrom the job's output:")
print("\n".join(line for line in output.splitlines() if line.startswith(("resumed", "final test"))))

# %% [markdown]
# Read the log from the top: `start` (attempt 0), `ranks` (each rank's pid), `checkpoint` events as the
# job commits steps, then `failure`: the launcher saw rank 1 end first and names it, with its pid and how
# it ended (MPICH then ended rank 0 itself, and `mpiexec` exits non-zero). `kill` says every process of
# the job is gone: the launcher finds them by the run id in
# their environment, because MPICH's ranks each lead their own session and no process group holds them
# all. `verify` names the checkpoint the restart will resume from, and `restart` starts attempt 1, which
# printed `resumed from ... step 10`. On the cluster, a second `failure` (the node) is followed by a
# `nodes` event that leaves node 1 out, and attempt 2 runs on one rank. The training ends as an
# uninterrupted run would (`tests/tools/launch/test_launch.py` checks the final weights bit for bit on the
# same layout; with fewer nodes they agree to float rounding).
#
# Where did the time go? Plot the steps each attempt committed against the wall clock:

# %%
fig, ax = plt.subplots(figsize=(9, 3.5))
attempt, steps = 0, {0: ([], [])}
for e in events:
    if e["event"] == "start":
        attempt = e.get("restart", 0)
        steps.setdefault(attempt, ([], []))
    elif e["event"] == "checkpoint":
        steps[attempt][0].append(e["time"] - start)
        steps[attempt][1].append(e["step"])
    elif e["event"] == "failure":
        ax.axvline(e["time"] - start, color="red", linestyle="--")
        ax.text(e["time"] - start, 2, f" failure ({e.get('reason', '?')})", color="red", rotation=90)
for k, (t, s) in steps.items():
    ax.plot(t, s, "o-", markersize=3, label=f"attempt {k}")
ax.set_xlabel("seconds since the launcher started")
ax.set_ylabel("last step saved")
ax.legend()
plt.tight_layout()
plt.show()
failures = [e["time"] for e in events if e["event"] == "failure"]
first_saves = [t[0] + start for k, (t, s) in steps.items() if k > 0 and t]
restart_cost = first_saves[0] - failures[0] if failures and first_saves else float("nan")
print(f"from the first failure to the next saved step: {restart_cost:.1f} s")

# %% [markdown]
# Most of a restart here is starting Python, importing minidist and MPI, and loading the checkpoint:
# seconds on a laptop, minutes on a big cluster (scheduling, thousands of processes, terabytes of
# checkpoint to read). The steps between the last checkpoint and the failure are computed twice. Both
# costs come back in section 3.
#
# ### The same failure on a Slurm cluster
#
# On a university or lab cluster nobody runs `minidist launch` by hand: a scheduler, usually **Slurm**,
# owns the nodes. You submit a *job script* (`sbatch`), Slurm starts it when nodes are free, and a node
# that fails is set DOWN by Slurm (or by an administrator, with `scontrol`). A job submitted with
# `--requeue` then goes back into the queue, keeps its id, and starts again on the nodes it gets; its
# script sees `SLURM_RESTART_COUNT=1` and resumes from its checkpoints. Read
# `examples/slurm/train_gpt.sbatch`, commented for you: it is the script you would submit on a real cluster.
#
# The cell below makes the same 2-node cluster with a real Slurm on it (munge, slurmctld and a slurmd
# per node: `minidist cluster up --scheduler slurm`; it needs root, and installs Slurm from the
# distribution's packages if missing), submits a small GPT job of 40 steps, and once step 20 is saved,
# sets node 1 DOWN. Watch the job's own output: the requeue, the second start on the one node left, the
# resume from step 20, resharded from 4 ranks to 2.

# %%
from minidist_tools.cluster.slurm import packages  # noqa: E402

GPT = ["--max-iters", "40", "--eval-interval", "10", "--eval-iters", "2", "--n-layer", "1", "--n-embd", "32",
       "--n-head", "2", "--block-size", "32", "--batch-size", "16", "--sample-tokens", "0"]  # fmt: skip


def slurm_job_state(env, job):
    shown = subprocess.run(["scontrol", "show", "job", "-o", job], env=env, capture_output=True, text=True)
    return shown.stdout.split("JobState=", 1)[1].split()[0] if "JobState=" in shown.stdout else "?"


def run_on_slurm():
    """Submit the job script, set node 1 DOWN after step 20 is saved, wait for the job; its output."""
    folder = WORK / "slurm"
    folder.mkdir()
    with Cluster.up(nodes=2, ranks_per_node=2, scheduler="slurm") as slurm_cluster:
        env = {
            **os.environ,
            **slurm_cluster.env(),
            **slurm_cluster.slurm_env(),
            "CHECKPOINT_DIR": str(folder / "ckpt"),
        }
        print(subprocess.run(["sinfo"], env=env, capture_output=True, text=True).stdout)
        submitted = subprocess.run(
            ["sbatch", "--parsable", "-o", str(folder / "job.out"), "examples/slurm/train_gpt.sbatch", *GPT],
            env=env, cwd=REPO, capture_output=True, text=True, check=True,
        )  # fmt: skip
        job, lost = submitted.stdout.strip().split(";")[0], slurm_cluster.nodes[1]
        deadline = time.monotonic() + 240
        while not (folder / "ckpt" / "step_000000020").is_dir() and time.monotonic() < deadline:
            time.sleep(0.1)
        subprocess.run(
            ["scontrol", "update", f"nodename={lost}", "state=down", "reason=lesson"], env=env, check=True
        )
        print(f"job {job}: set {lost} DOWN after step 20 was saved")
        while slurm_job_state(env, job) not in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "?"):
            if time.monotonic() > deadline:
                subprocess.run(["scancel", job], env=env)
                break
            time.sleep(0.2)
        print(f"job {job} ended {slurm_job_state(env, job)}")
    return (folder / "job.out").read_text()


slurm_reason = reason if not available else None
if slurm_reason is None and packages.missing() and os.geteuid() != 0:
    slurm_reason = "Slurm is not installed, and installing it needs root"
if slurm_reason is None:
    job_output = run_on_slurm()
    keep = ("job ", "slurmstepd", "resumed from", "val loss")
    print(
        "\n".join(line for line in job_output.splitlines() if line.startswith(keep) or "NODE FAILURE" in line)
    )
else:
    print(
        f"no Slurm cluster here ({slurm_reason.split(':')[0]}); on one, you would see: the job's first start"
    )
    print("on 2 nodes, Slurm cancelling it DUE TO NODE FAILURE, its second start on 1 node, 'resumed from")
    print(".../step_000000020', and the same final validation loss as an uninterrupted run.")

# %% [markdown]
# The job ends at the validation loss of an uninterrupted run: the checkpoint at step 20 was resharded from
# 4 ranks to 2 (lesson 08), and no step was trained twice. The time lost here is mostly Slurm's: a
# requeued job waits until its old credentials expire (10 s in this box, `cred_expire`; Slurm's default
# is 120 s). On your university's cluster the commands are the same (`sbatch`, `squeue`, `scontrol show
# job`, `scancel`); add the partition and account its documentation asks for (see the job script's
# header, and `docs/many-machines.md`, "Slurm").
#
# ## 2. Find the straggler
#
# A rank need not die to hurt: one that is merely slower (a throttled GPU, a busy neighbour, a bad
# cable that retransmits) slows everyone. In synchronous data parallelism every rank waits for the
# gradients of all others in every all-reduce, so every rank's step takes as long as the slowest one's,
# and step times alone do not say who is slow. `minidist_tools.straggler` splits each step of each rank into
# **compute** (the training thread busy), **comm** (collectives moving data) and **wait** (inside a
# collective, waiting for another rank to arrive), from the trace (lesson 04), with every rank's clock
# aligned to rank 0's (Cristian's algorithm: a few ping-pongs). `StragglerMonitor` warns during
# training when one rank's compute is consistently (the median over a window of steps, in 2 windows
# running) more than 1.2 times the others'.
#
# To make one, `MINIDIST_SLOW_RANK=1:0.02` (a teaching aid that the examples read) makes rank 1 sleep
# 20 ms in every step. 2 ranks, 3 epochs (33 steps), with `--straggler-report`:

# %%
env = dict(os.environ, OMP_NUM_THREADS="1", MINIDIST_SLOW_RANK="1:0.02")
train = [
    python,
    str(REPO / "examples" / "train_mlp.py"),
    "--epochs",
    "3",
    "--hidden",
    "32",
    "--straggler-report",
]
done = subprocess.run(
    [mpiexec_path(), "-n", "2", *train], capture_output=True, text=True, timeout=300, env=env
)
assert done.returncode == 0, done.stdout + done.stderr
for line in (done.stdout + done.stderr).splitlines():
    if "StragglerWarning" in line:
        print(line[line.index("StragglerWarning") :])
print(done.stdout[done.stdout.index("straggler report") :])

# %% [markdown]
# The warning came during training, after two windows of 10 steps. In the table, rank 1 has the
# compute (its 20 ms of sleep counts as compute: the training thread was busy, as far as the trace can
# tell) and rank 0 the matching *wait*: its step is as long, spent waiting inside the all-reduce.
# Without the split both ranks would just look slow.
#
# **Your turn.** The wait is measured per collective call. Each rank enters the call at its own time
# (seconds, all on one clock after the alignment), and no rank can finish before the data of every
# rank has arrived. Write `waits(entries)`: how long each rank waits for the others in that call (a
# list, one value per rank).


# %% [exercise waits]
def waits(entries):
    raise NotImplementedError  # your code here: one wait per rank, in seconds


# %% [check waits]
checks.waits(waits)

# %% [markdown reveal]
# **The answer.** Try first; then open this cell (click it, or the bar at its left).
#
# Every rank waits until the last one enters: `[max(entries) - t for t in entries]`; the straggler,
# last to arrive, waits 0. `minidist_tools/straggler/breakdown.py` does this for every call, matching the
# k-th call on a group across ranks (MPI's rule: the members of a communicator call its collectives in
# the same order), and cuts each wait at the end of the rank's call.
#
# What to do with a straggler? Find why (its node's temperature, its GPU's clock, the neighbours
# sharing its link); on a big cluster, drain the node and restart the job without it, which is the
# launcher's `--nodes MIN:MAX` of section 1.
#
# ## 3. How often to checkpoint
#
# A job on N nodes stops when any of them fails. Measure each node's reliability by its *mean time
# between failures* (MTBF): a node with an MTBF of 5 years fails, on average, once in 5 years. Assume,
# as Young and Daly do, that each node fails after an exponentially distributed time, independently of
# the others (no memory: a node that ran for a year is as likely to fail today as a new one).
#
# **Your turn.** Write `system_mtbf(node_mtbf, nodes)`: the mean time between failures of a job that
# runs on `nodes` such nodes (seconds in, seconds out).


# %% [exercise mtbf]
def system_mtbf(node_mtbf, nodes):
    raise NotImplementedError  # your code here: seconds between two failures of the job


# %% [check mtbf]
checks.system_mtbf(system_mtbf)

# %% [markdown reveal]
# **The answer.** Try first; then open this cell (click it, or the bar at its left).
#
# Each node fails at a rate of 1 / node_mtbf per second; the job fails when the first of them does, and
# the rates of independent exponential failures add up: nodes / node_mtbf. The MTBF of the job is one
# over that, `node_mtbf / nodes`. 16,384 GPUs of 5 years each: 2.7 hours, close to what Llama 3 saw.

# %%
mtbf_of = checks.yours_or_minidists(system_mtbf)
YEAR = 365.25 * 86400
nodes = np.unique(np.geomspace(1, 100_000, 60).astype(int))
fig, ax = plt.subplots(figsize=(7, 3.5))
for years in (1, 5, 20):
    ax.loglog(nodes, [mtbf_of(years * YEAR, int(n)) / 3600 for n in nodes], label=f"node MTBF {years} y")
ax.axhline(1, color="gray", linestyle=":")
ax.set_xlabel("nodes")
ax.set_ylabel("job MTBF (hours)")
ax.legend()
plt.tight_layout()
plt.show()
print(f"16,384 nodes of 5 years: one failure every {mtbf_of(5 * YEAR, 16384) / 3600:.1f} hours")

# %% [markdown]
# So a big job must save checkpoints. Say a save takes C seconds and the job has an MTBF of M seconds.
# Saving after every τ seconds of work wastes time two ways:
#
# * the saves themselves: C seconds per τ of work, a fraction C / τ;
# * the work redone after a failure: a failure strikes, on average, halfway through an interval, so
#   each one (one per M seconds) throws away τ / 2 of work, a fraction τ / (2M) (plus the restart, which
#   does not depend on τ).
#
# Frequent saves make the first term large, rare ones the second. J. W. Young ("A first order
# approximation to the optimum checkpoint interval", Communications of the ACM 17(9), 1974) chose the
# τ that makes their sum smallest.
#
# **Your turn.** Write `young_interval(save_cost, mtbf)`: the interval τ (seconds of work between two
# saves) that minimises the wasted fraction above. (`math` is imported.)


# %% [exercise young]
def young_interval(save_cost, mtbf):
    raise NotImplementedError  # your code here: seconds of work between two checkpoints


# %% [check young]
checks.young_interval(young_interval)

# %% [markdown reveal]
# **The answer.** Try first; then open this cell (click it, or the bar at its left).
#
# The derivative of C / τ + τ / (2M) is -C / τ² + 1 / (2M), zero at τ = sqrt(2 C M). At that τ both
# terms are equal: the time lost to saves equals the time lost to failures. With M = 2.7 hours and a
# save of one minute, that is a save every 18 minutes; a save 100 times faster, only 10 times as often.

# %% [markdown]
# Young's answer is a first-order approximation: it assumes a failure never strikes during a save or a
# restart, and that C is much smaller than M. J. T. Daly ("A higher order estimate of the optimum
# checkpoint interval for restart dumps", Future Generation Computer Systems 22(3), 2006) wrote the
# expected runtime exactly for exponential failures (failures during saves and restarts included:
# `pf.expected_runtime`) and found a better approximation of its minimum (`pf.daly_interval`);
# `pf.optimal_interval` finds that minimum exactly. And `pf.simulate_run` checks all of them without
# any formula: it plays jobs against random failures, a segment at a time, and times them.

# %%
young_of = checks.yours_or_minidists(young_interval)
print(f"{'save / MTBF':>12} {'Young':>8} {'Daly':>8} {'exact':>8}   (intervals, in MTBFs)")
for ratio in (1e-4, 1e-3, 1e-2, 0.1, 0.5):
    row = [young_of(ratio, 1.0), pf.daly_interval(ratio, 1.0), pf.optimal_interval(ratio, 1.0)]
    print(f"{ratio:>12g} " + " ".join(f"{x:8.4f}" for x in row))

# %% [markdown]
# While a save is a small fraction of the MTBF, all three agree; Young saves a little too rarely once it
# is not (he did not count failures during the save itself). Now a week of work on 16,384 nodes of 5
# years (M = 2.7 h), saves of one minute, restarts of ten: the expected runtime for a range of
# intervals, and 300 simulated jobs at a few of them.

# %%
mtbf, save, restart, work = mtbf_of(5 * YEAR, 16384), 60.0, 600.0, 7 * 86400.0
taus = np.geomspace(60, 15_000, 80)
fig, ax = plt.subplots(figsize=(8, 3.8))
model = [pf.expected_runtime(work, t, save, restart, mtbf) / 86400 for t in taus]
ax.semilogx(taus / 60, model, label="model (pf.expected_runtime)")
for t in young_of(save, mtbf) * np.array([0.25, 0.5, 1, 2, 4]):
    sim = pf.simulate_run(work, t, save, restart, mtbf, seed=0, runs=300)
    ax.errorbar(t / 60, sim.mean_s / 86400, yerr=2 * sim.stderr_s / 86400, fmt="ko", markersize=4)
for name, t, color in [("Young", young_of(save, mtbf), "C1"), ("Daly", pf.daly_interval(save, mtbf), "C2")]:
    ax.axvline(t / 60, linestyle="--", color=color, label=f"{name} {t / 60:.0f} min")
ax.set_xlabel("minutes of work between two checkpoints")
ax.set_ylabel("days to finish 7 days of work")
ax.set_ylim(0.95 * min(model), 1.6 * min(model))
ax.legend()
plt.tight_layout()
plt.show()

# %% [markdown]
# The black points (simulated means, with two standard errors) sit on the curve, and its minimum is at
# Young's and Daly's interval. The curve is flat near the minimum: saving at half or twice the optimum
# costs little, ten times off costs a lot. `minidist checkpoint interval` prints the same
# numbers from the command line (here called in-process):

# %%
from minidist_cli import main as minidist_cli

status = minidist_cli(["checkpoint", "interval", "--node-mtbf", "5y", "--nodes", "16384", "--save-cost", "60",
              "--restart-cost", "600", "--work", "7d", "--interval", "4h"])  # fmt: skip

# %% [markdown]
# What makes the optimum better is a cheaper save: since the best interval and the time wasted both
# grow like the square root of C, a save 4 times faster halves the waste. That is why large jobs save
# asynchronously (the training continues while a background thread writes: `checkpoint.save(...,
# async_save=True)`), to local disk or a partner node's memory first.
#
# ## Summary
# - At scale failures are routine: N nodes fail N times as often as one. The job must restart by
#   itself: `minidist launch` ends every process left, resumes from the newest checkpoint
#   that verifies, and continues on fewer nodes if one is gone.
# - A straggler slows every rank, so step times do not name it; splitting each step into compute, comm
#   and wait does: the straggler has the compute, the others the matching wait.
# - Save every sqrt(2 C M) seconds of work (Young); Daly's formula is better when saves are slow;
#   both are checked here against a simulation.

# %%
stack.close()  # removes the namespaces, links and bridge of the cluster
