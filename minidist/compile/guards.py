"""When a recorded step may be replayed: the guards, and the layouts that always run eagerly.

A replay runs the recorded ops on new arrays without any of eager's checks, so it is valid only while
everything the recording depended on is unchanged. ``Guard.check`` compares, before every replay:

* the step inputs' number, shapes and dtypes (a new batch shape is a new program), and no negative
  integer input (NumPy would read it from the end; the eager ops refuse it); grad mode on, autocast off;
* every module's ``training`` flag (``model.eval()`` removes dropout ops from the step);
* the model's parameters, by identity, shape, dtype and ``requires_grad`` (a new, removed, replaced or
  frozen parameter), and the optimizer's parameter list;
* that no parameter holds a gradient when the step starts (the replay sets ``.grad``, it does not
  accumulate into one: gradient accumulation runs eagerly).

``unsupported_layout`` names the layouts not replayed: they communicate outside what the recording
sees. ``differs`` compares two recordings of the same step; a difference means the step depends on
something a fixed program cannot follow (data-dependent Python, arrays made outside the ops).

The same idea as ``torch.compile``'s guards (Ansel et al. 2024, "PyTorch 2", §4: a captured graph is
valid while its guards hold) and tinygrad's ``TinyJit`` (replays only for the shapes it captured with).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from minidist.autograd import autocast, grad_mode
from minidist.backend import is_gpu_array

# Layouts that communicate outside the recorded ops, by the module their class lives in.
_ASIDE = {
    "minidist.parallel.fsdp": "FSDP gathers and frees parameters in forward and backward hooks",
    "minidist.parallel.zero": "ZeRO's optimizer exchanges gradient and parameter shards in its step",
    "minidist.parallel.tensor_parallel": "tensor parallelism communicates inside its layers' ops",
    "minidist.parallel.pipeline": "pipeline parallelism sends activations between stage steps",
    "minidist.parallel.context_parallel": "context parallelism exchanges keys and values inside attention",
    "minidist.models.gpt.parallel": "the parallel GPT's layers communicate inside their ops",
}


def unsupported_layout(model: Any, optimizer: Any) -> str | None:
    """The reason ``model``/``optimizer`` run eagerly, or None if one process or DDP (replayed)."""
    if not hasattr(model, "modules"):  # PipelineParallel: a trainer with its own train_step, no Module
        return f"{type(model).__name__} is not a Module: it runs its own step (train_step), not a loss_fn"
    for obj in [optimizer, *model.modules()]:
        where = type(obj).__module__
        for prefix, why in _ASIDE.items():
            if where.startswith(prefix):
                return f"{type(obj).__name__}: {why}, outside the recorded ops"
    for p in model.parameters():
        if p.sharded_over is not None:
            return "a parameter is a tensor-parallel shard: its layers communicate inside their ops"
        if is_gpu_array(p._data):  # (kernels.py and fused.py are written for NumPy's ufuncs)
            return "the GPU backend is not replayed: the replay's kernels are NumPy's"
    return None


def _input_signature(inputs: tuple) -> tuple:
    return tuple((x.shape, x.dtype) for x in inputs)


class Guard:
    """What a recording depended on, checked before every replay (module docstring)."""

    def __init__(self, model: Any, optimizer: Any, inputs: tuple) -> None:
        self.model, self.optimizer = model, optimizer
        self.inputs = _input_signature(inputs)
        self.modules = list(model.modules())
        self.training = [m.training for m in self.modules]
        self.params = list(model.parameters())
        self.param_signature = [(p._data.shape, p._data.dtype, p.requires_grad) for p in self.params]
        self.optimizer_params = list(optimizer.params)

    def check(self, inputs: tuple) -> str | None:
        """None if the recording may be replayed on ``inputs``, else the one-line reason it may not."""
        if _input_signature(inputs) != self.inputs:
            got = ", ".join(f"{tuple(x.shape)} {x.dtype}" for x in inputs)
            want = ", ".join(f"{tuple(s)} {d}" for s, d in self.inputs)
            return f"the step's inputs are {got}, recorded with {want}"
        if any(x.dtype.kind == "i" and x.size and x.min() < 0 for x in inputs):  # NumPy would wrap it
            return "an integer input (token ids, targets) is negative: the eager step checks it"
        if not grad_mode._grad_enabled:
            return "grad mode is off (no_grad)"
        if autocast.low_dtype is not None:
            return "autocast is on"
        if [m.training for m in self.modules] != self.training:
            return "a module's training mode changed since the recording (model.train() / model.eval())"
        params = list(self.model.parameters())
        if len(params) != len(self.params) or any(p is not q for p, q in zip(params, self.params)):
            return "the model's parameters changed since the recording (added, removed or replaced)"
        for p, (shape, dtype, needs) in zip(params, self.param_signature):
            if p._data.shape != shape or p._data.dtype != dtype or p.requires_grad != needs:
                return f"a parameter's shape, dtype or requires_grad changed since the recording: {p.shape}"
            if p.grad is not None:
                return "a parameter holds a gradient when the step starts (accumulation runs eagerly)"
        if list(self.optimizer.params) != self.optimizer_params:
            return "the optimizer's parameters changed since the recording"
        return None


def differs(a: Any, b: Any) -> str | None:
    """Where two recordings of the step differ (None: the same program), for the fallback's message."""
    if len(a.ops) != len(b.ops) or len(a.tape) != len(b.tape):
        return f"{len(a.ops)} then {len(b.ops)} ops"
    for i, (x, y) in enumerate(zip(a.ops, b.ops)):
        if (x.cls, x.args, x.out, x.patches) != (y.cls, y.args, y.out, y.patches) or not _same(
            x.options, y.options
        ):
            return f"op {i} ({x.cls.__name__}, then {y.cls.__name__})"
    for (slot, x), (_, y) in zip(a.sources, b.sources):
        if x[0] != y[0] or (x[0] == "input" and x[1:] != y[1:]):
            return f"the source of slot %{slot}"
        # A tensor made during the step (a lifted number, a mask) must hold the same values both times.
        if x[0] == "tensor" and x[1] is not y[1] and not _same(x[1]._data, y[1]._data):
            return f"the constant %{slot} changed (made from the inputs outside the ops?)"
    for x, y in zip(a.tape, b.tape):
        if x[0] != y[0] or x[1] != y[1] or (x[0] == "leaf" and (x[2] is not y[2] or x[3] != y[3])):
            return "the backward's order"
    return None


def _same(x: Any, y: Any) -> bool:
    if isinstance(x, dict):
        return isinstance(y, dict) and x.keys() == y.keys() and all(_same(x[k], y[k]) for k in x)
    if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
        return (
            isinstance(x, np.ndarray)
            and isinstance(y, np.ndarray)
            and x.shape == y.shape
            and x.dtype == y.dtype
            and bool(np.array_equal(x, y, equal_nan=x.dtype.kind in "fc"))
        )
    try:
        return bool(x == y)
    except (TypeError, ValueError):
        return x is y
