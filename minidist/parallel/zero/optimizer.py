"""ZeRO stages 1 and 2: shard the optimizer state (and the gradients) over the data-parallel group.

Plain data parallelism keeps N identical copies of everything: parameters, gradients and optimizer
state. ZeRO (Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter
Models", SC 2020, §5) removes the redundancy. Rank r of N owns 1/N of the flattened parameter vector
(``layout.py``) and alone keeps what is needed to update it:

* stage 1 (P_os, §5.1): only the optimizer state of the owned elements;
* stage 2 (P_os+g, §5.2): also only the (averaged) gradient of the owned elements.

One ``step()`` is three moves (``clip_grad_norm_`` between backward and step does the first early):

1. reduce-scatter the flat gradient with op="avg": each rank receives the group-average gradient of
   exactly the elements it owns (``dist.reduce_scatter`` uses the same chunk layout);
2. run the wrapped optimizer (SGD, AdamW, ... unchanged) on *shard tensors*, one per owned segment,
   whose ``.data`` is a 1-D view into the parameter and whose ``.grad`` is that averaged slice;
3. all-gather the owned elements so every rank again holds all updated parameters.

Reduce-scatter + all-gather move the same volume as one ring all-reduce, so stages 1 and 2 cost no more
communication than plain data parallelism (§7).

Memory per rank: stage 1 keeps 1/N of the optimizer state, stage 2 also 1/N of the gradients; the
parameters stay whole (stage 3, ``fsdp/``, shards them too). ``memory.py`` gives the paper's formulas and
``memory_report()`` measures them.

Simplification: the reduce-scatter runs in ``step()`` (or ``clip_grad_norm_``), after backward, so
every rank briefly holds all of its local gradients, as in stage 1, and stage 2 frees them only then.
The paper's stage 2 reduces bucket by bucket *during* backward and frees each bucket at once, so the
full gradient never exists; that needs the overlapped bucketing of ``data_parallel/ddp.py``.
``memory_report()`` shows what stays between steps. ``step()`` also allocates two transient buffers of
P elements (the flat gradient it reduce-scatters and the all-gathered parameters), which a bucketed
version would shrink to a bucket.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

import minidist.distributed as dist
from minidist import backend
from minidist.autograd import Tensor, bump_version
from minidist.optim.optimizer import Optimizer, clear_grads
from minidist.parallel.agreed import agreed_arguments
from minidist.parallel.zero import checks
from minidist.parallel.zero import groups as zero_groups
from minidist.parallel.zero.clip import clip_shards_
from minidist.parallel.zero.layout import ShardLayout
from minidist.parallel.zero.memory import memory_report


class ZeroRedundancyOptimizer:
    """Wrap ``optimizer_class`` so that each rank of ``group`` keeps and updates only its shard.

    Use it on a *plain* model, not one wrapped in ``DistributedDataParallel``: ``step()`` averages the
    gradients itself (reduce-scatter), so DDP's all-reduce would be redundant traffic (the average of
    equal averages is the same numbers) and would hold the full averaged gradients that stage 2 frees::

        model = build_model()                                 # no DDP
        zero = ZeroRedundancyOptimizer(model.parameters(), optim.AdamW, stage=2, lr=1e-3)  # or groups
        scheduler = lr_scheduler.cosine_with_warmup(zero, warmup_steps=100, total_steps=5000)
        for x, y in my_share_of_each_global_batch:
            zero.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()   # local gradients, no communication
            norm = zero.clip_grad_norm_(1.0)                      # optional: reduce-scatter, clip shards
            zero.step()                                           # (reduce-scatter,) step shard, all-gather
            scheduler.step()

    If every rank's loss is the mean over an equal share of the global batch, this trains exactly like
    one process on the whole batch (with ``minidist.nn.utils.clip_grad_norm_`` and the same schedule).

    Args:
        params: the model's parameters (duplicates are kept once), or parameter groups as for any
            optimizer: dicts whose values override ``optimizer_kwargs``, e.g. ``[{"params": matrices,
            "weight_decay": 0.1}, {"params": biases, "weight_decay": 0.0}]``. The same count, sizes,
            dtype and groups on every rank; flattened in this order. Constructing is *collective*: it
            checks that the ranks agree and overwrites every rank's parameters with rank 0's (one
            broadcast of P elements), as DDP does, so the replicas start identical.
        optimizer_class: an ``Optimizer`` subclass (``optim.SGD``, ``optim.AdamW``), not an instance.
        group: the data-parallel communicator (default: the world).
        stage: 1 (shard optimizer state) or 2 (also shard gradients).
        **optimizer_kwargs: passed to ``optimizer_class`` (``lr=...``, ``momentum=...``).

    After ``clip_grad_norm_()`` or ``step()``, the elements of ``p.grad`` that this rank owns hold the
    group average. Stage 1 leaves the other elements as this rank's local gradient; stage 2 frees them:
    ``p.grad`` is None unless this rank owns the whole of ``p`` (then it is a view of the averaged shard).

    ``param_groups`` are the user's groups (full parameters, every value filled in), the same on every
    rank: a scheduler, or you, sets ``group["lr"]`` there, as with any optimizer, and each ``step()``
    hands the values to the wrapped optimizer (``optimizer``), whose groups hold this rank's shards.

    Raises:
        ValueError: ``stage`` not 1 or 2; parameters or groups that differ between ranks (count, total
            size, dtype, a parameter's size, a group's parameter count, size or values), an empty
            list, mixed dtypes, a parameter in two groups, a group without ``"params"`` or a value
            ``optimizer_class`` rejects. Raised on *every* rank, because the check is collective.
        TypeError: ``optimizer_class`` is not an ``Optimizer`` subclass; a parameter is not a tensor;
            an argument ``optimizer_class`` does not take.
    """

    @agreed_arguments(
        checks.arguments
    )  # first, collectively: a bad or differing argument raises on every rank
    def __init__(
        self,
        params: Iterable[Tensor] | Iterable[dict[str, Any]],
        optimizer_class: type[Optimizer],
        group: Any = None,
        stage: int = 1,
        **optimizer_kwargs: Any,
    ) -> None:
        # Here ``params`` is the user's groups, filled in and agreed by checks.arguments, and
        # ``group`` the communicator (the world for None).
        self.group, self.stage = group, stage
        self.param_groups: list[dict[str, Any]] = params  # see the class docstring
        self.params: list[Tensor] = [p for g in params for p in g["params"]]  # flat order, each once
        self.layout = ShardLayout.build([p.size for p in self.params], self.group.size, self.group.rank)
        self._broadcast_parameters()

        # One shard tensor per owned segment; its .data and .grad are (re)attached in each step.
        xp = backend.array_module(self.params[0].data)
        self._shards = [
            Tensor(_flat(self.params[s.param_index].data)[s.lo : s.hi], requires_grad=True)
            for s in self.layout.segments
        ]
        # A rank that owns nothing (P < N) still gets an optimizer, so state_dict() etc. work everywhere.
        empty = Tensor(xp.zeros(0, dtype=self.params[0].dtype), requires_grad=True)
        inner, self._owner = zero_groups.shard_groups(self.param_groups, self.layout, self._shards, empty)
        self.optimizer: Optimizer = optimizer_class(inner, **optimizer_kwargs)
        self._reduced = False  # whether clip_grad_norm_ already averaged this step's gradients

    @property
    def defaults(self) -> dict[str, Any]:
        """The wrapped optimizer's constructor hyperparameters (each group's values are in its dict)."""
        return self.optimizer.defaults

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the parameters' gradients (None, or zeros with ``set_to_none=False``) and the shards'."""
        clear_grads(self.params, set_to_none)
        for shard in self._shards:
            shard.grad = None
        self._reduced = False

    def clip_grad_norm_(
        self, max_norm: float, norm_type: float = 2.0, error_if_nonfinite: bool = False
    ) -> float:
        """Average the gradients now and clip them by the global norm of the average (``clip.py``).

        Call it after the last ``backward()`` of a step, before ``step()``, as PyTorch's
        ``FullyShardedDataParallel.clip_grad_norm_`` (``minidist.nn.utils.clip_grad_norm_`` would see only
        local, un-averaged gradients). It does step()'s reduce-scatter early; the clipped step equals
        one process's ``clip_grad_norm_`` + step. Returns the norm before clipping, a Python float, the
        same on every rank (NaN or inf if a gradient is: the gradients are then left unchanged, skip the
        step). Collective, with the same arguments on every rank: the reduce-scatter (once per step)
        and one all-gather of five numbers. Raises on every rank: ``TypeError``/``ValueError`` for
        ``max_norm < 0``, ``norm_type <= 0`` or arguments that differ between ranks; ``RuntimeError``
        for a non-finite norm if ``error_if_nonfinite``.
        """
        self._average_gradients()
        grads = [shard.grad for shard in self._shards]
        return clip_shards_(grads, self.group, max_norm, norm_type, error_if_nonfinite)

    def step(self) -> None:
        """Average the gradients over the group, update this rank's shard, all-gather the parameters.

        Collective: every rank of the group must call it. A parameter with no gradient on any rank is
        skipped (as a plain optimizer skips it); one with a gradient on some ranks only counts as zero
        on the others. Each group's current values (``param_groups``) are used. Communication: one
        all-reduce of ``len(params)`` flags and one reduce-scatter (unless ``clip_grad_norm_`` did
        them), one all-gather of P elements; transient buffers of P elements for each.
        """
        self._average_gradients()
        zero_groups.push_values(self.param_groups, self.optimizer.param_groups, self._owner)
        self.optimizer.step()  # the wrapped optimizer, on this rank's shard tensors only
        self._all_gather_parameters()
        self._reduced = False

    def _average_gradients(self) -> None:
        """Reduce-scatter the local gradients and point the shards at the averages, once per step."""
        if self._reduced:
            return
        used = self._used_everywhere()
        averaged = self._reduce_scatter_gradients()
        self._attach_shards(used, averaged)
        if self.stage == 2:
            self._free_full_gradients()
        self._reduced = True

    def memory_report(self) -> dict[str, int]:
        """Bytes this rank holds now: ``{"parameters", "gradients", "optimizer_state", "total"}``,
        measured from the live buffers (``memory.py``, which gives the formulas to compare with)."""
        return memory_report(self.params, self._shards, self.optimizer)

    def state_dict(self) -> dict[str, Any]:
        """``{"optimizer": <the wrapped optimizer's state_dict of this rank's shard>, "layout": {...},
        "param_groups": [{name: value, ..., "params": [indices into params]}]}``.

        ``state["optimizer"]["state"][k]`` belongs to segment k of ``layout["segments"]``
        (``[param_index, lo, hi]``: elements lo:hi of that flattened parameter), with 1-D arrays of
        ``hi - lo`` elements. ``layout`` also records world_size, rank, numel, sizes and the owned
        range [start, stop) of the flat vector, enough to reassemble the full state from all ranks.
        """
        layout = {**self.layout.describe(), "stage": self.stage}
        groups = zero_groups.groups_state(self.param_groups)
        return {"optimizer": self.optimizer.state_dict(), "layout": layout, "param_groups": groups}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore a ``state_dict()`` saved by the same rank of the same layout (any stage).

        Raises ``ValueError`` if the layout or the groups' sizes differ (another world size, rank or
        model); loading a shard saved under another world size needs resharding, which is the
        checkpoint module's job. Each group's saved values (a scheduled ``lr``) are restored.
        """
        self.layout.check_same({k: v for k, v in state_dict["layout"].items() if k != "stage"})
        saved_groups = state_dict.get("param_groups", [])  # absent in state dicts of older versions
        zero_groups.check_same_sizes(saved_groups, self.param_groups)
        self.optimizer.load_state_dict(state_dict["optimizer"])
        for ours, saved in zip(self.param_groups, saved_groups):
            ours.update(zero_groups.values_of(saved))

    # -- the shard tensors ---------------------------------------------------------------------------
    def _attach_shards(self, used: np.ndarray, averaged: Any) -> None:
        """Point each shard tensor at its slice of the parameter and of the averaged gradient."""
        for shard, seg in zip(self._shards, self.layout.segments):
            p = self.params[seg.param_index]
            shard.data = _flat(p.data)[seg.lo : seg.hi]  # re-attach: p.data may have been replaced
            if not used[seg.param_index]:
                shard.grad = None  # the wrapped optimizer skips it, as a plain one would
                continue
            piece = averaged[seg.shard_offset : seg.shard_offset + seg.numel]
            if self.stage == 2:
                shard.grad = piece
                continue
            # Stage 1 keeps the full gradient buffer and stores the average in its owned part, so the
            # shard's gradient costs no extra memory.
            if p.grad is None:  # no local gradient, but another rank had one: ours was zero
                p.grad = backend.array_module(p.data).zeros(p.shape, dtype=p.dtype)
            elif not p.grad.flags.c_contiguous:  # _flat must give a view we can write through
                p.grad = backend.array_module(p.grad).ascontiguousarray(p.grad)
            _flat(p.grad)[seg.lo : seg.hi] = piece
            shard.grad = _flat(p.grad)[seg.lo : seg.hi]

    def _free_full_gradients(self) -> None:
        """Stage 2: drop every full gradient; a wholly owned parameter keeps a view of its average."""
        for p in self.params:
            p.grad = None
        for shard, seg in zip(self._shards, self.layout.segments):
            if shard.grad is not None and self.layout.owns_whole(seg.param_index):
                p = self.params[seg.param_index]
                p.grad = shard.grad.reshape(p.shape)

    # -- communication ----------------------------------------------------------------------------
    def _broadcast_parameters(self) -> None:
        flat = self._flat_buffer()
        for p, offset in zip(self.params, self.layout.offsets):
            flat[offset : offset + p.size] = p.data.reshape(-1)
        dist.broadcast(flat, src=0, group=self.group)
        self._write_parameters(flat)

    def _used_everywhere(self) -> np.ndarray:
        """Per parameter: does any rank have a gradient for it? (One all-reduce of small flags.)"""
        flags = np.array([p.grad is not None for p in self.params], dtype=np.int64)
        return dist.all_reduce(flags, op="max", group=self.group).astype(bool)

    def _reduce_scatter_gradients(self) -> Any:
        """The group-average gradient of this rank's chunk, 1-D, ``layout.shard_numel`` elements."""
        # BEGIN SOLUTION A7.1: reduce-scatter the flat gradient so each rank gets the average of its chunk
        flat = self._flat_buffer()  # zero where a parameter has no local gradient
        for p, offset in zip(self.params, self.layout.offsets):
            if p.grad is not None:
                flat[offset : offset + p.size] = p.grad.reshape(-1)
        averaged = dist.reduce_scatter(flat, op="avg", group=self.group)
        # END SOLUTION
        checks.check_chunk(averaged, self.layout)  # the chunk dist returned is the one this rank owns
        return averaged

    def _all_gather_parameters(self) -> None:
        # BEGIN SOLUTION A7.2: all-gather the updated shards into every rank's parameters
        xp = backend.array_module(self.params[0].data)
        owned = [s.data.reshape(-1) for s in self._shards]
        mine = xp.concatenate(owned) if owned else xp.zeros(0, dtype=self.params[0].dtype)
        self._write_parameters(dist.all_gather(mine, group=self.group))
        # END SOLUTION

    def _write_parameters(self, flat: Any) -> None:
        """Copy consecutive pieces of the P-element ``flat`` into the parameters, in place."""
        for p, offset in zip(self.params, self.layout.offsets):
            p.data[...] = flat[offset : offset + p.size].reshape(p.shape)
            bump_version(p)  # an optimizer step: a graph built before it must not backward through it

    def _flat_buffer(self) -> Any:
        xp = backend.array_module(self.params[0].data)
        return xp.zeros(self.layout.numel, dtype=self.params[0].dtype)


def _flat(a: Any) -> Any:
    """``a`` as 1-D: a view when ``a`` is C-contiguous (as parameters and gradients are), else a copy."""
    return a.reshape(-1)
