"""A replayed training step (minidist.compile) gives the eager step's results bit for bit, and falls back to
eager, with a one-line reason, whenever a guard says the recording does not fit the call."""

from __future__ import annotations

import numpy as np
import pytest
from replay_steps import train_steps

import minidist as md
from minidist import nn, optim
from minidist.compile import Replay, ReplayFallbackWarning
from minidist.models import GPT, GPTConfig
from minidist.models.mlp import MLP
from minidist.nn import functional as F


def mlp_batches(n, rows=32):
    rng = np.random.default_rng(1)
    return [(rng.standard_normal((rows, 16)).astype(np.float32), rng.integers(0, 10, rows)) for _ in range(n)]


def gpt_batches(n, vocab=40, batch=3, block=16):
    rng = np.random.default_rng(2)
    return [
        (rng.integers(0, vocab, (batch, block)), rng.integers(0, vocab, (batch, block))) for _ in range(n)
    ]


def make(kind, optimizer, dropout=0.0):
    md.manual_seed(0)
    if kind == "mlp":
        model = MLP(16, [32, 32], 10)

        def loss_fn(x, y):
            return F.cross_entropy(model(x), y)
    else:
        model = GPT(GPTConfig(vocab_size=40, block_size=16, n_layer=2, n_head=2, n_embd=16, dropout=dropout))

        def loss_fn(x, y):
            return F.cross_entropy(model(x).reshape(-1, 40), y.reshape(-1))

    params = list(model.parameters())
    if optimizer == "adamw":
        groups = [
            {"params": [p for p in params if p.ndim >= 2], "weight_decay": 0.1},
            {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0},
        ]
        opt = optim.AdamW(groups, lr=2e-3, betas=(0.9, 0.99))
    else:
        opt = optim.SGD(params, lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-3)
    return model, opt, loss_fn


def train(kind, optimizer, batches, replay, dropout=0.0):
    """Losses and final parameters of eager steps, or of ``Replay`` steps, from the same seed."""
    model, opt, loss_fn = make(kind, optimizer, dropout)
    step = Replay(model, opt, loss_fn, max_grad_norm=0.5)
    losses = train_steps(step, batches, replay)
    return losses, [p.data.copy() for p in model.parameters()], opt, step


def assert_same(a, b):
    assert a[0] == b[0]
    for x, y in zip(a[1], b[1]):
        assert x.tobytes() == y.tobytes()


@pytest.mark.parametrize("kind, optimizer, dropout", [
    ("mlp", "sgd", 0.0), ("mlp", "adamw", 0.0),
    ("gpt", "adamw", 0.0), ("gpt", "adamw", 0.1), ("gpt", "sgd", 0.1),
])  # fmt: skip
def test_replay_is_bit_identical_to_eager(kind, optimizer, dropout):
    batches = mlp_batches(6) if kind == "mlp" else gpt_batches(5)
    eager = train(kind, optimizer, batches, replay=False, dropout=dropout)
    replayed = train(kind, optimizer, batches, replay=True, dropout=dropout)
    assert replayed[3].replays == len(batches) - 2  # calls 1 and 2 record, the rest replay
    assert_same(eager, replayed)
    for i, state in eager[2].state.items():  # the optimizer's state too (moments, step counts)
        for key, value in state.items():
            other = replayed[2].state[i][key]
            assert np.array_equal(value, other) if isinstance(value, np.ndarray) else value == other
    assert replayed[2].step_count == eager[2].step_count


def test_the_program_prints_the_ops_and_the_backward_order():
    *_, step = train("mlp", "sgd", mlp_batches(3), replay=True)
    text = repr(step.program)
    assert "LinearReLU(%0, %1, %2)" in text and "CrossEntropy(" in text and "targets=input1" in text
    assert "backward from" in text and "CrossEntropy.backward" in text


def fallback(step, *inputs):
    with pytest.warns(ReplayFallbackWarning) as caught:
        step(*inputs)
    assert len(caught) == 1 and "\n" not in str(caught[0].message)
    return step.fallback_reason


def replaying_mlp():
    """An MLP step recorded on its first two batches and replayed on the third: (model, step, batches)."""
    model, opt, loss_fn = make("mlp", "sgd")
    step = Replay(model, opt, loss_fn)
    batches = mlp_batches(3)
    for x, y in batches:
        step(x, y)
    assert step.replays == 1
    return model, step, batches


