"""MPI worker: node layouts and the hierarchical all-reduce on simulated (or real) nodes.

Usage: ``mpiexec -n W python hier_check.py OUT_DIR CASES_JSON`` with ``MINIDIST_RANKS_PER_NODE`` set
(or on a real cluster). ``CASES_JSON`` is a list of cases drawn in ``tests/distributed/test_hierarchical.py``
(length, shape, dtype, op, group, seed). For each case every rank runs ``all_reduce`` with
``"hierarchical"`` and ``"auto"`` and compares the result with the NumPy reduction of all ranks'
inputs (rebuilt from ``(seed, world rank)``, as ``distributed/coll_check.py`` does), and checks that
every rank holds the same bits. Groups: ``"world"``; ``"parity"`` (even / odd world ranks, which
span nodes with one or two ranks each); ``"tail"`` (world ranks 1..W-1: a sub-group whose first node
is one rank short). It also builds ``ProcessMesh(dp=W/tp, tp=tp)`` for every ``tp`` dividing ``W``.
Each rank writes ``rank<r>.json``: the checks made, the failures, its node layout of every group and
each mesh's nodes and the ``PlacementWarning`` this rank issued (to compare with what the test expects).
"""

from __future__ import annotations

import hashlib
import json
import sys
import warnings
from pathlib import Path

from dist_worker_utils import run_worker, write_json

import minidist.distributed as dist
from minidist.distributed.topology import node_layout
from minidist.parallel import ProcessMesh
from minidist.parallel.mesh import PlacementWarning

sys.path.insert(0, str(Path(__file__).parent.parent / "distributed"))  # coll_check's NumPy reference
from coll_check import close, expected_reduction, rank_input  # noqa: E402


def groups(world: dist.Communicator) -> dict[str, tuple[dist.Communicator | None, list[int]]]:
    """Each test group (None where this rank is not a member) and its members' world ranks."""
    w, me = world.size, world.rank
    parity = world.split(color=me % 2, name="parity")
    tail = world.split(color=0 if me > 0 else None, name="tail")
    return {
        "world": (world, list(range(w))),
        "parity": (parity, list(range(me % 2, w, 2))),
        "tail": (tail, list(range(1, w))),
    }


def layout_record(group: dist.Communicator) -> dict:
    layout = node_layout(group)
    assert node_layout(group) is layout  # cached on the group
    leaders = layout.leader_group
    return {
        "node_of_rank": list(layout.node_of_rank),
        "nodes": layout.nodes,
        "local_rank": layout.local_rank,
        "local_size": layout.local_size,
        "node_group_size": layout.node_group.size,
        "node_group_rank": layout.node_group.rank,
        "leader_rank": None if leaders is None else leaders.rank,
        "leaders": None if leaders is None else leaders.size,
        "spans_nodes": layout.spans_nodes,
        "hostname": layout.hostnames[group.rank],
    }


def mesh_records(world: dist.Communicator) -> dict:
    """For every tp dividing the world size, ProcessMesh(dp=W/tp, tp): its nodes and this rank's warnings."""
    records = {}
    for tp in (t for t in range(1, world.size + 1) if world.size % t == 0):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            mesh = ProcessMesh(dp=world.size // tp, tp=tp)
        placement = [w for w in caught if issubclass(w.category, PlacementWarning)]
        records[tp] = {
            "nodes": mesh.nodes,
            "node_of_rank": list(mesh.node_of_rank),
            "warnings": [str(w.message) for w in placement],
            "other_warnings": [str(w.message) for w in caught if w not in placement],
        }
    return records


def main(out_dir: str, cases_path: str) -> None:
    cases = json.loads(Path(cases_path).read_text())
    world = dist.init()
    report: dict = {"checks": 0, "failures": [], "layouts": {}, "meshes": mesh_records(world)}
    all_groups = groups(world)
    for name, (group, _) in all_groups.items():
        if group is not None:
            report["layouts"][name] = layout_record(group)

    for i, case in enumerate(cases):
        group, members = all_groups[case["group"]]
        if group is None:  # rank 0 is not in "tail"
            continue
        length, dtype, op, seed = case["length"], case["dtype"], case["op"], case["seed"]
        inputs = [rank_input(seed, w, length, dtype) for w in members]
        expected, tol = expected_reduction(inputs, op)
        for algorithm in ("hierarchical", "auto"):
            a = inputs[group.rank].reshape(case["shape"]).copy()
            out = dist.all_reduce(a, op=op, group=group, algorithm=algorithm)
            ok = out is a and list(a.shape) == case["shape"] and close(a.reshape(-1), expected, tol, dtype)
            digests = group.mpi.allgather(hashlib.sha256(a.tobytes()).hexdigest())
            for good, what in ((ok, "result"), (len(set(digests)) == 1, "differs between ranks")):
                report["checks"] += 1
                if not good:
                    report["failures"].append(f"case {i} {case} {algorithm}: {what}")
    write_json(out_dir, f"rank{world.rank}.json", report)


if __name__ == "__main__":
    run_worker(main, *sys.argv[1:])
