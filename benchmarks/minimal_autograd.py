"""The least any autograd engine must do for the small MLP: one graph node per op, and a walk over them.

A yardstick between the hand-written NumPy reference (``numpy_reference.py``: no graph at all) and
minidist's engine (issue 16, "Measured floors" in ``benchmarks/README.md``). The arithmetic is the
reference's, line for line (it reuses its parameters, gradient views and loss); what is added is only
what *recording* the computation costs in Python:

* every op creates one ``Node`` (the arrays its backward needs, the nodes of its inputs) and one
  output ``Var`` (the array and the node that made it);
* ``backward`` walks the nodes in reverse order of creation, which is a topological order of any
  graph recorded this way (a Wengert list / tape: Griewank & Walther, "Evaluating Derivatives", 2nd
  ed. 2008, ch. 3), and adds each gradient into its input's running sum, leaves into their ``.grad``.

Nothing else: no checks of shapes, dtypes or versions, no hooks, no modules, no ``no_grad``. The walk
frees each node (and so the arrays its backward saved) as soon as it has run. An engine that users can
write new ops for must do at least this much per op, so ``minimal - reference`` (instructions or time
per step) is the price of having a graph at all, and ``minidist - minimal`` is what minidist's checks
and features cost on top. Two steps, each the reference's with a tape in place of the hand-written backward:
``minimal_step`` (one rank, or data parallel: ``dp_step``) and ``minimal_gpipe_step`` (GPipe with the
reference's blocking mpi4py messages: ``gpipe_step``, one tape per microbatch per stage).
``benchmarks/peer.py`` times both beside minidist, the reference and PyTorch.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from mpi4py import MPI
from numpy_reference import ReferenceStage, cross_entropy


class Var:
    """An array, the node that made it (None for a leaf) and the gradient summed so far."""

    __slots__ = ("data", "node", "grad")

    def __init__(self, data: np.ndarray, node: Node | None = None, grad: np.ndarray | None = None) -> None:
        self.data, self.node, self.grad = data, node, grad


class Node:
    """One recorded op: its inputs and a function from the output's gradient to the inputs' gradients."""

    __slots__ = ("inputs", "backward", "output")

    def __init__(self, inputs: tuple[Var, ...], backward: Callable) -> None:
        self.inputs, self.backward = inputs, backward


class Tape:
    """The graph of one forward pass, as the list of its nodes in order of creation."""

    def __init__(self) -> None:
        self.nodes: list[Node] = []

    def record(self, data: np.ndarray, inputs: tuple[Var, ...], backward: Callable) -> Var:
        node = Node(inputs, backward)
        self.nodes.append(node)
        node.output = Var(data, node)
        return node.output

    def linear(self, x: Var, w: Var, b: Var, input_grad: bool = False) -> Var:
        """(B, in) @ (out, in)^T + (out,). An input gradient only if ``x`` was computed (none for a leaf
        batch, as minidist's F.linear) or ``input_grad`` (a pipeline stage's received activations)."""
        y = x.data @ w.data.T
        y += b.data
        xd, wd, need_dx = x.data, w.data, input_grad or x.node is not None
        return self.record(y, (x, w, b), lambda g: (g @ wd if need_dx else None, g.T @ xd, g.sum(axis=0)))

    def relu(self, x: Var) -> Var:
        y = np.maximum(x.data, 0, out=x.data)  # in place, as the reference (the linear saved its input)
        return self.record(y, (x,), lambda g: (g * (y > 0),))

    def cross_entropy(self, logits: Var, targets: np.ndarray, scale: float = 1.0) -> tuple[float, Var]:
        """(the mean loss, its Var); the gradient is the reference's, times ``scale`` (1/m for GPipe)."""
        loss, grad = cross_entropy(logits.data, targets, scale)  # the reference's loss and its gradient
        return loss, self.record(np.float32(loss), (logits,), lambda g: (grad * g,))

    def backward(self, root: Var, grad: np.ndarray | None = None) -> None:
        """Gradients of ``root`` (seeded with ``grad``, or 1 for a loss: a pipeline stage's output starts
        from the gradient it received) into every recorded input; a leaf's are summed into its ``.grad``."""
        root.grad = np.float32(1.0) if grad is None else grad
        # Pop each node and drop its output's gradient once used, as the reference drops each saved
        # input in its backward: the freed arrays are reused while still in cache. Walking a list kept
        # whole until the step ends timed 3-4 % slower on the small MLP (benchmarks/README.md, "The floor,
        # timed"), which is memory held, not the price of a graph.
        while self.nodes:
            node = self.nodes.pop()
            g, node.output.grad = node.output.grad, None
            for inp, g_inp in zip(node.inputs, node.backward(g)):
                if g_inp is None:
                    continue
                if inp.grad is None:
                    inp.grad = g_inp
                else:  # a leaf's .grad is the reference's view into its flat buffer: add in place
                    inp.grad += g_inp


