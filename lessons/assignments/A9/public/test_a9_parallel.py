"""A9 public tests: the vocabulary-parallel cross-entropy and ring attention, against one process.

The MPI tests run 2 or 3 real ranks (``workers/a9_check.py``; 3 launches, so that an untouched
starter is graded quickly): every rank draws the same whole arrays,
computes the one-process answer itself (``F.cross_entropy`` of all the logits, or
``F.scaled_dot_product_attention`` of the whole sequence) and compares its own piece, in float64. The
two tests of ring attention's parts need no ranks: the causal plan (``attention_blocks``) against the
mask itself, and the online softmax step against the softmax of all scores at once (``a9lib.py``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from gradelib import assert_no_failures, run_ranks

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # a9lib.py, beside this folder
import a9lib  # noqa: E402

WORKER = Path(__file__).resolve().parents[1] / "workers" / "a9_check.py"


def loss(seed: int, vocab: int, shape: tuple[int, ...], reduction: str, backward: bool = False) -> dict:
    return {
        "kind": "loss", "seed": seed, "vocab": vocab, "shape": list(shape), "reduction": reduction,
        "backward": backward,
    }  # fmt: skip


def ring(seed: int, shape: tuple[int, ...], causal: bool, layout: str, backward: bool = False) -> dict:
    return {
        "kind": "ring", "seed": seed, "shape": list(shape), "causal": causal, "layout": layout,
        "backward": backward,
    }  # fmt: skip


@pytest.mark.mpi
def test_vocab_parallel_loss_forward():
    cases = [loss(0, 65, (2, 3), "none"), loss(1, 10, (4,), "mean")]  # 65 = 33 + 32: uneven
    assert_no_failures(run_ranks(2, WORKER, {"cases": cases}))


@pytest.mark.mpi
def test_vocab_parallel_loss_backward():
    cases = [loss(2, 65, (2, 3), "mean", backward=True), loss(3, 9, (5,), "none", backward=True)]
    assert_no_failures(run_ranks(2, WORKER, {"cases": cases}))


def test_causal_plan():
    failures = []
    for seq_len, cp, layout in [(8, 2, "balanced"), (12, 3, "contiguous"), (12, 3, "balanced")]:
        failures += a9lib.plan_failures(seq_len, cp, layout)
    assert not failures, failures[0]


def test_online_softmax_step():
    failures = a9lib.online_step_failures(seed=0)
    assert not failures, failures[0]


@pytest.mark.mpi
def test_ring_attention_three_ranks():
    cases = [
        ring(6, (1, 2, 12, 3), True, "contiguous"),
        ring(7, (1, 1, 12, 2), True, "balanced", True),
        ring(5, (2, 1, 6, 2), False, "contiguous", True),
    ]
    assert_no_failures(run_ranks(3, WORKER, {"cases": cases}))
