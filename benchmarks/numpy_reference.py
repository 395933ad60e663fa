"""A NumPy-only training loop with a hand-written backward: the yardstick for minidist's fixed costs.

This reproduces the workload of ShallowSpeed (a small NumPy + mpi4py framework whose every backward is
written out by hand), not its code: an MLP of Linear layers with ReLU between them, softmax
cross-entropy (mean over the batch), plain SGD, float32, C-contiguous (row-major) arrays, weights of
shape (out, in) as minidist's and PyTorch's. Nothing here builds a graph or checks an argument: each
step is only the arithmetic, so ``minidist step time / reference step time`` is what minidist's
bookkeeping costs (``benchmarks/peer.py`` runs the comparison).

Parallel versions, with mpi4py directly:

* data parallel: every gradient is a view into one flat buffer, averaged with a single
  ``Allreduce`` after the backward (no buckets, no overlap: the simplest correct way);
* GPipe with 2 or more stages (Huang et al. 2019, §2.2): all microbatches forward, each stage
  ``Send``-ing its activations on, then all backward in reverse order, gradients travelling back;
  with a dp group as well the stage's flat gradient is averaged over it after the last backward.

    linear:  y = x W^T + b          dW = g^T x,  db = sum_rows g,  dx = g W
    relu:    y = max(x, 0)          dx = g * [y > 0]
    loss:    L = mean_n(logsumexp(z_n) - z_n[t_n])     dz = (softmax(z) - onehot(t)) / N
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from mpi4py import MPI


class ReferenceStage:
    """Consecutive Linear layers of the MLP (a whole model, or one pipeline stage).

    ``params``: ``[W_0, b_0, W_1, b_1, ...]`` float32 arrays, ``W_k`` of shape (out, in), copied.
    ``head``: True if this stage's last layer is the model's last (no ReLU after it, the loss follows).
    Gradients live in ``self.grads`` (same order and shapes as ``self.params``), views into the one
    flat array ``self.flat_grad`` so that a data-parallel average is one ``Allreduce``.
    """

    def __init__(self, params: Sequence[np.ndarray], head: bool) -> None:
        self.params = [np.array(p, dtype=np.float32, order="C") for p in params]
        self.head = head
        self.flat_grad = np.zeros(sum(p.size for p in self.params), dtype=np.float32)
        self.grads, offset = [], 0
        for p in self.params:
            self.grads.append(self.flat_grad[offset : offset + p.size].reshape(p.shape))
            offset += p.size
        self._saved: dict[int, list[np.ndarray]] = {}  # microbatch -> each layer's input

    def forward(self, x: np.ndarray, microbatch: int = 0) -> np.ndarray:
        """(B, in) -> (B, out); keeps each layer's input for the backward of ``microbatch``."""
        inputs = []
        n_layers = len(self.params) // 2
        for k in range(n_layers):
            inputs.append(x)
            w, b = self.params[2 * k], self.params[2 * k + 1]
            x = x @ w.T
            x += b
            if k < n_layers - 1 or not self.head:
                np.maximum(x, 0, out=x)  # in place: the output itself tells where the ReLU passed
        inputs.append(x)  # the output (the ReLU's derivative reads it)
        self._saved[microbatch] = inputs
        return x

    def backward(self, grad: np.ndarray, microbatch: int = 0) -> np.ndarray:
        """Gradient of the stage's output (B, out) -> of its input (B, in); ADDS to ``self.grads``."""
        inputs = self._saved.pop(microbatch)
        n_layers = len(self.params) // 2
        for k in reversed(range(n_layers)):
            if k < n_layers - 1 or not self.head:
                grad = grad * (inputs[k + 1] > 0)
            self.grads[2 * k] += grad.T @ inputs[k]
            self.grads[2 * k + 1] += grad.sum(axis=0)
            grad = grad @ self.params[2 * k]
        return grad

    def zero_grad(self) -> None:
        self.flat_grad[:] = 0.0

    def sgd(self, lr: float) -> None:
        """p -= lr * grad for every parameter, in place."""
        for p, g in zip(self.params, self.grads):
            p -= lr * g


