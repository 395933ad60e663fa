"""Node layouts and the hierarchical all-reduce on a real cluster: network namespaces linked over TCP.

``minidist_tools.cluster`` makes 2 "machines" (network namespaces with their own host names) of 2 ranks
each, joined by veth links; MPI finds the nodes itself (``MPI_COMM_TYPE_SHARED``), with no
``MINIDIST_RANKS_PER_NODE``. Checked here, in three launches on one cluster:

* the node layouts of the world and of sub-groups, and ``ProcessMesh``'s placement warnings, equal
  those of the simulation on one machine (``tests/distributed/test_hierarchical.py``: the same worker and the
  same expected values), and the hierarchical all-reduce (and ``auto``) equal NumPy;
* the hierarchical all-reduce sends fewer bytes over the links than the ring, as its cost formula says;
* DDP over the 2 nodes, its buckets all-reduced hierarchically, equals one process after 5 steps.

Needs root (network namespaces); skipped with the reason otherwise.
"""

from __future__ import annotations

import json

import pytest
from cluster_utils import cluster_fixture, run_on_cluster

from tests.distributed.test_hierarchical import check_reports, drawn_cases, run_hier_check
from tests.parallel.data_parallel.test_ddp import FIVE_STEPS, compare

NODES, RANKS_PER_NODE = 2, 2
WORLD = NODES * RANKS_PER_NODE

pytestmark = [pytest.mark.mpi, pytest.mark.cluster]
cluster = cluster_fixture(nodes=NODES, ranks_per_node=RANKS_PER_NODE)  # skips, with the reason, without root


def run_on(cluster, script: str, *args):
    """Run ``tests/workers/<script>`` on every rank of the cluster (fails with every rank's output)."""
    return run_on_cluster(cluster, WORLD, script, *args, timeout=120)


def test_layouts_meshes_and_hierarchical_results_match_the_simulation(cluster):
    batch = drawn_cases(WORLD)
    reports = run_hier_check(WORLD, batch, lambda *args: run_on(cluster, *args))
    check_reports(reports, batch, RANKS_PER_NODE)
    assert {r["layouts"]["world"]["hostname"] for r in reports} == set(cluster.nodes)  # real host names


def test_hierarchical_sends_fewer_bytes_across_nodes_than_the_ring(cluster):
    """Per all-reduce of N bytes over 2 nodes x 2 ranks, each node's link carries 2(n-1)/n N = 1.5 N
    bytes each way for the ring (two of its four edges cross), but only 2(k-1)/k N = N for hierarchical
    (the leaders' exchange). MPI's start-up adds well under 1 MiB per launch; 4 x 16 MiB dominate."""
    nbytes, repeats = 16 << 20, 4
    sent = {}
    for algorithm in ("ring", "hierarchical"):
        before = cluster.link_bytes()
        run_on(cluster, "topology/cluster_traffic.py", algorithm, nbytes, repeats)
        after = cluster.link_bytes()
        sent[algorithm] = [after[node][0] - before[node][0] for node in cluster.nodes]
    for node, ring, hierarchical in zip(cluster.nodes, sent["ring"], sent["hierarchical"]):
        assert ring >= 1.5 * nbytes * repeats, (node, sent)
        assert nbytes * repeats <= hierarchical < 0.75 * ring, (node, sent)  # 2/3 expected


def test_ddp_over_two_nodes_matches_one_process(cluster, tmp_path):
    """DDP's buckets all-reduced hierarchically across the 2 nodes (the worker lowers auto's threshold,
    see ddp_hierarchical.py) train the model of one process (tolerances:
    tests/parallel/data_parallel/test_ddp.py)."""
    config = FIVE_STEPS[WORLD]
    run_on(cluster, "topology/ddp_hierarchical.py", tmp_path, *config[1:])
    compare(tmp_path, *config)
    for rank in range(WORLD):  # every step's buckets (and the loss sums) went through it
        assert json.loads((tmp_path / f"hierarchical_rank{rank}.json").read_text()) >= config[2]
