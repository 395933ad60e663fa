"""Stage partitioning: cut a ``Sequential`` into ``p`` consecutive stages.

A pipeline stage is a run of consecutive layers. Cuts are given as the indices where stages 1..p-1
begin (``cuts=[2, 5]`` on 7 layers: stages [0, 2), [2, 5), [5, 7)), or chosen to balance the parameter
count: cuts that minimise the largest stage (GPipe's partitioning goal, Huang et al. 2019, §2.2;
parameters stand in for compute, which for Linear layers is proportional to them). Among equally good
cuts the choice is deterministic (it leans towards fewer layers per stage, e.g. spreading parameter-free
activations), so every rank computes the same cuts.

``PipelineStage`` keeps the layers' original names, so ``stage.named_parameters()`` yields the names
the whole model would ("4.weight"), which checkpoints use to map a stage's tensors to the full model.
A layer may say where its parameters sit in the model it came from with a ``pipeline_name`` attribute
(:func:`layer_prefix`): ``GPT.pipeline_layers()`` gives ``"h.3"`` to block 3 and ``""`` (the model's
root) to the embedding and the head, so a stage of a GPT names its parameters as the GPT does
(``h.3.ln_1.weight``, ``wte.weight``). With the interleaved schedule a rank holds several
non-consecutive chunks; ``PipelineChunks`` registers all their layers, again under the full model's
names, and keeps the chunks in order.

A parameter that several layers use (the GPT's token table, read by the embedding and by a tied head)
counts fully for each of them in the balanced cuts: each stage that holds it stores a copy, and a
tied head's product costs as much as a Linear of that size.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from minidist.nn.layers import Sequential, run_in_order
from minidist.nn.module import Module, Parameter


def layer_prefix(layer: Module, index: int | str) -> str:
    """Where ``layer``'s parameters sit in the full model: its ``pipeline_name`` if it has one ("" = the
    model's root, "h.3" = under that prefix), else its index in the Sequential ("4")."""
    return getattr(layer, "pipeline_name", str(index))


def named_layer_parameters(layers: Iterable[tuple[int | str, Module]]) -> Iterator[tuple[str, Parameter]]:
    """``(full-model name, parameter)`` of ``(index, layer)`` pairs, each parameter once (the first name
    it is met under), as ``Module.named_parameters`` but with :func:`layer_prefix` for each layer."""
    seen: set[int] = set()
    for index, layer in layers:
        prefix = layer_prefix(layer, index)
        for name, p in layer.named_parameters():
            if id(p) not in seen:
                seen.add(id(p))
                yield (f"{prefix}.{name}" if prefix else name), p


class PipelineStage(Module):
    """Layers ``start .. start + len(layers) - 1`` of a ``Sequential``, registered under those names;
    ``named_parameters`` (and so ``state_dict``) names each layer's parameters by its ``pipeline_name``
    where it has one (module docstring)."""

    def __init__(self, layers: Sequence[Module], start: int) -> None:
        super().__init__()
        self.start = start
        for i, layer in enumerate(layers):
            setattr(self, str(start + i), layer)

    def named_parameters(self) -> Iterator[tuple[str, Parameter]]:
        """The parameters under the full model's names (:func:`named_layer_parameters`)."""
        return named_layer_parameters(self._modules.items())

    def forward(self, x: Any) -> Any:
        return run_in_order(list(self._modules.values()), x)  # as Sequential (Linear + ReLU fused)

    def extra_repr(self) -> str:
        return f"layers {self.start}..{self.start + len(self._modules) - 1}"


class PipelineChunks(Module):
    """A rank's model chunks for the interleaved schedule: ``chunks[k]`` (a :class:`PipelineStage`) is
    virtual stage ``k * p + rank`` (Narayanan et al. 2021, §2.2.2).

    Every layer of every chunk is registered here under its index in the full model, so
    ``named_parameters()``, ``state_dict()`` and checkpoints see the full model's names ("12.weight"),
    as for a single stage. The chunks are not consecutive, so there is no single forward of the whole:
    ``forward(x, chunk)`` runs one chunk.
    """

    def __init__(self, chunks: Sequence[PipelineStage]) -> None:
        super().__init__()
        for chunk in chunks:
            for name, layer in chunk._modules.items():
                setattr(self, name, layer)
        object.__setattr__(self, "chunks", tuple(chunks))  # not registered: each layer appears once

    def named_parameters(self) -> Iterator[tuple[str, Parameter]]:
        """The parameters of all chunks under the full model's names (:func:`named_layer_parameters`)."""
        return named_layer_parameters(self._modules.items())

    def forward(self, x: Any, chunk: int) -> Any:
        return self.chunks[chunk](x)

    def extra_repr(self) -> str:
        return "chunks: " + ", ".join(chunk.extra_repr() for chunk in self.chunks)


