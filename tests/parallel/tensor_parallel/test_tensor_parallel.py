"""Tensor-parallel layers equal the dense ones; the f/g operators' gradients equal finite differences.

Megatron-LM (Shoeybi et al. 2019, §3). Each layer check runs hypothesis-drawn configs on tp real
ranks (one launch per example, several configs per launch) and rebuilds the full tensors from the
shards: sharded ones concatenated in tp-rank order along their ``tp_dim`` (or the last axis for
activations), replicated ones required bit-identical on every rank.
"""

from __future__ import annotations

import json
import math
import re
import tempfile
from pathlib import Path

import numpy as np
import pytest
import strategies as S
import tp_common  # noqa: E402
from fake_group import fake_group  # noqa: E402
from hypothesis import given, settings
from hypothesis import strategies as st
from mpi_utils import run_mpi  # noqa: E402

import minidist as md  # noqa: E402
from minidist import nn  # noqa: E402
from minidist.parallel import ColumnParallelLinear, ParallelMLP, RowParallelLinear  # noqa: E402
from minidist.parallel.tensor_parallel import shard_parameter  # noqa: E402

# float64, and the only difference from the dense layer is the order of a sum: a row-parallel layer
# adds n partial products over slices of the input features, the dense one sums all features at once
# (a few ulps, ~1e-16 relative, on values of order 1-10). 1e-10 leaves a wide margin yet catches any
# wrong slice, missing reduction or doubled bias by many orders of magnitude.
TOL = dict(rtol=1e-10, atol=1e-12)


@st.composite
def layer_configs(draw, tp: int):
    """A layer config for a tp group: the split dimension is a multiple of tp, the others free."""
    kind = draw(st.sampled_from(["column", "row", "mlp"]))

    def split() -> int:
        return tp * draw(st.integers(1, 3))

    return {
        "kind": kind,
        "batch": draw(st.lists(st.integers(1, 4), min_size=1, max_size=2)),
        "in": split() if kind == "row" else draw(st.integers(1, 6)),
        "out": split() if kind == "column" else draw(st.integers(1, 6)),
        "hidden": split(),
        "bias": draw(st.booleans()),
        "flag": draw(st.booleans()),  # gather_output (column) / input_is_parallel (row)
        "seed": draw(st.integers(0, 2**31 - 1)),
    }


def assemble(shards: list[np.ndarray], axis: int | None) -> np.ndarray:
    """The full tensor: shards concatenated along ``axis``, or (None) the one value every rank holds."""
    if axis is not None:
        return np.concatenate(shards, axis=axis)
    for r, s in enumerate(shards[1:], 1):
        np.testing.assert_array_equal(s, shards[0], err_msg=f"replicated value differs on tp rank {r}")
    return shards[0]


def drawn_configs(tp: int) -> list[dict]:
    """The configs of 2 hypothesis examples of 6, each distinct one once, for ONE launch of tp ranks.

    Collected before the launch: one MPI job per example spent most of its time starting the ranks,
    and hypothesis's first example (its simplest) is six copies of one config.
    """
    drawn: list[dict] = []

    @settings(max_examples=2, database=None)
    @given(data=st.data())
    def collect(data):
        drawn.extend(data.draw(st.lists(layer_configs(tp), min_size=6, max_size=6)))

    collect()
    return list({json.dumps(c, sort_keys=True): c for c in drawn}.values())


@pytest.mark.mpi
@pytest.mark.parametrize("tp", S.TP_SIZES)
def test_layers_equal_the_dense_layer(tp):
    configs = drawn_configs(tp)
    assert len(configs) > 6  # both examples were drawn
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "configs.json").write_text(json.dumps(configs))
        run_mpi(tp, "tensor_parallel/tp_layers.py", tmp, Path(tmp, "configs.json"), timeout=120)
        ranks = [dict(np.load(Path(tmp, f"rank{r}.npz"))) for r in range(tp)]
        meta = json.loads(Path(tmp, "meta.json").read_text())
    for i, (cfg, m) in enumerate(zip(configs, meta)):
        x, w = tp_common.layer_inputs(cfg)
        ref = tp_common.run_layer(tp_common.dense_layer(cfg), x, w)
        axes = {"y": -1 if m["y_sharded"] else None, "x.grad": -1 if m["x_sharded"] else None}
        for j, tp_dim in enumerate(m["tp_dims"]):
            axes[f"p{j}"] = axes[f"p{j}.grad"] = tp_dim  # p{j}: the initial weights, equal to dense init
        assert set(axes) == set(ref), (cfg, sorted(axes), sorted(ref))
        for key, axis in axes.items():
            got = assemble([r[f"{i}/{key}"] for r in ranks], axis)
            np.testing.assert_allclose(got, ref[key], **TOL, err_msg=f"{key} of {cfg}")


