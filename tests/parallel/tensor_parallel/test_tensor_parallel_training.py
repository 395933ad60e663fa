"""Training under tensor parallelism (and dp x tp) equals one process (docs/design.md, property 3).

The worker trains ``minidist.models.MLP`` (column, row, column, row, replicated Linear) for a few
SGD steps on a dp x tp mesh, DDP over the dp group, optionally with ``clip_grad_norm_``; the test
trains the dense MLP from the same seed in this process and compares losses, clip norms and the
parameters rebuilt from the shards. It also checks what keeps the replicas consistent: replicated
parameters and their gradients are bit-identical on every rank. The tp=2 run also trains a model
with dropout on sharded activations (a different mask per tp rank, from the RNG tracker) and on
replicated ones (the same mask everywhere, from the default generator), and compares it with a
dense model using the masks the math says it must: the concatenation of the ranks' masks.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import tp_common  # noqa: E402
from mpi_utils import run_mpi  # noqa: E402

import minidist as md  # noqa: E402
from minidist import nn, optim  # noqa: E402
from minidist.models import MLP  # noqa: E402
from minidist.nn.utils import clip_grad_norm_  # noqa: E402
from minidist.parallel.tensor_parallel.random import TP_SEED_OFFSET  # noqa: E402

SEED, STEPS, BATCH = 3, 4, 16
# float64; tp and dp change only the order of sums (a row-parallel matmul adds tp partial products, DDP
# adds dp partial gradients), a few ulps per step. After 4 steps of a small model 1e-9 is a wide margin
# that still catches a wrong shard, a missing reduction or a norm counted twice by many orders.
TOL = dict(rtol=1e-9, atol=1e-11)
RUNS = {  # name: (dp, tp, worker flags)
    "tp2": (1, 2, ("--clip", "0.25", "--dropout", "0.3")),
    "tp4": (1, 4, ()),
    "dp2xtp2": (2, 2, ("--clip", "0.25")),
}


def reference(clip: float | None):
    """The dense MLP trained in this process on whole global batches: (state_dict, losses, norms)."""
    x, y = tp_common.make_data(SEED)
    md.manual_seed(SEED)
    model = MLP(tp_common.N_IN, tp_common.HIDDEN, tp_common.N_CLASSES, dtype=np.float64)
    opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3)
    losses, norms = [], []
    for step in range(STEPS):
        xb, yb = tp_common.global_batch(x, y, step, BATCH)
        loss = nn.functional.cross_entropy(model(md.tensor(xb, dtype=np.float64)), yb)
        opt.zero_grad()
        loss.backward()
        if clip is not None:
            norms.append(clip_grad_norm_(model.parameters(), clip))
        opt.step()
        losses.append(loss.item())
    return model.state_dict(), losses, norms


def dropout_reference(p: float, tp: int):
    """The dropout model on one device. The sharded mask is the concatenation of what each tp rank's
    tracker stream (seed + 2718 + tp_rank) draws; the replicated Dropout draws from the default
    generator exactly as every tp rank does."""
    x, y = tp_common.make_data(SEED)
    md.manual_seed(SEED + 1)  # model_parallel_manual_seed(SEED + 1) on the ranks
    fc1, fc2 = nn.Linear(tp_common.N_IN, 8, dtype=np.float64), nn.Linear(8, 6, dtype=np.float64)
    model = nn.Sequential(fc1, fc2, nn.Dropout(p), nn.Linear(6, tp_common.N_CLASSES, dtype=np.float64))
    streams = [np.random.default_rng(SEED + 1 + TP_SEED_OFFSET + r) for r in range(tp)]
    opt = optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for step in range(STEPS):
        xb, yb = tp_common.global_batch(x, y, step, BATCH)
        mask = np.concatenate([tp_common.dropout_mask(g, (BATCH, 8 // tp), p) for g in streams], axis=-1)
        h = fc1(md.tensor(xb, dtype=np.float64)).relu() * md.tensor(mask, dtype=np.float64)
        loss = nn.functional.cross_entropy(model[3](model[2](fc2(h))), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return model, losses


@pytest.fixture(scope="module", params=sorted(RUNS))
def run(request, tmp_path_factory):
    dp, tp, flags = RUNS[request.param]
    out = tmp_path_factory.mktemp(request.param)
    run_mpi(dp * tp, "tensor_parallel/tp_train.py", out, SEED, STEPS, dp, tp, *flags, timeout=120)
    ranks = [
        (dict(np.load(out / f"rank{r}.npz")), json.loads((out / f"rank{r}.json").read_text()))
        for r in range(dp * tp)
    ]
    return request.param, dp, tp, flags, ranks


def assemble(ranks, prefix: str, tp_dims: dict, dp_rank: int, tp: int) -> dict[str, np.ndarray]:
    """One dp replica's full tensors: shards concatenated along tp_dim (world rank = dp_rank*tp + tp_rank)."""
    mine = [ranks[dp_rank * tp + t][0] for t in range(tp)]
    return {
        name: mine[0][f"{prefix}{name}"]
        if d is None
        else np.concatenate([m[f"{prefix}{name}"] for m in mine], d)
        for name, d in tp_dims.items()
    }


