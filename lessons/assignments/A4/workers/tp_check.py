"""MPI worker for A4: tensor-parallel operators and layers on real ranks vs. one device, in plain words.

Config (OUT_DIR/config.json)::

    {"cases": [{"kind": "mappings" | "shard" | "column" | "row" | "column_row", "seed": 0,
                "in": 6, "out": 8, "hidden": 8, "bias": true, "flag": false, "batch": [3]}, ...],
     "groups": [2, 1]}      # optional: split the world into consecutive tensor-parallel groups

``flag`` is ``gather_output`` (column) or ``input_is_parallel`` (row). Every rank computes the
single-device answer itself in NumPy from the weights ``nn.Linear`` draws with the same seed (the
layers must start equal to it), so no extra communication is needed. Everything is float64: the only
difference between the two computations is the order of additions inside the all-reduce (a few ulp),
so rtol 1e-10 is safe, while every mistake below is off by O(1).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import gradelib  # noqa: E402
import rules  # noqa: E402

import minidist as md  # noqa: E402
from minidist import nn  # noqa: E402
from minidist.nn.module import Parameter  # noqa: E402
from minidist.parallel.tensor_parallel import (  # noqa: E402
    ColumnParallelLinear,
    RowParallelLinear,
    copy_to_tensor_parallel_region,
    reduce_from_tensor_parallel_region,
    shard_parameter,
)

# The handout's "Not allowed": MPI's own collectives instead of minidist.distributed.
RULE = rules.Rule(
    files=("minidist.parallel.tensor_parallel.mappings", "minidist.parallel.tensor_parallel.layers"),
    why="the handout asks for the f and g operators built on minidist.distributed, not MPI's own collectives",
)
F64 = np.float64
RTOL, ATOL = 1e-10, 1e-12


def close(a, b) -> bool:
    a = None if a is None else np.asarray(a)
    return a is not None and a.shape == np.shape(b) and np.allclose(a, b, rtol=RTOL, atol=ATOL)


def cols(a: np.ndarray, n: int, r: int, axis: int = -1) -> np.ndarray:
    return np.split(a, n, axis=axis)[r]


def dense(seed: int, fan_in: int, fan_out: int, bias: bool) -> tuple[np.ndarray, np.ndarray | None]:
    """The weight and bias a single-device nn.Linear draws after manual_seed(seed)."""
    md.manual_seed(seed)
    layer = nn.Linear(fan_in, fan_out, bias, dtype=F64)
    return layer.weight.data.copy(), None if layer.bias is None else layer.bias.data.copy()


def data(seed: int, batch: list[int], fan_in: int, fan_out: int) -> tuple[np.ndarray, np.ndarray]:
    """Input x (*batch, in) and the upstream gradient w = dL/dy (*batch, out), the same on every rank."""
    rng = np.random.default_rng([seed, 7])
    return rng.standard_normal((*batch, fan_in)), rng.standard_normal((*batch, fan_out))


def linear_grads(x, w, weight, bias):
    """y = x W^T + b and the gradients of L = sum(y * w) by hand."""
    y = x @ weight.T + (0 if bias is None else bias)
    xs, ws = x.reshape(-1, x.shape[-1]), w.reshape(-1, w.shape[-1])
    return y, w @ weight, ws.T @ xs, None if bias is None else ws.sum(axis=0)


def any_rank(group, failures: list[str]) -> bool:
    """True on every rank if any rank of ``group`` has failed: all ranks then stop at the same point
    (a rank that skipped the next collective while the others entered it would hang them)."""
    return any(group.mpi.allgather(bool(failures)))


def leaf(a: np.ndarray):
    return md.tensor(np.ascontiguousarray(a), dtype=F64, requires_grad=True)


def check_mappings(group, case: dict) -> list[str]:
    n, r = group.size, group.rank
    shape = (*case["batch"], case["in"])
    mine = [np.random.default_rng([case["seed"], q]).standard_normal(shape) for q in range(n)]
    same = np.random.default_rng([case["seed"], 99]).standard_normal(shape)
    where = f"(group of {n} ranks, rank {r}, shape {shape})"
    failures = []

    x = leaf(same)  # f: identity forward, sum of the ranks' gradients backward
    y = copy_to_tensor_parallel_region(x, group)
    if not close(y.data, same):
        failures.append(
            f"f (copy_to_tensor_parallel_region) forward {where}: y must equal x, got "
            f"{gradelib.show(y.data)} instead of {gradelib.show(same)}"
        )
    if not any_rank(group, failures):
        y.backward(mine[r])
        want = np.sum(mine, axis=0)
        if not close(x.grad, want):
            why = ""
            if close(x.grad, mine[r]) and n > 1:
                why = (
                    " It is this rank's own gradient: f's backward must all-reduce (sum) the gradient"
                    " over the group, because every rank used x for a different part of the output."
                )
            elif close(x.grad, want / n) and n > 1:
                why = " It is the average: f's backward must SUM the gradients (op='sum'), not average them."
            failures.append(
                f"f backward {where}: dL/dx is {gradelib.show(x.grad)}, expected the sum over "
                f"ranks {gradelib.show(want)}.{why}"
            )

    if any_rank(group, failures):
        return failures
    x = leaf(mine[r])  # g: sum forward, identity backward
    before = mine[r].copy()
    y = reduce_from_tensor_parallel_region(x, group)
    want = np.sum(mine, axis=0)
    if not np.array_equal(x.data, before) and n > 1:
        failures.append(
            f"g forward {where}: it overwrote its input x in place (all-reduce a copy: x is "
            "this rank's partial result and must stay unchanged)"
        )
    elif not close(y.data, want):
        why = ""
        if close(y.data, mine[r]) and n > 1:
            why = " It is this rank's own input: g's forward must all-reduce (sum) over the group."
        elif close(y.data, want / n) and n > 1:
            why = " It is the average: g must SUM the partial results (op='sum')."
        failures.append(
            f"g (reduce_from_tensor_parallel_region) forward {where}: y is "
            f"{gradelib.show(y.data)}, expected the sum over ranks {gradelib.show(want)}.{why}"
        )
    if not any_rank(group, failures):
        y.backward(same)
        if not close(x.grad, same):
            why = ""
            if close(x.grad, n * same) and n > 1:
                why = (
                    f" It is {n} times too large: g's backward is the identity (dL/dy is already the "
                    "same on every rank); do not all-reduce it."
                )
            failures.append(
                f"g backward {where}: dL/dx is {gradelib.show(x.grad)}, expected dL/dy "
                f"{gradelib.show(same)}.{why}"
            )
    return failures


def check_shard(group, case: dict) -> list[str]:
    n, r = group.size, group.rank
    full_data = np.random.default_rng([case["seed"], 5]).standard_normal((case["out"], case["in"]))
    failures = []
    for tp_dim in (0, 1):
        full = Parameter(full_data.copy())
        where = f"shard_parameter(full of shape {full_data.shape}, tp_dim={tp_dim}) on rank {r} of {n}"
        shard = shard_parameter(full, tp_dim, group)
        want = cols(full_data, n, r, axis=tp_dim)
        if not isinstance(shard, Parameter):
            failures.append(f"{where}: returned a {type(shard).__name__}, expected a Parameter")
        elif not close(shard.data, want):
            strided = np.take(full_data, range(r, full_data.shape[tp_dim], n), axis=tp_dim)
            why = ""
            if close(shard.data, strided) and n > 1:
                why = (
                    " You took every n-th slice (strided); rank r owns the r-th CONTIGUOUS block of "
                    "size/n, as np.split does."
                )
            elif np.shape(shard.data) != want.shape:
                why = f" Its shape is {np.shape(shard.data)}, expected {want.shape}."
            failures.append(
                f"{where}: holds {gradelib.show(shard.data)}, expected block {r} of {n} along "
                f"axis {tp_dim}: {gradelib.show(want)}.{why}"
            )
        elif getattr(shard, "tp_dim", None) != tp_dim or getattr(shard, "tp_group", None) is not group:
            failures.append(
                f"{where}: set shard.tp_dim = {tp_dim} and shard.tp_group = the group (gradient "
                "clipping and checkpoints read them)"
            )
        elif np.shares_memory(shard.data, full.data):
            failures.append(
                f"{where}: the shard is a view of the full weight; copy it (contiguous, and the "
                "full array can be freed)"
            )
        if failures:
            break
    return failures


def check_column(group, case: dict) -> list[str]:
    n, r = group.size, group.rank
    seed, fi, fo, bias, gather = case["seed"], case["in"], case["out"], case["bias"], case["flag"]
    weight, b = dense(seed, fi, fo, bias)
    x_np, w_np = data(seed, case["batch"], fi, fo)
    y_ref, dx_ref, dw_ref, db_ref = linear_grads(x_np, w_np, weight, b)
    md.manual_seed(seed)
    layer = ColumnParallelLinear(fi, fo, bias, group=group, gather_output=gather, dtype=F64)
    where = (
        f"ColumnParallelLinear({fi}, {fo}, bias={bias}, gather_output={gather}) on rank {r} of {n}, "
        f"input {x_np.shape}"
    )
    failures = []
    if not close(layer.weight.data, cols(weight, n, r, axis=0)):
        failures = [
            f"{where}: the weight shard is not rows {r}/{n} of the weight nn.Linear draws with the "
            "same seed (check shard_parameter, task A4.2)"
        ]
    if any_rank(group, failures):
        return failures
    x = leaf(x_np)
    y = layer(x)
    want = y_ref if gather else cols(y_ref, n, r)
    if not close(y.data, want):
        why = ""
        if gather and np.shape(y.data) == cols(y_ref, n, r).shape and n > 1:
            why = " With gather_output=True every rank must return the whole output (all-gather the slices)."
        failures = [
            f"{where}: output {gradelib.show(y.data)} (shape {np.shape(y.data)}), expected "
            f"{'the single-device output' if gather else f'slice {r} of the single-device output'} "
            f"{gradelib.show(want)} (shape {want.shape}).{why}"
        ]
    if any_rank(group, failures):
        return failures
    y.backward(w_np if gather else cols(w_np, n, r))
    if not close(x.grad, dx_ref):
        why = ""
        if close(x.grad, cols(w_np, n, r) @ cols(weight, n, r, axis=0)) and n > 1:
            why = (
                " It is only this rank's part: pass the input through f (copy_to_tensor_parallel_region) "
                "so that backward sums dL/dx over the group."
            )
        return [
            f"{where}: dL/dx is {gradelib.show(x.grad)}, single-device gives {gradelib.show(dx_ref)}.{why}"
        ]
    if not close(layer.weight.grad, cols(dw_ref, n, r, axis=0)):
        return [f"{where}: the weight gradient differs from rows {r}/{n} of the single-device one"]
    if bias and not close(layer.bias.grad, cols(db_ref, n, r)):
        return [f"{where}: the bias gradient differs from slice {r}/{n} of the single-device one"]
    return []


def check_row(group, case: dict) -> list[str]:
    n, r = group.size, group.rank
    seed, fi, fo, bias, parallel = case["seed"], case["in"], case["out"], case["bias"], case["flag"]
    weight, b = dense(seed, fi, fo, bias)
    x_np, w_np = data(seed, case["batch"], fi, fo)
    y_ref, dx_ref, dw_ref, db_ref = linear_grads(x_np, w_np, weight, b)
    md.manual_seed(seed)
    layer = RowParallelLinear(fi, fo, bias, group=group, input_is_parallel=parallel, dtype=F64)
    where = (
        f"RowParallelLinear({fi}, {fo}, bias={bias}, input_is_parallel={parallel}) on rank {r} of {n}, "
        f"input {x_np.shape}"
    )
    failures = []
    if not close(layer.weight.data, cols(weight, n, r, axis=1)):
        failures = [
            f"{where}: the weight shard is not columns {r}/{n} of the weight nn.Linear draws with "
            "the same seed (check shard_parameter, task A4.2)"
        ]
    if any_rank(group, failures):
        return failures
    x = leaf(cols(x_np, n, r) if parallel else x_np)
    y = layer(x)
    if not close(y.data, y_ref):
        why = ""
        partial = cols(x_np, n, r) @ cols(weight, n, r, axis=1).T
        if bias and n > 1 and close(y.data, y_ref + (n - 1) * b):
            why = (
                f" The bias was added {n} times: on every rank BEFORE the all-reduce. The bias is "
                "replicated; add it once, AFTER g (reduce_from_tensor_parallel_region)."
            )
        elif n > 1 and (close(y.data, partial) or close(y.data, partial + (0 if b is None else b))):
            why = (
                " It is this rank's partial product x_r W_r^T: sum the partials over the group with g "
                "(reduce_from_tensor_parallel_region)."
            )
        failures = [
            f"{where}: output {gradelib.show(y.data)}, single-device nn.Linear gives "
            f"{gradelib.show(y_ref)}.{why}"
        ]
    if any_rank(group, failures):
        return failures
    y.backward(w_np)
    want_dx = cols(dx_ref, n, r) if parallel else dx_ref
    if not close(x.grad, want_dx):
        return [f"{where}: dL/dx is {gradelib.show(x.grad)}, expected {gradelib.show(want_dx)}"]
    if not close(layer.weight.grad, cols(dw_ref, n, r, axis=1)):
        return [f"{where}: the weight gradient differs from columns {r}/{n} of the single-device one"]
    if bias and not close(layer.bias.grad, db_ref):
        why = f" It is {n} times too large." if close(layer.bias.grad, n * db_ref) and n > 1 else ""
        return [
            f"{where}: the bias gradient is {gradelib.show(layer.bias.grad)}, expected "
            f"{gradelib.show(db_ref)} (the whole bias, on every rank).{why}"
        ]
    return []


def check_column_row(group, case: dict) -> list[str]:
    """Megatron's MLP without the activation: column (no gather) feeding row (parallel input)."""
    n, r = group.size, group.rank
    seed, fi, h, fo, bias = case["seed"], case["in"], case["hidden"], case["out"], case["bias"]
    w1, b1 = dense(seed, fi, h, bias)
    w2, b2 = dense(seed + 1, h, fo, bias)
    x_np, w_np = data(seed, case["batch"], fi, fo)
    hid = x_np @ w1.T + (0 if b1 is None else b1)
    y_ref, dh, _, _ = linear_grads(hid, w_np, w2, b2)
    dx_ref = dh @ w1
    md.manual_seed(seed)
    first = ColumnParallelLinear(fi, h, bias, group=group, dtype=F64)
    md.manual_seed(seed + 1)
    second = RowParallelLinear(h, fo, bias, group=group, dtype=F64)
    x = leaf(x_np)
    y = second(first(x))
    where = f"ColumnParallelLinear({fi}, {h}) -> RowParallelLinear({h}, {fo}), bias={bias}, rank {r} of {n}"
    failures = []
    if not close(y.data, y_ref):
        failures = [
            f"{where}: output {gradelib.show(y.data)}, the two dense layers give {gradelib.show(y_ref)}"
        ]
    if any_rank(group, failures):
        return failures
    y.backward(w_np)
    if not close(x.grad, dx_ref):
        return [
            f"{where}: dL/dx is {gradelib.show(x.grad)}, the two dense layers give {gradelib.show(dx_ref)}"
        ]
    return []


CHECKS = {
    "mappings": check_mappings,
    "shard": check_shard,
    "column": check_column,
    "row": check_row,
    "column_row": check_column_row,
}


def body(world, config: dict) -> list[str]:
    group = world
    sizes = config.get("groups")
    if sizes:
        starts = np.cumsum([0, *sizes])
        color = int(np.searchsorted(starts, world.rank, side="right") - 1)
        group = world.split(color=color, key=world.rank)
    failures: list[str] = []
    for case in config["cases"]:
        failures += CHECKS[case["kind"]](group, case)
    return failures


if __name__ == "__main__":
    gradelib.worker_main(body, RULE)
