"""The recorded program of one training step, and how it is recorded and replayed.

Recording: while one eager step runs, ``Function.apply`` reports every op (class, options, which
tensors went in, the tensor that came out) and the graph walk (``autograd/graph.py``) reports, in the
order it did them, every op whose backward it ran and every leaf whose ``.grad`` it set. Each tensor
gets a *slot*, an index into the list of arrays the replay fills: an op's result, a step input (or a
reshaped view of one), or a tensor from outside the step (a parameter, a constant) whose ``_data`` is
read afresh at every replay.

Replaying: the same ``forward`` and ``backward`` methods on the arrays, in the recorded order, with no
``Tensor``, version counter, graph or topological sort; gradients that meet at a tensor are summed in
the order the eager walk summed them, so every result has the same bits. What a replay leaves out
(argument checks, saved-version checks, the return-value checks of a backward) was checked when the
step was recorded, on the same shapes and dtypes (the guards, ``guards.py``, see that they still are).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from minidist.autograd import Tensor, autocast, function, grad_mode, graph
from minidist.compile.kernels import KERNELS


class _Meta:
    """What an op's backward may ask of its inputs at replay: ``requires_grad``, ``shape``, ``dtype``."""

    __slots__ = ("requires_grad", "shape", "dtype")

    def __init__(self, t: Tensor) -> None:
        self.requires_grad, self.shape, self.dtype = t.requires_grad, t.shape, t.dtype


class Op:
    """One recorded op: ``cls().forward(*arrays at args, **options)`` into slot ``out``.

    ``patches``: ``(option name, input index, shape)`` for an option that is a step input (integer
    token ids, class targets), filled in at each replay.
    """

    __slots__ = ("cls", "kernel", "args", "options", "patches", "out", "metas")

    def __init__(self, cls: type, args: tuple, options: dict, patches: list, out: int, metas: tuple) -> None:
        self.cls, self.args, self.options, self.patches = cls, args, options, patches
        self.out, self.metas = out, metas
        self.kernel = KERNELS.get(cls, cls)  # what the replay runs: the op or its variant (kernels.py)

    def __repr__(self) -> str:
        opts = {k: _short(v) for k, v in self.options.items()}
        opts.update({k: f"input{i}" for k, i, _ in self.patches})
        args = ", ".join(f"%{a}" for a in self.args)
        return (
            f"%{self.out} = {self.kernel.__name__}({args}{', ' if opts else ''}"
            + ", ".join(f"{k}={v}" for k, v in opts.items())
            + ")"
        )


def _short(v: Any) -> str:
    return f"<array {v.dtype}{list(v.shape)}>" if isinstance(v, np.ndarray) else repr(v)


