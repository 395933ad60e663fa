"""``FullyShardedDataParallel`` in a checkpoint: the same files as every other layout.

Under FSDP (Zhao et al. 2023; ZeRO-3, Rajbhandari et al. 2020 §5.3) a rank holds, between steps, only
its shard of every unit's flat parameter vector, and its optimizer steps the *shard tensors*
(``fsdp.parameters()``): 1-D slices of the original parameters, one per segment of the unit's
``ShardLayout``. A checkpoint stores neither: it stores full tensors by global name (for a tp-sharded
parameter, this tp rank's piece, exactly as DDP holds it), and optimizer state by global parameter
name, with the parameter's shape. So:

* saving gathers, collectively over ``fsdp.group``, the full parameters (``fsdp.state_dict()``) and
  the optimizer state, unit by unit, with ZeRO's gather (``optim_state.gather_segments``: FSDP is ZeRO
  with one flat layout per unit), then hands the arrays to the usual writer (``collect.py``), which
  writes every distinct tensor once;
* loading reads the full tensors as for DDP (resharded over tp as usual), then keeps this rank's
  shards: ``fsdp.load_state_dict`` for the parameters, ``optim_state.slice_segment`` for the state.

Both directions copy values only (no arithmetic), so a checkpoint moves between FSDP on N ranks, FSDP on
M ranks, DDP, ZeRO-1/2 and tp/pp meshes with every value equal. The price: while saving or loading,
each rank holds the full model (its tp piece) and, when saving, the full state of one unit at a time,
like PyTorch's ``FULL_STATE_DICT`` without its rank-0-only option.

Communication is imported inside the functions: importing ``minidist.checkpoint`` must not start MPI.
"""

from __future__ import annotations

from typing import Any

from minidist.autograd import Tensor
from minidist.checkpoint import optim_state


def is_fsdp(model: Any) -> bool:
    """Whether ``model`` is a ``FullyShardedDataParallel`` (by name: no import of minidist.parallel)."""
    return type(model).__name__ == "FullyShardedDataParallel" and hasattr(model, "units")


def full_parameters(fsdp: Any) -> dict[str, Any]:
    """Collective over ``fsdp.group``: ``{global name: full array}`` (this tp rank's piece)."""
    return {n: v.data if isinstance(v, Tensor) else v for n, v in fsdp.state_dict().items()}


class FullParameter:
    """A parameter of an FSDP model as ``load`` sees it: its full array (``data``, written in place by
    ``load``) and the original ``Parameter``'s shape, dtype and tensor-parallel split."""

    def __init__(self, original: Any, array: Any) -> None:
        self.data = array
        self.tp_dim = getattr(original, "tp_dim", None)
        self.tp_stride = getattr(original, "tp_stride", 1)
        self.is_tied_copy = getattr(original, "is_tied_copy", False)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.data.shape)

    @property
    def ndim(self) -> int:
        return self.data.ndim

    @property
    def dtype(self) -> Any:
        return self.data.dtype


def load_targets(fsdp: Any) -> dict[str, FullParameter]:
    """Collective: ``{global name: FullParameter}``, in ``named_parameters`` order, for ``load`` to fill."""
    full = full_parameters(fsdp)
    return {n: FullParameter(p, full[n]) for n, p in fsdp.module.named_parameters()}


def restore_parameters(fsdp: Any, targets: dict[str, FullParameter]) -> None:
    """Collective: keep this rank's shards of the filled ``targets`` (``fsdp.load_state_dict``)."""
    fsdp.load_state_dict({n: t.data for n, t in targets.items()})


def _segments(fsdp: Any, optimizer: Any) -> list[tuple[Any, list[int | None]]]:
    """``[(unit, [optimizer index of each of its shard tensors, None if not optimized])]``.

    Raises ``ValueError`` for an optimizer parameter that is no shard tensor of ``fsdp``.
    """
    opt = optim_state.inner(optimizer)
    index = {id(p): i for i, p in enumerate(opt.params)}
    out, seen = [], set()
    for unit in fsdp.units:
        indices = [index.get(id(s)) for s in unit.shards]
        seen.update(i for i in indices if i is not None)
        out.append((unit, indices))
    placeholder = getattr(fsdp, "_placeholder", None)  # what a rank owning nothing hands the optimizer
    for i, p in enumerate(opt.params):
        if i not in seen and p is not placeholder:
            raise ValueError(
                f"optimizer parameter {i} (shape {p.shape}) is not a shard tensor of the "
                "FullyShardedDataParallel passed to checkpoint; build the optimizer from fsdp.parameters() "
                "or fsdp.shard_param_groups(...)"
            )
    return out


def check_optimizer(fsdp: Any, optimizer: Any) -> None:
    """``ValueError`` unless every parameter of ``optimizer`` is a shard tensor of ``fsdp``."""
    _segments(fsdp, optimizer)


def state_by_name(fsdp: Any, optimizer: Any, shapes: dict[str, tuple[int, ...]]) -> dict[str, dict[str, Any]]:
    """Collective over ``fsdp.group``: ``{global name: {state: full array, counter: int}}``.

    ``shapes``: every parameter's full shape (this tp rank's piece), by global name.
    """
    state = optim_state.inner(optimizer).state
    out: dict[str, dict[str, Any]] = {}
    for unit, indices in _segments(fsdp, optimizer):
        seg_states = [{} if i is None else state.get(i, {}) for i in indices]
        unit_shapes = [shapes[n] for n in unit.names]
        out.update(
            optim_state.gather_segments(
                seg_states, unit.layout, unit_shapes, list(unit.names), fsdp.group, unit.flat_shard
            )
        )
    return out


def load_by_name(fsdp: Any, optimizer: Any, header: dict[str, Any], state: dict[str, dict[str, Any]]) -> None:
    """Restore the optimizer state by global name (``state``: full arrays, this tp rank's piece) into
    ``optimizer``, which steps the shard tensors: each gets its slice (``optim_state.load_by_index``)."""
    optim_state.load_by_index(optimizer, header, _slices(fsdp, optimizer, state))


def _slices(fsdp: Any, optimizer: Any, state: dict[str, dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """``{optimizer index: state of that shard tensor}`` cut from the full state by global name."""
    per_index = {}
    for unit, indices in _segments(fsdp, optimizer):
        for seg, i in zip(unit.layout.segments, indices):
            full = state.get(unit.names[seg.param_index])
            if full and i is not None:
                per_index[i] = optim_state.slice_segment(full, seg)
    return per_index