# case in tests/workers/tensor_parallel/tp_errors.py -> (exception type, pattern), the same on both ranks
TP_DIFFER = "the ranks of the tensor-parallel group passed different values: "
TP_ERRORS = {
    "row_in_features_differ": ("ValueError", rf"RowParallelLinear: {TP_DIFFER}in_features \(8 on rank 0; "),
    "column_out_features_differ": ("ValueError", r"ColumnParallelLinear: .* out_features \(8 on rank 0; 12 "),
    "gather_output_differs": ("ValueError", r"gather_output \(True on rank 0; False on rank 1\)"),
    "input_is_parallel_differs": ("ValueError", r"input_is_parallel \(True on rank 0; False on rank 1\)"),
    "dtype_differs": ("ValueError", r"dtype \(float32 on rank 0; float64 on rank 1\)"),
    "mlp_activation_differs": ("ValueError", r"ParallelMLP: .*activation \('relu' on rank 0; 'gelu' on "),
    "float_size_on_rank_1": ("TypeError", r"rank 1 of the tensor-parallel group: .*in_features must be a "
                             r"positive int, got 6.0"),
    "not_divisible_on_rank_0": ("ValueError", r"rank 0 of the tensor-parallel group: .*in_features=7 is "
                                r"not divisible"),
    "mlp_hidden_not_divisible": ("ValueError", r"hidden_features=7 is not divisible by .* size 2"),
    "scalar_input": ("ValueError", r"got input of shape \(\): it expects input of shape \(\.\.\., 6\)"),
    "clip_error_if_nonfinite": ("RuntimeError", r"total norm of order 2.0 of the gradients is inf"),
    "clip_fewer_params_on_rank_1": ("ValueError", rf"clip_grad_norm_: {TP_DIFFER}parameters \(4 on rank 0; 2 "
                                    r"on rank 1\), sharded \(3 on rank 0; 1 on rank 1\)"),
    "clip_other_max_norm": ("ValueError", rf"{TP_DIFFER}max_norm \("),
    "clip_other_norm_type_over_pp": ("ValueError", r"pipeline group passed different values: norm_type \("),
}  # fmt: skip


@pytest.mark.mpi
def test_misuse_raises_the_same_error_on_every_rank(tmp_path):
    run_mpi(2, "tensor_parallel/tp_errors.py", tmp_path, timeout=60)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for case, (kind, pattern) in TP_ERRORS.items():
        assert ranks[0][case] == ranks[1][case], case
        assert ranks[0][case][0] == kind and re.search(pattern, ranks[0][case][1]), (case, ranks[0][case])
    assert ranks[0]["numpy_sizes"] == ranks[1]["numpy_sizes"] == [None, ["int", 4]]
    # a NaN in one rank's copy of a replicated gradient: NaN on every rank, gradients left unchanged
    for case in ("clip_nan_inf_norm", "clip_nan_2_norm"):
        assert ranks[0][case] == ranks[1][case] == [None, ["nan", True]], case
    assert ranks[0]["after"] == ranks[1]["after"] > 0  # nothing was left half done


@pytest.mark.mpi
def test_f_g_scatter_gather_gradients_match_finite_differences(tmp_path):
    run_mpi(3, "tensor_parallel/tp_mappings.py", tmp_path, 7, timeout=120)
    for r in range(3):
        got = np.load(tmp_path / f"rank{r}.npz")
        for op in ("f", "g", "scatter", "gather"):
            # J is linear in x, so central differences are exact but for rounding: eps 1e-6 on values of
            # order 1-10 leaves ~1e-10 absolute error; 1e-7 is far below any wrong gradient (order 1).
            np.testing.assert_allclose(
                got[f"{op}/analytic"], got[f"{op}/numeric"], atol=1e-7, err_msg=f"{op} on rank {r}"
            )
            assert np.abs(got[f"{op}/analytic"]).max() > 0.1  # a non-trivial gradient was checked


# --- errors and metadata, in one process (a world of one rank) ---------------------------------------


