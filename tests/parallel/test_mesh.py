"""ProcessMesh: the dp x tp x pp x cp grid of ranks (tp fastest, then cp, dp, pp) and its errors."""

from __future__ import annotations

import json

import numpy as np
import pytest
import strategies as S
from hypothesis import given
from hypothesis import strategies as st
from mpi_utils import run_mpi

from minidist.parallel import ProcessMesh
from minidist.parallel.mesh import draw_grid, mesh_coords, mesh_coords4, mesh_rank


@given(S.meshes())
def test_coords_and_rank_are_inverse_and_tp_varies_fastest(mesh):
    dp, tp, pp = mesh
    ranks = [mesh_rank(d, t, p, dp, tp) for p in range(pp) for d in range(dp) for t in range(tp)]
    assert ranks == list(range(dp * tp * pp))  # tp innermost, then dp, then pp outermost
    for rank in ranks:
        d, t, p = mesh_coords(rank, dp, tp, pp)
        assert mesh_rank(d, t, p, dp, tp) == rank and d < dp and t < tp and p < pp


@given(S.meshes(max_dp=3, max_tp=3, max_pp=3), st.integers(1, 4))
def test_4d_coords_and_rank_are_inverse_and_tp_then_cp_then_dp_then_pp(mesh, cp):
    dp, tp, pp = mesh
    order = [(d, t, p, c) for p in range(pp) for d in range(dp) for c in range(cp) for t in range(tp)]
    ranks = [mesh_rank(d, t, p, dp, tp, c, cp) for d, t, p, c in order]
    assert ranks == list(range(dp * tp * pp * cp))  # tp innermost, then cp, then dp, pp outermost
    for rank, coords in zip(ranks, order):
        assert mesh_coords4(rank, dp, tp, pp, cp) == coords
        assert mesh_coords(rank, dp, tp, pp, cp) == coords[:3]  # coords stays (dp, tp, pp)


def test_the_grid_drawing_shows_every_rank_at_its_coordinates():
    lines = draw_grid(2, 2, 2).splitlines()
    assert lines[0] == "ProcessMesh(dp=2, tp=2, pp=2): 8 ranks, rank = pp_rank*4 + dp_rank*2 + tp_rank"
    assert lines[1:] == [
        "pp stage 0:", "         tp0 tp1", "  dp0      0   1", "  dp1      2   3",
        "pp stage 1:", "         tp0 tp1", "  dp0      4   5", "  dp1      6   7",
    ]  # fmt: skip
    lines = draw_grid(2, 2, 1, 2).splitlines()  # the 8-rank example of the module docstring
    assert lines[0] == (
        "ProcessMesh(dp=2, tp=2, pp=1, cp=2): 8 ranks, rank = pp_rank*8 + dp_rank*4 + cp_rank*2 + tp_rank"
    )
    assert lines[1:] == [
        "             tp0 tp1", "  dp0 cp0      0   1", "  dp0 cp1      2   3",
        "  dp1 cp0      4   5", "  dp1 cp1      6   7",
    ]  # fmt: skip


def test_one_process_mesh_and_its_errors():
    mesh = ProcessMesh()
    assert (mesh.dp, mesh.tp, mesh.pp, mesh.world_size, mesh.coords) == (1, 1, 1, 1, (0, 0, 0))
    assert mesh.tp_group.size == mesh.dp_group.size == mesh.pp_group.size == 1
    assert (mesh.cp, mesh.cp_rank, mesh.coords4) == (1, 0, (0, 0, 0, 0))
    assert mesh.cp_group.size == mesh.dp_cp_group.size == 1 and mesh.dp_cp_group is not mesh.dp_group
    with pytest.raises(ValueError, match=r"dp\*tp\*pp\*cp = 1\*1\*1\*2 = 2 but the world has 1 ranks"):
        ProcessMesh(cp=2)
    with pytest.raises(ValueError, match="ProcessMesh: cp must be >= 1, got cp=0"):
        ProcessMesh(1, 1, 1, 0)
    with pytest.raises(ValueError, match=r"cp_rank must be in \[0, 1\), got 1"):
        mesh.rank_of(0, 0, 0, 1)
    with pytest.raises(ValueError, match=r"dp\*tp\*pp = 1\*2\*1 = 2 but the world has 1 ranks"):
        ProcessMesh(tp=2)
    with pytest.raises(TypeError, match="ProcessMesh: pp must be an int, got 1.0"):
        ProcessMesh(pp=1.0)
    with pytest.raises(ValueError, match=r"tp_rank must be in \[0, 1\), got 1"):
        mesh.rank_of(0, 1, 0)


