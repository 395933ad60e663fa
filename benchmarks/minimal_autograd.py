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

Nothing else: no checks of shapes, dtypes or versions, no hooks, no modules, no ``no_grad``, no
freeing of saved arrays. The tape is freed by dropping it. An engine that users can write new ops for
must do at least this much per op, so ``minimal - reference`` instructions per step is the price of
having a graph at all, and ``minidist - minimal`` is what minidist's checks and features cost on top.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
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

    def linear(self, x: Var, w: Var, b: Var) -> Var:
        """(B, in) @ (out, in)^T + (out,); no input gradient for a leaf batch (as minidist's F.linear)."""
        y = x.data @ w.data.T
        y += b.data
        xd, wd, need_dx = x.data, w.data, x.node is not None
        return self.record(y, (x, w, b), lambda g: (g @ wd if need_dx else None, g.T @ xd, g.sum(axis=0)))

    def relu(self, x: Var) -> Var:
        y = np.maximum(x.data, 0, out=x.data)  # in place, as the reference (the linear saved its input)
        return self.record(y, (x,), lambda g: (g * (y > 0),))

    def cross_entropy(self, logits: Var, targets: np.ndarray) -> tuple[float, Var]:
        loss, grad = cross_entropy(logits.data, targets)  # the reference's loss and its gradient
        return loss, self.record(np.float32(loss), (logits,), lambda g: (grad * g,))

    def backward(self, root: Var) -> None:
        root.grad = np.float32(1.0)
        for node in reversed(self.nodes):
            g = node.output.grad
            for inp, g_inp in zip(node.inputs, node.backward(g)):
                if g_inp is None:
                    continue
                if inp.grad is None:
                    inp.grad = g_inp
                else:  # a leaf's .grad is the reference's view into its flat buffer: add in place
                    inp.grad += g_inp


def minimal_step(
    stage: ReferenceStage, x: np.ndarray, y: np.ndarray, lr: float, allreduce: Callable
) -> float:
    """One SGD step of the whole model ``stage`` (``head=True``) through a tape; ``allreduce(flat)``
    averages the flat gradient (a no-op on one rank). Same arithmetic as ``numpy_reference.dp_step``."""
    stage.zero_grad()
    params = [Var(p, None, g) for p, g in zip(stage.params, stage.grads)]
    tape = Tape()
    h = Var(x)
    n_layers = len(params) // 2
    for k in range(n_layers):
        h = tape.linear(h, params[2 * k], params[2 * k + 1])
        if k < n_layers - 1:
            h = tape.relu(h)
    loss, root = tape.cross_entropy(h, y)
    tape.backward(root)
    allreduce(stage.flat_grad)
    stage.sgd(lr)
    return loss
