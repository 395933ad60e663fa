"""Training across nodes of a cluster in a box equals one process.

One cluster of 4 nodes x 2 ranks (network namespaces linked over TCP, ``minidist_tools.cluster``) serves the
module. The runs are the existing workers whose results the single-node tests already compare with one
process; here their ranks sit on several nodes, so every collective between nodes crosses a veth link
over TCP (``UCX_TLS=tcp,self``). Ranks fill the nodes in blocks: with ``n`` ranks, rank ``r`` is on node
``r // 2``. The tolerances are those of the single-node tests (only summation orders differ) and the
comparisons are their functions.
"""

from __future__ import annotations

import json

import pytest
from cluster_utils import cluster_fixture, run_on_cluster
from mpi_utils import run_mpi

from minidist_tools.cluster import netns, shaping
from tests.checkpoint import test_checkpoint_mpi as ckpt
from tests.parallel.data_parallel import test_ddp
from tests.parallel.pipeline import test_pipeline_mesh

pytestmark = [pytest.mark.mpi, pytest.mark.cluster]
RANKS_PER_NODE = 2
cluster = cluster_fixture(nodes=4, ranks_per_node=RANKS_PER_NODE)


def node_of(rank: int) -> int:
    return rank // RANKS_PER_NODE


def test_ranks_land_on_their_nodes_and_an_all_reduce_crosses_the_links(cluster, tmp_path):
    mib = 8
    before = cluster.link_bytes()
    run_on_cluster(cluster, 4, "cluster/traffic.py", tmp_path, mib, timeout=60)
    after = cluster.link_bytes()
    for rank in range(4):
        record = json.loads((tmp_path / f"rank{rank}.json").read_text())
        node = cluster.nodes[node_of(rank)]
        assert record["hostname"] == record["processor_name"] == node, (rank, record)
        assert record["shared_memory_size"] == RANKS_PER_NODE, (rank, record)  # MPI sees the same nodes
        assert record["sum_is_exact"], rank
    # Whatever the algorithm, node 0 needs the sum of node 1's data (and vice versa): at least the
    # all-reduced size must leave and enter each of the two nodes through its link. Over shared memory
    # (without UCX_TLS=tcp,self) almost nothing would (the launcher's own messages: a few KB).
    size = mib * 2**20
    for node in cluster.nodes[:2]:
        sent, received = (a - b for a, b in zip(after[node], before[node]))
        assert sent >= size and received >= size, (node, sent, received, size)
    for node in cluster.nodes[2:]:  # no rank there: only stray packets (IPv6 neighbour discovery)
        sent, received = (a - b for a, b in zip(after[node], before[node]))
        assert sent + received < size // 100, (node, sent, received)


def qdiscs(cluster) -> list[str]:
    """``tc qdisc show`` of both ends of every node's link."""
    host_side = [netns.command(["tc", "qdisc", "show", "dev", f"{node}h"]) for node in cluster.nodes]
    inside = [netns.command(["tc", "qdisc", "show", "dev", "eth0"], netns=node) for node in cluster.nodes]
    return host_side + inside


def test_a_shaped_link_is_no_faster_than_its_rate(cluster, tmp_path):
    rate, mib = 50e6, 2
    cluster.set_bandwidth("50mbit")
    try:
        assert all("tbf" in q and "rate 50Mbit" in q for q in qdiscs(cluster))
        run_on_cluster(cluster, 4, "cluster/traffic.py", tmp_path, mib, timeout=60)
    finally:
        cluster.set_bandwidth(None)
    assert not any("tbf" in q for q in qdiscs(cluster))
    seconds = max(json.loads((tmp_path / f"rank{r}.json").read_text())["seconds"] for r in range(4))
    # Each of the two nodes must receive the all-reduced size through its link (see above); the token
    # bucket lets its first `burst` bytes (shaping.tbf_args) pass at once and the rest at the rate.
    # Load on the machine can only make it slower, so the bound holds on any machine.
    burst = int(shaping.tbf_args(int(rate))[4])
    assert seconds >= (mib * 2**20 - burst) * 8 / rate, seconds


def test_ddp_across_two_nodes_equals_one_process(cluster, tmp_path):
    configs = [
        test_ddp.FIVE_STEPS[4],  # overlapped, one bucket
        test_ddp.FLOAT32,
        (4, 11, 4, 12, "adamw", "float64", "--bucket-cap-mb", "0.0005", "--small-bucket-bytes", "0"),
    ]
    args = []
    for i, config in enumerate(configs):
        (tmp_path / str(i)).mkdir()
        args += ["--then"] * (i > 0) + [tmp_path / str(i), *config[1:]]
    run_on_cluster(cluster, 4, "ddp/ddp_equivalence.py", *args, timeout=120)
    for i, config in enumerate(configs):
        test_ddp.compare(tmp_path / str(i), *config)


