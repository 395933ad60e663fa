"""The GPT block split over tp ranks (Megatron-LM, Shoeybi et al. 2019, §3) equals the one-process block,
with and without sequence parallelism (Korthikanti et al. 2022, §4.2.2).

Every rank cuts its ``ParallelBlock`` from the full block (tests/workers/tensor_parallel/tp_block.py);
here the full block runs in one process, and its output, input gradient and every parameter gradient
are cut with ``split.py`` (the layers' own rule, stride 3 for c_attn) and compared rank by rank.
"""

from __future__ import annotations

import json

import gpt_tp_common as common  # noqa: E402
import numpy as np
import pytest
from fake_group import fake_group  # noqa: E402
from hypothesis import given, settings
from hypothesis import strategies as st
from mpi_utils import run_mpi  # noqa: E402

from minidist import nn  # noqa: E402
from minidist.models.gpt.transformer import Block  # noqa: E402
from minidist.parallel import ColumnParallelLinear, RowParallelLinear  # noqa: E402
from minidist.parallel.tensor_parallel import ParallelBlock  # noqa: E402
from minidist.parallel.tensor_parallel.cut import cut_parameter, replicate  # noqa: E402
from minidist.parallel.tensor_parallel.split import shard_index  # noqa: E402

# float64, and the parallel block differs from the full one only in the order of sums (a row-parallel
# product adds t partial sums over slices of the input features): a few ulps, ~1e-16 relative, on
# values of order 1-10. 1e-10 leaves a wide margin yet catches a wrong slice, head or missing sum.
TOL = dict(rtol=1e-10, atol=1e-12)


@st.composite
def block_configs(draw, tp: int, dropout: float = 0.0):
    heads = tp * draw(st.integers(1, 2))
    return {
        "n_head": heads,
        "n_embd": heads * draw(st.integers(1, 3)),
        "batch": draw(st.integers(1, 2)),
        "T": tp * draw(st.integers(1, 3)),
        "bias": draw(st.booleans()),
        "dropout": dropout,
        "seed": draw(st.integers(0, 2**31 - 1)),
    }


def cut(value: np.ndarray, flags, tp: int, rank: int) -> np.ndarray:
    """This rank's piece of a full parameter (or its gradient) by split.py's rule; flags from meta."""
    tp_dim, stride, _ = flags
    return value if tp_dim is None else value[shard_index(value.shape, tp_dim, tp, rank, stride)]


def positions(a: np.ndarray, tp: int, rank: int, sp: int) -> np.ndarray:
    """Under sequence parallelism, this rank's contiguous positions (axis 1); else the whole tensor."""
    t = a.shape[1] // tp
    return a[:, rank * t : (rank + 1) * t] if sp else a


@pytest.mark.mpi
@pytest.mark.parametrize("tp", [2, 4])
@settings(max_examples=1)
@given(data=st.data())
def test_parallel_block_equals_the_full_block(tmp_path_factory, tp, data):
    configs = data.draw(st.lists(block_configs(tp), min_size=2, max_size=2))
    configs.append(data.draw(block_configs(tp, dropout=0.5)))
    tmp = tmp_path_factory.mktemp("block")
    (tmp / "configs.json").write_text(json.dumps(configs))
    run_mpi(tp, "tensor_parallel/tp_block.py", tmp, tmp / "configs.json", timeout=180)
    ranks = [dict(np.load(tmp / f"rank{r}.npz")) for r in range(tp)]
    meta = json.loads((tmp / "meta.json").read_text())
    for i, cfg in enumerate(configs):
        if cfg["dropout"] > 0:  # residual dropout on a replicated stream: the same mask on every rank
            for r in range(1, tp):
                np.testing.assert_array_equal(ranks[r][f"{i}/0/y"], ranks[0][f"{i}/0/y"])
            continue
        x, w = common.block_inputs(cfg)
        ref = common.run_module(common.full_block(cfg), x, w)
        flags = meta[i]
        # under sequence parallelism the LayerNorms and both c_proj biases act on sequence shards
        sp_flagged = {name for name, f in flags.items() if f[2]}
        want = {n for n in flags if ".ln_" in f".{n}" or n.endswith("c_proj.bias")}
        assert sp_flagged == want, sp_flagged
        assert flags["attn.c_attn.weight"][:2] == [0, 3] and flags["mlp.c_proj.weight"][:2] == [1, 1]
        for r in range(tp):
            for sp in (0, 1):
                got = {k.split("/", 2)[2]: v for k, v in ranks[r].items() if k.startswith(f"{i}/{sp}/")}
                where = f"config {i}, tp rank {r}, sequence_parallel={sp}"
                for key in ("y", "x.grad"):
                    np.testing.assert_allclose(got[key], positions(ref[key], tp, r, sp), **TOL, err_msg=where)
                for name, f in flags.items():
                    for key in (name, f"{name}.grad"):
                        np.testing.assert_allclose(got[key], cut(ref[key], f, tp, r), **TOL, err_msg=key)


