"""Jobs on a real Slurm in a box: the three ways users launch, and a node lost the Slurm way.

One cluster of 2 nodes x 2 ranks with Slurm (``Cluster.up(..., scheduler="slurm")``) serves the module;
its fixture checks at the end that no daemon, namespace, link or file of it is left. Skipped with the
reason where there is no root or no Slurm (``scripts/install_slurm.sh`` installs it).

* ``srun --mpi=pmi2`` direct launch, ``mpiexec`` inside an allocation (``salloc`` on the host,
  ``sbatch`` on the first node) and ``minidist launch`` inside ``sbatch``: two ranks per node, and
  minidist counts two nodes (its node layout, which the hierarchical all-reduce and the mesh placement
  use).
* ``sbatch examples/slurm/train_gpt.sbatch``: the same weights and validation loss as ``mpiexec -n 4``
  on one machine, bit for bit for this small float64 model (the default GPT in float32 drifts apart by
  up to 6e-4 in 200 steps: across nodes the all-reduce is hierarchical and adds in another order,
  docs/many-machines.md).
* A node set DOWN with ``scontrol`` after the checkpoint at step 20 of 40: the job is requeued
  (``--requeue``), resumes from that checkpoint and ends where the uninterrupted run ends: bit for bit
  when the node is back before the restart (the same layout), allclose on the one node left (2 ranks:
  the checkpoint is resharded).
* The time limit: Slurm signals the job script (``--signal=B:USR1@60``) a minute before the limit, and
  the script requeues itself. The test sends that signal itself after step 20 (``scancel --batch
  --signal=USR1``, what Slurm does at that moment) rather than wait for a limit, which Slurm counts in
  whole minutes: the job comes back and ends where the uninterrupted run ends, bit for bit.
"""

from __future__ import annotations

import json
import re
import time

import numpy as np
import pytest
from mpi_utils import REPO, run_mpi
from slurm_utils import slurm, slurm_fixture, submit, wait_for, wait_for_idle, wait_for_job

pytestmark = [pytest.mark.mpi, pytest.mark.cluster]
slurm_cluster = slurm_fixture(nodes=2, ranks_per_node=2)
NODES_WORKER = "cluster/slurm_nodes.py"
JOB_SCRIPT = "examples/slurm/train_gpt.sbatch"
# A small GPT: 40 steps, evaluated and checkpointed every 10 (a few seconds on 4 ranks). float64: a run
# resumed on another number of ranks differs only in the order of its sums, a few ulps per step, which a
# tolerance of 1e-9 relative tells apart from a real mistake (a step's update is ~lr = 2e-3); in float32
# the same rounding grows to ~1e-5 absolute in 20 AdamW steps. atol: the attention's key bias, whose
# exact gradient is 0 and whose weights are rounding noise (test_train_gpt_layouts.py).
GPT = ["--max-iters", "40", "--eval-interval", "10", "--eval-iters", "2", "--n-layer", "1", "--n-embd", "32",
       "--n-head", "2", "--block-size", "32", "--batch-size", "16", "--sample-tokens", "0",
       "--dtype", "float64"]  # fmt: skip


