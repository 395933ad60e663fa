"""minidist_tools.perfmodel.transformer: each formula against small cases worked out by hand, and the
formulas against each other (sequence parallelism saves memory, costs no bandwidth, ...)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from minidist_tools.perfmodel import transformer as pt


def test_activation_memory_is_the_papers_formula_by_hand():
    # s = 4, b = 1, h = 2, a = 1: sbh = 8 and 5as/h = 10, so sbh(34 + 10) = 352 bytes (16-bit, 1-byte masks).
    assert pt.activation_memory_per_layer(4, 1, 2, 1) == 8 * (34 + 10) == 352
    # tp = 2: sbh(10 + 24/2 + 10/2) = 8 * 27
    assert pt.activation_memory_per_layer(4, 1, 2, 1, tp=2) == 8 * 27
    # tp = 2 with sequence parallelism: everything halves, 352 / 2
    assert pt.activation_memory_per_layer(4, 1, 2, 1, tp=2, sequence_parallel=True) == 176
    # float32 without dropout: 16 h values of 4 bytes and 2 a s score values of 4 bytes, no masks:
    # 8 * 64 + (4 * 1 * 4 * 1) * 8 = 512 + 128
    assert pt.activation_memory_per_layer(4, 1, 2, 1, bytes_per_value=4, mask_bytes=0) == 640


def test_activation_memory_of_gpt3_175b_on_tp8():
    # Korthikanti et al. 2022, Table 2's setting: s = 2048, b = 1, h = 12288, a = 96, t = 8. Their
    # per-layer figures follow from the formula: with SP exactly 1/t of the unsplit layer.
    s, b, h, a, t = 2048, 1, 12288, 96, 8
    full = s * b * h * (34 + 5 * a * s / h)
    assert pt.activation_memory_per_layer(s, b, h, a) == pytest.approx(full, rel=1e-15)
    tp = pt.activation_memory_per_layer(s, b, h, a, tp=t)
    assert tp == pytest.approx(s * b * h * (10 + 24 / t + 5 * a * s / (h * t)), rel=1e-15)
    sp = pt.activation_memory_per_layer(s, b, h, a, tp=t, sequence_parallel=True)
    assert sp == pytest.approx(full / t, rel=1e-15)
    assert sp < tp < full


@given(
    seq=st.integers(1, 64),
    batch=st.integers(1, 4),
    hidden=st.integers(1, 64),
    heads=st.integers(1, 8),
    tp=st.integers(2, 8),
    e=st.sampled_from([2, 4]),
    m=st.sampled_from([0, 1]),
)
def test_sequence_parallel_memory_is_below_tensor_parallel_and_tp1_is_the_unsplit_layer(
    seq, batch, hidden, heads, tp, e, m
):
    kw = dict(bytes_per_value=e, mask_bytes=m)
    full = pt.activation_memory_per_layer(seq, batch, hidden, heads, **kw)
    assert pt.activation_memory_per_layer(seq, batch, hidden, heads, tp=1, **kw) == full
    plain = pt.activation_memory_per_layer(seq, batch, hidden, heads, tp=tp, **kw)
    sp = pt.activation_memory_per_layer(seq, batch, hidden, heads, tp=tp, sequence_parallel=True, **kw)
    assert sp < plain < full
    assert sp == pytest.approx(full / tp, rel=1e-12)
    # What plain tp leaves unsplit: 4 value-sized and 2 mask-sized activations per width unit.
    assert plain - sp == pytest.approx(seq * batch * hidden * (4 * e + 2 * m) * (1 - 1 / tp), rel=1e-12)


@given(nbytes=st.integers(0, 10**9), n=st.integers(1, 1024))
def test_all_reduce_moves_what_reduce_scatter_plus_all_gather_move(nbytes, n):
    total = pt.reduce_scatter_bytes(nbytes, n) + pt.all_gather_bytes(nbytes, n)
    assert pt.all_reduce_bytes(nbytes, n) == pytest.approx(total, rel=1e-12, abs=1e-9)
    assert pt.all_reduce_bytes(nbytes, n) < 2 * nbytes or nbytes == 0


def test_tensor_parallel_traffic_by_hand():
    # b = 2, s = 3, h = 4, float32: 96 bytes per activation; tp = 4: an all-reduce sends 2 * 3/4 * 96 = 144.
    per_layer = pt.tensor_parallel_bytes_per_layer(2, 3, 4, 4)
    assert per_layer == (2 * 144, 2 * 144) and per_layer.total == 576
    # Sequence parallelism: each all-reduce is a reduce-scatter + an all-gather (72 + 72 bytes): the same
    # bytes; storing only the shard of the 2 column layers' inputs costs 2 all-gathers more in backward.
    assert pt.tensor_parallel_bytes_per_layer(2, 3, 4, 4, sequence_parallel=True, regather=False) == per_layer
    assert pt.tensor_parallel_bytes_per_layer(2, 3, 4, 4, sequence_parallel=True) == (288, 288 + 2 * 72)
    assert pt.tensor_parallel_bytes_per_layer(2, 3, 4, 1).total == 0  # nothing to send alone
    # Whole model, 3 layers: + the embedding's g forward and the head's f backward, 144 each.
    assert pt.tensor_parallel_bytes(3, 2, 3, 4, 4) == (3 * 288 + 144, 3 * 288 + 144)
    sp = pt.tensor_parallel_bytes(3, 2, 3, 4, 4, sequence_parallel=True)
    assert sp == (3 * 288 + 144, 3 * (288 + 144) + 144)  # the head's input is not gathered again


def test_the_vocabulary_ends_by_hand_and_as_parts_of_the_whole_model():
    # b = 2, s = 3, h = 4, float32, tp = 4: 96 bytes per activation, an all-reduce sends 144, a
    # reduce-scatter or an all-gather 72. Embedding: g forward; head: f backward (or their SP pairs).
    assert pt.vocabulary_ends_bytes(2, 3, 4, 4) == ((144, 0), (0, 144))
    assert pt.vocabulary_ends_bytes(2, 3, 4, 4, sequence_parallel=True) == ((72, 72), (72, 72))
    for sp in (False, True):  # a pipeline stage holds one end: the whole model is the layers + both
        embedding, head = pt.vocabulary_ends_bytes(2, 3, 4, 4, sp)
        layer = pt.tensor_parallel_bytes_per_layer(2, 3, 4, 4, sp).total
        assert pt.tensor_parallel_bytes(3, 2, 3, 4, 4, sp).total == 3 * layer + embedding.total + head.total


def test_recursive_doubling_tied_and_sequence_parallel_grads_by_hand():
    # log2(n) whole arrays: at n = 2 what the ring sends, at n = 4 twice the array (ring: 1.5 times)
    assert pt.recursive_doubling_bytes(100, 2) == pt.all_reduce_bytes(100, 2) == 100
    assert pt.recursive_doubling_bytes(100, 4) == 200 and pt.all_reduce_bytes(100, 4) == 150
    assert pt.recursive_doubling_bytes(100, 1) == 0
    with pytest.raises(ValueError, match="power of two"):
        pt.recursive_doubling_bytes(100, 6)
    # the tied table's 33 x 8 float32 shard summed over 2 ranks: the shard once, in backward
    assert pt.tied_embedding_bytes(33, 8) == (0, 33 * 8 * 4)
    # 100 LayerNorm values summed over tp = 4 (a ring all-reduce of 400 bytes), in backward
    assert pt.sequence_parallel_grad_bytes(100, 4) == (0, 600)


def test_vocab_parallel_loss_traffic_by_hand():
    # b = 2, s = 5, float32: 40 bytes per all-reduce buffer; tp = 2 sends 40 of them; 3 all-reduces.
    assert pt.vocab_parallel_loss_bytes(2, 5, 2) == (120, 0)
    assert pt.vocab_parallel_loss_bytes(2, 5, 1) == (0, 0)


def test_context_parallel_traffic_by_hand():
    # b = 1, T = 8, h = 4, cp = 2, float32: a K block is 1 x 4 x 4 values = 64 bytes. Forward: K and V
    # one hop = 128; backward: K and V one hop (128) + dK and dV two hops (256).
    assert pt.context_parallel_bytes_per_layer(1, 8, 4, 2) == (128, 384)
    # tp = 2 halves the heads a rank holds, so its blocks
    assert pt.context_parallel_bytes_per_layer(1, 8, 4, 2, tp=2) == (64, 192)
    assert pt.context_parallel_bytes_per_layer(1, 8, 4, 1) == (0, 0)
    # cp = 4: blocks of 2 tokens (32 bytes), 3 hops forward for K and V
    assert pt.context_parallel_bytes_per_layer(1, 8, 4, 4).forward == 2 * 32 * 3


def test_pipeline_and_data_parallel_traffic_by_hand():
    assert pt.pipeline_bytes_per_boundary(2, 3, 4) == (96, 96)
    assert pt.pipeline_bytes_per_boundary(2, 4, 4, tp=2, sequence_parallel=True) == (64, 64)
    assert pt.data_parallel_bytes(1000, 4) == (0, 1500)  # 2 * 3/4 of the gradients, in backward


def test_communication_per_step_adds_up_the_parts():
    kw = dict(layers=4, batch=8, seq=16, hidden=32, grad_bytes=4000.0)
    got = pt.communication_per_step(**kw, dp=2, tp=2, pp=2, cp=2, sequence_parallel=True)
    b, s = 4, 8  # per dp rank; per cp rank
    tp = pt.tensor_parallel_bytes(2, b, s, 32, 2, True)
    loss = pt.vocab_parallel_loss_bytes(b, s, 2)
    assert got["tp"] == (tp.forward + loss.forward, tp.backward + loss.backward)
    cp = pt.context_parallel_bytes_per_layer(b, 16, 32, 2, tp=2)
    assert got["cp"] == (2 * cp.forward, 2 * cp.backward)
    assert got["pp"] == pt.pipeline_bytes_per_boundary(b, s, 32, 2, True)
    assert got["dp"] == pt.data_parallel_bytes(4000.0, 4)  # the dp x cp group
    alone = pt.communication_per_step(**kw)
    assert all(t.total == 0 for t in alone.values())


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: pt.activation_memory_per_layer(0, 1, 2, 1), "seq"),
        (lambda: pt.activation_memory_per_layer(4, 1, 2, 1, tp=2.0), "tp"),
        (lambda: pt.activation_memory_per_layer(4, 1, 2, 1, sequence_parallel=True), "tp > 1"),
        (lambda: pt.all_reduce_bytes(10, 0), "n must"),
        (lambda: pt.context_parallel_bytes_per_layer(1, 8, 4, 0), "cp"),
        (lambda: pt.communication_per_step(3, 8, 16, 32, 1.0, pp=2), "layers % pp"),
    ],
)
def test_bad_sizes_raise_value_error(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_numpy_integers_are_sizes():
    assert pt.activation_memory_per_layer(np.int64(4), 1, 2, 1) == 352


def test_formulas_are_the_bytes_minidist_sends_on_two_ranks(tmp_path):
    """ParallelGPT (tp 2, with and without sequence parallelism) and ring_attention (cp 2), one step,
    the bytes counted at the collectives and sends (tests/workers/perfmodel/traffic.py). About 5 s."""
    import json

    from mpi_utils import run_mpi

    run_mpi(2, "perfmodel/traffic.py", tmp_path, timeout=120)
    got = json.loads((tmp_path / "traffic.json").read_text())
    b, t, c, layers, e = 2, 8, 16, 2, 8  # the worker's GPT, float64
    for key, sp in (("tp", False), ("tp_sp", True)):
        model = pt.tensor_parallel_bytes(layers, b, t, c, 2, sp, e)
        loss = pt.vocab_parallel_loss_bytes(b, t, 2, e)
        assert got[key]["forward"] == pytest.approx(model.forward + loss.forward, rel=1e-12), key
        assert got[key]["backward"] == pytest.approx(model.backward + loss.backward, rel=1e-12), key
    ring = pt.context_parallel_bytes_per_layer(b, t, c, 2, bytes_per_value=e)
    assert got["cp"] == pytest.approx({"forward": ring.forward, "backward": ring.backward}, rel=1e-12)
