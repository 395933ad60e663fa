"""Checks of lesson 12 (the network as the bottleneck): the bytes an all-reduce puts on each node's link,
flat and hierarchical, and the values PowerSGD all-reduces for a model. Both compare with
``minidist_tools.perfmodel.network``; ``tests/course/test_lessons.py`` also compares the reference answers
with the
bytes minidist's all-reduces and PowerSGD hook really send, and with a cluster's link counters."""

from __future__ import annotations

from collections.abc import Callable

from minidist_course.notebook.checks.harness import call, close, exercise, holds


@exercise(
    "In a ring over all the ranks, how many of the ring's edges leave one node, and how much travels "
    "over one edge in a whole all-reduce? And in the hierarchical one, who talks across nodes?",
    "Count per node, not per rank: ranks sit in blocks, so one neighbour pair per node straddles the "
    "link. Each edge carries what one rank sends in a ring all-reduce over the ranks that take part "
    "(lesson 03); in the hierarchical all-reduce only the node leaders form that ring.",
)
def inter_node_bytes(fn: Callable[[float, int, int, str], float]) -> None:
    """inter_node_bytes(nbytes, nodes, ranks_per_node, algorithm) is what minidist_tools.perfmodel.network
    says a
    ring over all ranks and the hierarchical all-reduce send out of each node, 1 to 64 nodes of 1 to 8."""
    from minidist_tools.perfmodel.network import inter_node_bytes as reference

    cases = [(8 * 2**20, 2, 2), (8 * 2**20, 2, 8), (1e6, 4, 2), (1e6, 1, 4), (3e5, 3, 1), (4e9, 64, 8)]
    for nbytes, nodes, per_node in cases:
        for algorithm in ("ring", "hierarchical"):
            want = reference(nbytes, nodes, per_node, algorithm)
            got = call(fn, nbytes, nodes, per_node, algorithm)
            context = f"inter_node_bytes({nbytes:g}, nodes={nodes}, ranks_per_node={per_node}, {algorithm!r})"
            if nodes == 1:
                holds(got == 0, context, got, "on one node no byte leaves the node", want)
            close(got, want, context, rtol=1e-9)


@exercise(
    "Which two matrices replace an m x n gradient, and which tensors of a model are not worth compressing?",
    "Add up, tensor by tensor: a matrix whose two thin factors are not at least min_compression_rate "
    "times smaller than itself goes whole, and so does every bias vector; the others send both factors.",
)
def powersgd_values(fn: Callable[[list[tuple[int, ...]], int, float], int]) -> None:
    """powersgd_values(shapes, rank, min_compression_rate) counts the values minidist_tools.perfmodel.network
    says PowerSGD all-reduces per step, for six models at four ranks and rates."""
    from minidist_tools.perfmodel.network import powersgd_values as reference

    models = [
        [(512, 512), (512,), (10, 512), (10,)],
        [(1024, 1024), (1024,), (1024, 1024), (1024,)],
        [(64, 8), (64,), (8, 64)],
        [(4, 4), (4,)],
        [(256, 3, 3, 3), (256,)],
        [(50257, 768), (768, 3072), (3072,)],
    ]
    for shapes in models:
        for rank, rate in [(1, 2), (4, 2), (32, 2), (4, 1)]:
            want = reference(shapes, rank, rate)
            got = call(fn, shapes, rank, rate)
            close(got, want, f"powersgd_values({shapes}, rank={rank}, min_compression_rate={rate})", rtol=0)