def check_two_nodes(out, cluster) -> None:
    """Ranks 0-1 on the first node, 2-3 on the second, and minidist sees the two nodes."""
    for rank in range(4):
        record = json.loads((out / f"rank{rank}.json").read_text())
        node = cluster.nodes[rank // 2]
        assert record["hostname"] == record["processor_name"] == node, (rank, record)
        assert (record["node_count"], record["nodes"], record["node"]) == (2, 2, rank // 2), (rank, record)
        assert record["local_rank"] == rank % 2 and record["sum_is_exact"], (rank, record)


def test_srun_direct_launch_puts_two_ranks_on_each_node(slurm_cluster, tmp_path):
    worker = REPO / "tests" / "workers" / NODES_WORKER
    proc = slurm(slurm_cluster, "srun", "--mpi=pmi2", "-N2", "-n4", "python", str(worker), str(tmp_path))
    check_two_nodes(tmp_path, slurm_cluster)
    assert proc.stderr == "", proc.stderr


def test_mpiexec_and_minidist_launch_inside_an_allocation(slurm_cluster, tmp_path):
    """Hydra finds the allocation's nodes in SLURM_* and starts its proxies with srun; the proxies call
    back on the address of ``-iface``: the bridge's under salloc (mpiexec runs on this host), the node's
    eth0 in a batch job (HYDRA_IFACE, set by the cluster's TaskProlog). ``minidist launch`` in the batch
    job takes its ranks from the allocation (no -n) and says so."""
    worker = REPO / "tests" / "workers" / NODES_WORKER
    on_host, in_batch, launched = tmp_path / "salloc", tmp_path / "sbatch", tmp_path / "launch"
    for folder in (on_host, in_batch, launched):
        folder.mkdir()
    bridge = f"{slurm_cluster.name}-br"
    salloc = ["salloc", "-N2", "--exclusive", "mpiexec", "-iface", bridge, "-n", "4", "-ppn", "2"]
    slurm(slurm_cluster, *salloc, "python", str(worker), str(on_host))
    check_two_nodes(on_host, slurm_cluster)
    wrap = (
        f"mpiexec -n 4 -ppn 2 python {worker} {in_batch} && "
        f"python -m minidist_tools.launch --log {tmp_path / 'launch.log'} -- python {worker} {launched}"
    )
    out = tmp_path / "job.out"
    job = submit(slurm_cluster, "-N2", "--ntasks-per-node=2", "-o", str(out), "--wrap", wrap)
    assert wait_for_job(slurm_cluster, job) == "COMPLETED", out.read_text()
    check_two_nodes(in_batch, slurm_cluster)
    check_two_nodes(launched, slurm_cluster)
    nodes = f"{slurm_cluster.name}n[0-1]"
    assert f"[minidist launch] inside Slurm job {job}: 2 node(s) {nodes}, 4 tasks" in out.read_text()
    assert f"attempt 0: 4 ranks on the nodes of Slurm job {job} ({nodes})" in out.read_text()


@pytest.fixture(scope="module")
def one_machine(slurm_cluster, tmp_path_factory):
    """The uninterrupted reference: ``mpiexec -n 4 python examples/train_gpt.py`` on this machine."""
    out = tmp_path_factory.mktemp("one_machine") / "gpt.npz"
    proc = run_mpi(4, REPO / "examples" / "train_gpt.py", *GPT, "--out", str(out), timeout=120)
    return out, val_loss(proc.stdout)


def val_loss(output: str) -> str:
    """The last ``val loss: X`` line's X (train_gpt.py's closing line)."""
    return re.findall(r"^val loss: (\S+)$", output, re.MULTILINE)[-1]


def sbatch_gpt(cluster, tmp_path, *sbatch_args: str) -> tuple[str, object]:
    """Submit the example job script with GPT's flags; return the job id and its output file."""
    out = tmp_path / "job.out"
    env = {"CHECKPOINT_DIR": str(tmp_path / "ckpt")}
    job = submit(
        cluster, "-o", str(out), *sbatch_args, JOB_SCRIPT, *GPT, "--out", str(tmp_path / "gpt.npz"), env=env
    )
    return job, out


def assert_same_run(a, b, exact: bool) -> None:
    with np.load(a) as x, np.load(b) as y:
        assert sorted(x.files) == sorted(y.files)
        for name in x.files:
            if exact:
                np.testing.assert_array_equal(x[name], y[name], err_msg=name)
            else:
                np.testing.assert_allclose(x[name], y[name], rtol=1e-9, atol=1e-12, err_msg=name)


def test_sbatch_gpt_on_two_nodes_equals_mpiexec_on_one_machine(slurm_cluster, one_machine, tmp_path):
    job, out = sbatch_gpt(slurm_cluster, tmp_path)
    assert wait_for_job(slurm_cluster, job) == "COMPLETED", out.read_text()
    text = out.read_text()
    assert f"job {job} (start 1): 4 ranks on 2 nodes" in text, text
    assert val_loss(text) == one_machine[1], text
    assert_same_run(tmp_path / "gpt.npz", one_machine[0], exact=True)


@pytest.mark.parametrize("node_back", [False, True], ids=["on_the_node_left", "node_back"])
def test_a_node_set_down_mid_run_requeues_the_job_which_resumes(
    slurm_cluster, one_machine, tmp_path, node_back
):
    lost = slurm_cluster.nodes[1]
    # (a node set DOWN by the test before returns to idle a moment after its `state=resume`)
    wait_for_idle(slurm_cluster)
    start = time.monotonic()
    job, out = sbatch_gpt(slurm_cluster, tmp_path)
    try:
        wait_for(
            lambda: (tmp_path / "ckpt" / "step_000000020").is_dir(),
            "the checkpoint at step 20",
            slurm_cluster,
            job,
        )
        slurm(slurm_cluster, "scontrol", "update", f"nodename={lost}", "state=down", "reason=pulled")
        if node_back:  # back before the requeued job may start (cred_expire, slurm.conf): the same layout
            wait_for(lambda: "Restarts=1" in job_info(slurm_cluster, job), "the requeue", slurm_cluster, job)
            slurm(slurm_cluster, "scontrol", "update", f"nodename={lost}", "state=resume")
        assert wait_for_job(slurm_cluster, job) == "COMPLETED", out.read_text()
    finally:
        slurm(slurm_cluster, "scontrol", "update", f"nodename={lost}", "state=resume", check=False)
    seconds = time.monotonic() - start
    text = out.read_text()
    assert "DUE TO NODE FAILURE" in text, text
    ranks = 4 if node_back else 2
    nodes = "2 nodes" if node_back else "1 node"
    assert f"job {job} (start 2): {ranks} ranks on {nodes} (" in text, text
    assert f"resumed from {tmp_path / 'ckpt' / 'step_000000020'}" in text, text
    assert val_loss(text) == one_machine[1], text
    assert_same_run(tmp_path / "gpt.npz", one_machine[0], exact=node_back)
    print(f"node DOWN at step 20 of 40, {'node back' if node_back else 'one node left'}: {seconds:.1f} s")


def job_info(cluster, job) -> str:
    return slurm(cluster, "scontrol", "show", "job", "-o", job).stdout


def test_the_time_limit_signal_requeues_the_job_which_resumes(slurm_cluster, one_machine, tmp_path):
    wait_for_idle(slurm_cluster)
    job, out = sbatch_gpt(slurm_cluster, tmp_path)
    wait_for(
        lambda: (tmp_path / "ckpt" / "step_000000020").is_dir(),
        "the checkpoint at step 20",
        slurm_cluster,
        job,
    )
    slurm(slurm_cluster, "scancel", "--batch", "--signal=USR1", job)  # as Slurm does 60 s before the limit
    assert wait_for_job(slurm_cluster, job) == "COMPLETED", out.read_text()
    text = out.read_text()
    assert f"time limit near: requeueing job {job}" in text, text
    # Both nodes are free again, so the job should come back on both; if Slurm starts it while one still
    # cleans up, it runs on the other (--nodes=1-2) and the checkpoint is resharded.
    ranks = re.findall(rf"job {job} \(start 2\): (\d) ranks on", text)
    assert ranks in (["4"], ["2"]), text
    resumed = re.findall(r"resumed from \S+step_(\d+)", text)
    assert resumed and int(resumed[0]) >= 20, text
    assert val_loss(text) == one_machine[1], text
    assert_same_run(tmp_path / "gpt.npz", one_machine[0], exact=ranks == ["4"])
