"""MPI worker: the bytes each rank sends in one step, counted at the collectives, for the formulas of
``minidist_tools.perfmodel.transformer``.

argv: out_dir. Run on 2 ranks; rank 0 writes ``traffic.json`` with, per case, the float bytes one rank
sends in forward and in backward:

* ``tp`` / ``tp_sp``: ``ParallelGPT`` (2 layers) over a tp group of 2, without and with sequence
  parallelism: every ``dist.all_reduce`` / ``reduce_scatter`` / ``all_gather`` of a float buffer, counted
  as a ring sends it (2 (n-1)/n, (n-1)/n of the full buffer, (n-1) chunks). Integer buffers are the
  argument checks (a few numbers), not the model's traffic.
* ``cp``: ``ring_attention`` over a cp group of 2: every point-to-point send of ``RingPass`` (not the
  argument check's all-gather of a few numbers).
"""

import sys

import numpy as np
from dist_worker_utils import run_worker, write_json

import minidist as md
import minidist.distributed as dist
from minidist.models import GPT, GPTConfig, ParallelGPT
from minidist.parallel import ProcessMesh
from minidist.parallel.context_parallel import ring_attention, ring_pass

B, T, C, L, HEADS = 2, 8, 16, 2, 4
sent = {"collectives": {"forward": 0.0, "backward": 0.0}, "sends": {"forward": 0.0, "backward": 0.0}}
phase = "forward"


def count_collective(name):
    original = getattr(dist, name)

    def counted(a, *args, **kwargs):
        group = kwargs.get("group") or dist.init()
        n = group.size
        if a.dtype.kind == "f":
            share = {"all_reduce": 2 * (n - 1) / n, "reduce_scatter": (n - 1) / n, "all_gather": n - 1}[name]
            sent["collectives"][phase] += share * a.nbytes
        return original(a, *args, **kwargs)

    setattr(dist, name, counted)


def count_sends():
    original = ring_pass.isend

    def counted(group, a, *args, **kwargs):
        sent["sends"][phase] += a.nbytes
        return original(group, a, *args, **kwargs)

    ring_pass.isend = counted


def one_step(run_forward, kind):
    """The bytes of ``kind`` ("collectives" or "sends") one forward and backward send."""
    global phase
    for counts in sent.values():
        counts.update(forward=0.0, backward=0.0)
    phase = "forward"
    out = run_forward()
    phase = "backward"
    out.backward()
    return dict(sent[kind])


def main(out_dir: str) -> None:
    world = dist.init()
    for name in ("all_reduce", "reduce_scatter", "all_gather"):
        count_collective(name)
    count_sends()
    result = {}
    ids = np.random.default_rng(0).integers(0, 65, (B, T + 1))
    mesh = ProcessMesh(dp=1, tp=world.size)
    for key, sp in (("tp", False), ("tp_sp", True)):
        md.manual_seed(0)
        gpt = GPT(GPTConfig(vocab_size=65, block_size=T, n_layer=L, n_head=HEADS, n_embd=C, dtype=np.float64))
        model = ParallelGPT.from_gpt(gpt, mesh, sequence_parallel=sp)
        result[key] = one_step(lambda: model.loss(model(ids[:, :-1]), ids[:, 1:]), "collectives")  # noqa: B023
    q, k, v = (md.tensor(np.ones((B, HEADS, T // world.size, C // HEADS)), requires_grad=True) for _ in "qkv")
    # Only the ring's sends: ring_attention's argument check all-gathers a few numbers too.
    result["cp"] = one_step(lambda: ring_attention(q, k, v, group=world).sum(), "sends")
    if world.rank == 0:
        write_json(out_dir, "traffic.json", result)


run_worker(main, sys.argv[1])