class Program:
    """A step as recorded: ``sources`` fill the slots that no op computes, ``ops`` run forward in order,
    ``tape`` is the backward: ``("op", i)`` runs op i's backward, ``("leaf", slot, tensor, owned)`` sets a
    leaf's ``.grad`` (a copy unless ``owned``) and runs its post-accumulate hooks (DDP's bucket all-reduce).
    """

    def __init__(self, inputs: tuple) -> None:
        self.inputs = inputs
        self.sources: list[tuple[int, Any]] = []  # (slot, ("input", k, shape) | ("tensor", t))
        self.ops: list[Op] = []
        self.tape: list[tuple] = []
        self.grad_inputs: list[tuple] = []  # per op: (slot, requires_grad, dtype) per input
        self.root = -1  # the loss's slot
        self._slot: dict[int, int] = {}  # id(tensor) -> slot, while recording
        self._keep: list[Tensor] = []  # the recorded tensors stay alive: their ids stay theirs
        self._n = 0
        self.invalid: str | None = None  # why this recording cannot be replayed, found while recording

    def __repr__(self) -> str:
        lines = [f"program: {len(self.ops)} ops forward, {len(self.tape)} steps backward"]
        for slot, src in self.sources:
            what = f"input{src[1]}{list(src[2])}" if src[0] == "input" else _source_name(src[1])
            lines.append(f"%{slot} = {what}")
        lines += [repr(op) for op in self.ops]
        lines.append(f"backward from %{self.root}:")
        for entry in self.tape:
            if entry[0] == "op":
                op = self.ops[entry[1]]
                lines.append(f"  {op.cls.__name__}.backward(d%{op.out})")
            else:
                lines.append(f"  .grad of %{entry[1]} {list(entry[2].shape)} (+ hooks)")
        return "\n".join(lines)

    # -- recording ---------------------------------------------------------------------------------
    def record(self, cls: type, tensors: tuple, options: dict, out: Tensor) -> None:
        """``Function.apply``'s report of one op (``autograd/function.py``)."""
        if grad_mode._in_backward and self.invalid is None:  # recomputation (nn.recompute) in backward
            self.invalid = f"{cls.__name__} ran inside backward (activation recomputation)"
        if autocast.low_dtype is not None:  # apply runs such ops on float32 copies: not what forward does
            self.invalid = "autocast is on (its ops run on float32 copies inside Function.apply)"
        args = tuple(self._slot_of(t) for t in tensors)
        static, patches = {}, []
        for key, value in options.items():
            where = self._input_of(value) if isinstance(value, np.ndarray) else None
            if where is None:
                static[key] = value
            else:
                patches.append((key, *where))
        self.ops.append(Op(cls, args, static, patches, self._new_slot(out), tuple(_Meta(t) for t in tensors)))
        self.grad_inputs.append(tuple((a, t.requires_grad, t.dtype) for a, t in zip(args, tensors)))

    def record_backward(self, tape: list, root: Tensor) -> None:
        """Turn the graph walk's tape (``autograd/graph.py``) into slots."""
        self.root = self._slot[id(root)]
        op_of = {op.out: i for i, op in enumerate(self.ops)}
        for node, flag in tape:
            slot = self._slot[id(node)]  # every tensor the walk reaches was an op's input or output
            if node._ctx is None:  # a leaf: flag says whether the walk could keep g as its .grad
                self.tape.append(("leaf", slot, node, flag))
            elif flag:  # an op whose backward ran (one that got no gradient is skipped, as eagerly)
                self.tape.append(("op", op_of[slot]))
        self._slot.clear()
        self._keep.clear()
        self.inputs = ()  # (the recorded batch need not stay alive)

    def _new_slot(self, t: Tensor) -> int:
        self._slot[id(t)] = slot = self._n
        self._keep.append(t)
        self._n += 1
        return slot

    def _slot_of(self, t: Tensor) -> int:
        slot = self._slot.get(id(t))
        if slot is None:  # not made by a recorded op: a step input, a parameter or a constant
            slot = self._new_slot(t)
            where = self._input_of(t._data)
            self.sources.append((slot, ("input", *where) if where else ("tensor", t)))
        return slot

    def _input_of(self, a: Any) -> tuple[int, tuple] | None:
        """``(k, shape)`` if ``a`` is step input k or a reshaped view of all of it; None if it shares no
        memory with an input. Any other array made from an input outside the ops makes the recording invalid
        (a replay could not follow it): ``self.invalid`` says so, and the eager step goes on."""
        for k, x in enumerate(self.inputs):
            if a is x:
                return k, a.shape
            if isinstance(x, np.ndarray) and np.may_share_memory(a, x):
                if a.size == x.size and a.flags.c_contiguous and x.flags.c_contiguous:
                    return k, a.shape
                self.invalid = self.invalid or f"an op reads part of step input {k} taken outside the ops"
        return None

    # -- replaying ---------------------------------------------------------------------------------
    def replay(self, inputs: tuple) -> Any:
        """Run the step's forward and backward on ``inputs`` (arrays of the recorded shapes and dtypes: the
        guards check that first); returns the loss array (the recorded loss's shape, usually ``()``).

        Leaves' ``.grad`` are set (their hooks run) inside one backward pass (``grad_mode.run_pass``), as
        ``loss.backward()`` does. The ops' argument checks ran when the step was recorded, on its shapes and
        dtypes, not on each replay's values: a token id or class target out of range is not checked again
        (too large, NumPy's lookup raises ``IndexError``; negative, it counts from the end, as NumPy does).
        """
        env: list[Any] = [None] * self._n
        for slot, src in self.sources:
            if src[0] == "tensor":
                env[slot] = src[1]._data
            else:
                x = inputs[src[1]]
                env[slot] = x if x.shape == src[2] else x.reshape(src[2])
        fns = []
        for op in self.ops:
            fn = op.kernel()
            fn.inputs = op.metas
            options = op.options
            if op.patches:
                options = dict(options)
                for key, k, shape in op.patches:
                    options[key] = inputs[k] if inputs[k].shape == shape else inputs[k].reshape(shape)
            result = fn.forward(*[env[a] for a in op.args], **options)
            env[op.out] = np.asarray(result) if isinstance(result, np.generic) else result
            fns.append(fn)
        loss = env[self.root]
        del env  # from here on only what the ops saved is alive, as after an eager forward
        grad_mode.run_pass(lambda: self._backward(fns, np.ones(loss.shape, dtype=loss.dtype)))
        return loss

    def _backward(self, fns: list, grad: Any) -> None:
        pending = {self.root: grad}
        # Slots whose pending gradient is an array nothing else refers to (a sum made here, or the result
        # of an op that ``returns_new_arrays``): the next gradient is added into it in place, which gives
        # the bits of eager's ``a + b`` without a new array (eager's walk may not know it is alone).
        owned: set[int] = set()
        ops, grad_inputs = self.ops, self.grad_inputs
        for entry in self.tape:
            if entry[0] == "op":
                i = entry[1]
                g = pending.pop(ops[i].out, None)
                if g is None:
                    continue
                grads = fns[i].backward(g)
                fns[i] = None  # its saved arrays go now, as eagerly (Function.release)
                new = ops[i].cls.returns_new_arrays
                for (slot, needs, dtype), gi in zip(grad_inputs[i], grads):
                    if gi is None or not needs:
                        continue
                    if gi.dtype != dtype:
                        gi = gi.astype(dtype)
                    if slot not in pending:
                        pending[slot] = gi
                        if new:
                            owned.add(slot)
                    elif slot in owned and dtype.itemsize > 2:  # (2-byte sums go through float32)
                        pending[slot] += gi
                    else:
                        pending[slot] = graph._add_gradients(pending[slot], gi)
                        owned.add(slot)
            else:
                _, slot, leaf, alone = entry
                g = pending.pop(slot, None)
                if g is None:
                    continue
                leaf.grad = g if alone else g.copy()  # a copy where eager's walk made one
                for hook in leaf._post_accumulate_hooks:
                    hook(leaf)