# --- errors and the cut itself, in one process (a fake group that never communicates) ------------------


def test_from_linear_errors_name_the_axis_that_does_not_split(same_arguments_everywhere):
    g = fake_group(3)
    cases = [
        (
            lambda: ColumnParallelLinear.from_linear(nn.Linear(4, 8), g),
            ValueError,
            "out_features=8 is not div",
        ),
        (
            lambda: ColumnParallelLinear.from_linear(nn.Linear(4, 6), g, 3),
            ValueError,
            "out_features / stride=2",
        ),
        (lambda: ColumnParallelLinear.from_linear(nn.Linear(4, 9), g, 2), ValueError, "stride=2 must be a"),
        (lambda: RowParallelLinear.from_linear(nn.Linear(4, 9), g), ValueError, "in_features=4 is not div"),
        (lambda: RowParallelLinear.from_linear("W", g), TypeError, "expects an nn.Linear, got str"),
        (
            lambda: ParallelBlock(Block(12, 6), fake_group(4)),
            ValueError,
            r"n_head=6 .* tp among \[1, 2, 3, 6\]",
        ),
    ]
    for build, kind, pattern in cases:
        with pytest.raises(kind, match=pattern):
            build()


def test_from_linear_cuts_by_split_rule():
    full = nn.Linear(4, 18, dtype=np.float64)
    col = ColumnParallelLinear.from_linear(full, fake_group(1), stride=3, sequence_parallel=True)
    assert col.weight.tp_stride == 3 and col.sequence_parallel and not col.gather_output
    for rank in range(3):
        piece = cut_parameter(full.weight, 0, fake_group(3, rank), stride=3)
        rows = [b * 6 + rank * 2 + i for b in range(3) for i in range(2)]  # q, k, v blocks of 6, 2 each
        np.testing.assert_array_equal(piece.numpy(), full.weight.numpy()[rows])
        assert (piece.tp_dim, piece.tp_stride, piece.tp_group.rank) == (0, 3, rank)
    row = RowParallelLinear.from_linear(nn.Linear(6, 4), fake_group(1), sequence_parallel=True)
    assert row.bias.sequence_parallel and row.bias.tp_dim is None and row.weight.tp_dim == 1


def test_replicate_copies_the_parameters_only():
    from minidist import random

    ln = nn.LayerNorm(4, dtype=np.float64)
    ln.weight.grad = np.ones(4)
    ln.weight.register_post_accumulate_grad_hook(lambda p: None)  # as DDP does on the original
    state = random.get_rng_state()
    twin = replicate(ln, fake_group(2), sequence_parallel=True)
    assert random.get_rng_state() == state  # no draw: the generator is where one process has it
    assert (
        twin.weight is not ln.weight and twin.weight.grad is None and not twin.weight._post_accumulate_hooks
    )
    np.testing.assert_array_equal(twin.weight.numpy(), ln.weight.numpy())
    assert twin.weight.sequence_parallel and twin.bias.sequence_parallel and twin.eps == ln.eps
    twin.weight.data[...] = 5.0
    assert ln.weight.numpy()[0] == 1.0 and list(dict(ln.named_parameters())) == ["weight", "bias"]
    with pytest.raises(ValueError, match="has submodules"):
        replicate(nn.Sequential(ln), fake_group(2))
