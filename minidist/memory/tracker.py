"""``MemoryTracker``: the bytes one rank holds per category, current and peak, measured.

Parameters, gradients and optimizer state are *measured* by walking the model and the optimizer (each
underlying buffer once: a view or a ZeRO shard that views a parameter adds nothing); activations are
reported by the autograd engine as ops record and release them (``activations.py``); FSDP's gathered
parameters and communication buffers by the code that allocates them (``counters.allocated``). The
tracker re-measures its own categories at the moments they change: when the model's forward starts,
after each gradient accumulates into a parameter (backward), and after ``optimizer.step()`` and
``zero_grad()``. Every increase runs the budget check, so the error is raised by the allocation that would
overflow, with the stack of the code that made it; a decrease never raises (the clean-up after an error
frees memory, and must not fail again half-way).

Usage (a context manager, or ``start()`` / ``stop()``)::

    with memory.MemoryTracker(model, optimizer, budget="64MiB") as tracker:
        loss = loss_fn(model(x), y); loss.backward(); optimizer.step(); optimizer.zero_grad()
    print(tracker.table())          # per category: now, peak, and what each held at the total's peak
"""

from __future__ import annotations

import os
from typing import Any

from minidist.memory import activations, counters
from minidist.memory.activations import unique_nbytes
from minidist.memory.errors import OutOfMemoryError, describe_overflow
from minidist.memory.sizes import format_bytes, parse_size

BUDGET_ENV = "MINIDIST_MEMORY_BUDGET"
MEASURED = ("parameters", "gradients", "optimizer_state")


def _optimizers(optimizer: Any) -> list[Any]:
    """The optimizer and those it wraps (``ZeroRedundancyOptimizer.optimizer``), duck-typed."""
    chain = []
    while optimizer is not None and optimizer not in chain:
        chain.append(optimizer)
        optimizer = getattr(optimizer, "optimizer", None)
    return chain


def _env_rank() -> int | None:
    for name in ("PMI_RANK", "OMPI_COMM_WORLD_RANK"):  # MPICH's and Open MPI's launchers set one
        if name in os.environ:
            return int(os.environ[name])
    return None


def _set_instance_attribute(obj: Any, name: str, value: Any, undo: list) -> None:
    """``obj.name = value`` as an instance attribute (it shadows the method), and an ``undo`` entry that
    restores what was there: FSDP, too, replaces its units' ``forward`` by instance attributes."""
    missing = object()
    before = obj.__dict__.get(name, missing)
    obj.__dict__[name] = value

    def restore() -> None:
        if obj.__dict__.get(name, missing) is not value:
            # Replaced after us (FSDP wrapped the model inside the tracked span: its unit forwards call
            # ours): putting ``before`` back would undo that wrapper. Ours stays in its chain, harmless.
            return
        if before is missing:
            obj.__dict__.pop(name, None)
        else:
            obj.__dict__[name] = before

    undo.append(restore)


