"""``FullyShardedDataParallel``: ZeRO stage 3 as PyTorch's FSDP does it, unit by unit.

Rajbhandari et al., "ZeRO", SC 2020, §5.3 (P_os+g+p): besides optimizer state and gradients, the
*parameters* are partitioned over the N data-parallel ranks, so a rank keeps 1/N of everything and
rebuilds each layer's parameters by an all-gather just before it needs them. Zhao et al., "PyTorch
FSDP: Experiences on Scaling Fully Sharded Data Parallel", VLDB 2023, §3: the model is cut into
*units* (``wrap``), each flattened into one vector (``flat_unit.py``); a unit is all-gathered just
before its forward and again before its backward, freed right after each, its gradient
reduce-scattered after its backward; and the next unit's all-gather is issued before the current unit
computes (prefetch, §3.3.2), so communication overlaps computation.

**Why every unit runs under activation recomputation.** An autograd ``Function`` keeps the *arrays*
it needs for backward (``Linear`` keeps its weight), so a graph recorded through a gathered unit would
keep the gathered buffer alive until backward: "freeing" it after forward would free nothing, and a
rank would hold every unit at once. So a unit's forward runs without recording a graph, keeping only
its input (``minidist.nn.recompute``); its backward gathers the unit, runs its forward again with a
graph, backpropagates through it and frees it. A unit's full parameters then exist only while it
computes: per rank, P/N (shards) + the root unit + at most two gathered units (the one computing, the
one prefetched). The cost is one extra forward per unit per step (about a third more compute, as any
full activation checkpointing; PyTorch FSDP users mostly combine the two for the same reason).
Dropout masks are equal in both runs (recompute replays the generator states).

The *root* unit (parameters in no selected module: the GPT's embeddings, tied head and final
LayerNorm) is gathered when ``forward`` starts and freed when backward ends, as PyTorch keeps its
root unsharded between forward and backward. With ``wrap=None`` the root is the whole model: memory
is not bounded then (the whole model is gathered for the step), but the optimizer state and
gradients are still 1/N.

Everything is equal to one process (tests/parallel/fsdp/test_fsdp.py: 1 vs 2 and 4 ranks, train_gpt on 3): the
gradients are the same sums in another order, averaged by ``reduce_scatter(op="avg")``.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator
from typing import Any

import minidist.distributed as dist
from minidist import autograd
from minidist.autograd import Tensor
from minidist.nn.module import IncompatibleKeys, Module, Parameter
from minidist.parallel.data_parallel.comm_thread import CommThread
from minidist.parallel.fsdp import state
from minidist.parallel.fsdp.flat_unit import FlatUnit
from minidist.parallel.fsdp.schedule import UnitSchedule
from minidist.parallel.fsdp.units import Wrap, describe, local_problem, plan_units
from minidist.parallel.zero.clip import clip_shards_


class FullyShardedDataParallel(Module):
    """Shard ``module``'s parameters, gradients and (through ``parameters()``) optimizer state over ``group``.

    Usage (``examples/train_gpt.py --fsdp``)::

        fsdp = FullyShardedDataParallel(gpt, wrap=(Block,))        # collective; broadcasts rank 0's weights
        decay = [p for p in gpt.parameters() if p.ndim >= 2]       # groups of the ORIGINAL parameters
        opt = optim.AdamW(fsdp.shard_param_groups([{"params": decay, ...}, ...]), lr=1e-3)
        loss = cross_entropy(fsdp(x), y); loss.backward()          # shards' .grad: the group average
        fsdp.clip_grad_norm_(1.0); opt.step(); opt.zero_grad()     # any unmodified optimizer

    Args:
        module: the model, the same on every rank (names, shapes, dtypes; checked).
        group: the data-parallel communicator (default: the world).
        wrap: which submodules become units: a Module class or tuple of classes (``(Block,)``), or a
            predicate ``(name, module) -> bool``; None: one unit, the whole model. Rules (nesting,
            shared parameters) in ``units.py``.
        prefetch: issue the next unit's all-gather before the current unit computes (forward: the
            next unit in module order; backward: the previous one in the order the forward ran).
            Off: every all-gather waits at once. Same numbers either way.
        param_dtype: dtype of the all-gather (None: the parameters' own; "bfloat16", "float16"):
            halves its bytes; the units compute with the rounded values, cast back to the parameters'
            dtype (this version's ops compute in float32/float64), and the shards stay the master copy.
        reduce_dtype: dtype of the gradient reduce-scatter (None: the parameters' own). Lower
            precision halves the bytes, but averaging many small float16 gradients underflows (below
            6e-8 they become 0), so the default keeps the master dtype.

    Between steps the original Parameters hold *empty* arrays of shape ``(0,) * ndim`` (so ``p.ndim``
    still tells matrices from vectors, while any read of the values fails loudly instead of seeing
    stale numbers); ``state_dict()`` gives the full values. A unit's parameters must be used only
    inside its own forward (or be root parameters). A unit's ``forward`` must return one Tensor.

    Names against ``torch.distributed.fsdp.FullyShardedDataParallel`` (FSDP1): ``group`` is its
    ``process_group``, ``wrap`` its ``auto_wrap_policy`` (a class tuple or predicate, not a policy
    object), ``param_dtype`` / ``reduce_dtype`` the fields of its ``MixedPrecision``, ``prefetch=True``
    its ``forward_prefetch=True`` with ``backward_prefetch=BACKWARD_PRE``. ``no_sync``,
    ``summon_full_params``, ``clip_grad_norm_`` (returns a Python float, torch a tensor),
    ``state_dict`` (torch's default ``FULL_STATE_DICT``: full values, the model's names, on every rank)
    and ``load_state_dict`` behave as torch's. Unlike torch's flat parameters, ``named_parameters()``
    names each shard ``"<name>[lo:hi]"``. Trained on 2 ranks with AdamW and clipping, the GPT equals
    PyTorch's on one process (tests/torch_oracle/test_torch_oracle_amp_fsdp_memory.py).

    Attributes:
        units: the ``FlatUnit`` s, root first (see ``flat_unit.py``: ``.name``, ``.params``,
            ``.names``, ``.layout``, ``.shards``, ``.flat_shard``).

    Raises:
        ValueError / TypeError, on every rank (the check is collective): parameters that differ between
            ranks (count, names, shape, dtype) or arguments that differ; a ``wrap`` that selects
            nothing, nested units, a module selected twice; mixed dtypes in a unit; bad dtypes.
    """

    def __init__(
        self,
        module: Module,
        group: Any = None,
        wrap: Wrap = None,
        prefetch: bool = True,
        param_dtype: Any = None,
        reduce_dtype: Any = None,
    ) -> None:
        super().__init__()
        self.group = group if group is not None else dist.init()
        error, plans, dtypes = None, [], (None, None)
        try:
            if not isinstance(module, Module):
                raise TypeError(f"FullyShardedDataParallel wraps a Module, got {type(module).__name__}")
            dtypes = (
                state.resolve_dtype(param_dtype, "param_dtype"),
                state.resolve_dtype(reduce_dtype, "reduce_dtype"),
            )
            if any(getattr(m, "_fsdp_wrapped", False) for m in module.modules()):
                raise ValueError(
                    "FullyShardedDataParallel: this model (or a part of it) is already wrapped by a "
                    "FullyShardedDataParallel, which keeps its parameters as shards; wrap a fresh model, or "
                    "use the existing wrapper (its state_dict() gives the full parameters)"
                )
            plans = plan_units(module, wrap)
            error = local_problem(plans)
        except (TypeError, ValueError) as e:
            error = e
        summary = {} if error else {**describe(plans), "prefetch": bool(prefetch), "dtypes": str(dtypes)}
        fix = "build the same model and pass the same arguments on every rank"
        dist.agree(summary, error, self.group, what="FullyShardedDataParallel", fix=fix)
        self.module, self.prefetch = module, bool(prefetch)
        self._thread = CommThread("fsdp-comm")
        weakref.finalize(self, self._thread.close, False)  # stop the thread when collected or at exit
        for plan in plans:  # the replicas start identical: rank 0's values, as DDP
            state.broadcast_params(plan.params, self.group)
        self.units = [FlatUnit(plan, self.group, self._thread, *dtypes) for plan in plans]
        self._schedule = UnitSchedule(self.units, self.prefetch)  # replaces the units' forward methods
        object.__setattr__(module, "_fsdp_wrapped", True)  # its parameters are shards now
        first = self.units[0]  # a rank owning nothing still gives its optimizer one (empty) tensor:
        self._placeholder = Tensor(first.flat_shard[:0].copy(), requires_grad=True)

    # -- forward / backward (schedule.py) ------------------------------------------------------------
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Run the module; its output's backward (re)gathers, reduce-scatters and frees the units."""
        if self._schedule.summoned:
            raise RuntimeError(
                "FullyShardedDataParallel: do not call the FSDP model inside summon_full_params(); call "
                "its .module there (no communication), or leave the block first"
            )
        self._schedule.begin_forward()
        try:
            out = self.module(*args, **kwargs)
        except BaseException:
            self._schedule.free_all()
            raise
        out = self._schedule.end_forward(out)
        if autograd.is_grad_enabled() and not isinstance(out, Tensor):
            raise TypeError(
                f"FullyShardedDataParallel: the wrapped module returned a {type(out).__name__}; with "
                "gradients on it must return one Tensor (FSDP finishes its backward from it). Return the "
                "logits (or the loss) alone, or run this forward under minidist.no_grad()"
            )
        return out

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Gradient accumulation without communication: the full gradients stay on the parameters
        (memory of P, not P/N) and are reduce-scattered, summed in, by the first backward outside."""
        previous, self._schedule.sync = self._schedule.sync, False
        try:
            yield
        finally:
            self._schedule.sync = previous

    def zero_grad(self) -> None:
        """Drop the shards' gradients and any full gradients ``no_sync()`` left on the parameters."""
        for u in self.units:
            for t in (*u.shards, *u.params):
                t.grad = None

    @contextlib.contextmanager
    def summon_full_params(self) -> Iterator[None]:
        """Inside the block the original parameters hold their full values and ``self.module`` runs as
        a plain model, with no communication (PyTorch's name): e.g. rank 0 alone samples from it.

        Collective on entry (one all-gather per unit); leaving it frees them again without
        communication, so ranks may leave at different times. Values written to the parameters inside
        are discarded (the shards are the master copy). Raises ``RuntimeError`` if entered during a
        step (a backward still pending) or nested.
        """
        if self._schedule.summoned or any(u.gathered for u in self.units):
            raise RuntimeError(
                "summon_full_params: enter it between steps (after backward, not nested), on every rank"
            )
        for u in self.units:
            u.gather()
        self._schedule.summoned = True
        try:
            yield
        finally:
            self._schedule.summoned = False
            self._schedule.free_all()

    # -- the optimizer's view -------------------------------------------------------------------------
    def named_parameters(self) -> Iterator[tuple[str, Parameter]]:
        """``(name[lo:hi], shard)`` for every owned segment: the tensors an optimizer should step."""
        any_owned = False
        for u in self.units:
            for seg, shard in zip(u.layout.segments, u.shards):
                any_owned = True
                yield f"{u.names[seg.param_index]}[{seg.lo}:{seg.hi}]", shard
        if not any_owned:  # P < N: an optimizer still needs one tensor
            yield "", self._placeholder

    def shard_param_groups(self, groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Map parameter groups of the ORIGINAL parameters to groups of this rank's shard tensors.

        Every group keeps its values and its place (a group this rank owns nothing of stays, empty),
        so schedulers and checkpoints see the same groups on every rank. Raises ``ValueError`` for a
        parameter that is not the wrapped model's, ``TypeError`` for a group that is not a dict.
        """
        return state.shard_groups(self.units, groups, self._placeholder)

    def clip_grad_norm_(
        self, max_norm: float, norm_type: float = 2.0, error_if_nonfinite: bool = False
    ) -> float:
        """Clip the averaged gradient (held as shards) to global norm ``max_norm``; return the norm before.

        Collective (one all-gather of five numbers per rank, ``zero/clip.py``); equal to one process's
        ``nn.utils.clip_grad_norm_``. Raises on every rank as ``clip_shards_``.
        """
        grads = [s.grad for u in self.units for s in u.shards]
        what = "FullyShardedDataParallel.clip_grad_norm_"
        return clip_shards_(grads, self.group, max_norm, norm_type, error_if_nonfinite, what=what)

    # -- full state ---------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Full parameters by the model's own names (no "module." prefix), like PyTorch's
        FULL_STATE_DICT, on every rank. Collective: one all-gather per unit."""
        return state.full_state_dict(self.units, self.module)

    def load_state_dict(self, state_dict: dict[str, Any], strict: bool = True) -> IncompatibleKeys:
        """Keep this rank's shards of the full values in ``state_dict`` (not collective).

        Raises ``KeyError`` (with ``strict``) for missing or unexpected names, ``ValueError`` for a
        shape that differs from the parameter's; nothing changes then.
        """
        return state.load_full_state_dict(self.units, state_dict, strict)
