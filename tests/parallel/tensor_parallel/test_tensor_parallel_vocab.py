"""The vocabulary split over a tensor-parallel group equals one process (Shoeybi et al. 2019, §3).

``VocabParallelEmbedding`` against ``nn.Embedding`` / ``F.embedding`` and ``vocab_parallel_cross_entropy``
against ``F.cross_entropy`` of the gathered logits, on tp = 2, 3, 4 real ranks with an uneven (65)
and an even vocabulary: outputs, the initial table and the gradients, piece by piece (a rank's rows
are ``shard_bounds(V, tp, rank)``). Then the loss's gradient against central finite differences
across ranks, and misuse that must raise the same error on every rank (a bad id on one rank only).
Configurations are drawn by hypothesis here and passed to the workers
(tests/workers/tensor_parallel/vocab_*.py, inputs from tests/workers/vocab_common.py).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import vocab_common as vc  # noqa: E402
from cupy_stand_in import DeviceArray, install  # noqa: E402
from hypothesis import given, settings
from hypothesis import strategies as st
from mpi_utils import run_mpi  # noqa: E402

import minidist as md  # noqa: E402
import minidist.distributed as dist  # noqa: E402
from minidist import nn  # noqa: E402
from minidist.distributed import Communicator  # noqa: E402
from minidist.nn import functional as F  # noqa: E402
from minidist.parallel.tensor_parallel import VocabParallelEmbedding, vocab_parallel_cross_entropy  # noqa: E402
from minidist.parallel.tensor_parallel.split import shard_bounds  # noqa: E402

# float64; the parallel results differ from one process's only in the order of float sums (the
# exp-sum over the ranks' slices, log S + m - z_t instead of z_t - m - log S): ~1e-16 relative on
# values of order 1-10. 1e-12 is far below any wrong slice, missing term or scale (order 1e-2 or more).
TOL = dict(rtol=1e-12, atol=1e-12)


@st.composite
def configs(draw, tp: int, vocab: int | None = None):
    """A config for ``vc.inputs``: V >= tp (65 or an even V when given), batch of 1-2 axes."""
    vocab = vocab if vocab is not None else draw(st.integers(tp, 12))
    padding = draw(st.one_of(st.none(), st.integers(-vocab, vocab - 1)))
    return {
        "vocab": vocab,
        "dim": draw(st.integers(1, 4)),
        "batch": draw(st.lists(st.integers(1, 4), min_size=1, max_size=2)),
        "padding_idx": padding,
        "reduction": draw(st.sampled_from(["mean", "sum", "none"])),
        "seed": draw(st.integers(0, 2**31 - 1)),
    }


def reference(cfg: dict) -> dict[str, np.ndarray]:
    """The one-process results the worker's keys name: nn.Embedding, F.embedding of the full table
    the worker cuts with from_weight, and F.cross_entropy of the full (N, V) logits."""
    data = vc.inputs(cfg)
    md.manual_seed(cfg["seed"])
    emb = nn.Embedding(cfg["vocab"], cfg["dim"], padding_idx=cfg["padding_idx"], dtype=vc.F64)
    out = vc.run_embedding(emb, emb.weight, data)
    full = nn.Parameter(np.random.default_rng(cfg["seed"]).standard_normal((cfg["vocab"], cfg["dim"])))
    cut = vc.run_embedding(lambda ids: F.embedding(ids, full, cfg["padding_idx"]), full, data)
    out.update({f"cut/{k}": v for k, v in cut.items()})

    def loss_fn(z, t):
        loss = F.cross_entropy(z.reshape(-1, cfg["vocab"]), t.reshape(-1), reduction=cfg["reduction"])
        return loss.reshape(*t.shape) if cfg["reduction"] == "none" else loss

    out.update(vc.run_loss(loss_fn, data["logits"], data))
    return out


# where each key's pieces lie: a rank's rows of the table (axis 0), a rank's vocabulary slice of the
# logits (last axis), or None: the same value on every rank (checked bit-identical)
AXES = {"y": None, "weight": 0, "weight.grad": 0, "loss": None, "logits.grad": -1}
AXES.update({f"cut/{k}": AXES[k] for k in ("y", "weight", "weight.grad")})


def assemble(pieces: list[np.ndarray], axis: int | None) -> np.ndarray:
    if axis is not None:
        return np.concatenate(pieces, axis=axis)
    for r, piece in enumerate(pieces[1:], 1):
        np.testing.assert_array_equal(piece, pieces[0], err_msg=f"replicated value differs on rank {r}")
    return pieces[0]


def run_configs(tmp: Path, tp: int, script: str, cfgs: list[dict]) -> list[dict[str, np.ndarray]]:
    (tmp / "configs.json").write_text(json.dumps(cfgs))
    run_mpi(tp, f"tensor_parallel/{script}", tmp, tmp / "configs.json", timeout=120)
    return [dict(np.load(tmp / f"rank{r}.npz")) for r in range(tp)]


@pytest.mark.mpi
@pytest.mark.parametrize("tp", [2, 3, 4])
@settings(max_examples=1)
@given(data=st.data())
def test_vocab_parallel_embedding_and_loss_equal_one_process(tp, data, tmp_path_factory):
    even = 2 * 3 * 4 + 2 * tp  # divisible by tp
    cfgs = [data.draw(configs(tp, 65)), data.draw(configs(tp, even)), data.draw(configs(tp))]
    ranks = run_configs(tmp_path_factory.mktemp("vocab"), tp, "vocab_layers.py", cfgs)
    for i, cfg in enumerate(cfgs):
        ref = reference(cfg)
        assert set(ref) == set(AXES)
        for key, axis in AXES.items():
            got = assemble([r[f"{i}/{key}"] for r in ranks], axis)
            np.testing.assert_allclose(got, ref[key], **TOL, err_msg=f"{key} of {cfg}")
        rows = [shard_bounds(cfg["vocab"], tp, r) for r in range(tp)]
        assert [len(r[f"{i}/weight"]) for r in ranks] == [b - a for a, b in rows]  # the split rule's rows
        assert np.abs(ref["logits.grad"]).max() > 1e-3 and np.abs(ref["weight.grad"]).max() > 1e-3


@pytest.mark.mpi
@settings(max_examples=1)
@given(data=st.data())
def test_vocab_parallel_loss_gradient_matches_finite_differences_across_ranks(data, tmp_path_factory):
    cfgs = data.draw(st.lists(configs(2), min_size=3, max_size=3))
    ranks = run_configs(tmp_path_factory.mktemp("vocab_fd"), 2, "vocab_gradcheck.py", cfgs)
    for i, cfg in enumerate(cfgs):
        for r, got in enumerate(ranks):
            # central differences with eps 1e-6 on a smooth loss of order 1-10: truncation ~1e-12,
            # rounding ~1e-10; 1e-7 is far below any wrong gradient term (order 1e-2 or more)
            np.testing.assert_allclose(
                got[f"{i}/analytic"], got[f"{i}/numeric"], atol=1e-7, err_msg=f"rank {r} of {cfg}"
            )
        assert max(np.abs(got[f"{i}/analytic"]).max() for got in ranks) > 1e-3  # non-trivial


# case in tests/workers/tensor_parallel/vocab_errors.py -> (exception type, pattern); same on both ranks
VOCAB_ERRORS = {
    "embedding_id_too_large_on_rank_1": ("IndexError", r"index out of range in self: .* \[0, 7\) .* 0 to 9"),
    "embedding_negative_id_on_rank_0": ("IndexError", r"index out of range in self: .* from -1 to 6"),
    "embedding_float_ids": ("RuntimeError", r"expected integer token ids .* got float32"),
    "embedding_float_ids_on_rank_1": ("RuntimeError", r"^rank 1 of the tensor-parallel group: .* float32"),
    "embedding_ids_differ": ("ValueError", r"passed different ids \(their sums range from 17 to 18\)"),
    "embedding_vocab_smaller_than_tp": ("ValueError", r"num_embeddings=1 is smaller than the tensor-parallel "
                                        r"group size 2, so a rank would own no row"),
    "embedding_vocab_differs": ("ValueError", r"passed different values: num_embeddings \(7 on rank 0; 8 on"),
    "embedding_padding_idx_out_of_range": ("ValueError", r"padding_idx must be within num_embeddings \(7\)"),
    "from_weight_not_2d": ("ValueError", r"weight must be 2-D .* got shape \(7,\)"),
    "from_weight_shape_differs": ("ValueError", r"passed different values: shape \(\[7, 2\] on rank 0; "),
    "loss_target_too_large_on_rank_1": ("IndexError", r"Target 9 is out of bounds: .* \[0, 7\)"),
    "loss_negative_target": ("IndexError", r"Target -1 is out of bounds"),
    "loss_float_targets": ("TypeError", r"expects integer class indices as targets, got dtype float64"),
    "loss_target_shape": ("ValueError", r"targets have shape \(6,\), expected the logits' leading shape "
                          r"\(2, 3\)"),
    "loss_reduction": ("ValueError", r"reduction must be 'mean', 'sum' or 'none', got 'avg'"),
    "loss_empty_mean": ("ValueError", r"the mean over an empty batch is undefined"),
    "loss_fewer_targets_on_rank_1": ("ValueError", r"passed different numbers of targets \(3 to 6\)"),
    "loss_float_targets_on_rank_1": ("TypeError", r"^rank 1 of the tensor-parallel group: .* dtype float64"),
    "loss_target_shape_on_rank_0": ("ValueError", r"^rank 0 of the tensor-parallel group: .* shape \(6,\)"),
    "loss_bad_reduction_on_rank_1": ("ValueError", r"^rank 1 of the tensor-parallel group: .* got 'avg'"),
    "loss_reductions_differ": ("ValueError", r"passed different values: reduction \(mean on rank 0; sum on "
                               r"rank 1\)"),
    "loss_targets_differ": ("ValueError", r"passed different targets \(their sums range from 17 to 18\)"),
    "loss_no_vocabulary_on_rank_1": ("ValueError", r"the logits of rank 1 of the tensor-parallel group have "
                                     r"no vocabulary entry"),
}  # fmt: skip


@pytest.mark.mpi
def test_vocab_parallel_misuse_raises_the_same_error_on_every_rank(tmp_path):
    run_mpi(2, "tensor_parallel/vocab_errors.py", tmp_path, timeout=60)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for case, (kind, pattern) in VOCAB_ERRORS.items():
        assert ranks[0][case] == ranks[1][case], case
        assert ranks[0][case][0] == kind and re.search(pattern, ranks[0][case][1]), (case, ranks[0][case])
    assert ranks[0]["loss_empty_sum"] == ranks[1]["loss_empty_sum"] == [None, 0.0]
    assert ranks[0]["after"] == ranks[1]["after"]  # nothing was left half done


# --- one process: a group of one rank is the plain embedding and loss ------------------------------
@settings(max_examples=10)
@given(cfg=configs(1))
def test_one_rank_is_the_plain_embedding_and_loss(cfg):
    data = vc.inputs(cfg)
    ref = reference(cfg)
    md.manual_seed(cfg["seed"])
    emb = VocabParallelEmbedding(cfg["vocab"], cfg["dim"], dtype=vc.F64, padding_idx=cfg["padding_idx"])
    got = vc.run_embedding(emb, emb.weight, data)
    got.update(vc.run_loss(lambda z, t: vocab_parallel_cross_entropy(z, t, reduction=cfg["reduction"]),
                           data["logits"], data))  # fmt: skip
    for key in ("y", "weight", "weight.grad", "loss", "logits.grad"):
        np.testing.assert_allclose(got[key], ref[key], **TOL, err_msg=key)
    assert emb.weight.tp_dim == 0 and (emb.vocab_start, emb.vocab_end) == (0, cfg["vocab"])


def test_the_loss_has_the_logits_dtype_and_is_replicated():
    z = md.tensor(np.random.default_rng(0).standard_normal((3, 5)).astype(np.float32), requires_grad=True)
    loss = vocab_parallel_cross_entropy(z, np.array([0, 4, 2]))
    ref = F.cross_entropy(md.tensor(z.numpy()), np.array([0, 4, 2]))
    assert loss.dtype == ref.dtype == np.float32 and loss.shape == ()
    assert loss.sharded_over is None  # the same on every rank: not a shard (dropout would mask alike)
    loss.backward()
    assert z.grad.dtype == np.float32


@pytest.mark.parametrize("offset", [1e3, 1e5])
def test_large_float32_logits_keep_the_loss_precise(offset):
    """Logits far from 0 in float32 (an untrained head's bias, or scores before a max subtraction):
    the loss must stay as precise as F.cross_entropy's, i.e. within float32 rounding of the loss
    itself, not of the logits. Computing ``(log S + m) - z_t`` rounds log S to the ulp of m (0.008
    at 1e5); ``log S + (m - z_t)`` subtracts the two close logits exactly first."""
    rng = np.random.default_rng(0)
    z = rng.standard_normal((8, 7)) * 3
    t = rng.integers(0, 7, 8)
    z[np.arange(8), t] += 5  # mostly right predictions: small losses, where the rounding shows
    z32 = (z + offset).astype(np.float32)
    z64 = z32.astype(np.float64)  # the same logits, the reference computed in float64
    exact = np.log(np.exp(z64 - z64.max(1, keepdims=True)).sum(1)) + z64.max(1) - z64[np.arange(8), t]
    loss = vocab_parallel_cross_entropy(md.tensor(z32), t, reduction="none")
    np.testing.assert_allclose(loss.numpy(), exact, rtol=1e-5, atol=1e-6)


def one_rank_of_two(monkeypatch) -> Communicator:
    """Rank 0 of a group of 2 whose collectives return this rank's own input (sum / max of one term):
    enough to run every line of the layers, foreign ids included, in one process."""
    from minidist.distributed.safety import agreement

    group = Communicator.__new__(Communicator)  # skips __init__ (which would duplicate an MPI communicator)
    group.size, group.rank = 2, 0
    monkeypatch.setattr(agreement, "all_gather_json", lambda obj, group: [obj] * group.size)

    def all_reduce(a, op="sum", group=None, algorithm="auto"):
        if a.dtype == np.int64 and a.size == group.size + 9:  # the loss's facts: rank 1 holds ids 6-10
            a[1] = 5
        return a

    monkeypatch.setattr(dist, "all_reduce", all_reduce)
    return group


def forward_backward(group: Communicator) -> tuple[type, list[np.ndarray]]:
    cfg = {"vocab": 11, "dim": 3, "batch": [2, 5], "padding_idx": 2, "reduction": "none", "seed": 4}
    data = vc.inputs(cfg)
    md.manual_seed(0)
    emb = VocabParallelEmbedding(cfg["vocab"], cfg["dim"], group, dtype=vc.F64, padding_idx=2)
    out = vc.run_embedding(emb, emb.weight, data)
    z = md.tensor(data["logits"][..., :6], requires_grad=True)  # rank 0's slice: ids 0-5
    loss = vocab_parallel_cross_entropy(z, data["targets"], group, reduction="none")
    (loss * md.tensor(data["g"])).sum().backward()
    return type(emb.weight.data), [*out.values(), loss.numpy(), vc.host(z.grad)]


def test_the_layers_run_on_the_cupy_stand_in_as_on_the_cpu(monkeypatch):
    """Every op takes its array module from its input (no ``np.`` on device data, no host array in
    device arithmetic): on the CuPy stand-in (tests/helpers/cupy_stand_in.py) the results equal the CPU's."""
    group = one_rank_of_two(monkeypatch)
    cpu = forward_backward(group)
    install(monkeypatch)
    device = forward_backward(group)
    assert cpu[0] is np.ndarray and device[0] is DeviceArray  # the table really lived on the "device"
    for a, b in zip(cpu[1], device[1]):
        np.testing.assert_array_equal(b, a)
