"""``ParallelGPT`` (tensor + sequence parallelism, vocabulary-parallel embedding, head and loss, context
parallelism) trains the same model as one process: float64, tp 2 and 4, cp 2 x tp 2, dp 2 x cp 2 x tp 2,
with and without sequence parallelism.

The worker (tests/workers/tensor_parallel/tp_gpt.py) trains 3 AdamW steps on one global batch; here
the one-process ``GPT`` from the same seed does the same, and its losses, first-step gradients and
final parameters are cut with ``split.py`` (the parallel model's own rule: the vocabulary split
unevenly, 65 = 33 + 32 or 17 + 16 + 16 + 16; c_attn with stride 3) and compared rank by rank.
"""

from __future__ import annotations

import json
import re

import gpt_tp_common as common  # noqa: E402
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mpi_utils import run_mpi  # noqa: E402

from minidist.parallel.tensor_parallel.split import shard_index  # noqa: E402

# float64; the parallel model differs from one process only in the order of floating-point sums (row-
# parallel partial products, the loss's sums over vocabulary slices): ~1e-16 relative per operation,
# amplified a little by 3 AdamW steps (whose first steps move each weight by ~lr whatever the gradient's
# size). 1e-10 relative is far above that and far below any real mistake (a missing sum, a wrong slice).
TOL = dict(rtol=1e-10, atol=1e-12)


def gpt_configs(tp: int, cp: int, dp: int = 1):
    lengths = [n for n in (8, 12, 16) if n % (2 * cp) == 0 and (n // cp) % tp == 0]  # cp and sp splits
    return st.fixed_dictionaries(
        {
            "vocab_size": st.just(65),  # Shakespeare's characters: uneven over 2 and 4 ranks
            "block_size": st.just(16),
            "n_layer": st.just(2),
            "n_head": st.just(4),
            "n_embd": st.sampled_from([16, 24]),
            "bias": st.booleans(),
            "tie_weights": st.booleans(),
            "batch": st.just(2) if dp == 2 else st.integers(1, 2),  # dp ranks take one row each
            "T": st.sampled_from(lengths),
            "seed": st.integers(0, 2**31 - 1),
            "cp": st.just(cp),
            "dp": st.just(dp),
        }
    )


def piece(full: np.ndarray, flags, tp: int, rank: int) -> np.ndarray:
    tp_dim, stride, _ = flags
    return full if tp_dim is None else full[shard_index(full.shape, tp_dim, tp, rank, stride)]


@pytest.mark.mpi
@pytest.mark.parametrize("dp, cp, tp", [(1, 1, 2), (1, 1, 4), (1, 2, 2), (2, 2, 2)])
@settings(max_examples=1)
@given(data=st.data())
def test_parallel_gpt_trains_like_one_process(tmp_path_factory, dp, cp, tp, data):
    """cp ranks hold the balanced split's tokens (ring attention), dp ranks their rows; DDP averages
    over dp_cp_group. The 8-rank case composes all three: dp x cp x tp."""
    cfg = data.draw(gpt_configs(tp, cp, dp))
    tmp = tmp_path_factory.mktemp("gpt")
    (tmp / "cfg.json").write_text(json.dumps(cfg))
    world = dp * cp * tp
    run_mpi(world, "tensor_parallel/tp_gpt.py", tmp, tmp / "cfg.json", timeout=240)
    ranks = [dict(np.load(tmp / f"rank{r}.npz")) for r in range(world)]
    meta = json.loads((tmp / "meta.json").read_text())
    ref = common.train_full_gpt(cfg)
    for sp in ("0", "1"):
        flags = meta[sp]
        assert set(flags) == {k.split("/", 1)[1] for k in ref if k.startswith("param/")}  # GPT's names
        assert flags["wte.weight"][0] == 0 and flags["h.0.attn.c_attn.weight"][:2] == [0, 3]
        flagged = {n for n, f in flags.items() if f[2]}
        replicated_on_shards = {n for n in flags if "ln_" in n or n.startswith("wpe") or "c_proj.bias" in n}
        assert flagged == (replicated_on_shards if sp == "1" else set())
        for r in range(world):
            got = ranks[r]
            where = f"rank {r} (tp rank {r % tp}), sequence_parallel={sp}"
            np.testing.assert_allclose(got[f"{sp}/losses"], ref["losses"], **TOL, err_msg=where)
            for name, f in flags.items():
                for kind in ("grad", "param"):
                    want = piece(ref[f"{kind}/{name}"], f, tp, r % tp)  # tp fastest in the mesh
                    np.testing.assert_allclose(
                        got[f"{sp}/{kind}/{name}"], want, **TOL, err_msg=f"{kind} {name}, {where}"
                    )
                # gather_gpt puts the pieces back together: the full tensor, exactly the pieces' values
                np.testing.assert_allclose(got[f"{sp}/gathered/{name}"], ref[f"param/{name}"], **TOL)
                np.testing.assert_array_equal(piece(got[f"{sp}/gathered/{name}"], f, tp, r % tp),
                                              got[f"{sp}/param/{name}"])  # fmt: skip
    assert ref["losses"][-1] < ref["losses"][0]  # the steps did train


@pytest.mark.mpi
def test_errors_are_raised_on_every_rank(tmp_path):
    run_mpi(2, "tensor_parallel/tp_gpt_errors.py", tmp_path, timeout=120)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    expected = {
        "gpt_heads": (
            "ValueError",
            r"n_head=1 is not divisible by the tensor-parallel size 2.*choose tp among \[1\]",
        ),
        "block_heads": ("ValueError", r"n_head=3 is not divisible by the tensor-parallel size 2"),
        "from_gpt_heads": ("ValueError", r"n_head=1 is not divisible"),
        "sequence": ("ValueError", r"7 is not divisible by tp=2; use a sequence length divisible by tp"),
        "dropout_cp": ("NotImplementedError", r"dropout=0.1 with cp=2: attention dropout is not implemented"),
        "ids": ("IndexError", r"ids must lie in \[0, 11\)"),
        "different_gpts": (
            "ValueError",
            r"from_gpt: the ranks .* passed different values: weights .*same seed",
        ),
    }
    for r, got in enumerate(ranks):
        for case, (kind, pattern) in expected.items():
            assert got[case][0] == kind and re.search(pattern, got[case][1]), (r, case, got[case])


@pytest.mark.mpi
def test_parallel_gpt_on_the_cupy_stand_in_equals_the_cpu(tmp_path):
    """The GPU code path without a GPU (tests/helpers/cupy_stand_in.py): sequence-parallel mappings,
    vocabulary-
    parallel embedding and loss, staging of device arrays through the collectives; bit for bit."""
    run_mpi(2, "tensor_parallel/tp_gpt_stand_in.py", tmp_path, timeout=120)
    for r in range(2):
        got = json.loads((tmp_path / f"rank{r}.json").read_text())
        assert got["on_device"] and got["device"] == got["cpu"] and got["worst"] == 0.0, (r, got)
