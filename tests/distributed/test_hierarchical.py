"""Node layouts, the hierarchical all-reduce and ProcessMesh placement on simulated nodes.

Real MPI ranks on one machine; ``MINIDIST_RANKS_PER_NODE=R`` makes consecutive blocks of ``R`` world
ranks separate nodes (``minidist/distributed/topology.py``). One ``mpiexec`` job per layout runs many
all-reduce cases (drawn here by hypothesis, checked in ``tests/workers/topology/hier_check.py``
against NumPy) on the world and on sub-groups that span nodes unevenly, and reports each rank's node
layouts and ``ProcessMesh`` warnings, which this file compares with layouts computed by hand from R.
The real cluster (network namespaces) is checked in ``tests/distributed/test_topology.py``.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
import strategies as S
from hypothesis import given, settings
from hypothesis import strategies as st
from mpi_utils import run_mpi

from minidist.distributed.tuning import HIERARCHICAL_FROM, choose, choose_across_nodes

FLOATS = ["float16", "float32", "float64"]
INTS = ["int32", "int64"]
GROUPS = {  # world ranks of each group of hier_check.py
    "world": lambda w: list(range(w)),
    "parity": lambda w: None,  # depends on the rank: checked per rank below
    "tail": lambda w: list(range(1, w)),
}
# (world size, ranks per node): even nodes; a short last node; 3-rank nodes whose parity sub-groups
# hold 2 and 1 ranks per node.
LAYOUTS = [(4, 2), (5, 2), (6, 3)]


@st.composite
def cases(draw, world_size: int) -> dict:
    length = draw(st.one_of(st.integers(0, world_size + 2), st.integers(0, 50_000)))
    rows = draw(st.sampled_from([r for r in (1, 2, 3) if length % r == 0]))
    dtype = draw(st.sampled_from(FLOATS + INTS))
    ops = ["sum", "avg", "max", "min"] if dtype in FLOATS else ["sum", "max", "min"]
    return {
        "length": length,
        "shape": [length] if rows == 1 else [rows, length // rows],
        "dtype": dtype,
        "op": draw(st.sampled_from(ops)),
        "group": draw(st.sampled_from(sorted(GROUPS))),
        "seed": draw(S.seeds),
    }


def drawn_cases(world_size: int) -> list[dict]:
    """Every op on every group (length 0, 1 and 1000), then the profile's hypothesis examples."""
    fixed = [
        {"length": n, "shape": [n], "dtype": d, "op": op, "group": g, "seed": n}
        for g in sorted(GROUPS)
        for n, d, op in ((0, "float32", "sum"), (1, "float64", "avg"), (1000, "int32", "max"),
                         (1000, "float16", "min"), (999, "float64", "avg"))
    ]  # fmt: skip
    drawn: list[dict] = []

    @settings(max_examples=max(1, settings.default.max_examples // 8), database=None)
    @given(data=st.data())
    def collect(data):
        drawn.extend(data.draw(st.lists(cases(world_size), min_size=4, max_size=4)))

    collect()
    return fixed + drawn


def expected_layout(members: list[int], ranks_per_node: int, me: int) -> dict:
    """The node layout a group with world ranks ``members`` must report on world rank ``me``."""
    numbers: dict[int, int] = {}
    node_of_rank = [numbers.setdefault(w // ranks_per_node, len(numbers)) for w in members]
    mine = node_of_rank[members.index(me)]
    peers = [w for w, n in zip(members, node_of_rank) if n == mine]
    local_rank = peers.index(me)
    return {
        "node_of_rank": node_of_rank,
        "nodes": len(numbers),
        "local_rank": local_rank,
        "local_size": len(peers),
        "node_group_size": len(peers),
        "node_group_rank": local_rank,
        "leader_rank": mine if local_rank == 0 else None,
        "leaders": len(numbers) if local_rank == 0 else None,
        "spans_nodes": len(numbers) > 1,
    }


def expected_warning_ranks(world_size: int, tp: int, ranks_per_node: int) -> set[int]:
    """The first rank of every tp group (consecutive ranks) whose ranks lie on more than one node."""
    return {
        start
        for start in range(0, world_size, tp)
        if len({w // ranks_per_node for w in range(start, start + tp)}) > 1
    }


def run_hier_check(world_size: int, batch: list[dict], launch) -> list[dict]:
    """Run hier_check.py on ``batch`` with ``launch(script, out_dir, cases_file)``; every rank's report."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        (out / "cases.json").write_text(json.dumps(batch))
        launch("topology/hier_check.py", out, out / "cases.json")
        return [json.loads((out / f"rank{r}.json").read_text()) for r in range(world_size)]


def check_reports(reports: list[dict], batch: list[dict], ranks_per_node: int) -> None:
    """hier_check.py found no wrong result, and every layout and mesh warning is the expected one for
    nodes of ``ranks_per_node`` consecutive world ranks (also used on the real cluster)."""
    world_size = len(reports)
    for rank, report in enumerate(reports):
        assert report["failures"] == [], "\n".join(report["failures"])
        in_tail = sum(1 for case in batch if case["group"] == "tail")
        assert report["checks"] == 4 * (len(batch) - (in_tail if rank == 0 else 0))
        groups = {"world": list(range(world_size)), "parity": list(range(rank % 2, world_size, 2))}
        if rank > 0:
            groups["tail"] = list(range(1, world_size))
        assert sorted(report["layouts"]) == sorted(groups)
        for name, members in groups.items():
            got = dict(report["layouts"][name])
            assert got.pop("hostname")  # the processor name, for messages
            assert got == expected_layout(members, ranks_per_node, rank), name
        for tp, mesh in report["meshes"].items():
            nodes = [w // ranks_per_node for w in range(world_size)]
            assert (mesh["nodes"], mesh["node_of_rank"]) == (max(nodes) + 1, nodes)
            warned = rank in expected_warning_ranks(world_size, int(tp), ranks_per_node)
            assert len(mesh["warnings"]) == warned and mesh["other_warnings"] == [], (tp, mesh)
            if warned:  # names the group, its nodes and what to change
                members = list(range(rank, rank + int(tp)))
                assert f"tp group of world ranks {members} spans node" in mesh["warnings"][0]
                assert "choose tp dividing" in mesh["warnings"][0]


@pytest.mark.mpi
@pytest.mark.parametrize("world_size, ranks_per_node", LAYOUTS)
def test_hierarchical_all_reduce_layouts_and_mesh_placement(world_size, ranks_per_node):
    batch = drawn_cases(world_size)
    env = {"MINIDIST_RANKS_PER_NODE": str(ranks_per_node)}
    reports = run_hier_check(
        world_size, batch, lambda *args: run_mpi(world_size, *args, timeout=120, env=env)
    )
    check_reports(reports, batch, ranks_per_node)


@pytest.mark.mpi
def test_bad_ranks_per_node_raises_on_every_rank(tmp_path):
    """A malformed MINIDIST_RANKS_PER_NODE: the same clear ValueError on every rank, no hang."""
    env = {"MINIDIST_RANKS_PER_NODE": "two"}
    run_mpi(2, "topology/layout_errors.py", tmp_path, timeout=60, env=env)
    for rank in range(2):
        errors = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert len(errors) == 3, errors  # node_layout, all_reduce hierarchical, ProcessMesh
        for message in errors:
            assert "MINIDIST_RANKS_PER_NODE='two' must be a whole number >= 1" in message


@pytest.mark.mpi
def test_hierarchical_stages_gpu_arrays_through_the_host_once(tmp_path):
    """With the CuPy stand-in and 2 simulated nodes (2 + 1 ranks): one copy to the host and one back, as
    for the flat algorithms; the sub-collectives inside work on the host copy."""
    env = {"MINIDIST_RANKS_PER_NODE": "2"}
    run_mpi(3, "distributed/coll_staging.py", tmp_path, timeout=60, env=env)
    for rank in range(3):
        report = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert report["failures"] == [], "\n".join(report["failures"])
        assert report["checks"] == 2 * (6 + 4 + 3 + 4)  # as in test_collectives.py


def test_auto_across_nodes_follows_the_measured_table():
    """Below the measured threshold auto keeps the flat pick; from it on it runs hierarchical."""
    below = HIERARCHICAL_FROM - 1
    assert choose_across_nodes(below, 2, 4) == choose("all_reduce", below, 4) != "hierarchical"
    assert choose_across_nodes(HIERARCHICAL_FROM, 2, 4) == "hierarchical"
    assert choose_across_nodes(64 << 20, 3, 5) == "hierarchical"
