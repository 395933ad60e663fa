"""Communication of one training step of the parallel GPT: bytes per group and kind, measured against
the formulas.

    mpiexec -n 8 python benchmarks/gpt_comm.py --dp 2 --tp 2 --pp 2
    mpiexec -n 8 python benchmarks/gpt_comm.py --dp 2 --tp 2 --cp 2 --sequence-parallel
    mpiexec -n 4 python benchmarks/gpt_comm.py --tp 4
    mpiexec -n 4 python benchmarks/gpt_comm.py --cp 4

(``python benchmarks/gpt.py --comm ...`` runs this script too.) It trains ``ParallelGPT`` on the bundled
Shakespeare as examples/train_gpt.py's model (width 128, 4 layers, 4 heads, context 64, vocabulary 65,
global batch 32, float32, dropout 0) for one warm-up step, then traces one more step with
``trace.enable(messages=True)``: every collective call and point-to-point send records a span with its
group's name and the bytes this rank sent (counted per message where it leaves, so what the algorithm
``"auto"`` chose really sent). The step is the composed one: forward, the vocabulary-parallel loss,
backward, the gradients combined (DDP over ``mesh.dp_cp_group``, or the pipeline's own dp combine),
the sequence-parallel gradients summed over tp, the tied copies summed, the gradient norm clipped (with
``--max-norm``), AdamW. The vocabulary is ``--vocab-size`` 65 (GPTConfig's default; the bundled text's
ids are below it, its tokenizer has 63 symbols).

Each rank adds up its spans per (group, kind, part) and compares them with the formula for its place
in the mesh, from ``minidist_tools.perfmodel.transformer`` (which counts ring algorithms: an all-reduce of N
bytes over n ranks sends ``2 (n-1)/n N`` per rank). Rank 0 prints one row per (group, kind, part): how
many ranks have it, calls, bytes measured, formula, their ratio (ranges where ranks differ) and the
algorithms run. Messages in another dtype than the model's (int64 id-range and batch-size checks,
pipeline shape headers, float64 gradient norms and losses) are "bookkeeping", listed apart without a
formula. ``--json PATH`` writes every rank's rows (tests/benchmarks/test_gpt_comm.py checks measured ==
formula).
"""

from __future__ import annotations

import argparse
import json
import os
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

import minidist as md
import minidist.distributed as dist
from minidist import optim, trace
from minidist.data import CharTokenizer, RandomWindows, load_shakespeare
from minidist.models import GPTConfig, ParallelGPT
from minidist.parallel import DistributedDataParallel, PipelineParallel, ProcessMesh, clip_grad_norm_
from minidist.parallel.context_parallel import split_for_context_parallel
from minidist.parallel.tensor_parallel import ParallelBlock, allreduce_sequence_parallel_grads
from minidist_tools.perfmodel import transformer as pm

PHASE = "phase"  # the trace category of this script's own spans (the parts of a step it tells apart)
LOSS, SP_GRADS, CLIP = "loss", "sequence-parallel grads", "clip"
# The part a row's traffic belongs to, when no phase span of this script contains it: by group.
PART = {"tp": "layers + embedding + head", "cp": "ring attention K/V", "pp": "stage boundaries",
        "dp_cp": "gradients", "tied": "tied wte gradient"}  # fmt: skip

parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
for axis in ("dp", "tp", "pp", "cp"):
    parser.add_argument(f"--{axis}", type=int, default=1, help=f"{axis} size (dp*tp*pp*cp = ranks)")
parser.add_argument("--sequence-parallel", action="store_true")
parser.add_argument("--microbatches", type=int, default=4, help="pipeline microbatches (pp > 1)")
parser.add_argument("--schedule", default="1f1b", help="pipeline schedule (pp > 1)")
parser.add_argument("--batch-size", type=int, default=32, help="global batch B (windows per step)")
for size, default in (("block-size", 64), ("n-layer", 4), ("n-head", 4), ("n-embd", 128)):
    parser.add_argument(f"--{size}", type=int, default=default)
parser.add_argument("--vocab-size", type=int, default=65, help="V (at least the text's 63 symbols)")
parser.add_argument("--seed", type=int, default=1337)
parser.add_argument("--max-norm", type=float, default=0.0, help="clip the gradient norm (0: do not)")
parser.add_argument("--json", type=Path, default=None, help="write every rank's rows to this file")


