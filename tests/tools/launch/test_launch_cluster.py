"""``minidist launch --cluster NAME --nodes MIN:MAX``: a node dies, the job goes on with fewer.

Two nodes of one rank each, on a cluster in a box (skipped without root). When the node's link goes down
(tests/helpers/launch_utils.py ``kill_node``: what a machine that lost power looks like), no error ever
reaches the other rank: its TCP connection just waits. The launcher notices the link, ends the job, and starts
it again on the node still alive; train_mlp.py resumes the checkpoint saved by 2 data-parallel ranks on 1
(resharded). Its global batch, learning rate and sample order are the same, so the result is the same
training, up to float rounding in the gradient sum: it equals, bit for bit, a one-process run resumed
from a copy of that checkpoint.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cluster_utils import cluster_fixture
from launch_utils import EXAMPLE, Launcher, assert_identical, final_checkpoint, kill_node, leftovers
from mpi_utils import REPO, mpi_env

from minidist_tools.cluster import netns
from minidist_tools.launch import launch, nodes

pytestmark = [pytest.mark.mpi, pytest.mark.cluster]
cluster = cluster_fixture(nodes=2, ranks_per_node=1)

TRAIN = ["--epochs", "3", "--hidden", "32", "32", "--checkpoint-every", "4"]  # 33 steps: a kill lands mid-run


def test_a_dead_node_shrinks_the_world_and_training_goes_on(cluster, tmp_path):
    ckpt, copy = tmp_path / "ckpt", tmp_path / "copy"
    run = Launcher(
        ["--cluster", cluster.name, "--nodes", "1:2", "--max-restarts", "1", "--monitor-interval", "0.2"],
        ["python", EXAMPLE, *TRAIN, "--checkpoint-dir", str(ckpt)],
        tmp_path / "launch.log",
    )
    try:
        assert run.wait_for(lambda e: e["event"] == "start", 60)["nodes"] == cluster.nodes
        run.wait_for(lambda e: e["event"] == "checkpoint" and e["step"] >= 4, 120)
        killed_at = time.time()
        kill_node(cluster, cluster.nodes[1])
        # Keep the checkpoint the restart resumes from (the resumed run prunes it after 3 saves).
        verify = run.wait_for(lambda e: e["event"] == "verify", 60)
        shutil.copytree(verify["path"], copy / Path(verify["path"]).name)
        (copy / "latest").write_text(Path(verify["path"]).name + "\n")
        assert run.wait(180) == 0, run.output()
    finally:
        run.close()

    failure, kill = run.events("failure")[0], run.events("kill")[0]
    assert failure["reason"] == "node" and cluster.nodes[1] in failure["dead"]
    # From the link going down to every process gone: one monitor interval (0.2 s) to see it, then the
    # kill. Measured 0.3-0.5 s on 2 loaded cores; 10 s catches a launcher that waits for MPI to notice.
    print(f"node {cluster.nodes[1]} down -> every process gone: {kill['time'] - killed_at:.2f} s")
    assert kill["time"] - killed_at < 10
    restarted = run.events("start")[1]
    assert restarted["nodes"] == cluster.nodes[:1] and restarted["n"] == 1
    assert "its link is down" in run.events("nodes")[0]["dead"][cluster.nodes[1]]
    out = run.out_path.read_text()
    assert "(saved on dp=2 x tp=1 x pp=1, resharded)" in out
    assert leftovers(run.run_id) == []
    assert all(netns.pids(node) == [] for node in cluster.nodes)

    # The reference: one process resumed from the same checkpoint (same dp=1 layout as the restart).
    reference = subprocess.run(
        [sys.executable, EXAMPLE, *TRAIN, "--checkpoint-dir", str(copy), "--resume"],
        capture_output=True, text=True, env=mpi_env(), cwd=REPO, timeout=120,
    )  # fmt: skip
    assert reference.returncode == 0, reference.stderr
    step, got = final_checkpoint(ckpt)
    assert step == 33
    assert_identical(got, final_checkpoint(copy)[1])
    accuracy = [line for line in reference.stdout.splitlines() if line.startswith("final test accuracy")]
    assert accuracy and accuracy[-1] in out

    # With the node still dead, a job that needs both nodes cannot start: the launcher says why.
    again = Launcher(
        ["--cluster", cluster.name, "--nodes", "2:2"], ["python", EXAMPLE], tmp_path / "again.log"
    )
    try:
        assert again.wait(60) == 1
    finally:
        again.close()
    give_up = again.events("give_up")[0]
    assert "only 1 of cluster" in give_up["detail"] and "fewer than the minimum of 2" in give_up["detail"]


def test_node_counts_that_do_not_fit_are_refused(cluster, tmp_path):
    log = tmp_path / "launch.log"
    with pytest.raises(ValueError, match="more than cluster .*'s 2 nodes"):
        launch(["python", EXAMPLE], 3, cluster=cluster.name, log=log)  # 1 rank per node: 3 nodes
    with pytest.raises(ValueError, match="outside --nodes 2:2"):
        launch(["python", EXAMPLE], 1, cluster=cluster, nodes=(2, 2), log=log)
    assert not log.exists()  # refused before anything started


def test_the_probe_finds_a_node_that_cannot_be_reached_over_a_link_that_is_up(cluster):
    node, address = cluster.nodes[0], cluster.addresses[0]
    assert nodes.probe(cluster, [node]) == {}
    # Its eth0 loses its address: the link stays "up", but no TCP connection can leave the node.
    subprocess.run(["ip", "-n", node, "addr", "flush", "dev", "eth0"], check=True)
    try:
        assert nodes.link_problems(cluster, [node]) == {}
        assert "TCP probe failed" in nodes.probe(cluster, [node], timeout=5)[node]
    finally:
        subprocess.run(["ip", "-n", node, "addr", "add", f"{address}/24", "dev", "eth0"], check=True)
    assert nodes.probe(cluster, [node]) == {}
