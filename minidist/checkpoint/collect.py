"""What a rank saves: its tensors by global key, and the sizes that decide who writes each piece.

``save`` calls :func:`collect` (model parameters and optimizer state, by key) and then
:func:`writer_items` (every piece's size, as the rank holding it has it) before
``layout.assign_writers``. A tied copy (``is_tied_copy``: the last pipeline stage's copy of the token
embedding, Shoeybi et al. 2019 keep the two equal) is left out: the original, on the first stage,
is saved under the same name with the same values, and ``load`` fills the copy from it.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from minidist.checkpoint import format as fmt
from minidist.checkpoint import fsdp_state, optim_state
from minidist.checkpoint.checks import all_gather_json
from minidist.checkpoint.layout import Layout, tp_dim_of, tp_stride_of


class Saved(NamedTuple):
    """One tensor this rank holds: its array and split (``tp_dim``, ``tp_stride``), and what it is."""

    array: Any
    tp_dim: int | None
    tp_stride: int
    name: str  # the parameter's global name
    kind: str  # "model" or "optim"
    state: str | None  # the optimizer state's name ("exp_avg", ...), None for a parameter


def collect(
    module: Any, optimizer: Any, fsdp: Any = None
) -> tuple[dict[str, Saved], dict[str, dict[str, int]], list[str]]:
    """``({key: Saved}, {name: {counter: int}}, [names of tied copies])`` of this rank; collective
    for ZeRO (``optim_state.state_by_name`` gathers its shards) and for FSDP (``fsdp``, whose
    ``module`` is ``module``: ``fsdp_state.py`` gathers full parameters and state). Tied copies are
    left out."""
    full = fsdp_state.full_parameters(fsdp) if fsdp is not None else None
    tensors: dict[str, Saved] = {}
    split, tied = {}, []  # split: name -> (tp_dim, tp_stride) of every parameter that is saved
    for name, p in module.named_parameters():
        if getattr(p, "is_tied_copy", False):
            tied.append(name)
            continue
        split[name] = (tp_dim_of(p), tp_stride_of(p))
        array = p.data if full is None else full[name]  # (under FSDP, p holds no values between steps)
        tensors[fmt.model_key(name)] = Saved(array, *split[name], name, "model", None)
    scalars: dict[str, dict[str, int]] = {}
    if optimizer is not None:
        if fsdp is None:
            by_name = optim_state.state_by_name(optimizer, module)
        else:
            by_name = fsdp_state.state_by_name(fsdp, optimizer, {n: tuple(a.shape) for n, a in full.items()})
        for name, state in by_name.items():
            if name not in split:  # a tied copy: its state equals the original's, saved by its stage
                continue
            for k, v in state.items():
                if hasattr(v, "shape"):
                    tensors[fmt.optim_key(name, k)] = Saved(v, *split[name], name, "optim", k)
                else:
                    scalars.setdefault(name, {})[k] = int(v)
    return tensors, scalars, tied


def writer_items(comm: Any, tensors: dict[str, Saved], layout: Layout) -> list[tuple[str, Any, int | None]]:
    """Collective: ``assign_writers``' items, with each tp piece's size as its own tp rank has it.

    The ranks of a stage must all compute the same assignment, but uneven pieces (a 65-row embedding
    over tp 2: 33 + 32 rows) differ in size between tp ranks: each rank learns the others' sizes
    (one small JSON all-gather; the full shape itself is the sum of the written pieces, which
    ``format.build_manifest`` adds up).
    """
    mine = {k: int(t.array.nbytes) for k, t in tensors.items()}
    everyone = all_gather_json(mine, comm)
    stage = layout.stage_ranks()
    items = []
    for k, t in tensors.items():
        if t.tp_dim is None:
            items.append((k, mine[k], None))
        else:  # the rank of this stage at tp rank j (any dp or cp replica) holds piece j
            items.append((k, [everyone[stage[j]].get(k, 0) for j in range(layout.tp)], t.tp_dim))
    return items