class Step:
    """One composed training step of ParallelGPT on ``mesh`` (module docstring); ``run(x, y)`` takes
    this dp rank's rows of the global batch (B / dp, T) and cuts this cp rank's tokens itself."""

    def __init__(self, args: argparse.Namespace, mesh: ProcessMesh, config: GPTConfig) -> None:
        self.mesh, self.max_norm = mesh, args.max_norm
        self.model = ParallelGPT(config, mesh, sequence_parallel=args.sequence_parallel)
        if mesh.pp > 1:
            self.pipe = PipelineParallel(
                self.model.pipeline_layers(), mesh.pp_group, microbatches=args.microbatches,
                schedule=args.schedule, dp_group=mesh.dp_cp_group,
            )  # fmt: skip
            self.params = list(self.pipe.parameters())
            stage = list(self.pipe.stage_module.modules())
        else:
            # cp ranks hold the same weights: gradients are averaged over dp x cp
            wrap = mesh.dp * mesh.cp > 1
            self.ddp = DistributedDataParallel(self.model, group=mesh.dp_cp_group) if wrap else self.model
            self.params = list(self.model.parameters())
            stage = list(self.model.modules())
        self.layers = sum(isinstance(m, ParallelBlock) for m in stage)  # blocks on this rank's stage
        self.optimizer = optim.AdamW(self.params, lr=1e-3)

    def loss(self, logits: md.Tensor, targets: np.ndarray) -> md.Tensor:
        with trace.span(LOSS, PHASE):
            return self.model.loss(logits, targets)

    def run(self, x: np.ndarray, y: np.ndarray) -> None:
        mesh = self.mesh
        x, y = (split_for_context_parallel(a, mesh.cp, mesh.cp_rank) for a in (x, y))
        if mesh.pp > 1:
            self.pipe.train_step(x, y, self.loss)
        else:
            self.loss(self.ddp(x), y).backward()
        with trace.span(SP_GRADS, PHASE):
            allreduce_sequence_parallel_grads(self.params, mesh.tp_group)
        if self.max_norm > 0:
            with trace.span(CLIP, PHASE):
                clip_grad_norm_(self.params, self.max_norm, pp_group=mesh.pp_group if mesh.pp > 1 else None)
        self.optimizer.step()
        self.optimizer.zero_grad()


def measured(events: list[dict], dtype: str) -> tuple[dict, dict]:
    """This rank's traced bytes: ``{(group, kind, part): [calls, bytes, algorithms, group size]}`` for
    the messages in the model's ``dtype``, and the same keyed ``(group, kind, dtype)`` for the others
    (bookkeeping). A call belongs to the part of the step whose ``PHASE`` span (same thread) holds it."""
    phases = [e for e in events if e["cat"] == PHASE]
    rows: dict = defaultdict(lambda: [0, 0, set(), 0])
    other: dict = defaultdict(lambda: [0, 0, set(), 0])
    for e in events:
        a = e.get("args", {})
        if e["cat"] not in (trace.COLLECTIVE, trace.MESSAGE) or not a["bytes"]:  # a group of one sends none
            continue
        kind = e["name"] if e["cat"] == trace.COLLECTIVE else "send/recv"
        inside = [p["name"] for p in phases if p["tid"] == e["tid"] and p["start"] <= e["start"] <= p["end"]]
        part = inside[0] if inside else PART.get(a["group"], "")
        row = rows[(a["group"], kind, part)] if a["dtype"] == dtype else other[(a["group"], kind, a["dtype"])]
        row[0] += 1
        row[1] += a["bytes"]
        row[2].add(a.get("algorithm") or e["name"])
        row[3] = a.get("ranks", 2)
    return rows, other


def as_run(ring: float, algorithms: set[str], n: int) -> float | None:
    """The ring formula ``ring`` turned into the bytes of the algorithm that ran: recursive doubling
    sends ``log2 n`` whole arrays where the ring sends ``2 (n-1)/n`` of one; the other algorithms of
    these rows send what the ring does (Rabenseifner, recursive halving: for n a power of two). None
    for a row that mixes recursive doubling with another algorithm."""
    if algorithms == {"recursive_doubling"}:
        return ring * pm.recursive_doubling_bytes(1, n) / pm.all_reduce_bytes(1, n)
    return None if "recursive_doubling" in algorithms else ring