def test_sizes_not_divisible_by_the_group_are_errors(same_arguments_everywhere):
    group = fake_group(3)
    with pytest.raises(ValueError, match=r"out_features=8 is not divisible .* group size 3"):
        ColumnParallelLinear(4, 8, group=group)
    with pytest.raises(ValueError, match=r"in_features=10 is not divisible .* group size 3"):
        RowParallelLinear(10, 4, group=group)
    with pytest.raises(ValueError, match=r"hidden_features=4 is not divisible"):
        ParallelMLP(6, 4, group=group)
    with pytest.raises(ValueError, match="in_features must be a positive int, got 0"):
        ColumnParallelLinear(0, 3, group=group)


def test_sizes_must_be_ints_and_numpy_ints_are_fine(same_arguments_everywhere):
    group = fake_group(2)
    with pytest.raises(TypeError, match=r"ColumnParallelLinear: in_features must be a positive int, got 6.0"):
        ColumnParallelLinear(6.0, 8, group=group)
    with pytest.raises(TypeError, match="out_features must be a positive int, got True"):
        RowParallelLinear(8, True, group=group)  # a bool is not a size, although True == 1
    with pytest.raises(TypeError, match="hidden_features must be a positive int, got '8'"):
        ParallelMLP(4, "8", group=group)
    layer = ColumnParallelLinear(np.int64(6), np.int32(8), group=group)
    assert type(layer.in_features) is int and layer.out_features_per_partition == 4
    assert type(ParallelMLP(np.int16(4), np.uint8(8), group=group).fc2.in_features) is int


def test_disagreeing_ranks_are_listed_by_their_arguments(monkeypatch):
    """The message of ``checks.agree`` when the gathered records differ (rank 2 flipped gather_output)."""
    from minidist.distributed.safety import agreement

    def gather(obj, group):
        other = {**obj, "values": {**obj["values"], "gather_output": True}}
        return [obj, obj, other]

    monkeypatch.setattr(agreement, "all_gather_json", gather)
    pattern = (
        r"ColumnParallelLinear: the ranks of the tensor-parallel group passed different values: "
        r"gather_output \(False on ranks 0, 1; True on rank 2\); build the layer with the same arguments"
    )
    with pytest.raises(ValueError, match=pattern):
        ColumnParallelLinear(4, 6, group=fake_group(3))


def test_wrong_input_width_and_bad_options_are_errors():
    col = ColumnParallelLinear(4, 6)
    with pytest.raises(ValueError, match=r"got input of shape \(2, 5\): .*its last axis must be 4"):
        col(md.tensor(np.ones((2, 5))))
    for layer in (col, RowParallelLinear(4, 6)):
        with pytest.raises(
            ValueError, match=r"got input of shape \(\)\: it expects input of shape \(\.\.\., 4\)"
        ):
            layer(md.tensor(np.float32(1.0)))
    with pytest.raises(ValueError, match="activation must be one of"):
        ParallelMLP(4, 8, activation="swish")
    with pytest.raises(ValueError, match="dropout probability"):
        ParallelMLP(4, 8, dropout=1.5)


def test_parameters_carry_their_tp_metadata():
    col, row = ColumnParallelLinear(4, 6), RowParallelLinear(6, 3)
    assert (col.weight.tp_dim, col.bias.tp_dim, row.weight.tp_dim, row.bias.tp_dim) == (0, 0, 1, None)
    assert col.weight.tp_group is not None and row.bias.tp_group is None
    assert nn.Linear(2, 3).weight.tp_dim is None  # the Parameter default: replicated


def test_shard_parameter_takes_the_rank_th_equal_slice():
    full = nn.Parameter(np.arange(24.0).reshape(4, 6))
    shard = shard_parameter(full, 1, fake_group(3, rank=1))
    np.testing.assert_array_equal(shard.numpy(), full.numpy()[:, 2:4])
    assert shard.tp_dim == 1 and shard.tp_group is not None and shard.data.flags.c_contiguous


# --- gradient clipping ----------------------------------------------------------------------------------
def params_with_grads(seed: int) -> list[nn.Parameter]:
    rng = np.random.default_rng(seed)
    params = [nn.Parameter(rng.standard_normal(shape)) for shape in [(3, 4), (4,), (0,), (2, 2)]]
    for p in params:
        p.grad = rng.standard_normal(p.shape)
    return params