@pytest.mark.mpi
def test_training_equals_one_process(run):
    name, dp, tp, flags, ranks = run
    clip = float(flags[flags.index("--clip") + 1]) if "--clip" in flags else None
    ref_params, ref_losses, ref_norms = reference(clip)
    tp_dims = ranks[0][1]["tp_dims"]
    assert sorted(tp_dims) == sorted(ref_params)  # the same global names for every tp
    for rank, (_, record) in enumerate(ranks):
        assert record["coords"] == [(rank // tp) % dp, rank % tp, 0]
        np.testing.assert_allclose(record["losses"], ref_losses, **TOL)
        np.testing.assert_allclose(record["norms"], ref_norms, **TOL)
    if clip is not None:
        assert max(ref_norms) > clip  # clipping really changed the updates
    for dp_rank in range(dp):
        full = assemble(ranks, "param/", tp_dims, dp_rank, tp)
        for key, ref in ref_params.items():
            np.testing.assert_allclose(full[key], ref, **TOL, err_msg=f"{name}: {key} on replica {dp_rank}")


@pytest.mark.mpi
def test_replicated_parameters_and_gradients_are_identical_on_every_rank(run):
    name, dp, tp, _, ranks = run
    tp_dims = ranks[0][1]["tp_dims"]
    assert any(d is None for d in tp_dims.values()) and any(d is not None for d in tp_dims.values())
    for key, d in tp_dims.items():
        for rank in range(dp * tp):
            # Replicated: the same on all ranks. Sharded: the same on ranks holding the same shard
            # (same tp_rank, other dp replicas), because DDP averages them over the dp group.
            twin = 0 if d is None else rank % tp
            for kind in ("param/", "grad/"):
                np.testing.assert_array_equal(
                    ranks[rank][0][kind + key], ranks[twin][0][kind + key], err_msg=f"{name}: {kind}{key}"
                )


@pytest.mark.mpi
@pytest.mark.parametrize("run", ["tp2"], indirect=True)  # the run that trains the dropout model
def test_dropout_masks_per_tp_rank_on_sharded_activations_shared_on_replicated(run):
    name, dp, tp, flags, ranks = run
    model, ref_losses = dropout_reference(float(flags[flags.index("--dropout") + 1]), tp)
    for _, record in ranks:
        np.testing.assert_allclose(record["drop_losses"], ref_losses, **TOL)
    tp_dims = ranks[0][1]["drop_tp_dims"]
    full = assemble(ranks, "drop/param/", tp_dims, 0, tp)
    dense = dict(zip(["0.fc1.weight", "0.fc1.bias", "0.fc2.weight", "0.fc2.bias", "2.weight", "2.bias"],
                     [p.numpy() for p in model.parameters()]))  # fmt: skip
    assert sorted(full) == sorted(dense)
    for key, ref in dense.items():
        np.testing.assert_allclose(full[key], ref, **TOL, err_msg=key)
