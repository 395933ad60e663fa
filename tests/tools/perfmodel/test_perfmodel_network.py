"""minidist_tools.perfmodel.network (and perfmodel_compression, which it re-exports): the two-level network's
formulas against hand-computed cases and limits (one node is the flat model of minidist_tools.perfmodel.step;
free
links make the step pure compute)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from minidist_tools.perfmodel import network as pn
from minidist_tools.perfmodel import step as pm

# Shared memory inside a node (1 us, 10 GB/s), a 1 Gbit/s link between nodes (100 us, 8 ns/B).
NET = pn.Network(intra_alpha=1e-6, intra_beta=1e-10, inter_alpha=1e-4, inter_beta=8e-9)


def test_link_beta_reads_tc_rates():
    assert pn.link_beta("1gbit") == pytest.approx(8e-9)  # 8 bits per byte at 1e9 bit/s
    assert pn.link_beta("100mbit") == pytest.approx(8e-8)
    assert pn.link_beta("10Gbit") == pytest.approx(8e-10)
    assert pn.link_beta(1e6) == pytest.approx(8e-6)
    for bad in ("fast", "1gbyte", 0, "0mbit"):
        with pytest.raises(ValueError, match="rate"):
            pn.link_beta(bad)


def test_flat_ring_across_nodes_by_hand():
    # 2 nodes x 2 ranks, N = 4 MB: 6 steps of a 1 MB chunk, each waiting for the link:
    # max(1 us + 1e6 * 0.1 ns, 100 us + 1e6 * 8 ns) = 8.1 ms -> 48.6 ms.
    assert pn.flat_all_reduce_time(4e6, 2, 2, NET) == pytest.approx(6 * 8.1e-3, rel=1e-12)
    # One node: the shared-memory ring only, 2 steps of 2 MB: 2 (1 us + 0.2 ms).
    assert pn.flat_all_reduce_time(4e6, 1, 2, NET) == pytest.approx(2 * (1e-6 + 2e-4), rel=1e-12)
    assert pn.flat_all_reduce_time(4e6, 1, 1, NET) == 0.0
    # gamma adds (n-1)/n N gamma once: 3/4 * 4e6 * 1e-10 = 0.3 ms
    with_gamma = pn.Network(1e-6, 1e-10, 1e-4, 8e-9, gamma=1e-10)
    assert pn.flat_all_reduce_time(4e6, 2, 2, with_gamma) == pytest.approx(48.6e-3 + 0.3e-3, rel=1e-12)


def test_hierarchical_by_hand_and_its_flat_limits():
    # 2 x 2, N = 4 MB: reduce + broadcast, 1 tree step each of 4 MB over memory: 2 (1 us + 0.4 ms);
    # ring over 2 leaders: 2 (100 us + 2e6 * 8 ns) = 32.2 ms.
    want = 2 * (1e-6 + 4e-4) + 2 * (1e-4 + 16e-3)
    assert pn.hierarchical_all_reduce_time(4e6, 2, 2, NET) == pytest.approx(want, rel=1e-12)
    # 3 ranks per node: ceil(log2 3) = 2 tree steps each way.
    want3 = 4 * (1e-6 + 4e-4) + 2 * (1e-4 + 16e-3)
    assert pn.all_reduce_time(4e6, 2, 3, NET, "hierarchical") == pytest.approx(want3, rel=1e-12)
    # No hierarchy to use: one node, or one rank per node, runs the flat ring (as minidist does).
    for nodes, per_node in [(1, 4), (4, 1), (1, 1)]:
        assert pn.hierarchical_all_reduce_time(4e6, nodes, per_node, NET) == pn.flat_all_reduce_time(
            4e6, nodes, per_node, NET
        )
    # Large messages on a slow link: hierarchical sends N across instead of 1.5 N and wins.
    assert pn.all_reduce_time(4e6, 2, 2, NET, "hierarchical") < pn.all_reduce_time(4e6, 2, 2, NET, "ring")
    with pytest.raises(ValueError, match="algorithm"):
        pn.all_reduce_time(1.0, 2, 2, NET, "tree")


def test_recursive_doubling_across_nodes_by_hand():
    # 2 x 2, N = 1 MB: partner 1 apart on the node (1 us + 0.1 ms), then 2 apart across the link, where
    # both ranks of a node send 1 MB through it at once (100 us + 2e6 * 8 ns = 16.1 ms).
    want = (1e-6 + 1e-4) + (1e-4 + 16e-3)
    assert pn.all_reduce_time(1e6, 2, 2, NET, "recursive_doubling") == pytest.approx(want, rel=1e-12)
    # One node: perfmodel's one-level formula.
    assert pn.recursive_doubling_time(1e6, 1, 4, NET) == pytest.approx(
        pm.recursive_doubling_time(1e6, 4, 1e-6, 1e-10)
    )
    with pytest.raises(ValueError, match="power-of-two"):
        pn.recursive_doubling_time(1e6, 3, 1, NET)


@given(
    nbytes=st.floats(1.0, 1e9),
    per_node=st.integers(1, 16),
    alpha=st.floats(0.0, 1e-3),
    beta=st.floats(0.0, 1e-8),
)
def test_one_node_is_the_flat_model(nbytes, per_node, alpha, beta):
    net = pn.Network(alpha, beta, inter_alpha=1.0, inter_beta=1.0)  # a link that is never used
    flat = pm.ring_all_reduce_time(nbytes, per_node, alpha, beta)
    assert pn.flat_all_reduce_time(nbytes, 1, per_node, net) == pytest.approx(flat, rel=1e-12, abs=1e-300)
    assert pn.inter_node_bytes(nbytes, 1, per_node) == 0.0


def test_inter_node_bytes():
    # The ring's one edge per node carries 2 (n-1)/n N; the leaders' ring 2 (k-1)/k N.
    assert pn.inter_node_bytes(8.0, 2, 2, "ring") == pytest.approx(12.0)
    assert pn.inter_node_bytes(8.0, 2, 2, "hierarchical") == pytest.approx(8.0)
    assert pn.inter_node_bytes(8.0, 4, 1, "hierarchical") == pn.inter_node_bytes(8.0, 4, 1, "ring") == 12.0
    # It is the ring's time with alpha = 0 and beta = 1 s/byte.
    unit = pn.Network(0.0, 0.0, 0.0, 1.0)
    assert pn.inter_node_bytes(8e6, 4, 2, "ring") == pytest.approx(pn.flat_all_reduce_time(8e6, 4, 2, unit))
    with pytest.raises(ValueError, match="algorithm"):
        pn.inter_node_bytes(8.0, 2, 2, "star")


def test_powersgd_values_and_compression_by_hand():
    shapes = [(1024, 1024), (1024,)]
    # rank 4: P and Q are 1024 x 4 each (8192 values, far below 1024^2 / 2); the bias goes whole.
    assert pn.powersgd_values(shapes, 4) == 8192 + 1024
    # (4, 4) at rank 1: factors of 8 values, not 2x smaller than 16 -> whole, as torch decides.
    assert pn.powersgd_values([(4, 4), (4,)], 1) == 20
    # Convolution weights are matrices of the first dimension by the rest: 256 x 27, rank 2 -> 566.
    assert pn.powersgd_values([(256, 3, 3, 3)], 2) == (256 + 27) * 2
    c = pn.powersgd_compression(shapes, 4, flops=1e9)
    assert c.ratio == pytest.approx((1024 * 1024 + 1024) / (8192 + 1024))
    assert c.rounds == 3  # the uncompressed bias, then P, then Q
    assert c.seconds == pytest.approx((6 * 1024 * 1024 * 4 + 2 * 1024 * 16) / 1e9)
    assert pn.powersgd_compression([(1024, 1024)], 4, flops=1e9).rounds == 2
    # Error feedback: 4 passes over the 4 MB gradient at 1e-10 s/byte add 1.6 ms.
    fed = pn.powersgd_compression(shapes, 4, flops=1e9, seconds_per_byte=1e-10)
    assert fed.seconds == pytest.approx(c.seconds + 4 * (1024 * 1024 + 1024) * 4 * 1e-10)
    with pytest.raises(ValueError, match="rank"):
        pn.powersgd_values(shapes, 0)
    fp16 = pn.fp16_compression(4e6, seconds_per_byte=1e-10)
    assert fp16.ratio == 2 and fp16.seconds == pytest.approx(2 * 4e6 * 1e-10)


def test_backward_with_buckets_by_hand():
    # Backward of 3 s makes 3 equal buckets at 1, 2, 3 s.
    assert pn.backward_with_buckets(3.0, [1, 1, 1], [0.5, 0.5, 0.5]) == pytest.approx(3.5)  # last one shows
    assert pn.backward_with_buckets(3.0, [1, 1, 1], [2, 2, 2]) == pytest.approx(7.0)  # comm-bound: 1 + 6
    assert pn.backward_with_buckets(3.0, [2, 1], [0.5, 0.5]) == pytest.approx(3.5)  # ready at 2 and 3
    assert pn.backward_with_buckets(3.0, [5], [2.0]) == pytest.approx(5.0)  # one bucket: nothing overlaps
    assert pn.backward_with_buckets(3.0, [1, 1], [0.0, 0.0]) == pytest.approx(3.0)


def test_predict_nodes_by_hand():
    # 1e6 params (4 MB of float32 gradients), batch 100, 1e9 FLOP/s per rank, 2 x 2 ranks.
    work = pm.Workload(params=1e6, global_batch=100)
    p = pn.predict_nodes(work, 1e9, NET, nodes=2, ranks_per_node=2)
    compute = 6e6 * 100 / 4 / 1e9  # 0.15 s
    comm = 6 * 8.1e-3  # the flat ring above
    assert p.compute == pytest.approx(compute) and p.dp_comm == pytest.approx(comm)
    assert p.step == pytest.approx(compute + comm) and p.devices == 4
    assert p.efficiency == pytest.approx(compute / (compute + comm))
    # 4 buckets of 1 MB during backward (0.1 s): each 6 steps of 250 kB = 6 * 2.1 ms = 12.6 ms, ready
    # every 25 ms, so only the last one shows: forward 0.05 + backward 0.1 + 12.6 ms.
    q = pn.predict_nodes(work, 1e9, NET, 2, 2, overlap=True, bucket_bytes=[1e6] * 4)
    assert q.dp_comm == pytest.approx(4 * 6 * (1e-4 + 2.5e5 * 8e-9))
    assert q.step == pytest.approx(0.15 + 6 * 2.1e-3) and q.dp_comm_exposed == pytest.approx(6 * 2.1e-3)
    # The same buckets without overlap pay all four after backward.
    r = pn.predict_nodes(work, 1e9, NET, 2, 2, overlap=False, bucket_bytes=[1e6] * 4)
    assert r.step == pytest.approx(0.15 + 4 * 6 * 2.1e-3)
    # fp16 halves the bytes: 6 steps of 0.5 MB chunks (4.1 ms), plus its casts.
    h = pn.predict_nodes(work, 1e9, NET, 2, 2, compression=pn.Compression(ratio=2.0, seconds=1e-3))
    assert h.step == pytest.approx(0.15 + 6 * (1e-4 + 5e5 * 8e-9) + 1e-3)
    # PowerSGD-like: 0.4 MB in 2 rounds of 0.2 MB (chunks of 50 kB), each round pays the 6 latencies.
    s = pn.predict_nodes(work, 1e9, NET, 2, 2, compression=pn.Compression(ratio=10.0, rounds=2))
    assert s.dp_comm == pytest.approx(2 * 6 * (1e-4 + 5e4 * 8e-9))
    z = pn.predict_nodes(work, 1e9, NET, 2, 2, algorithm="hierarchical")
    assert z.dp_comm == pytest.approx(pn.hierarchical_all_reduce_time(4e6, 2, 2, NET))


@given(
    params=st.floats(1e3, 1e9),
    batch=st.integers(16, 4096),
    per_node=st.integers(1, 8),
    alpha=st.floats(0.0, 1e-4),
    beta=st.floats(0.0, 1e-9),
    gamma=st.floats(0.0, 1e-10),
)
def test_predict_nodes_on_one_node_is_perfmodel_predict(params, batch, per_node, alpha, beta, gamma):
    work = pm.Workload(params=params, global_batch=batch)
    net = pn.Network(alpha, beta, 1.0, 1.0, gamma)
    got = pn.predict_nodes(work, 1e10, net, nodes=1, ranks_per_node=per_node)
    want = pm.predict(work, pm.Hardware(1e10, alpha, beta, gamma), dp=per_node)
    for field in ("compute", "dp_comm", "step", "speedup", "efficiency"):
        assert getattr(got, field) == pytest.approx(getattr(want, field), rel=1e-12), field


def test_free_links_make_the_step_pure_compute():
    work = pm.Workload(params=4.2e6, global_batch=256)
    free = pn.Network(0.0, 0.0, 0.0, 0.0)
    for nodes in (1, 2, 4, 8):
        for algorithm in pn.ALGORITHMS:  # 1, 2, 4, 8 nodes x 2 ranks: powers of two for doubling
            p = pn.predict_nodes(work, 1e10, free, nodes, 2, algorithm=algorithm)
            assert p.step == pytest.approx(p.compute) and p.efficiency == pytest.approx(1.0)


def test_a_slow_link_has_a_sweet_spot_a_fast_one_scales():
    # The benchmark's MLP (4.2 M params, batch 256) at 20 GFLOP/s per rank, one rank per node.
    work = pm.Workload(params=4.2e6, global_batch=256)
    slow = pn.Network(1e-6, 1e-10, 1e-4, pn.link_beta("100mbit"))
    fast = pn.Network(1e-6, 1e-10, 1e-5, pn.link_beta("10gbit"))
    curve = {name: [pn.predict_nodes(work, 2e10, net, k) for k in (1, 2, 4, 8)] for name, net in
             (("slow", slow), ("fast", fast))}  # fmt: skip
    assert all(p.speedup < 1 for p in curve["slow"][1:])  # 100 Mbit/s: adding nodes only slows it down
    speedups = [p.speedup for p in curve["fast"]]
    assert speedups == sorted(speedups) and speedups[-1] > 4
    assert pm.sweet_spot(curve["fast"], 0.75).devices == 4


def test_calibrate_link_recovers_a_link_and_reports_errors():
    sizes = np.array([1e3, 1e5, 1e6, 1e7])
    for k in (2, 4):  # synthetic ring all-reduce times on k nodes of one rank
        times = 2 * (k - 1) * (2e-4 + sizes / k * 8e-9) + (k - 1) / k * sizes * 1e-10
        cal = pn.calibrate_link(sizes, times, nodes=k, gamma=1e-10)
        assert cal.alpha == pytest.approx(2e-4, rel=1e-6) and cal.beta == pytest.approx(8e-9, rel=1e-6)
        assert cal.max_error < 1e-9 and len(cal.errors) == 4
    noisy = times * np.array([1.1, 1.0, 1.0, 0.9])
    cal = pn.calibrate_link(sizes, noisy, nodes=4, gamma=1e-10)
    assert cal.errors == pytest.approx(pn.relative_errors(cal.predicted, noisy))
    assert 0.01 < cal.max_error < 0.2  # the fit cannot follow noise, and says by how much
    assert math.isclose(pn.relative_errors([1.1], [1.0])[0], 0.1)
    with pytest.raises(ValueError, match="2 nodes"):
        pn.calibrate_link(sizes, times, nodes=1)
    with pytest.raises(ValueError):
        pn.relative_errors([1.0], [1.0, 2.0])


@pytest.mark.parametrize("nodes, per_node", [(0, 1), (2, 0), (1.5, 2)])
def test_bad_sizes_raise(nodes, per_node):
    with pytest.raises(ValueError, match="node"):  # names nodes or ranks_per_node
        pn.flat_all_reduce_time(1.0, nodes, per_node, NET)
    with pytest.raises(ValueError, match="node"):
        pn.predict_nodes(pm.Workload(params=1e3, global_batch=8), 1e9, NET, nodes, per_node)