def test_guards_fall_back_with_a_reason_and_replay_resumes():
    model, step, batches = replaying_mlp()
    x, y = mlp_batches(1, rows=8)[0]
    assert "inputs are (8, 16) float32" in fallback(step, x, y)
    model.eval()
    assert "training mode" in fallback(step, *batches[0])
    model.train()
    with md.no_grad(), pytest.warns(ReplayFallbackWarning, match="grad mode is off"):
        with pytest.raises(RuntimeError, match="does not require grad"):  # as the eager step would
            step(*batches[0])
    step(*batches[0])  # back to what was recorded: replayed again
    assert step.replays == 2 and step.fallback_reason is None
    model.temperature = nn.Parameter(np.ones(1, np.float32))  # a new parameter
    assert "parameters changed" in fallback(step, *batches[0])


def test_a_negative_target_runs_eagerly_and_gets_the_eager_error():
    """NumPy would read target -1 as the last class, silently; the eager step refuses it."""
    model, step, batches = replaying_mlp()
    x, y = batches[0]
    y = y.copy()
    y[3] = -1
    with pytest.warns(ReplayFallbackWarning, match="integer input .* is negative"):
        with pytest.raises((IndexError, ValueError)):
            step(x, y)
    assert step.replays == 1


def test_a_step_that_cannot_be_recorded_runs_eagerly():
    model, opt, _ = make("mlp", "sgd")

    def loss_fn(x, y):  # the recording cannot follow a slice taken outside the ops
        return F.cross_entropy(model(x[:16]), y[:16])

    step = Replay(model, opt, loss_fn)
    with pytest.warns(ReplayFallbackWarning, match="part of step input 0"):
        for x, y in mlp_batches(3):
            step(x, y)
    assert step.replays == 0

    def copied(x, y):  # a copy of the input made outside the ops: the two recordings' constants differ
        return F.cross_entropy(model(md.tensor(x)), y)

    step = Replay(model, opt, copied)
    with pytest.warns(ReplayFallbackWarning, match="recordings of the step differ"):
        for x, y in mlp_batches(3):
            step(x, y)
    assert step.replays == 0


def test_recomputation_and_autocast_are_not_recorded():
    md.manual_seed(0)
    model = MLP(16, [32, 32], 10, recompute=True)  # its hidden blocks run forward again inside backward
    opt = optim.SGD(model.parameters(), lr=0.1)
    step = Replay(model, opt, lambda x, y: F.cross_entropy(model(x), y))
    with pytest.warns(ReplayFallbackWarning, match="inside backward"):
        for x, y in mlp_batches(3):
            step(x, y)
    assert step.replays == 0
    model, opt, loss_fn = make("mlp", "sgd")
    step = Replay(model, opt, loss_fn)
    with md.autocast(np.float16), pytest.warns(ReplayFallbackWarning, match="autocast is on"):
        for x, y in mlp_batches(3):
            step(x, y)
    assert step.replays == 0


def test_a_frozen_parameter_falls_back():
    model, step, batches = replaying_mlp()
    model[0].weight.requires_grad = False
    assert "requires_grad changed" in fallback(step, *batches[0])


def test_the_gpu_backend_runs_eagerly_and_says_so(monkeypatch):
    from cupy_stand_in import install  # noqa: PLC0415  (tests/helpers: device arrays that refuse np.)

    install(monkeypatch)
    model, opt, loss_fn = make("mlp", "sgd")  # its parameters are device arrays now
    step = Replay(model, opt, loss_fn)
    with pytest.warns(ReplayFallbackWarning, match="GPU backend"):
        for x, y in mlp_batches(3):
            step(x, y)
    assert step.replays == 0


def test_a_graph_walk_that_reports_nothing_is_not_replayed(monkeypatch):
    """An assignment's own run_backward lacks the tape's lines: the step must run eagerly, not replay
    a backward with no steps (which would leave every gradient unset)."""
    import sys  # noqa: PLC0415

    from minidist.autograd import graph  # noqa: PLC0415

    tensor = sys.modules["minidist.autograd.tensor"]  # (the package's name `tensor` is the function)

    def walk_without_tape(root, grad, retain_graph=False):
        tape, graph._tape = graph._tape, None
        try:
            graph.run_backward(root, grad, retain_graph)
        finally:
            graph._tape = tape

    monkeypatch.setattr(tensor, "run_backward", walk_without_tape)
    model, opt, loss_fn = make("mlp", "sgd")
    step = Replay(model, opt, loss_fn)
    with pytest.warns(ReplayFallbackWarning, match="reported nothing"):
        for x, y in mlp_batches(3):
            step(x, y)
    assert step.replays == 0