def test_numpy_integer_sizes_are_ints_and_bools_are_not():
    mesh = ProcessMesh(dp=np.int64(1), tp=np.int32(1), pp=np.uint8(1))
    assert (mesh.dp, mesh.tp, mesh.pp) == (1, 1, 1) and all(
        type(v) is int for v in (mesh.dp, mesh.tp, mesh.pp)
    )
    for bad in (True, np.bool_(True)):  # True == 1 would pass as a size
        with pytest.raises(TypeError, match=r"ProcessMesh: dp must be an int, got (np\.)?True_?"):
            ProcessMesh(dp=bad)


@pytest.mark.mpi
def test_groups_on_four_ranks_and_errors_on_every_rank(tmp_path):
    run_mpi(4, "mesh/mesh_check.py", tmp_path, timeout=60)
    records = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(4)]
    for layout in records[0]["layouts"]:
        dp, tp, pp = map(int, layout.split(","))
        for rank, record in enumerate(records):
            got = record["layouts"][layout]
            d, t, p = mesh_coords(rank, dp, tp, pp)
            assert got["coords"] == [d, t, p] and got["rank_of"] == rank
            assert got["sizes"] == [dp, tp, pp, 4]
            # Each group: the ranks that differ from this one only along that axis, in axis order.
            assert got["tp"] == [mesh_rank(d, i, p, dp, tp) for i in range(tp)]
            assert got["dp"] == [mesh_rank(i, t, p, dp, tp) for i in range(dp)]
            assert got["pp"] == [mesh_rank(d, t, i, dp, tp) for i in range(pp)]
        assert records[0]["drawings"][layout] == draw_grid(dp, tp, pp)
    expected = {
        "product": ("ValueError", "dp*tp*pp = 3*1*1 = 3 but the world has 4 ranks"),
        "zero": ("ValueError", ": ProcessMesh: tp must be >= 1, got tp=0"),
        "not_int": ("TypeError", "rank 0 of the group: ProcessMesh: tp must be an int, got 2.0"),
        "differ": (
            "ValueError",
            "the ranks of the group passed different values: dp (2 on ranks 0, 1, 3; 4 on rank 2), "
            "tp (2 on ranks 0, 1, 3; 1 on rank 2); every rank must pass the same dp, tp and pp",
        ),
        "one_bad": ("TypeError", "rank 3 of the group: ProcessMesh: tp must be an int, got '2'"),
        "numpy_on_rank_1": ("ok", "ProcessMesh(dp=2, tp=2, pp=1;"),  # np.int64(2) on rank 1 equals 2
        "rank_of": ("ValueError", "tp_rank must be in [0, 2), got 2"),
    }
    for rank, record in enumerate(records):
        for case, (kind, text) in expected.items():
            assert record["errors"][case] is not None, f"rank {rank} raised nothing for {case}"
            assert record["errors"][case][0] == kind and text in record["errors"][case][1], (rank, case)


@pytest.mark.mpi
def test_4d_rank_order_and_groups_on_eight_ranks(tmp_path):
    run_mpi(8, "mesh/mesh4_check.py", tmp_path, timeout=90)
    records = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(8)]
    for layout in records[0]["layouts"]:
        dp, tp, pp, cp = map(int, layout.split(","))
        for rank, record in enumerate(records):
            got = record["layouts"][layout]
            d, t, p, c = mesh_coords4(rank, dp, tp, pp, cp)
            assert got["coords4"] == [d, t, p, c] and got["coords"] == [d, t, p] and got["rank_of"] == rank
            assert got["sizes"] == [dp, tp, pp, cp, 8]
            # Each group: the ranks that differ from this one only along its axis, in axis order;
            # dp_cp: the same (tp, pp) coordinates, ordered dp_rank * cp + cp_rank.
            assert got["tp"] == [mesh_rank(d, i, p, dp, tp, c, cp) for i in range(tp)]
            assert got["cp"] == [mesh_rank(d, t, p, dp, tp, i, cp) for i in range(cp)]
            assert got["dp"] == [mesh_rank(i, t, p, dp, tp, c, cp) for i in range(dp)]
            assert got["pp"] == [mesh_rank(d, t, i, dp, tp, c, cp) for i in range(pp)]
            assert got["dp_cp"] == [mesh_rank(i, t, p, dp, tp, j, cp) for i in range(dp) for j in range(cp)]
        assert records[0]["drawings"][layout] == draw_grid(dp, tp, pp, cp)
    # the docstring's example: ProcessMesh(dp=2, tp=2, pp=1, cp=2)
    assert [r["layouts"]["2,2,1,2"]["cp"] for r in records[:4]] == [[0, 2], [1, 3], [0, 2], [1, 3]]
    assert records[0]["layouts"]["2,2,1,2"]["dp_cp"] == [0, 2, 4, 6]
    for record in records:
        assert "dp*tp*pp*cp = 2*2*1*4 = 16 but the world has 8 ranks" in record["product_error"]