def formula(step: Step, args: argparse.Namespace, config: GPTConfig) -> dict[tuple[str, str, str], float]:
    """Bytes this rank should send per (group, kind, part), from perfmodel_transformer (ring algorithms).

    b = B / dp rows, s = T / cp tokens of them on this rank, h = width, L_here = the blocks on this
    rank's stage; the stage holds the embedding if it is the first, the head and the loss if the last.
    """
    mesh, e = step.mesh, np.dtype(config.dtype).itemsize
    b, s, h, tp, sp = (
        args.batch_size // mesh.dp,
        args.block_size // mesh.cp,
        config.n_embd,
        mesh.tp,
        args.sequence_parallel,
    )
    first, last = mesh.pp_rank == 0, mesh.pp_rank == mesh.pp - 1
    out: dict[tuple[str, str, str], float] = {}
    if tp > 1:
        layer = pm.tensor_parallel_bytes_per_layer(b, s, h, tp, sp, e, regather=False).total
        embedding, head = pm.vocabulary_ends_bytes(b, s, h, tp, sp, e)
        total = step.layers * layer + first * embedding.total + last * head.total
        if sp:  # every all-gather has its reduce-scatter (the same g, forward and backward): half each,
            # and backward all-gathers the column layers' inputs again (regather): all-gathers only
            again = pm.tensor_parallel_bytes_per_layer(b, s, h, tp, sp, e).total - layer
            out[("tp", "all_gather", PART["tp"])] = total / 2 + step.layers * again
            out[("tp", "reduce_scatter", PART["tp"])] = total / 2
            values = sum(p.size for p in step.params if p.sequence_parallel)
            out[("tp", "all_reduce", SP_GRADS)] = pm.sequence_parallel_grad_bytes(values, tp, e).total
        else:
            out[("tp", "all_reduce", PART["tp"])] = total
        if last:
            out[("tp", "all_reduce", LOSS)] = pm.vocab_parallel_loss_bytes(b, s, tp, e).total
    if mesh.cp > 1:
        ring = pm.context_parallel_bytes_per_layer(b, args.block_size, h, mesh.cp, tp, e).total
        out[("cp", "send/recv", PART["cp"])] = step.layers * ring
    if mesh.pp > 1:  # a stage sends activations forward (unless last), gradients backward (unless first)
        boundary = pm.pipeline_bytes_per_boundary(b, s, h, tp, sp, e)
        out[("pp", "send/recv", PART["pp"])] = (not last) * boundary.forward + (not first) * boundary.backward
        if config.tie_weights and (first or last):
            rows = step.model.wte.weight.shape[0]  # this tp rank's vocabulary rows
            out[("tied", "all_reduce", PART["tied"])] = pm.tied_embedding_bytes(rows, h, e).total
    if mesh.dp * mesh.cp > 1:
        grad_bytes = sum(p.data.nbytes for p in step.params)
        out[("dp_cp", "all_reduce", PART["dp_cp"])] = pm.data_parallel_bytes(
            grad_bytes, mesh.dp * mesh.cp
        ).total
    return out


def span_of(values: list[float], fmt: str = "{:,.0f}") -> str:
    """``"v"`` if all ranks agree (as printed), else ``"low-high"``."""
    low, high = fmt.format(min(values)), fmt.format(max(values))
    return low if low == high else f"{low}-{high}"


def table(ranks: list[dict], section: str, columns: list[tuple[str, int, Any]]) -> None:
    """Print one row per key of ``section`` over the ranks that have it; ``columns``: (title, width,
    function of those ranks' rows -> cell)."""
    print("  ".join(f"{title:<{width}}" for title, width, _ in columns).rstrip())
    for key in sorted({tuple(row["key"]) for rank in ranks for row in rank[section]}):
        mine = [row for rank in ranks for row in rank[section] if tuple(row["key"]) == key]
        cells = [*key, *(cell(mine) for _, _, cell in columns[3:])]
        print("  ".join(f"{c:<{width}}" for c, (_, width, _) in zip(cells, columns)).rstrip())


