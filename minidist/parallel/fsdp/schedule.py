"""When each FSDP unit is gathered, freed and reduced: the execution order of Zhao et al. 2023, §3.3.

``UnitSchedule`` is the state machine behind ``FullyShardedDataParallel.forward`` and ``backward``:

* the root unit is gathered when the model's forward starts (``begin_forward``) and freed when the
  backward pass ends (``_finish_backward``, an end-of-pass callback, queued by ``_EndOfBackward``, an
  identity op on the model's output whose backward runs first);
* every other unit's ``forward`` is replaced by ``unit_forward``: under activation recomputation
  (``minidist.nn.recompute``), it gathers the unit, runs it without a graph and frees it; in backward,
  recompute calls it again with a graph (gathered again) and then ``_after_backward`` reduce-scatters
  its gradient and frees it;
* prefetch: before a unit computes, the all-gather of the unit expected next is submitted too
  (forward: the next unit in module order; backward: the previous one in the order the forward ran),
  so it travels while this unit computes. Every rank runs the same model code, so every rank submits
  the same collectives in the same order to its communication thread.
"""

from __future__ import annotations

import functools
from typing import Any

from minidist import autograd
from minidist.autograd import Function, Tensor
from minidist.nn.recompute import recompute
from minidist.parallel.fsdp.flat_unit import FlatUnit


class UnitSchedule:
    """Gather, free and reduce ``units`` (root first, if any) at the right moments (module docstring).

    Flags the wrapper sets: ``sync`` (False inside ``no_sync()``: full gradients stay on the
    parameters), ``summoned`` (inside ``summon_full_params()``: units run as they are).
    """

    def __init__(self, units: list[FlatUnit], prefetch: bool) -> None:
        self.units, self.prefetch = units, prefetch
        self.root = units[0] if units[0].name == "" else None
        self.inner = [u for u in units if u.name != ""]
        self._next_in_forward = {id(a): b for a, b in zip(self.inner, self.inner[1:])}
        self.sync, self.summoned = True, False
        self._ran: list[FlatUnit] = []  # units whose forward ran with a graph, in order, not yet backward
        self._reducing: list[FlatUnit] = []  # units whose reduce-scatter may still be running, oldest first
        self._awaiting_backward = False  # a forward with a graph ran; its backward has not finished
        self._pass = -1  # the backward pass whose end-of-pass callback is queued
        self._finish_pending = False  # queued and not run yet: outside backward, that pass failed
        for u in self.inner:
            object.__setattr__(u.module, "forward", self.unit_forward(u, u.module.forward))

    # -- the model's forward -----------------------------------------------------------------------
    def begin_forward(self) -> None:
        if self._finish_pending:  # the last backward raised before its end: drop what it left behind
            self.abandon_failed_pass()
        for u in self.inner:  # left gathered only by a prefetch nobody used; no graph holds them
            u.free()
        if self.root is not None:
            self.root.refresh()  # for the whole step: freed when backward ends

    def end_forward(self, out: Any) -> Any:
        """The output, marked so that its backward finishes FSDP's pass; or, if nothing will be
        differentiated, everything back to shards now."""
        if autograd.is_grad_enabled() and isinstance(out, Tensor) and out.requires_grad:
            self._awaiting_backward = True
            return _EndOfBackward.apply(out, schedule=self)
        # Except a root that an earlier forward's graph still needs (its backward would refuse
        # parameters changed in place since).
        self.free_all(keep_root=self._awaiting_backward)
        return out

    def free_all(self, keep_root: bool = False) -> None:
        for u in self.units:
            if not (keep_root and u is self.root):
                u.free()

    # -- a unit's forward and backward ----------------------------------------------------------------
    def unit_forward(self, unit: FlatUnit, original: Any) -> Any:
        """The unit module's new ``forward``: gathered, computed and freed under recomputation."""

        def forward(*args: Any, **kwargs: Any) -> Any:
            if self.summoned:  # summon_full_params: every unit is gathered, run it as it is
                return original(*args, **kwargs)
            fn = functools.partial(original, **kwargs) if kwargs else original

            def body(*a: Any) -> Any:
                backward = autograd.is_grad_enabled()  # only recompute's backward runs this with a graph
                self._gather(unit, backward)
                try:
                    return fn(*a)
                finally:
                    if not backward:
                        unit.free()

            if not autograd.is_grad_enabled():
                return body(*args)
            self._ran.append(unit)
            return recompute(body, *args, after_backward=functools.partial(self._after_backward, unit))

        return forward

    def _gather(self, unit: FlatUnit, backward: bool) -> None:
        """Gather ``unit``; first issue the all-gather of the unit that runs after it (prefetch)."""
        unit.start_gather()  # (submitted before the prefetch: every rank queues them in this order)
        if backward:
            if unit in self._ran:  # the last time it ran is the one being differentiated now
                del self._ran[len(self._ran) - 1 - self._ran[::-1].index(unit)]
            following = self._ran[-1] if self._ran else None
        else:
            following = self._next_in_forward.get(id(unit))
        if self.prefetch and following is not None:
            following.start_gather()
        unit.gather()

    def _after_backward(self, unit: FlatUnit) -> None:
        self.queue_finish()  # (a unit's backward runs inside a pass)
        if self.sync:
            # At most two units' full gradients in flight: wait for (and add to the shards) older ones
            # first. Else, if the communication thread fell behind, every unit's flat gradient could be
            # waiting at once, a whole model's gradients, which FSDP exists not to hold.
            while len(self._reducing) >= 2:
                self._reducing.pop(0).wait_gradients()
            unit.reduce_gradients()
            self._reducing.append(unit)
        unit.free()

    # -- the end of the backward pass -----------------------------------------------------------------
    def queue_finish(self) -> None:
        """Queue ``_finish_backward`` once per backward pass."""
        if self._pass != autograd.backward_pass_count():
            self._pass = autograd.backward_pass_count()
            self._finish_pending = True
            autograd.queue_callback(self._finish_backward)

    def _finish_backward(self) -> None:
        """The root's reduce-scatter, wait for every job, every unit back to shards."""
        try:
            if self.root is not None and self.sync:
                self.root.reduce_gradients()
            for u in self.units:
                u.wait_gradients()
        finally:
            self._awaiting_backward, self._ran, self._finish_pending = False, [], False
            self._reducing = []
            self.free_all()

    def abandon_failed_pass(self) -> None:
        """After a backward that raised (its end-of-pass callback was dropped): let its reduce-scatters
        finish (every rank submitted the same ones) and drop their gradients, which cover only part of
        the model and must not leak into the next step; everything back to shards."""
        try:
            for u in self.units:
                u.wait_gradients(keep=False)
        finally:
            self._awaiting_backward, self._ran, self._finish_pending = False, [], False
            self._reducing = []
            self.free_all()


class _EndOfBackward(Function):
    """Identity on the model's output; its backward (the first of the pass) queues FSDP's end of pass."""

    saved_inputs = ()
    is_view = True  # the output is the input's array: one version counter

    def forward(self, x: Any, schedule: UnitSchedule) -> Any:
        self.schedule = schedule
        return x

    def backward(self, grad: Any) -> tuple[Any]:
        self.schedule.queue_finish()
        return (grad,)
