"""Which parameters go into which FSDP unit: the pure planning step (no communication, no arrays).

FSDP (Zhao et al., "PyTorch FSDP", VLDB 2023, §3.2) does not shard the model as one vector: it cuts it
into *units*, chosen submodules (a GPT's transformer blocks), and gathers one unit at a time. ``wrap``
selects the units; every parameter that is in no unit goes to the *root* unit, named "".

Rules, each with the reason:

* units may not be nested (one inside another): a parameter must belong to exactly one flat vector,
  and a unit inside a unit would be gathered twice. ``ValueError`` names both.
* a parameter shared by two units (weight tying across units) goes to the root: the root is gathered
  for the whole step, so each unit sees the same full values, and both uses add into one gradient.
  The GPT's tied ``wte.weight``/head is used outside the blocks, so with ``wrap=(Block,)`` it is a
  root parameter anyway.
* a unit without parameters (a selected ``Dropout``) is dropped: there is nothing to gather.
* a ``wrap`` that selects no submodule with parameters is a mistake (``ValueError``), not a silent
  single-unit run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from minidist.nn.module import Module, Parameter

Wrap = tuple[type, ...] | type | Callable[[str, Module], bool] | None


@dataclass
class UnitPlan:
    """One unit: the module it wraps (the whole model for the root), its parameters in
    ``named_parameters`` order and their global names (as in ``model.named_parameters()``)."""

    name: str
    module: Module
    names: list[str] = field(default_factory=list)
    params: list[Parameter] = field(default_factory=list)


def select_modules(model: Module, wrap: Wrap) -> list[tuple[str, Module]]:
    """``[(path, module)]`` that ``wrap`` selects, in ``named_modules`` order (never the model itself).

    Raises ``TypeError`` for a ``wrap`` that is neither None, a class, a tuple of classes nor a
    callable ``(name, module) -> bool``; ``ValueError`` for nested selections or one module selected
    under two paths.
    """
    if wrap is None:
        return []
    if isinstance(wrap, type) or (isinstance(wrap, tuple) and all(isinstance(c, type) for c in wrap)):
        classes = wrap

        def chosen(name: str, m: Module) -> bool:
            return isinstance(m, classes)
    elif callable(wrap):
        chosen = wrap
    else:
        raise TypeError(
            "FullyShardedDataParallel: wrap must be None, a Module class, a tuple of Module classes "
            f"(e.g. (Block,)) or a function (name, module) -> bool, got {wrap!r}"
        )
    selected = [(n, m) for n, m in model.named_modules() if n != "" and chosen(n, m)]
    seen: dict[int, str] = {}
    for n, m in selected:
        if id(m) in seen:
            raise ValueError(
                f"FullyShardedDataParallel: the module at {seen[id(m)]!r} is also registered at {n!r} and "
                "wrap selects it twice; a unit must be one place in the model"
            )
        seen[id(m)] = n
    for (a, _), (b, _) in zip(selected, selected[1:]):  # depth-first order: a nested one follows its parent
        if b.startswith(a + "."):
            raise ValueError(
                f"FullyShardedDataParallel: wrap selects {b!r} inside {a!r}; units cannot be nested "
                "(each parameter belongs to one unit). Select only the outer or only the inner modules"
            )
    return selected


def plan_units(model: Module, wrap: Wrap) -> list[UnitPlan]:
    """The units, root first (if it has parameters), then the selected modules in model order.

    Raises what :func:`select_modules` raises, and ``ValueError`` if ``wrap`` is given but no selected
    module has a parameter of its own (after shared parameters moved to the root).
    """
    selected = select_modules(model, wrap)
    holders: dict[int, set[int]] = {}  # id(parameter) -> indices of the selected modules that hold it
    for k, (_, m) in enumerate(selected):
        for p in m.parameters():
            holders.setdefault(id(p), set()).add(k)
    root = UnitPlan("", model)
    units = [UnitPlan(n, m) for n, m in selected]
    for name, p in model.named_parameters():
        held = holders.get(id(p), set())
        target = units[next(iter(held))] if len(held) == 1 else root  # shared by two units: the root
        target.names.append(name)
        target.params.append(p)
    units = [u for u in units if u.params]
    if wrap is not None and not units:
        raise ValueError(
            f"FullyShardedDataParallel: wrap={wrap!r} selects no submodule with parameters of its own "
            f"({len(selected)} selected); pass the classes of the model's repeated layers, e.g. "
            "wrap=(Block,), or wrap=None for one unit holding the whole model"
        )
    return ([root] if root.params else []) + units


def describe(plans: list[UnitPlan]) -> dict[str, Any]:
    """JSON values the ranks must agree on: the units' names and parameter counts, and per parameter
    its unit, shape and dtype (one key each, so a difference names the parameter)."""
    out: dict[str, Any] = {"units": [[u.name, len(u.params)] for u in plans]}
    for u in plans:
        for n, p in zip(u.names, u.params):
            out[f"parameter {n}"] = f"unit {u.name or 'root'!r}, shape {p.shape}, {p.dtype}"
    return out


def local_problem(plans: list[UnitPlan]) -> Exception | None:
    """What is wrong with this rank's units on their own: no parameters, non-float or mixed dtypes in a
    unit (a unit is one flat vector, so one dtype)."""
    if not plans:
        return ValueError("FullyShardedDataParallel: the model has no parameters to shard")
    for u in plans:
        dtypes = sorted({str(p.dtype) for p in u.params})
        if len(dtypes) > 1:
            return ValueError(
                f"FullyShardedDataParallel: unit {u.name or 'root'!r} mixes dtypes {dtypes}; a unit is one "
                "flat vector, so its parameters need one dtype (cast the model, or wrap the parts apart)"
            )
        if u.params[0].dtype.kind != "f":
            return ValueError(f"FullyShardedDataParallel needs floating-point parameters, got {dtypes[0]}")
    return None
