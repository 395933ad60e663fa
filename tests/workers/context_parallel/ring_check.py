"""MPI worker (cp ranks): ring attention's outputs, gradients and finite differences, and its errors.

argv: out_dir cases.json. Each case (drawn by hypothesis in
tests/parallel/context_parallel/test_context_parallel.py) is a dict with B, H, chunk (tokens per chunk), hs,
hs_v, layout, causal, scale (None: the default), seed, fd (whether to take finite differences) and stand_in
(run on the CuPy stand-in, tests/helpers/cupy_stand_in.py). Every rank draws the same full Q, K, V (B, H, T,
hs) and output weights W from the seed, takes its tokens with split_for_context_parallel, runs ring attention
and backward of the loss

    J = sum over ranks of <W_r, O_r>   (= <W, O> of the whole sequence)

Rank 0 writes case{i}.npz: the full q, k, v, w and the gathered out, dq, dk, dv (the test compares them
with scaled_dot_product_attention of the whole sequence), and with fd the gathered central differences
of J: each rank in turn perturbs its own entries of q, k, v, every rank runs the forward (collective),
and J is all-reduced. Then errors.json per rank: [exception class, message] of each misuse case.
"""

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parents[1]))  # tests/workers: the shared worker modules
from cross_rank_fd import numeric_gradient  # noqa: E402

import minidist as md  # noqa: E402
import minidist.distributed as dist  # noqa: E402
from minidist.parallel.context_parallel import (  # noqa: E402
    all_gather_from_context_parallel,
    ring_attention,
    split_for_context_parallel,
)

out_dir, cases = Path(sys.argv[1]), json.loads(Path(sys.argv[2]).read_text())
world = dist.init()
cp, rank = world.size, world.rank
EPS = 1e-6


def device_array(a: np.ndarray):
    return md.backend.xp().asarray(a)


def attend(q, k, v, case: dict):
    causal, scale, layout = case["causal"], case["scale"], case["layout"]
    return ring_attention(q, k, v, world, is_causal=causal, scale=scale, layout=layout)


def objective(pieces: list[np.ndarray], w: np.ndarray, case: dict) -> float:
    with md.no_grad():
        o = attend(*(md.tensor(device_array(p)) for p in pieces), case)
        local = float((md.backend.to_numpy(o.data) * w).sum())
    return float(dist.all_reduce(np.array([local]), group=world)[0])


def run_case(i: int, case: dict) -> None:
    pieces_per_rank = 2 * cp if case["layout"] == "balanced" else cp
    seq_len = case["chunk"] * pieces_per_rank
    rng = np.random.default_rng(case["seed"])
    lead = (case["B"], case["H"], seq_len)
    full = {name: rng.standard_normal(lead + (case["hs"],)) for name in "qk"}
    full.update({name: rng.standard_normal(lead + (case["hs_v"],)) for name in "vw"})

    def mine(a):
        return split_for_context_parallel(a, cp, rank, axis=2, layout=case["layout"])

    local = [mine(full[name]) for name in "qkv"]
    w = mine(full["w"])
    q, k, v = (md.tensor(device_array(p), requires_grad=True) for p in local)
    o = attend(q, k, v, case)
    assert type(o.data) is type(q.data), "the output left the device"  # noqa: E721
    (o * md.tensor(device_array(w))).sum().backward()

    def gather(a):
        return all_gather_from_context_parallel(md.backend.to_numpy(a), world, axis=2, layout=case["layout"])

    result = {**full, "out": gather(o.data), "dq": gather(q.grad), "dk": gather(k.grad), "dv": gather(v.grad)}
    if case["fd"]:
        for j, name in enumerate("qkv"):

            def with_moved(entry, j=j):  # q, k, v with input j replaced by its moved copy
                return objective([entry if t == j else p.copy() for t, p in enumerate(local)], w, case)

            # every rank runs every forward; only the owner moves its entry
            owners = [(owner, local[j].shape) for owner in range(cp)]
            numeric = numeric_gradient(local[j], with_moved, rank, owners, EPS)
            result[f"fd_d{name}"] = gather(numeric)
    if rank == 0:
        np.savez(out_dir / f"case{i}.npz", **result)


for i, case in enumerate(cases):
    if case.get("stand_in"):
        sys.path.insert(
            0, str(Path(__file__).resolve().parents[2] / "helpers")
        )  # tests/helpers/: cupy_stand_in
        import pytest
        from cupy_stand_in import install

        patch = pytest.MonkeyPatch()
        install(patch)
        run_case(i, case)
        patch.undo()
    else:
        run_case(i, case)


# --- misuse: every rank must raise the same error (no rank left waiting in the ring) -------------------
def tensors(length: int, dtype=np.float64, hs: int = 2):
    return [md.tensor(np.ones((1, 2, length, hs), dtype=dtype)) for _ in range(3)]


MISUSE = {
    # rank 1 holds 4 tokens, the others 2: the K/V blocks would not fit
    "t_local_differs": lambda: ring_attention(*tensors(4 if rank == 1 else 2), world),
    "odd_balanced": lambda: ring_attention(*tensors(3), world),
    "odd_on_rank_0_only": lambda: ring_attention(*tensors(3 if rank == 0 else 2), world),
    "dropout": lambda: ring_attention(*tensors(2), world, dropout_p=0.1),
    "dtype_differs": lambda: ring_attention(*tensors(2, np.float32 if rank == 0 else np.float64), world),
    "layout_differs": lambda: ring_attention(*tensors(2), world, layout="contiguous" if rank else "balanced"),
    "causal_differs": lambda: ring_attention(*tensors(2), world, is_causal=rank == 0),
    "not_4d": lambda: ring_attention(*[md.tensor(np.ones((2, 4))) for _ in range(3)], world),
}
errors = {}
for name, call in MISUSE.items():
    try:
        call()
        errors[name] = None
    except Exception as error:  # noqa: BLE001  (the test checks the class)
        errors[name] = [type(error).__name__, str(error)]
errors["after"] = float(ring_attention(*tensors(2), world).numpy().sum())  # the group still works
(out_dir / f"errors{rank}.json").write_text(json.dumps(errors))
