"""Activation memory of one GPT block per rank, with and without sequence parallelism.

    python benchmarks/sequence_parallel_memory.py                # tp = 1
    mpirun -n 2 python benchmarks/sequence_parallel_memory.py    # tp = 2 (and -n 4)

Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models", §4, eq. 1-3)
count the bytes a transformer layer stores for backward, with 16-bit activations and 1-byte dropout
masks (s sequence, b batch, h width, a heads, t tensor-parallel size):

    no parallelism          s b h (34 + 5 a s / h)
    tensor parallel         s b h (10 + 24 / t + 5 a s / (h t))
    tensor + sequence par.  s b h (34 + 5 a s / h) / t

minidist keeps every activation in the training dtype (float32 here), masks included, so the same
*elements* cost 4 bytes each: the formulas become 4 (18 sbh + 3 a s^2 b), 4 (6 sbh + (12 sbh +
3 a s^2 b) / t) and 4 (18 sbh + 3 a s^2 b) / t (the paper's items: LayerNorm inputs 2 sbh elements,
q k v input, q and k, softmax, its dropout mask and output, v, projection input, dropout mask, MLP
input, GELU input and output 4 sbh each, dropout mask); both columns come from
``minidist_tools.perfmodel.transformer.activation_memory_per_layer``. This script measures, per rank, after
one
forward of a ``ParallelBlock`` (dropout 0.1, float32):

* **saved**: the arrays the ops saved for their backward (the inputs they read back, masks, softmax
  outputs, LayerNorm statistics), each buffer once (views of one array count once), parameters excluded:
  the quantity the paper counts;
* **held**: everything the graph keeps alive, saved or not (a minidist op keeps all its inputs until
  backward, so every intermediate of the block is held).

It prints one row per shape and mode, the largest value over the ranks, for two shapes: one where
attention's a s^2 b term dominates (5 a s / h = 40 > 34) and one where the s b h terms do (5 a s / h = 2.5).
"""

from __future__ import annotations

from typing import Any

import numpy as np

import minidist as md
import minidist.distributed as dist
from minidist.autograd import Tensor
from minidist.models.gpt.transformer import Block
from minidist.parallel.tensor_parallel import ParallelBlock, model_parallel_manual_seed
from minidist.parallel.tensor_parallel.sequence_parallel import split_sequence
from minidist_tools.perfmodel.transformer import activation_memory_per_layer

SHAPES = [(256, 2, 256, 8), (64, 4, 512, 4)]  # (s, b, h, a): sequence, batch, width, heads
DROPOUT = 0.1


def _root(a: Any) -> Any:
    while getattr(a, "base", None) is not None:
        a = a.base
    return a


def graph_bytes(output: Tensor, exclude: set[int]) -> tuple[int, int]:
    """(saved, held) bytes of the autograd graph behind ``output`` (module docstring); ``exclude``:
    ids of root buffers not to count (the parameters)."""
    saved: dict[int, int] = {}
    held: dict[int, int] = {}

    def add(table: dict[int, int], a: Any) -> None:
        root = _root(a)
        if isinstance(root, np.ndarray) and id(root) not in exclude:
            table[id(root)] = root.nbytes

    seen, stack = set(), [output._ctx]
    while stack:
        fn = stack.pop()
        if fn is None or id(fn) in seen:
            continue
        seen.add(id(fn))
        reads = range(len(fn.inputs)) if fn.saved_inputs is None else fn.saved_inputs
        for i, t in enumerate(fn.inputs):
            add(held, t.data)
            if i in reads:
                add(saved, t.data)
            stack.append(t._ctx)
        for name, value in vars(fn).items():  # what forward kept on the op (masks, softmax, statistics)
            for a in value if isinstance(value, (tuple, list)) else (value,):
                if name != "inputs" and isinstance(a, np.ndarray):
                    add(saved, a), add(held, a)
    return sum(saved.values()), sum(held.values())


def formula_bytes(shape: tuple[int, ...], t: int, sequence_parallel: bool) -> float:
    """Korthikanti et al.'s stored items per layer at 4 bytes each, masks included (module docstring)."""
    s, b, h, a = shape
    return activation_memory_per_layer(s, b, h, a, t, sequence_parallel, bytes_per_value=4, mask_bytes=4)


def paper_bytes(shape: tuple[int, ...], t: int, sequence_parallel: bool) -> float:
    """The paper's bytes per layer (16-bit activations, 1-byte masks), its eq. 1-3."""
    s, b, h, a = shape
    return activation_memory_per_layer(s, b, h, a, t, sequence_parallel)


def main() -> None:
    world = dist.init()
    t = world.size
    rows = []
    for shape, sp in [(shape, sp) for shape in SHAPES for sp in ((False, True) if t > 1 else (False,))]:
        S, B, H, A = shape
        md.manual_seed(0)
        model_parallel_manual_seed(0, world)
        block = ParallelBlock(Block(H, A, DROPOUT, True, np.float32), world, sequence_parallel=sp)
        x = np.random.default_rng(0).standard_normal((B, S, H)).astype(np.float32)
        x = md.tensor(np.ascontiguousarray(split_sequence(x, world) if sp else x), requires_grad=True)
        y = block(x)
        params = {id(_root(p.data)) for p in block.parameters()}
        mine = np.array(graph_bytes(y, params), dtype=np.float64)
        saved, held = dist.all_reduce(mine, op="max", group=world)
        rows.append((shape, sp, saved, held, formula_bytes(shape, t, sp), paper_bytes(shape, t, sp)))
    if world.rank == 0:
        print(f"one GPT block, float32, dropout {DROPOUT}, MB per rank (the largest over the ranks)")
        print(
            "| s, b, h, a | tp | sequence parallel | saved | held | formula (float32) | saved / formula |",
            end="",
        )
        print(" paper (16-bit) |\n|---|---:|---|---:|---:|---:|---:|---:|")
        for shape, sp, saved, held, formula, paper in rows:
            mode, mb = "yes" if sp else "no", 1e6
            print(
                f"| {', '.join(map(str, shape))} | {t} | {mode} | {saved / mb:.2f} | {held / mb:.2f} ", end=""
            )
            print(f"| {formula / mb:.2f} | {saved / formula:.2f} | {paper / mb:.2f} |")


if __name__ == "__main__":
    main()