def compare(theirs: Sequence, ours: Sequence, rtol: float, atol: float) -> tuple[float, bool]:
    """How far one contender's parameters are from another's, pair by pair: (the largest |difference|,
    whether every pair is ``allclose(rtol, atol)``). Parameters are arrays or minidist Tensors (their
    ``.data``), in the same order and shapes on both sides; the benchmarks' checks before timing use it."""
    a = [p if isinstance(p, np.ndarray) else np.asarray(p.data) for p in theirs]
    b = [p if isinstance(p, np.ndarray) else np.asarray(p.data) for p in ours]
    diff = max(float(np.max(np.abs(x - y))) for x, y in zip(a, b))
    return diff, all(np.allclose(x, y, rtol=rtol, atol=atol) for x, y in zip(a, b))


def cross_entropy(logits: np.ndarray, targets: np.ndarray, scale: float = 1.0) -> tuple[float, np.ndarray]:
    """(mean softmax cross-entropy over the N rows, its gradient w.r.t. ``logits`` times ``scale``)."""
    z = logits - logits.max(axis=1, keepdims=True)  # shift: exp cannot overflow, softmax unchanged
    e = np.exp(z)
    total = e.sum(axis=1, keepdims=True)
    rows = np.arange(len(targets))
    loss = float(np.mean(np.log(total[:, 0]) - z[rows, targets]))
    grad = e / total
    grad[rows, targets] -= 1.0
    grad *= scale / len(targets)
    return loss, grad


def average(flat: np.ndarray, dp: MPI.Comm | None) -> None:
    """The data-parallel mean of a flat gradient, in place: one mpi4py ``Allreduce`` of the sum over
    ``dp``, then / its size; nothing without ``dp`` or with one rank."""
    if dp is not None and dp.Get_size() > 1:
        dp.Allreduce(MPI.IN_PLACE, flat, op=MPI.SUM)
        flat /= dp.Get_size()


def dp_step(stage: ReferenceStage, x: np.ndarray, y: np.ndarray, lr: float, dp: MPI.Comm | None) -> float:
    """One SGD step of a whole model on this rank's batch; gradients averaged over ``dp`` (if > 1 rank).
    Equal batch shares per rank, so the average of the ranks' mean gradients is the global mean's."""
    stage.zero_grad()
    loss, grad = cross_entropy(stage.forward(x), y)
    stage.backward(grad)
    average(stage.flat_grad, dp)
    stage.sgd(lr)
    return loss


def gpipe_step(
    stage: ReferenceStage,
    x: np.ndarray | None,
    y: np.ndarray | None,
    lr: float,
    microbatches: int,
    pp: MPI.Comm,
    dp: MPI.Comm | None = None,
) -> float:
    """One GPipe step on this rank's stage (``pp.rank``); returns the mean loss on the last stage, else
    nan. ``x`` is needed on stage 0, ``y`` on the last; both are cut into ``microbatches`` equal rows."""
    s, p = pp.Get_rank(), pp.Get_size()
    stage.zero_grad()
    n = len(x) if s == 0 else len(y)  # type: ignore[arg-type]
    size = n // microbatches
    width_in = stage.params[0].shape[1]
    loss, loss_grads = 0.0, {}
    for i in range(microbatches):  # all forwards: activations flow to stage s + 1
        if s == 0:
            inp = x[i * size : (i + 1) * size]  # type: ignore[index]
        else:
            inp = np.empty((size, width_in), dtype=np.float32)
            pp.Recv(inp, source=s - 1, tag=i)
        out = stage.forward(inp, i)
        if s < p - 1:
            pp.Send(out, dest=s + 1, tag=i)
        else:
            # each microbatch's mean, scaled by 1/m: the gradient of the mean over the whole batch
            targets = y[i * size : (i + 1) * size]  # type: ignore[index]
            part, loss_grads[i] = cross_entropy(out, targets, scale=1.0 / microbatches)
            loss += part / microbatches
    width_out = stage.params[-2].shape[0]
    for i in reversed(range(microbatches)):  # all backwards, the last microbatch first
        if s == p - 1:
            grad = loss_grads.pop(i)
        else:
            grad = np.empty((size, width_out), dtype=np.float32)
            pp.Recv(grad, source=s + 1, tag=microbatches + i)
        grad_in = stage.backward(grad, i)
        if s > 0:
            pp.Send(grad_in, dest=s - 1, tag=microbatches + i)
    average(stage.flat_grad, dp)
    stage.sgd(lr)
    return loss if s == p - 1 else float("nan")
