"""``Function``: one differentiable op, how it records itself in the graph, and what it saves.

Third in ``minidist/autograd/`` (after ``grad_mode.py`` and ``tensor.py``; then ``graph.py``). Every
op in ``minidist/ops`` subclasses ``Function``: ``forward`` computes the result from arrays and
``backward`` maps the gradient of the output to the gradients of the inputs (the vector-Jacobian
product). ``Function.apply`` runs ``forward`` on tensors and, when grad mode is on and an input
requires gradients, records the op on its result (``result._ctx``) together with the versions of the
tensors the op saved. The graph walk (``graph.py``) calls ``check_saved_versions`` before an op's
backward and ``release`` after it.

Source: the vector-Jacobian product of reverse mode (Griewank & Walther, "Evaluating Derivatives",
2008, ch. 3); the API follows PyTorch's ``torch.autograd.Function`` (Paszke et al. 2019).
"""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np

from minidist import backend
from minidist.autograd import autocast, grad_mode
from minidist.autograd.tensor import Tensor
from minidist.memory import activations, counters

# Called as ``_recorder(cls, tensors, options, out)`` by every ``apply`` while a step is captured
# (``minidist/compile``); None otherwise, so eager pays one global test per op.
_recorder: Any = None


class Function:
    """One differentiable operation: ``forward`` on arrays, ``backward`` = vector-Jacobian product.

    Subclasses implement ``forward(self, *arrays, **options) -> array`` (saving on ``self`` what
    ``backward`` needs) and ``backward(self, grad) -> tuple`` with one gradient (or ``None``) per
    input, each of that input's shape. Users call ``MyFunction.apply(*tensors, **options)``.
    """

    inputs: tuple[Tensor, ...] = ()
    # Which inputs ``forward`` keeps for ``backward`` (None: all of them, the safe default for a new
    # op); backward checks that those were not changed in place since. ``saves_output``: forward
    # keeps its own result (exp, tanh, sigmoid), which must not change either.
    saved_inputs: tuple[int, ...] | None = None
    saves_output = False
    # The result may be a view into input 0's array (reshape, permute, basic indexing): then both
    # tensors share one version counter, so changing either in place is seen through the other.
    is_view = False
    # ``backward`` returns arrays it has just made and keeps no reference to, a different one for each
    # input (Linear's g W, g^T x, sum g). Then the graph walk hands such a gradient to a leaf as its
    # .grad without copying it; for any other op it copies (an op may return its incoming gradient
    # itself, as Add does, or the same array for two inputs, and one .grad must not change another).
    returns_new_arrays = False
    _released = False  # set by release(): the saved arrays are gone
    _mem_saved = None  # set while a memory tracker counts what this op keeps (minidist.memory)
    # Under ``autocast``, an op given a low-precision (2-byte) array runs on float32 copies of it
    # (``autograd/autocast.py``: NumPy's float16 arithmetic is ~200x slower), unless it handles such
    # arrays itself (the matrix products, the cast) or only moves data (views): those set this.
    handles_low_precision = False

    def forward(self, *arrays: Any, **options: Any) -> Any:
        raise NotImplementedError

    def backward(self, grad: Any) -> tuple[Any, ...]:
        raise NotImplementedError

    def release(self) -> None:
        """Drop everything ``forward`` saved (and the inputs), after this op's backward has run.

        Called by the graph walk unless ``retain_graph=True``, so the activations can be freed as
        backward proceeds, as in PyTorch; using this op again raises instead of reusing stale state.
        """
        if self._mem_saved is not None:  # a tracker counted this op's arrays: they are freed now
            activations.release(self._mem_saved)
        self.__dict__.clear()
        self._released = True

    def check_saved_versions(self) -> None:
        """Raise ``RuntimeError`` if this op was released, or a tensor it saved changed in place.

        Without it, ``w.data *= 10`` (or ``optimizer.step()``) between forward and backward would
        give gradients computed from the new values silently. Torch's version counters, same texts.
        The graph walk calls it before every op's backward, so the common case (nothing changed) is
        one integer compare per saved tensor; the error message is built only when one differs.
        """
        if self._released:
            raise RuntimeError(
                f"Trying to backward through the graph a second time (or directly access saved tensors "
                f"after they have already been freed): the values {type(self).__name__} saved were freed "
                "by the first backward(). Specify retain_graph=True in the first backward() if you need "
                "to backward through the graph a second time, or compute the forward again."
            )
        saved = self.saved_inputs
        if saved is None:
            saved = range(len(self.inputs))
        for i in saved:  # empty for ops that save no input (then apply recorded no _versions)
            if self.inputs[i]._version_counter[0] != self._versions[i]:
                self._raise_modified(f"its input {i}", self.inputs[i], self._versions[i])
        if self.saves_output:
            output = self._output()
            if output is not None and output._version_counter[0] != self._output_version:
                self._raise_modified("its output", output, self._output_version)

    def _raise_modified(self, which: str, t: Tensor, expected: int) -> None:
        raise RuntimeError(
            "one of the variables needed for gradient computation has been modified by an inplace "
            f"operation: the {t.dtype} tensor of shape {t.shape} saved by {type(self).__name__} ({which}) "
            f"is at version {t._version}; expected version {expected} instead. Hint: change tensors in "
            "place (w.data = ..., +=, optimizer.step()) only after backward(), or compute the forward "
            "again after the change."
        )

    @classmethod
    def apply(cls, *inputs: Any, **options: Any) -> Tensor:
        """Run the op on tensors (Python numbers and arrays are lifted to constant tensors).

        This runs for every op of every forward, so it avoids work the common case does not need
        (docs/performance.md, "Version counters, freed graphs and dtype promotion"): no lifting when all
        inputs are tensors, versions recorded only for ops that save an input, view tests only for views.
        """
        tensors = inputs
        for x in inputs:
            if not isinstance(x, Tensor):  # a number or an array among them: lift it to a constant
                like = next((t for t in inputs if isinstance(t, Tensor)), None)
                tensors = tuple([_lift(t, like) for t in inputs])
                break
        fn = cls()
        arrays = [t._data for t in tensors]
        if autocast.low_dtype is None or cls.handles_low_precision or cls.is_view:
            result = fn.forward(*arrays, **options)
        elif any(autocast.is_low(a.dtype) for a in arrays):
            result = autocast.upcast_apply(fn, arrays, options)
        else:
            result = fn.forward(*arrays, **options)
        # Full reductions give NumPy scalars; keep .data a (0-d) backend array so in-place writes work.
        if isinstance(result, np.generic):
            result = _asarray_like(result, tensors)
        out = Tensor(result)
        records, shard = False, None
        for t in tensors:  # one loop for both: does any input require grad, is the first one a shard
            if t.requires_grad:
                records = True
            if shard is None:
                shard = t.sharded_over
        if shard is not None:  # computed from a shard: a shard too (Tensor.sharded_over)
            out.sharded_over = shard
        if cls.is_view and backend.array_module(result).may_share_memory(result, tensors[0]._data):
            out._version_counter = tensors[0]._version_counter
        if records and grad_mode._grad_enabled:
            out.requires_grad = True
            out._ctx = fn
            fn.inputs = tensors
            if cls.saved_inputs != ():  # Add, Sub, Neg save no input: nothing to check in backward
                fn._versions = [t._version_counter[0] for t in tensors]
            if cls.saves_output:  # a weak reference: the output holds fn, fn must not keep it alive
                fn._output, fn._output_version = weakref.ref(out), out._version_counter[0]
            if counters._active:  # memory accounting: one flag check when off (minidist.memory)
                activations.record(fn, tensors)
        if _recorder is not None:
            _recorder(cls, tensors, options, out)
        return out


def _asarray_like(value: Any, tensors: tuple[Tensor, ...]) -> Any:
    xp = backend.array_module(tensors[0].data) if tensors else backend.xp()
    return xp.asarray(value)


def _lift(x: Any, like: Tensor | None) -> Tensor:
    """A constant tensor from a number or array, in the dtype of ``like`` (2 * float32 stays float32)."""
    if isinstance(x, Tensor):
        return x
    # Only a floating tensor imposes its dtype: int tensor + 0.5 must not truncate 0.5 to 0.
    dtype = like.dtype if like is not None and like.dtype.kind == "f" else None
    return Tensor(backend.asarray(x, dtype=dtype))