def forward_layers(tape: Tape, params: list[Var], h: Var, head: bool, input_grad: bool = False) -> Var:
    """The Linear layers ``params`` (``[W_0, b_0, ...]``) on ``h``, a ReLU after each but a head's last
    (as ``ReferenceStage.forward``); ``input_grad``: record the gradient of ``h`` itself."""
    n_layers = len(params) // 2
    for k in range(n_layers):
        h = tape.linear(h, params[2 * k], params[2 * k + 1], input_grad and k == 0)
        if k < n_layers - 1 or not head:
            h = tape.relu(h)
    return h


def minimal_step(
    stage: ReferenceStage, x: np.ndarray, y: np.ndarray, lr: float, allreduce: Callable
) -> float:
    """One SGD step of the whole model ``stage`` (``head=True``) through a tape; ``allreduce(flat)``
    averages the flat gradient (a no-op on one rank). Same arithmetic as ``numpy_reference.dp_step``."""
    stage.zero_grad()
    params = [Var(p, None, g) for p, g in zip(stage.params, stage.grads)]
    tape = Tape()
    loss, root = tape.cross_entropy(forward_layers(tape, params, Var(x), head=True), y)
    tape.backward(root)
    allreduce(stage.flat_grad)
    stage.sgd(lr)
    return loss


def minimal_gpipe_step(
    stage: ReferenceStage,
    x: np.ndarray | None,
    y: np.ndarray | None,
    lr: float,
    microbatches: int,
    pp: MPI.Comm,
    allreduce: Callable,
) -> float:
    """One GPipe step of this rank's stage (``pp.rank``) with one tape per microbatch: the messages (blocking
    ``Send``/``Recv``, same tags and order) and the arithmetic of ``numpy_reference.gpipe_step``; then
    ``allreduce(flat)`` averages the stage's flat gradient over the dp group (a no-op without one).
    Returns the mean loss on the last stage, else nan. ``x``: the batch (stage 0), ``y``: the targets
    (last stage), both cut into ``microbatches`` equal row blocks.

    A stage after the first records the gradient of its received input (to send back); its backward
    starts from the output gradient it receives. Stage 0 computes no input gradient (nobody needs it;
    the reference's ``ReferenceStage.backward`` does compute it, one (rows, 256) @ (256, 64) matmul
    per microbatch that it then drops)."""
    s, p = pp.Get_rank(), pp.Get_size()
    stage.zero_grad()
    params = [Var(q, None, g) for q, g in zip(stage.params, stage.grads)]
    size = (len(x) if s == 0 else len(y)) // microbatches  # type: ignore[arg-type]
    width_in, width_out = stage.params[0].shape[1], stage.params[-2].shape[0]
    loss, recorded = 0.0, []  # per microbatch: (its tape, the Var its backward starts from, the input)
    for i in range(microbatches):  # all forwards
        if s == 0:
            inp = Var(x[i * size : (i + 1) * size])  # type: ignore[index]
        else:
            inp = Var(np.empty((size, width_in), dtype=np.float32))
            pp.Recv(inp.data, source=s - 1, tag=i)
        tape = Tape()
        out = forward_layers(tape, params, inp, stage.head, input_grad=s > 0)
        if s < p - 1:
            pp.Send(out.data, dest=s + 1, tag=i)
        else:  # each microbatch's mean times 1/m: the gradient of the whole batch's mean
            targets = y[i * size : (i + 1) * size]  # type: ignore[index]
            part, out = tape.cross_entropy(out, targets, 1.0 / microbatches)
            loss += part / microbatches
        recorded.append((tape, out, inp))
    for i in reversed(range(microbatches)):  # all backwards, the last microbatch first
        tape, out, inp = recorded.pop()
        if s == p - 1:
            tape.backward(out)
        else:
            grad = np.empty((size, width_out), dtype=np.float32)
            pp.Recv(grad, source=s + 1, tag=microbatches + i)
            tape.backward(out, grad)
        if s > 0:
            pp.Send(inp.grad, dest=s - 1, tag=microbatches + i)
    allreduce(stage.flat_grad)
    stage.sgd(lr)
    return loss if s == p - 1 else float("nan")
