"""Checks of lesson 09 (putting it together): a rank's place in the 3D mesh, and the data-parallel
speedup. Both compare with minidist's own functions (``parallel.mesh``, ``perfmodel``)."""

from __future__ import annotations

from collections.abc import Callable

from minidist_course.notebook.checks.harness import call, close, exercise, holds, same


@exercise(
    "Which coordinate changes between rank 0 and rank 1? And between rank 0 and the first rank of the "
    "second pipeline stage?",
    "One step in tp moves one rank; one step in dp moves as many ranks as a tp group has; one step in pp "
    "moves as many ranks as a whole pipeline stage has.",
)
def mesh_rank(fn: Callable[[int, int, int, int, int], int]) -> None:
    """mesh_rank(dp_rank, tp_rank, pp_rank, dp, tp) is the rank minidist.parallel.mesh gives every
    coordinate of five meshes."""
    from minidist.parallel.mesh import mesh_rank as reference

    for dp, tp, pp in [(2, 2, 2), (3, 2, 1), (1, 4, 2), (2, 1, 3), (4, 8, 2)]:
        for d in range(dp):
            for t in range(tp):
                for s in range(pp):
                    got, want = call(fn, d, t, s, dp, tp), reference(d, t, s, dp, tp)
                    context = f"mesh_rank(dp_rank={d}, tp_rank={t}, pp_rank={s}, dp={dp}, tp={tp})"
                    holds(
                        0 <= got < dp * tp * pp, context, got, f"this mesh has ranks 0 to {dp * tp * pp - 1}"
                    )
                    same(got, want, context, "another coordinate of this mesh has that rank")


@exercise(
    "How long does the step take on one GPU, and which two things take time on each of G GPUs?",
    "On G GPUs each computes a G-th of the FLOPs, then waits for the ring all-reduce of the gradients "
    "(your ring_time of lesson 03); the speedup is a ratio of two step times.",
)
def dp_speedup(fn: Callable[..., float]) -> None:
    """dp_speedup(...) is minidist_tools.perfmodel.step's data-parallel speedup of a 1.3 B-parameter model on
    1 to
    1,024 GPUs."""
    from minidist_tools.perfmodel import step as perfmodel

    hw = perfmodel.Hardware(flops=1e14, alpha=5e-6, beta=1 / 25e9)
    work = perfmodel.Workload(params=1.3e9, global_batch=1024, tokens_per_sample=2048, bytes_per_value=2)
    for gpus in (1, 8, 256, 1024):
        want = perfmodel.predict(work, hw, dp=gpus).speedup
        args = (work.flops_per_step, gpus, work.params * work.bytes_per_value, hw.flops, hw.alpha, hw.beta)
        context = (
            "dp_speedup(flops_per_step={:g}, gpus={}, grad_bytes={:g}, flops={:g}, alpha={:g}, beta={:g})"
        )
        close(call(fn, *args), want, context.format(*args), rtol=1e-6)
