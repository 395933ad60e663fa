"""``FlatUnit``: one FSDP unit's parameters as one sharded flat vector, gathered and freed on demand.

The unit's parameters, flattened in order, form one logical vector of P_u elements; rank r of N keeps
only chunk r of it (``zero/layout.py``'s ``ShardLayout``, ``numpy.array_split`` order, the chunk layout of
``dist.all_gather`` and ``dist.reduce_scatter``). Rajbhandari et al. 2020 §5.3 (P_os+g+p): the
parameters themselves are partitioned, and each rank rebuilds a layer's full parameters by an
all-gather just before using it.

States of a unit, and what the original parameters' ``.data`` hold in each:

* **sharded** (between uses): ``.data`` is an empty ``(0,) * ndim`` array of the parameter's dtype.
  Not the old values and not zeros, which would look real: reading it fails at once with a shape error.
* **gathering**: an all-gather is in flight on the communication thread (a prefetch).
* **gathered**: ``.data`` are views (of the right shapes) into one full flat buffer.

``param_dtype`` (e.g. bfloat16) is the dtype of the all-gather: the shards are rounded to it, sent,
and cast back to the parameters' dtype on the communication thread, so the unit computes with
bfloat16-rounded weights in the master dtype. (This branch's ops do not compute in bfloat16: autocast,
mixed precision (``autocast``), does that inside the ops; the halved all-gather bytes are FSDP's part.)

Gradients: after the unit's backward, each parameter's full ``.grad`` is copied into one flat buffer
(in ``reduce_dtype``) and reduce-scattered with op="avg", and the full gradients are dropped; when
backward ends, this rank's chunk is *added* to the shard tensors' ``.grad`` on the main thread (so
several backward passes accumulate, as ``.grad`` does). Every collective runs as a ``Job`` on the FSDP
instance's one communication thread, in submission order, so every rank runs them in the same order.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import minidist.distributed as dist
from minidist import backend, memory, trace
from minidist.autograd import Tensor
from minidist.parallel.data_parallel.comm_thread import CommThread, Job
from minidist.parallel.fsdp.units import UnitPlan
from minidist.parallel.zero.layout import ShardLayout


class FlatUnit:
    """One unit (see the module docstring). Attributes that the checkpoint code reads:

    Attributes:
        name: module path of the unit ("" for the root unit).
        params: the original Parameters, in flat order. ``names``: their global names.
        layout: the ``ShardLayout`` of the flat vector (sizes of ``params``) over the group.
        flat_shard: this rank's chunk, 1-D, ``layout.shard_numel`` elements of the parameters' dtype:
            the master copy the optimizer updates (through ``shards``).
        shards: one ``Tensor`` per ``layout.segments`` entry, a 1-D view into ``flat_shard``; these are
            what the optimizer steps (their ``.grad`` holds the averaged gradient of the segment).
    """

    def __init__(
        self, plan: UnitPlan, group: Any, thread: CommThread, param_dtype: Any, reduce_dtype: Any
    ) -> None:
        self.name, self.module = plan.name, plan.module
        self.params, self.names = list(plan.params), list(plan.names)
        self.shapes = [p.shape for p in self.params]
        self.dtype = self.params[0].dtype
        self.group, self._thread = group, thread
        self.param_dtype = np.dtype(param_dtype or self.dtype)
        self.reduce_dtype = np.dtype(reduce_dtype or self.dtype)
        self.layout = ShardLayout.build([p.size for p in self.params], group.size, group.rank)
        xp = backend.array_module(self.params[0].data)
        self._xp = xp
        full = xp.concatenate([p.data.reshape(-1) for p in self.params])
        self.flat_shard = full[self.layout.start : self.layout.stop].copy()
        self.shards = [
            Tensor(self.flat_shard[s.shard_offset : s.shard_offset + s.numel], requires_grad=True)
            for s in self.layout.segments
        ]
        self._job: Job | None = None  # the all-gather in flight, if any
        self._result: list[Any] = []  # where the job puts the gathered buffer
        self._full: Any = None  # the gathered flat buffer while gathered
        self._reduces: list[
            tuple[Job, list, list]
        ] = []  # reduce-scatters not yet waited for: job, the buffer until sent, result
        for p in self.params:  # an optimizer over these would step nothing: it refuses them (Optimizer)
            p._fsdp_unit_name = self.name or "root"
        # Between uses: shape (0,) * ndim (at least 1-D), so ``p.ndim`` still tells a matrix from a
        # vector (weight-decay groups are built from it) while any read of values fails at once.
        self._empties = [xp.empty((0,) * max(len(s), 1), dtype=self.dtype) for s in self.shapes]
        self.free()

    @property
    def gathered(self) -> bool:
        return self._full is not None

    @property
    def full_nbytes(self) -> int:
        """Bytes of the gathered flat buffer (P_u elements of the parameters' dtype)."""
        return self.layout.numel * self.dtype.itemsize

    @property
    def _staging_nbytes(self) -> int:
        """Bytes an all-gather in a lower ``param_dtype`` holds besides the gathered buffer: the rounded
        shard it sends and the low-precision buffer it receives (0 when nothing is cast)."""
        if self.param_dtype == self.dtype:
            return 0
        return (self.layout.shard_numel + self.layout.numel) * self.param_dtype.itemsize

    # -- parameters: gather, install, free ------------------------------------------------------------
    def start_gather(self) -> None:
        """Submit the all-gather of this unit's parameters (no-op if gathered or already in flight)."""
        if self._full is not None or self._job is not None:
            return
        # Counted before the buffers exist, so a budget refuses them before they are made; a refused
        # gather is uncounted again (it never happens, and nothing would ever free it).
        counted = []
        try:
            for category, nbytes in (
                ("gathered_parameters", self.full_nbytes),
                ("communication", self._staging_nbytes),
            ):
                counted.append((category, nbytes))
                memory.allocated(category, nbytes, owner=self.name)
        except BaseException:
            for category, nbytes in counted:
                memory.allocated(category, -nbytes, owner=self.name)
            raise
        send = self.flat_shard.astype(self.param_dtype, copy=False)  # copy only for a lower param_dtype
        self._result = []
        result, group, dtype, name = self._result, self.group, self.dtype, self.name or "root"

        def job() -> None:  # on the communication thread, the cast back included
            with trace.span(f"all_gather {name}", trace.COMM):
                result.append(dist.all_gather(send, group=group).astype(dtype, copy=False))

        self._job = self._thread.submit(Job(job))

    def gather(self) -> None:
        """Make the parameters' ``.data`` the full values (waits for the all-gather; starts it if needed)."""
        if self._full is None:
            self._full = self._fetch()
            self._install()

    def refresh(self) -> None:
        """Gather; if already gathered, gather again and keep the old buffer only if nothing changed.

        For the root at the start of a forward whose previous forward got no backward (an evaluation
        with gradients on, two forwards then one backward): an optimizer step in between must not
        leave the old values in place, yet a graph still waiting for backward must keep its
        parameters' versions if they did not change. Which ranks' shards changed is not known here
        (each rank sees only its own), so every rank all-gathers and compares: collective and equal
        on every rank, and it costs an extra all-gather only in that unusual case.
        """
        if self._full is None:
            return self.gather()
        old, self._full = self._full, None
        new = self._fetch()
        memory.allocated("gathered_parameters", -self.full_nbytes, owner=self.name)  # one of the two goes
        if bool(self._xp.array_equal(old, new)):
            self._full = old  # same values: the parameters keep their arrays and versions
        else:
            self._full = new  # changed (an optimizer step): a graph waiting for backward will refuse it
            self._install()

    def _fetch(self) -> Any:
        self.start_gather()
        # What the main thread waits for is the communication prefetching did not hide
        # (benchmarks/fsdp_prefetch.py).
        with trace.span(f"wait all_gather {self.name or 'root'}", trace.WAIT):
            self._job.wait()
        memory.allocated("communication", -self._staging_nbytes, owner=self.name)
        full, self._job = self._result.pop(), None
        return full

    def _install(self) -> None:
        for p, size, offset, shape in zip(self.params, self.layout.sizes, self.layout.offsets, self.shapes):
            p.data = self._full[offset : offset + size].reshape(shape)

    def free(self) -> None:
        """Back to sharded: the parameters hold empty arrays and the gathered buffer is dropped."""
        if self._job is not None:  # a prefetch nobody used: let it finish, then drop its buffer
            self._full = self._fetch()
        for p, empty in zip(self.params, self._empties):
            p.data = empty
        if self._full is not None:
            memory.allocated("gathered_parameters", -self.full_nbytes, owner=self.name)
        self._full = None

    # -- gradients ---------------------------------------------------------------------------------
    def reduce_gradients(self) -> None:
        """Submit the reduce-scatter (op="avg") of the parameters' full gradients; drop them here.

        A parameter without a gradient on this rank contributes zeros; whether a segment's shard gets
        a gradient at all is decided by all ranks together (one small all-reduce of flags, in the same
        job), so a parameter no rank used is left alone by the optimizer, as one process would.
        """
        xp = self._xp
        flat = xp.zeros(self.layout.numel, dtype=self.reduce_dtype)
        try:  # counted before the gradients move into it: a refusal (a budget) leaves them where they are
            memory.allocated("communication", flat.nbytes, owner=self.name)
        except BaseException:
            memory.allocated("communication", -flat.nbytes, owner=self.name)
            raise
        flags = np.zeros(len(self.params), dtype=np.int64)
        for i, (p, offset) in enumerate(zip(self.params, self.layout.offsets)):
            if p.grad is not None:
                flat[offset : offset + p.size] = p.grad.reshape(-1)
                flags[i] = 1
                p.grad = None
        result: list[Any] = []
        # The job takes the buffer out of `pending` and drops it once sent, so a unit's full gradient
        # lives only until its reduce-scatter has run (while backward goes on), not until backward ends:
        # else every unit's would pile up, a whole model's gradients, as DDP holds.
        pending = [flat]
        del flat
        job = self._thread.submit(Job(lambda: result.append(self._reduce_scatter(pending, flags))))
        self._reduces.append((job, pending, result))

    def _reduce_scatter(self, pending: list[Any], flags: np.ndarray) -> tuple[Any, np.ndarray]:
        """On the communication thread: this rank's chunk of the average, and which parameters any
        rank had a gradient for; the full gradient buffer in ``pending`` is released after it."""
        try:
            with trace.span(f"reduce_scatter {self.name or 'root'}", trace.COMM):
                averaged = dist.reduce_scatter(pending[0], op="avg", group=self.group)
                averaged = averaged.astype(self.dtype, copy=False)
                used = dist.all_reduce(flags, op="max", group=self.group)
        finally:
            memory.allocated("communication", -pending.pop().nbytes, owner=self.name)
        return averaged, used

    def wait_gradients(self, keep: bool = True) -> None:
        """Wait for this unit's reduce-scatters (re-raising their errors) and add the averages to the
        shards' ``.grad`` (on this thread: the optimizer never sees a gradient change under it).

        ``keep=False`` drops them instead: the jobs of a backward pass that failed half-way, whose
        gradients must not leak into the next step.
        """
        jobs, self._reduces = self._reduces, []
        for job, pending, result in jobs:
            try:
                with trace.span(f"wait reduce_scatter {self.name or 'root'}", trace.WAIT):
                    job.wait()
            finally:
                if pending:  # the job never ran (an earlier job failed): its buffer goes here
                    memory.allocated("communication", -pending.pop().nbytes, owner=self.name)
            if keep:
                self._accumulate(*result[0])

    def _accumulate(self, averaged: Any, used: np.ndarray) -> None:
        for shard, seg in zip(self.shards, self.layout.segments):
            if used[seg.param_index]:
                piece = averaged[seg.shard_offset : seg.shard_offset + seg.numel]
                shard.grad = piece.copy() if shard.grad is None else shard.grad + piece

    # -- full values (collective; for state_dict) -----------------------------------------------------
    def full_values(self) -> list[Any]:
        """Every parameter's full value in the master dtype, as new arrays (one all-gather, this thread)."""
        full = dist.all_gather(self.flat_shard, group=self.group)
        return [
            full[o : o + n].reshape(shape).copy()
            for n, o, shape in zip(self.layout.sizes, self.layout.offsets, self.shapes)
        ]

    def load_full(self, values: list[Any]) -> None:
        """Keep this rank's chunk of the full ``values`` (one per parameter; None: keep the current
        elements), in place in ``flat_shard`` so the shard tensors (and the optimizer) see them."""
        xp = self._xp
        for shard, seg in zip(self.shards, self.layout.segments):
            value = values[seg.param_index]
            if value is not None:
                flat = xp.asarray(value).reshape(-1)[seg.lo : seg.hi]
                shard.data[...] = flat.astype(self.dtype, copy=False)
                shard.data = shard.data  # bump the version, as an optimizer step's in-place update does
