"""benchmarks/gpt_comm.py: the bytes a step of the parallel GPT sends per group equal the formulas,
so the accounting (trace spans with bytes, perfmodel_transformer) cannot drift.

The benchmark itself (benchmarks/README.md, "Communication per step") runs the example's GPT;
here a tiny one (1 layer, width 16, 8 tokens, global batch 4) takes one traced step on 4 ranks in two
layouts that between them send every kind of message. Groups of 2 ranks: there recursive doubling sends
what the ring does, so the formula "as run" is the ring formula (the 4-rank rows of the README show
the other case). Where the formula is exact, measured == formula to the byte, on every rank.
"""

from __future__ import annotations

import json

import pytest
from mpi_utils import REPO, run_mpi

TINY = ["--n-layer", "1", "--n-head", "2", "--n-embd", "16", "--block-size", "8", "--batch-size", "4",
        "--microbatches", "2"]  # fmt: skip
SCRIPT = REPO / "benchmarks" / "gpt_comm.py"


def run_layout(tmp_path, *layout: str) -> dict:
    """Every rank's rows, keyed (group, kind, part) -> list over the ranks that have the row."""
    out = tmp_path / "rows.json"
    proc = run_mpi(4, SCRIPT, *layout, *TINY, "--json", out, timeout=120)
    assert "measured/as run" in proc.stdout, proc.stdout
    rows: dict = {}
    for rank in json.loads(out.read_text()):
        for row in rank["rows"]:
            rows.setdefault(tuple(row["key"]), []).append(row)
    return rows


def exact(rows: list[dict], extra_per_call: int = 0) -> None:
    for row in rows:
        assert row["calls"] > 0 and row["bytes"] == row["as_run"] + extra_per_call * row["calls"], row


@pytest.mark.mpi
def test_tensor_and_pipeline_parallel_bytes_equal_the_formulas(tmp_path):
    rows = run_layout(tmp_path, "--tp", "2", "--pp", "2")
    # the tp all-reduces of the layers and the vocabulary ends (f and g), on both stages
    assert len(rows[("tp", "all_reduce", "layers + embedding + head")]) == 4
    exact(rows[("tp", "all_reduce", "layers + embedding + head")])
    loss = rows[("tp", "all_reduce", "loss")]  # the vocabulary-parallel loss: on the last stage only
    assert len(loss) == 2 and all(row["calls"] == 3 * 2 for row in loss)  # 3 all-reduces x 2 microbatches
    exact(loss)
    exact(rows[("pp", "send/recv", "stage boundaries")])  # activations forward, their gradients back
    exact(rows[("tied", "all_reduce", "tied wte gradient")])  # wte's shard on the first and last stage
    assert len(rows) == 4  # nothing else in the model's dtype (headers and checks are int64 bookkeeping)


@pytest.mark.mpi
def test_sequence_and_context_parallel_bytes_equal_the_formulas(tmp_path):
    rows = run_layout(tmp_path, "--tp", "2", "--cp", "2", "--sequence-parallel")
    exact(rows[("cp", "send/recv", "ring attention K/V")])  # K/V round the ring, dK/dV home
    exact(rows[("tp", "reduce_scatter", "layers + embedding + head")])
    # an all-gather first passes the n - 1 = 1 other rank's length round the ring: one int64 per call
    exact(rows[("tp", "all_gather", "layers + embedding + head")], extra_per_call=8)
    exact(rows[("tp", "all_reduce", "loss")])
    exact(rows[("tp", "all_reduce", "sequence-parallel grads")])  # LayerNorms and wpe, summed over tp
    # DDP over dp x cp: its last bucket carries one flag per parameter and one more (used or not)
    for row in rows[("dp_cp", "all_reduce", "gradients")]:
        assert 0 < row["bytes"] - row["as_run"] <= 4 * 64, row
    assert len(rows) == 6  # and nothing else