@pytest.mark.parametrize("norm_type", [1.0, 2.0, 3.5, math.inf])
def test_clip_grad_norm_matches_the_norm_of_all_gradients_as_one_vector(norm_type):
    from minidist.nn.utils import clip_grad_norm_ as local_clip
    from minidist.parallel import clip_grad_norm_ as parallel_clip

    for clip in (local_clip, parallel_clip):
        params = params_with_grads(0)
        flat = np.concatenate([p.grad.ravel() for p in params])
        expected = np.linalg.norm(flat, ord=norm_type)
        assert clip(params, 1e9, norm_type) == pytest.approx(expected, rel=1e-12)  # no clipping
        np.testing.assert_array_equal(np.concatenate([p.grad.ravel() for p in params]), flat)
        assert clip(params, 0.5, norm_type) == pytest.approx(expected, rel=1e-12)
        clipped = np.concatenate([p.grad.ravel() for p in params])
        np.testing.assert_allclose(clipped, flat * 0.5 / (expected + 1e-6), rtol=1e-12)
        assert np.linalg.norm(clipped, ord=norm_type) == pytest.approx(0.5, rel=1e-5)


@pytest.mark.parametrize("norm_type", [2.0, math.inf])
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_a_non_finite_gradient_gives_a_non_finite_norm_and_leaves_the_gradients(norm_type, bad):
    from minidist.nn.utils import clip_grad_norm_ as local_clip
    from minidist.parallel import clip_grad_norm_ as parallel_clip

    for clip in (local_clip, parallel_clip):
        params = params_with_grads(2)
        params[3].grad[1, 1] = bad  # after a finite parameter: max(0, nan) must not hide it
        before = [p.grad.copy() for p in params]
        norm = clip(params, 0.5, norm_type)
        # PyTorch's total norm propagates NaN for every norm_type; inf stays inf
        assert math.isnan(norm) if math.isnan(bad) else norm == math.inf
        for p, b in zip(params, before):
            np.testing.assert_array_equal(p.grad, b)  # unchanged: not zeroed, not poisoned
        with pytest.raises(RuntimeError, match=f"total norm of order {norm_type} .* is {norm}"):
            clip(params, 0.5, norm_type, error_if_nonfinite=True)
        assert clip(params_with_grads(2), 0.5, norm_type, error_if_nonfinite=True) > 0.5  # finite: fine


def test_clip_grad_norm_errors():
    from minidist.parallel import clip_grad_norm_

    params = params_with_grads(1)
    with pytest.raises(ValueError, match="max_norm must be >= 0"):
        clip_grad_norm_(params, -1.0)
    with pytest.raises(ValueError, match="norm_type must be > 0"):
        clip_grad_norm_(params, 1.0, norm_type=0)
    with pytest.raises(TypeError, match="max_norm must be a number"):
        clip_grad_norm_(params, "1")
    params[0].tp_dim = 0
    with pytest.raises(ValueError, match=r"has tp_dim=0 but no tp_group"):
        clip_grad_norm_(params, 1.0)


def test_rng_tracker_fork_leaves_the_default_generator_alone_and_states_round_trip():
    from minidist import random
    from minidist.parallel.tensor_parallel import (
        RNGStatesTracker,
        get_rng_tracker,
        model_parallel_manual_seed,
    )

    model_parallel_manual_seed(5)  # world of one rank: tracked seed 5 + 2718 + 0
    expected_default = np.random.default_rng(5).random(3)
    with get_rng_tracker().fork():
        tracked = random.generator().random(3)
    np.testing.assert_array_equal(tracked, np.random.default_rng(5 + 2718).random(3))
    np.testing.assert_array_equal(random.generator().random(3), expected_default)  # untouched by the fork
    saved = json.loads(json.dumps(get_rng_tracker().get_states()))  # JSON-serialisable, for checkpoints
    with get_rng_tracker().fork():
        first = random.generator().random(2)
    get_rng_tracker().set_states(saved)
    with get_rng_tracker().fork():
        np.testing.assert_array_equal(random.generator().random(2), first)  # resumed from the saved state
    with pytest.raises(ValueError, match="model_parallel_manual_seed"):
        with RNGStatesTracker().fork():
            pass


def test_a_nested_fork_of_the_same_stream_continues_it_instead_of_replaying_it():
    """Dropout forks by itself for a shard, also inside ParallelMLP's own fork: the inner fork must not
    restart the stream (the outer one would then store the state of before the inner draws)."""
    from minidist import random
    from minidist.parallel.tensor_parallel import get_rng_tracker, model_parallel_manual_seed

    model_parallel_manual_seed(5)
    with get_rng_tracker().fork():
        with get_rng_tracker().fork():
            inner = random.generator().random(3)
        outer = random.generator().random(3)
    with get_rng_tracker().fork():
        after = random.generator().random(3)
    np.testing.assert_array_equal(
        np.concatenate([inner, outer, after]), np.random.default_rng(5 + 2718).random(9)
    )
    np.testing.assert_array_equal(random.generator().random(3), np.random.default_rng(5).random(3))