def check_placement(tmp_path, world_size: int, configs: list[dict]) -> None:
    """Mesh groups of the runs sit where the test names say: tp inside a node, pp stages across nodes."""
    for k, cfg in enumerate(configs):
        infos = [json.loads((tmp_path / f"{k}_rank{r}.json").read_text()) for r in range(world_size)]
        coords = [info["coords"] for info in infos]
        for r, (dp_r, tp_r, pp_r) in enumerate(coords):
            for s, (dp_s, tp_s, pp_s) in enumerate(coords):
                if (dp_r, pp_r) == (dp_s, pp_s):  # one tp group: one node
                    assert node_of(r) == node_of(s), (cfg, r, s)
                if (dp_r, tp_r) == (dp_s, tp_s) and pp_r != pp_s:  # stages of one pipeline: other nodes
                    assert node_of(r) != node_of(s), (cfg, r, s)


def test_tp_within_a_node_and_pp_across_nodes_equal_one_process(cluster, tmp_path):
    # (dp, tp, pp) = (2, 1, 2): dp inside each node, the two stages on nodes 0 and 1;
    # (1, 2, 2): a tp pair on each node, the pipeline from node 0 to node 1.
    configs = test_pipeline_mesh.configs(2, 1, 2) + test_pipeline_mesh.configs(1, 2, 2)
    run_on_cluster(cluster, 4, "pipeline/pp_mesh.py", tmp_path, json.dumps(configs), timeout=120)
    check_placement(tmp_path, 4, configs)
    test_pipeline_mesh.compare(tmp_path, 4, configs)


def test_3d_mesh_on_four_nodes_equals_one_process(cluster, tmp_path):
    # dp x tp x pp = 2 x 2 x 2 on 4 nodes x 2 ranks: tp pairs inside nodes, dp and pp between nodes
    configs = test_pipeline_mesh.configs(2, 2, 2)
    run_on_cluster(cluster, 8, "pipeline/pp_mesh.py", tmp_path, json.dumps(configs), timeout=180)
    check_placement(tmp_path, 8, configs)
    test_pipeline_mesh.compare(tmp_path, 8, configs)


def test_checkpoint_saved_across_nodes_resumes_there_and_on_one_process(cluster, tmp_path):
    """A 2x2x2 run on 4 nodes saves at step 4 (each rank writes its shards from its own node) and trains
    to step 7; resumed from that checkpoint on the cluster it ends bit for bit the same; loaded by one
    process on one node (resharded) it ends as the cluster run did; and the cluster run equals a run of
    one process from scratch."""
    saved = tmp_path / "3d"
    cluster_specs = [
        ckpt.spec(saved / "out", saved / "ckpt", "2,2,2", *ckpt.SAVE),
        ckpt.spec(tmp_path / "3d_resumed" / "out", tmp_path / "3d_resumed" / "ckpt", "2,2,2",
                  "--steps", ckpt.STEPS, "--resume-from", saved / "ckpt"),
    ]  # fmt: skip
    args = [a for i, s in enumerate(cluster_specs) for a in ["--then"] * (i > 0) + s]
    run_on_cluster(cluster, 8, "checkpoint/ckpt_train.py", *args, timeout=240)
    local_specs = [
        ckpt.spec(tmp_path / "one" / "out", tmp_path / "one" / "ckpt", "1,1,1", *ckpt.SAVE),
        ckpt.spec(tmp_path / "one_from_3d" / "out", tmp_path / "one_from_3d" / "ckpt", "1,1,1",
                  "--steps", ckpt.STEPS, "--resume-from", saved / "ckpt"),
    ]  # fmt: skip
    args = [a for i, s in enumerate(local_specs) for a in ["--then"] * (i > 0) + s]
    run_mpi(1, "checkpoint/ckpt_train.py", *args, timeout=120)
    on_cluster = ckpt.final(saved / "out")
    ckpt.assert_same(ckpt.final(tmp_path / "3d_resumed" / "out"), on_cluster, exact=True)
    ckpt.assert_same(ckpt.final(tmp_path / "one_from_3d" / "out"), on_cluster, exact=False)
    ckpt.assert_same(ckpt.final(tmp_path / "one" / "out"), on_cluster, exact=False)