def _source_name(t: Tensor) -> str:
    return f"{'parameter' if t.requires_grad else 'constant'} {t.dtype}{list(t.shape)}"


def record_step(forward: Any, inputs: tuple) -> tuple[Any, Program | str]:
    """Run ``loss = forward()`` and ``loss.backward()`` eagerly, with recording on.

    Returns the loss tensor and the program, or instead of the program the one-line reason it cannot be
    replayed. Nothing here raises for a step that cannot be recorded: the eager step runs to its end
    either way (a rerun would draw its dropout masks twice), and the caller goes on with it.
    """
    if function._recorder is not None:
        return forward_and_backward(forward), "a capture is already running (captures do not nest)"
    program = Program(inputs)
    function._recorder, graph._tape = program.record, []
    tape = graph._tape
    try:
        loss = forward()
        recorded = isinstance(loss, Tensor) and id(loss) in program._slot
        loss.backward()
    finally:
        function._recorder, graph._tape = None, None
    if not recorded:
        return loss, "the step's loss was not computed by minidist ops"
    if not tape:  # a run_backward without the tape's two lines (an assignment's own graph walk, say)
        return loss, "the graph walk reported nothing to record (autograd/graph.py's _tape)"
    if program.invalid is not None:
        return loss, program.invalid
    program.record_backward(tape, loss)
    return loss, program


def forward_and_backward(forward: Any) -> Any:
    """The eager step's first half, unrecorded: ``loss = forward()``, ``loss.backward()``; returns loss."""
    loss = forward()
    loss.backward()
    return loss