class MemoryTracker:
    """Measure this rank's bytes per category (``counters.CATEGORIES``), current and peak.

    Args:
        model: a ``Module`` (possibly wrapped: DDP, FSDP) or anything with ``parameters()`` (a
            ``PipelineParallel`` stage): its parameters and ``.grad`` arrays are measured, and a
            Module's submodule names label the activations (``"Linear in h.0.mlp.c_fc"``).
        optimizer: an ``Optimizer`` or a wrapper with ``.optimizer`` (``ZeroRedundancyOptimizer``): its
            state arrays are measured, and its parameters (ZeRO's shards) with their gradients.
        budget: the most bytes this rank may hold, an int or a size such as ``"64MiB"`` (see
            ``parse_size``); default: the environment variable ``MINIDIST_MEMORY_BUDGET``, else none.
        rank: named in ``table()``; default: the MPI launcher's rank variable, if any.

    ``MemoryTracker.running`` (class attribute): the tracker running on this process, or None.

    Raises:
        OutOfMemoryError: (from the tracked code) when the total would exceed ``budget``.
        ValueError: an unreadable budget. RuntimeError: ``start()`` while another tracker runs.
    """

    running: MemoryTracker | None = None

    def __init__(
        self,
        model: Any = None,
        optimizer: Any = None,
        budget: str | int | None = None,
        rank: int | None = None,
    ):
        if budget is None and os.environ.get(BUDGET_ENV, "").strip():
            budget = os.environ[BUDGET_ENV]
        self.budget = None if budget is None else parse_size(budget)
        self.model, self.optimizer = model, optimizer
        self.rank = _env_rank() if rank is None else rank
        self._peak_total = 0
        self._at_peak: dict[str, int] = dict.fromkeys(counters.CATEGORIES, 0)
        self._final: tuple | None = None  # the counters copied at stop()
        self._undo: list = []

    # -- start and stop ---------------------------------------------------------------------------
    def __enter__(self) -> MemoryTracker:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def start(self) -> MemoryTracker:
        """Reset the counters and start measuring (returns self)."""
        if counters._active:
            raise RuntimeError(
                "a MemoryTracker is already running on this process; stop() it first (if nothing refers to "
                "it any more, e.g. a notebook cell ran twice: MemoryTracker.running.stop())"
            )
        for table in (counters._current, counters._peak):
            table.update(dict.fromkeys(counters.CATEGORIES, 0))
        counters._owners.clear()
        activations.reset({id(activations.base_of(p.data)) for p in self._params()})
        self._peak_total, self._final = 0, None
        self._install_hooks()
        counters._listeners.append(self._on_change)
        counters._active = True
        MemoryTracker.running = self
        try:
            self.measure()  # the parameters alone may exceed the budget: then stop before raising
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop measuring; ``report()`` and ``table()`` keep the figures of the tracked span."""
        if not counters._active or self._on_change not in counters._listeners:
            return
        counters._active = False
        MemoryTracker.running = None
        counters._listeners.remove(self._on_change)
        for undo in reversed(self._undo):
            undo()
        self._undo.clear()
        activations.scope = ""
        self._final = (dict(counters._current), dict(counters._peak))

    # -- measuring --------------------------------------------------------------------------------
    def _params(self) -> list[Any]:
        params = list(self.model.parameters()) if self.model is not None else []
        for opt in _optimizers(self.optimizer):
            params += [p for g in getattr(opt, "param_groups", []) for p in g["params"]]
        return params

    def measure(self, gradients_only: bool = False) -> None:
        """Measure parameters, gradients and optimizer state now (the tracker calls it at each change;
        during backward only the gradients change)."""
        params = self._params()
        now = {"gradients": unique_nbytes(p.grad for p in params)}
        if not gradients_only:
            state = [
                v
                for opt in _optimizers(self.optimizer)
                for s in getattr(opt, "state", {}).values()
                for v in (s.values() if isinstance(s, dict) else ())
                if hasattr(v, "nbytes") and hasattr(v, "base")
            ]
            now["parameters"] = unique_nbytes(p.data for p in params)
            now["optimizer_state"] = unique_nbytes(state)
        for category, nbytes in now.items():
            delta = nbytes - counters._current[category]
            if delta:
                counters.allocated(category, delta, owner=category)

    def _on_change(self, category: str) -> None:
        total = sum(counters._current.values())
        if total > self._peak_total:
            self._peak_total = total
            self._at_peak = dict(counters._current)
        if self.budget is not None and total > self.budget:
            current = dict(counters._current)
            message = describe_overflow(self.budget, current, self._largest_owners())
            raise OutOfMemoryError(message, self.budget, total, current)

    def _largest_owners(self) -> dict[str, list[tuple[str, int]]]:
        owners: dict[str, list[tuple[str, int]]] = {}
        for (category, owner), nbytes in counters._owners.items():
            if category not in MEASURED:
                owners.setdefault(category, []).append((owner, nbytes))
        if hasattr(self.model, "named_parameters"):  # measured categories: name the largest parameters
            named = list(self.model.named_parameters())
            owners["parameters"] = [(n, int(p.data.nbytes)) for n, p in named]
            owners["gradients"] = [(n, int(p.grad.nbytes)) for n, p in named if p.grad is not None]
        for lst in owners.values():
            lst.sort(key=lambda kv: -kv[1])
        return owners

    def _install_hooks(self) -> None:
        """Measure at the moments the measured categories change; name the module running each op."""
        if hasattr(self.model, "named_modules"):  # a Module (a PipelineParallel is not: no op names then)
            for name, module in self.model.named_modules():
                self._wrap_forward(name, module, measure=module is self.model)
        if self.model is not None:
            for p in self.model.parameters():
                hook = self._after_accumulate
                p.register_post_accumulate_grad_hook(hook)
                self._undo.append(lambda p=p, h=hook: p._post_accumulate_hooks.remove(h))
        for opt in _optimizers(self.optimizer)[:1]:
            for method in ("step", "zero_grad"):
                self._wrap_method(opt, method)

    def _after_accumulate(self, _param: Any) -> None:
        self.measure(gradients_only=True)

    def _wrap_forward(self, name: str, module: Any, measure: bool) -> None:
        # Over the class's own forward the wrapper only observes: ``nn.Sequential`` may still run a Linear
        # and its ReLU as one op (``run_in_order``), through the wrapped ``forward_relu``, so the tracker
        # measures the graph that runs without it. Over FSDP's forward (which gathers) it does not.
        plain = "forward" not in module.__dict__
        fused = plain and hasattr(module, "forward_relu")
        for method in ("forward", "forward_relu") if fused else ("forward",):
            wrapped = self._scoped(getattr(module, method), name, measure)
            if plain:
                activations.scope_setters.add(wrapped)
            _set_instance_attribute(module, method, wrapped, self._undo)

    def _scoped(self, forward: Any, name: str, measure: bool) -> Any:
        def tracked_forward(*args: Any, **kwargs: Any) -> Any:
            if measure:
                self.measure()
            outer, activations.scope = activations.scope, name
            try:
                return forward(*args, **kwargs)
            finally:
                activations.scope = outer

        return tracked_forward

    def _wrap_method(self, obj: Any, method: str) -> None:
        original = getattr(obj, method)

        def tracked(*args: Any, **kwargs: Any) -> Any:
            result = original(*args, **kwargs)
            self.measure()
            return result

        _set_instance_attribute(obj, method, tracked, self._undo)

    # -- results ----------------------------------------------------------------------------------
    def report(self) -> dict[str, Any]:
        """``{category: {"current": bytes, "peak": bytes}, ..., "total": {"current", "peak"},
        "peak_breakdown": {category: bytes held at the moment of the total's peak}, "budget": bytes|None}``.

        A category's own peak may come at another moment than the total's (gradients peak after
        backward, activations at the end of forward), so the per-category peaks need not add up to the
        total's peak; ``peak_breakdown`` does.
        """
        current, peak = self._final or (dict(counters._current), dict(counters._peak))
        out: dict[str, Any] = {c: {"current": current[c], "peak": peak[c]} for c in counters.CATEGORIES}
        out["total"] = {"current": sum(current.values()), "peak": self._peak_total}
        out["peak_breakdown"] = dict(self._at_peak)
        out["budget"] = self.budget
        return out

    def table(self, rank: int | None = None) -> str:
        """A printable table of ``report()``: one row per category, sizes in B / KiB / MiB / GiB."""
        r = self.report()
        rank = self.rank if rank is None else rank
        budget = f", budget {format_bytes(self.budget)}" if self.budget is not None else ""
        head = f"memory of rank {rank}" if rank is not None else "memory"
        lines = [
            f"{head} (peak {format_bytes(r['total']['peak'])}{budget})",
            f"{'category':<20} {'now':>11} {'peak':>11} {'at peak':>11}",
        ]
        for c in (*counters.CATEGORIES, "total"):
            at_peak = r["total"]["peak"] if c == "total" else r["peak_breakdown"][c]
            lines.append(
                f"{c:<20} {format_bytes(r[c]['current']):>11} {format_bytes(r[c]['peak']):>11} "
                f"{format_bytes(at_peak):>11}"
            )
        return "\n".join(lines)
