"""Agreement: every rank learns what the others saw, then all of them raise the same error.

Why this exists. A collective is a promise that *every* rank of a group calls it. A mistake that only
one rank can see (a bad argument there, a corrupt file on its disk, a layer built with other sizes)
must not make that rank raise alone: the others would wait forever in the next collective. So code
that checks arguments across ranks follows one pattern, written once here:

1. each rank puts what it saw (its error, or None, and the values that must match) into a record;
2. one ``all_gather`` hands every rank every record, in rank order;
3. every rank runs the same decision on the same records, so all raise the same error (or none).

Records travel as JSON text (never pickle: nothing a peer sends can run code here, and every rank
reads exactly the same values), through :func:`minidist.distributed.all_gather` of ``uint8`` bytes,
which accepts a different length on every rank. A group of one rank exchanges nothing.

Used by the tensor-parallel layers, the pipeline, the mesh, ZeRO, ``clip_grad_norm_`` and
checkpointing.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import numpy as np

from minidist.distributed.collectives import all_gather
from minidist.distributed.comm import Communicator
from minidist.distributed.errors import CollectiveMismatchError, CollectiveTimeoutError, DistributedError
from minidist.distributed.world import group_or_world

# Exception classes that a rank can rebuild from another rank's record (by class name). A class not
# listed here, and not the rank's own error's class, arrives as a RuntimeError naming the original.
REBUILDABLE: tuple[type[Exception], ...] = (
    TypeError,
    ValueError,
    RuntimeError,
    KeyError,
    IndexError,
    OSError,
    DistributedError,
    CollectiveMismatchError,
    CollectiveTimeoutError,
)


def all_gather_json(obj: Any, group: Communicator | None = None) -> list[Any]:
    """Every rank's ``obj`` as JSON values (dicts, lists, str, int, float, None), in rank order, on
    every rank of ``group``.

    Collective: two all-gathers (the lengths, then the JSON text's UTF-8 bytes). A value that JSON
    cannot encode (a dtype, a shape object) travels as its ``str()``. (PyTorch's
    ``all_gather_object`` pickles instead; this is not that function: pickled bytes from a peer can
    run code, and the result here is a new list.)

    Raises ``TypeError`` on every rank if any rank's ``obj`` cannot be written as JSON at all (a list
    that contains itself, an int of more than 4300 digits): that rank still takes part in the
    exchange, so no rank is left waiting and no later message is mistaken for this one.
    """
    group = group_or_world(group)
    text, problem = _encode(obj)
    # Each rank sends [problem or null, obj]; the problem travels so that every rank raises alike.
    record = f"[{json.dumps(problem)}, {text}]"
    if group.size == 1:
        records = [json.loads(record)]
    else:
        mine = np.frombuffer(record.encode(), dtype=np.uint8)
        lengths = all_gather(np.array([mine.size], np.int64), group=group)
        blob = all_gather(mine, group=group).tobytes()
        bounds = np.concatenate([[0], np.cumsum(lengths)])
        records = [json.loads(blob[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]
    for rank, (problem, _) in enumerate(records):
        if problem is not None:
            raise TypeError(
                f"all_gather_json: rank {rank} could not write its object as JSON ({problem}); pass "
                "values JSON can encode: numbers, strings, lists, dicts with string keys, None"
            )
    return [value for _, value in records]


def agree(
    values: dict[str, Any] | None = None,
    error: BaseException | None = None,
    group: Communicator | None = None,
    *,
    what: str = "",
    label: str = "group",
    fix: str = "pass the same values on every rank",
    kinds: Iterable[type[Exception]] = (),
) -> None:
    """Collective: raise the same exception on every rank of ``group`` if any rank passes an ``error``,
    or if the ranks' ``values`` (name -> JSON value) differ. Returns None when all is well.

    - Errors win over differing values. The lowest rank with an error decides: every rank raises that
      error's class (each rank with an error of its own chains it as the cause) with the message
      ``"rank R of the <label>: <message>"``. Classes in ``kinds`` or :data:`REBUILDABLE` are rebuilt
      by name from the error's ``args``; anything else becomes ``RuntimeError("<ClassName>:
      <message>")`` on every rank, the failing one included, so that all ranks raise alike. The raised
      exception's ``own_error`` attribute is this rank's own ``error`` (None on a rank without one).
    - Differing values raise ``ValueError``: ``"<what>: the ranks of the <label> passed different
      values: in_features (8 on ranks 0, 1; 12 on rank 2); <fix>"`` (see :func:`describe_differences`).

    One exchange of a few hundred bytes per rank (:func:`all_gather_json`); none on a single rank,
    where ``error`` is simply raised. ``values`` should be JSON values (turn dtypes and shapes into
    strings and lists first; anything else is compared as its ``str()``); values that JSON cannot write
    at all (a list containing itself) become this rank's ``TypeError``, raised on every rank.
    """
    group = group_or_world(group)
    values = values or {}
    if error is not None and not isinstance(error, BaseException):  # a caller's mistake, on all ranks
        error = TypeError(f"agree: error must be an exception or None, got {type(error).__name__}")
    problem = _encode(values)[1]
    if problem is not None and error is None:  # it would fail in the exchange: report it as this rank's
        error = TypeError(f"{what or 'agree'}: these values cannot be compared across ranks: {problem}")
    if error is not None:
        values = {}
    if group.size == 1:
        if error is not None:
            raise error
        return
    records = all_gather_json({"error": _error_record(error), "values": values}, group)
    for rank, record in enumerate(records):
        if record["error"] is not None:
            agreed = _rebuild(record["error"], rank, label, kinds)
            # What this rank itself raised (None: it stops for another rank's error), so that a report
            # at the end (minidist_tools.report.exit_with_error) lists each rank under its own message.
            agreed.own_error = error  # type: ignore[attr-defined]
            raise agreed from error
    difference = describe_differences([r["values"] for r in records])
    if difference is not None:
        prefix = f"{what}: " if what else ""
        raise ValueError(f"{prefix}the ranks of the {label} passed different values: {difference}; {fix}")


def raise_if_any(
    error: BaseException | None,
    group: Communicator | None = None,
    *,
    label: str = "group",
    kinds: Iterable[type[Exception]] = (),
) -> None:
    """Collective: if any rank of ``group`` passes an exception, raise it on every rank (:func:`agree`)."""
    agree(None, error, group, label=label, kinds=kinds)


def describe_differences(everyone: list[dict[str, Any]]) -> str | None:
    """Which fields of the ranks' value dicts differ, and how; None if every rank's dict is equal.

    ``[{"n": 8}, {"n": 8}, {"n": 12}]`` -> ``"n (8 on ranks 0, 1; 12 on rank 2)"``. Fields are listed
    in the order of rank 0's dict, then any field that only some ranks have (shown as ``<missing>``).
    """
    fields = list(dict.fromkeys(name for values in everyone for name in values))
    parts = []
    for name in fields:
        seen = [json.dumps(values.get(name, "<missing>")) for values in everyone]
        if len(set(seen)) == 1:
            continue
        ranks: dict[str, list[int]] = {}
        for rank, value in enumerate(seen):
            ranks.setdefault(value, []).append(rank)
        listing = "; ".join(f"{_value(v)} on {_ranks(r)}" for v, r in ranks.items())
        parts.append(f"{name} ({listing})")
    return ", ".join(parts) if parts else None


def _encode(obj: Any) -> tuple[str, str | None]:
    """(JSON text of ``obj``, None), or ("null", what went wrong): never raises, so that a rank whose
    values cannot be written still takes part in the exchange."""
    try:
        return json.dumps(obj, default=_text), None
    except Exception as e:  # noqa: BLE001  (circular lists, huge ints, ...: reported, not raised here)
        return "null", f"{type(e).__name__}: {_text(e)}"


def _text(value: Any) -> str:
    """``str(value)``, or a placeholder if its ``__str__`` itself fails."""
    try:
        return str(value)
    except Exception:  # noqa: BLE001
        return f"<{type(value).__name__} that cannot be printed>"


def _error_record(error: BaseException | None) -> dict[str, Any] | None:
    if error is None:
        return None
    text = _text(error)
    args = list(error.args)
    if not args or not isinstance(args[0], str) or _encode(args)[1] is not None:
        args = [text]
    return {"type": type(error).__name__, "args": args, "text": text}


def _rebuild(
    record: dict[str, Any],
    rank: int,
    label: str,
    kinds: Iterable[type[Exception]],
) -> BaseException:
    """The exception that every rank raises for ``record`` (the error of ``rank``)."""
    # Only classes every rank knows by the same name: the rank whose own error is of another class
    # must raise what the others raise (its own error is chained as the cause).
    known = {cls.__name__: cls for cls in (*REBUILDABLE, *kinds)}
    where = f"rank {rank} of the {label}: "
    cls = known.get(record["type"])
    if cls is not None:
        try:
            return cls(where + record["args"][0], *record["args"][1:])
        except TypeError:  # a constructor with another signature: fall back to the text
            pass
    return RuntimeError(f"{where}{record['type']}: {record['text']}")


def _value(json_text: str) -> str:
    value = json.loads(json_text)  # shown as Python writes it (True, None), strings without quotes
    return value if isinstance(value, str) else repr(value)


def _ranks(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))
