"""Weights that two pipeline stages share: a GPT's token table, read by the embedding and the tied head.

On one process a tied weight is one Parameter used twice, and backward sums the gradients of both
uses into it. Cut into stages, the embedding is on the first stage and the head on the last, different
processes: each needs the table in its own memory. Megatron-LM's answer (Shoeybi et al. 2019, §3;
Narayanan et al. 2021, whose pipelines keep "the embedding and output layers" in sync this way):

1. the later stage holds a *copy*, a Parameter of the same name flagged ``is_tied_copy = True`` (made
   from the same seed, so equal at the start; checked at construction);
2. after each step's backward the two gradients are **summed** over a group of just those ranks, so
   both copies get the gradient of the weight on one process (the sum of both uses);
3. the same optimizer then makes the same update on both: the copies stay equal, bit for bit.

Which parameters are tied is found by identity, for any ``Sequential``: a Parameter object used by
layers of more than one rank. The first rank holding it (in pipeline order) keeps the original; every
other holder gets a copy, swapped into the modules of its stage only. The group of the holders is
made once, with one ``split`` of the pipeline group (middle stages join none). With data or tensor
parallelism each dp replica / tp rank has its own pipeline group and so its own pair: the copy is
then that rank's shard, and nothing here changes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import minidist.distributed as dist
from minidist import backend
from minidist.distributed import Communicator
from minidist.nn.module import Module, Parameter
from minidist.parallel.pipeline.partition import named_layer_parameters

_FLAGS = ("tp_dim", "tp_group", "tp_stride", "sequence_parallel")  # what a copy takes from its original


@dataclass
class TiedParameter:
    """One weight used on several ranks: its ``name`` (on the first rank), the pipeline ``ranks`` that
    hold it (``ranks[0]`` the original), this rank's ``param`` (None if it holds none) and the
    ``group`` of the holders (None on the other ranks)."""

    name: str
    ranks: tuple[int, ...]
    param: Parameter | None = None
    group: Communicator | None = None


def find_tied(model: Sequence[Module], bounds: Sequence[tuple[int, int]], p: int) -> list[TiedParameter]:
    """The parameters used by layers on more than one rank, in model order.

    ``bounds[g]`` is virtual stage g's layer range; it lives on rank ``g % p``. The same on every rank
    (it depends only on the model's structure), so every rank makes the same groups. Raises
    ``ValueError`` if two different parameters get the same name (layers whose ``pipeline_name``
    clash): their checkpoint entries and copies would be confused.
    """
    layers = list(model)
    first_name: dict[int, str] = {}
    holders: dict[int, list[int]] = {}
    owner: dict[str, tuple[int, int]] = {}  # name -> (id of its parameter, layer index)
    for g, (start, stop) in enumerate(bounds):
        for i in range(start, stop):
            for name, param in named_layer_parameters([(i, layers[i])]):
                other = owner.setdefault(name, (id(param), i))
                if other[0] != id(param):
                    fix = (  # the one way to get a tied copy into a Sequential: an earlier PipelineParallel
                        "build the layers anew for each PipelineParallel (e.g. gpt.pipeline_layers())"
                        if param.is_tied_copy
                        else "give the layers distinct pipeline_name attributes"
                    )
                    raise ValueError(
                        f"two different parameters are both named {name!r} (in layers {other[1]} and {i} "
                        f"of the Sequential); {fix}"
                    )
                first_name.setdefault(id(param), name)
                ranks = holders.setdefault(id(param), [])
                if g % p not in ranks:
                    ranks.append(g % p)
    return [TiedParameter(first_name[k], tuple(r)) for k, r in holders.items() if len(r) > 1]


def untie(chunks: Sequence[Module], model: Sequence[Module], tied: list[TiedParameter], rank: int) -> None:
    """Give this rank's ``chunks`` a copy (``is_tied_copy = True``) of every tied parameter whose
    original is on another rank; set each ``TiedParameter.param`` to this rank's one (or None)."""
    originals = {name: p for name, p in named_layer_parameters(enumerate(model))}
    for t in tied:
        if rank not in t.ranks:
            continue
        original = originals[t.name]
        if rank == t.ranks[0]:
            t.param = original
            continue
        copy = Parameter(original.data.copy(), requires_grad=original.requires_grad)
        for flag in _FLAGS:
            setattr(copy, flag, getattr(original, flag))
        copy.is_tied_copy = True
        for chunk in chunks:  # swap it in wherever this rank's layers use the original
            for module in chunk.modules():
                for key, value in list(module._parameters.items()):
                    if value is original:
                        setattr(module, key, copy)
        t.param = copy


def make_groups(tied: list[TiedParameter], pp_group: Communicator) -> None:
    """One ``split`` of ``pp_group`` per distinct set of holders (collective over ``pp_group``); then
    check that every copy equals its original (one broadcast each). Raises ``ValueError`` on every rank
    of ``pp_group`` if one differs: the ranks did not build the model from the same seed."""
    groups: dict[tuple[int, ...], Any] = {}
    for t in tied:
        if t.ranks not in groups:
            mine = pp_group.rank in t.ranks
            key = t.ranks.index(pp_group.rank) if mine else None  # the original's holder is rank 0
            groups[t.ranks] = pp_group.split(0 if mine else None, key=key, name="tied")
        t.group = groups[t.ranks]
    error = None
    for t in tied:
        if t.group is None:
            continue
        original = t.param.data.copy()  # (a contiguous array: the broadcast's buffer)
        dist.broadcast(original, src=0, group=t.group)
        if error is None and not bool((original == t.param.data).all()):
            diff = float(abs(original - t.param.data).max())
            error = ValueError(
                f"PipelineParallel: the copy of the tied parameter {t.name!r} on pipeline rank "
                f"{pp_group.rank} differs from the original on rank {t.ranks[0]} (largest difference "
                f"{diff:.3g}); build the model from the same seed (md.manual_seed) on every rank"
            )
    dist.raise_if_any(error, pp_group, label="pipeline group")


def set_aside_tied_gradients(tied: list[TiedParameter]) -> list[Any]:
    """Take the gradients the tied parameters hold before a step's backward out of them (this rank's
    holders are left with None) and return them, for :func:`sum_tied_gradients` to add back after the
    sum. Gradients accumulated over several steps without ``zero_grad`` were summed already: summing
    them again would count the earlier steps' share once per holder (twice with two stages)."""
    earlier = []
    for t in tied:
        earlier.append(None if t.group is None else t.param.grad)
        if t.group is not None:
            t.param.grad = None
    return earlier


def put_back_tied_gradients(tied: list[TiedParameter], earlier: Sequence[Any]) -> None:
    """After a failed step: add the gradients set aside before it back, unsummed (no collective)."""
    for t, before in zip(tied, earlier):
        if before is not None:
            if t.param.grad is not None:
                before += t.param.grad
            t.param.grad = before


def sum_tied_gradients(tied: list[TiedParameter], earlier: Sequence[Any] | None = None) -> None:
    """Sum each tied parameter's gradient over its holders, in place (a missing gradient counts as 0),
    then add back its ``earlier`` gradient (:func:`set_aside_tied_gradients`, summed by an earlier
    step): afterwards every copy has the gradient the one shared weight has on one process. A frozen
    weight (``requires_grad`` False) is left without a gradient, as on one process: a zero gradient
    would still let AdamW's weight decay change it."""
    for i, t in enumerate(tied):
        if t.group is None:
            continue
        if t.param.grad is None:
            t.param.grad = backend.array_module(t.param.data).zeros_like(t.param.data)
        dist.all_reduce(t.param.grad, op="sum", group=t.group)  # every holder takes part, frozen or not
        before = earlier[i] if earlier is not None else None
        if before is not None:
            before += t.param.grad  # in place: the array the user's .grad referred to before the step
            t.param.grad = before
        if not t.param.requires_grad:
            t.param.grad = None