def report(ranks: list[dict], args: argparse.Namespace, config: GPTConfig) -> None:
    """Rank 0's tables: one row per (group, kind, part) over the ranks that have it (module docstring)."""
    layout = ", ".join(f"{a}={getattr(args, a)}" for a in ("dp", "tp", "pp", "cp"))
    pipeline = f"; {args.schedule}, {args.microbatches} microbatches" if args.pp > 1 else ""
    print(
        f"ParallelGPT, one training step on {len(ranks)} ranks: {layout}, sequence parallel "
        f"{'on' if args.sequence_parallel else 'off'}{pipeline}; {config.n_layer} layers x {config.n_head} "
        f"heads x {config.n_embd} wide, vocabulary {config.vocab_size}, block {args.block_size}, global "
        f"batch {args.batch_size}, {np.dtype(config.dtype).name}; load average {os.getloadavg()[0]:.1f}"
    )
    print(
        "bytes one rank sent in the step, measured from the trace, against perfmodel_transformer's formulas"
    )

    def formula(rows: list[dict], field: str) -> str:
        return "-" if any(row[field] is None for row in rows) else span_of([row[field] for row in rows])

    def ratio(rows: list[dict]) -> str:
        if any(not row["as_run"] for row in rows):
            return "-"
        return span_of([row["bytes"] / row["as_run"] for row in rows], "{:.4f}")

    def calls(rows: list[dict]) -> str:
        return span_of([row["calls"] for row in rows])

    first = [("group", 6, None), ("kind", 14, None), ("part", 25, None),
             ("ranks", 5, lambda rows: str(len(rows))), ("calls", 5, calls)]  # fmt: skip
    table(ranks, "rows", first + [
        ("measured B", 19, lambda rows: span_of([r["bytes"] for r in rows])),
        ("ring formula B", 19, lambda rows: formula(rows, "ring")),
        ("algorithm", 18, lambda rows: ", ".join(sorted({a for r in rows for a in r["algorithms"]}))),
        ("formula as run B", 19, lambda rows: formula(rows, "as_run")),
        ("measured/as run", 0, ratio),
    ])  # fmt: skip
    print("bookkeeping (other dtypes: id and target checks, batch sizes, shape headers, norms, losses)")
    table(ranks, "other", first[:2] + [("dtype", 25, None)] + first[3:] + [
        ("measured B", 19, lambda rows: span_of([r["bytes"] for r in rows]))
    ])  # fmt: skip
    totals = [sum(row["bytes"] for row in rank["rows"]) for rank in ranks]
    expected = [sum(row["as_run"] or 0 for row in rank["rows"]) for rank in ranks]
    extra = [sum(row["bytes"] for row in rank["other"]) for rank in ranks]
    print(f"per rank: {span_of(totals)} B measured, {span_of(expected)} B by the formulas as run, "
          f"{span_of(extra)} B bookkeeping")  # fmt: skip


def main(argv: list[str] | None = None) -> list[dict] | None:
    """Run the traced step on every rank; rank 0 prints the tables. Returns every rank's rows on rank 0."""
    args = parser.parse_args(argv)
    world = dist.init()
    mesh = ProcessMesh(args.dp, args.tp, args.pp, args.cp)
    text = load_shakespeare()
    tokenizer = CharTokenizer(text)
    config = GPTConfig(
        vocab_size=max(args.vocab_size, tokenizer.vocab_size), block_size=args.block_size,
        n_layer=args.n_layer, n_head=args.n_head, n_embd=args.n_embd, dropout=0.0,
    )  # fmt: skip
    md.manual_seed(args.seed)
    step = Step(args, mesh, config)
    windows = RandomWindows(tokenizer.encode(text), args.block_size, args.batch_size, seed=args.seed,
                            rank=mesh.dp_rank, world_size=mesh.dp)  # fmt: skip
    step.run(*windows.next())  # warm-up: first allocations, DDP's buckets, the pipeline's shapes
    world.barrier()
    trace.enable(messages=True)
    step.run(*windows.next())
    trace.disable()
    rows, other = measured(trace.events(), np.dtype(config.dtype).name)
    expected = formula(step, args, config)
    mine = {"rank": world.rank, "rows": [], "other": []}
    for key in sorted(rows.keys() | {key for key, value in expected.items() if value}):
        calls, nbytes, algorithms, n = rows.get(key, (0, 0, set(), 0))
        ring = expected.get(key)
        mine["rows"].append({"key": list(key), "calls": calls, "bytes": nbytes, "ring": ring,
                             "as_run": as_run(ring, algorithms, n) if ring else ring,
                             "algorithms": sorted(algorithms)})  # fmt: skip
    for key, (calls, nbytes, algorithms, _) in other.items():
        mine["other"].append(
            {"key": list(key), "calls": calls, "bytes": nbytes, "algorithms": sorted(algorithms)}
        )
    ranks = world.mpi.gather(mine, root=0)
    if world.rank != 0:
        return None
    report(ranks, args, config)
    if args.json is not None:
        args.json.write_text(json.dumps(ranks, indent=1))
    return ranks


if __name__ == "__main__":
    main()