def check_cuts(cuts: Sequence[int], num_layers: int, num_stages: int) -> list[int]:
    """Validate explicit cut points; return them as a list.

    Raises ``ValueError`` unless there are ``num_stages - 1`` strictly increasing integers in
    ``1 .. num_layers - 1`` (every stage must get at least one layer).
    """
    cuts = list(cuts)
    if len(cuts) != num_stages - 1:
        raise ValueError(
            f"{num_stages} stages need {num_stages - 1} cut points (where stages 1..{num_stages - 1} start), "
            f"got {len(cuts)}: {cuts}"
        )
    bounds = [0, *cuts, num_layers]
    if not all(isinstance(c, int) for c in cuts) or any(a >= b for a, b in zip(bounds, bounds[1:])):
        raise ValueError(
            f"cut points must be strictly increasing integers between 1 and {num_layers - 1} so that every "
            f"stage gets at least one of the {num_layers} layers, got {cuts}"
        )
    return cuts


def balanced_cuts(weights: Sequence[int], num_stages: int) -> list[int]:
    """Cut points splitting ``weights`` (one per layer) into ``num_stages`` runs with the smallest maximum.

    Dynamic programming over (layers used, stages used), O(L^2 p); the largest stage weight is optimal,
    and ties are broken deterministically by the largest layer count, then the earliest cuts. Raises
    ``ValueError`` if there are fewer layers than stages.
    """
    n = len(weights)
    if num_stages < 1:
        raise ValueError(f"the number of stages must be >= 1, got {num_stages}")
    if n < num_stages:
        raise ValueError(
            f"cannot split a model with {n} layer(s) into {num_stages} pipeline stages: every stage needs "
            f"at least one layer; use at most {n} stage(s) or a model with more layers"
        )
    prefix = [0]
    for w in weights:
        prefix.append(prefix[-1] + w)
    # best[k][i]: (cost, cuts) for the first i layers in k stages; cost = (max weight, max layer count)
    best: list[dict[int, tuple[tuple[int, int], list[int]]]] = [{0: ((0, 0), [])}]
    for k in range(1, num_stages + 1):
        row = {}
        for i in range(k, n - (num_stages - k) + 1):
            options = []
            for j in range(k - 1, i):  # the last stage is layers j..i-1
                if j in best[k - 1]:
                    (w, c), cuts = best[k - 1][j]
                    cost = (max(w, prefix[i] - prefix[j]), max(c, i - j))
                    options.append((cost, cuts + [j] if k > 1 else []))
            row[i] = min(options)
        best.append(row)
    return best[num_stages][n][1]


def partition(model: Sequential, num_stages: int, cuts: Sequence[int] | None = None) -> list[tuple[int, int]]:
    """``[(start, stop), ...]``: the layer range of every stage (balanced by parameters unless ``cuts``).

    Raises ``TypeError`` if ``model`` is not an ``nn.Sequential``; ``ValueError`` for fewer layers than
    stages or bad cuts (see :func:`check_cuts`).
    """
    if not isinstance(model, Sequential):
        raise TypeError(
            f"pipeline parallelism splits an nn.Sequential into stages, got {type(model).__name__}; "
            "write the model as nn.Sequential(layer, layer, ...)"
        )
    n = len(model)
    if n < num_stages:
        balanced_cuts([0] * n, num_stages)  # raises the "fewer layers than stages" error
    if cuts is None:
        cuts = balanced_cuts([sum(p.size for p in layer.parameters()) for layer in model], num_stages)
    cuts = check_cuts(cuts, n, num_stages)
    bounds = [0, *cuts, n]
    return list(zip(bounds, bounds[1:]))


def build_stage(model: Sequential, bounds: tuple[int, int]) -> PipelineStage:
    """The stage holding layers ``bounds[0] .. bounds[1] - 1`` of ``model`` (the same layer objects)."""
    start, stop = bounds
    return PipelineStage(list(model)[start:stop], start)
