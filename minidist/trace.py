"""Timeline spans: record what each thread of each rank did when, and view it in Perfetto.

Distributed training is hard to reason about from step times alone: was the all-reduce hidden behind
backward, or did backward wait for it? A *span* is a named interval of wall-clock time on one thread:

    from minidist import trace
    trace.enable()                                    # right after a barrier: every rank's clock starts at 0
    with trace.span("backward", "backward"):
        loss.backward()                               # DDP's comm thread records "allreduce bucket i" spans
    events = trace.events()                           # this rank's spans, plain dicts (picklable)
    everyone = world.mpi.gather(events, root=0)       # the caller gathers: this module knows nothing of MPI

Reading them is a tool's work (``minidist_tools/timeline.py``): one Chrome/Perfetto JSON file of every
rank (``save_chrome_trace``), the share of communication hidden behind backward (``overlap_fraction``).

Clocks: each rank measures ``time.perf_counter()`` relative to its own call of :func:`enable`. If every
rank calls ``enable()`` right after a barrier, those zero points agree to within the barrier's exit skew
(microseconds on one machine), which is good enough to line ranks up; no clock synchronisation protocol
is needed.

This is the bottom layer (like ``backend``): it imports only the standard library. Recording is a
module-level list, the one piece of global state here, because spans are opened deep inside library code
(DDP's communication thread) that has no tracer object to hand. When tracing is off, ``span`` costs one
flag check. ``list.append`` is atomic under the GIL, so threads may record concurrently.

**Bytes**: ``enable(messages=True)`` also records a span for every collective call (category
:data:`COLLECTIVE`, named ``"all_reduce"``, ``"reduce_scatter"``...) and every point-to-point send
(:data:`MESSAGE`: ``"send"``, ``"sendrecv"``, ``"isend"``) with ``args``: the group's ``name``
(``ProcessMesh`` names its groups ``"tp"``, ``"cp"``, ``"pp"``, ``"dp"``, ``"dp_cp"``), the ``bytes``
this rank sent, the array's ``dtype`` and, for a collective, its ``payload`` (the array's bytes) and the
``algorithm`` it ran.
Off by default: a span per message costs microseconds, which a timeline of compute does not want.
``enable(collectives=True)`` records the collective spans without the per-message ones: what
``minidist_tools.straggler`` needs to match one call across ranks and tell waiting for a late rank from moving
data (its ``StragglerMonitor`` also records one :data:`STEP` span per training step with :func:`record`).

"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

# Categories the library and examples use (any string is allowed). timeline.overlap_fraction reads three.
COMM = "comm"  # a collective's own work (DDP: pack, all-reduce, unpack of one bucket)
BACKWARD = "backward"  # the whole loss.backward() call, as the training loop sees it
WAIT = "wait"  # time a thread spent blocked waiting for communication (inside a backward span)
LAUNCH = "launch"  # the moment a collective was handed to a communication thread (a very short span)
COLLECTIVE = "collective"  # one call of a collective, with its bytes (only with enable(messages=True))
MESSAGE = "message"  # one point-to-point send, with its bytes (only with enable(messages=True))
STEP = "step"  # one training step, as minidist_tools.straggler.StragglerMonitor.step() delimits it

Event = dict[str, Any]  # {"name", "cat", "start", "end" (seconds since enable), "tid", "thread"[, "args"]}

_enabled = False
_messages = False  # also record collectives and point-to-point sends (enable(messages=True))
_collectives = False  # also record collectives (enable(collectives=True), or messages=True)
_t0 = 0.0
_events: list[Event] = []


def enable(messages: bool = False, collectives: bool = False) -> None:
    """Start recording; clear earlier spans and set this rank's time zero to now.

    Call it on every rank right after a barrier, so the ranks' time zeros coincide. ``messages=True``
    also records every collective call and point-to-point send with its group and bytes (module
    docstring, "Bytes"); ``collectives=True`` records the collective calls only (one span per call, no
    span per message: what ``minidist_tools.straggler`` needs to tell waiting for peers from transferring).
    """
    global _enabled, _messages, _collectives, _t0
    _events.clear()
    _t0 = time.perf_counter()
    _enabled, _messages = True, bool(messages)
    _collectives = bool(messages or collectives)


def disable() -> None:
    """Stop recording (spans already recorded are kept until the next :func:`enable`)."""
    global _enabled, _messages, _collectives
    _enabled = _messages = _collectives = False


def is_enabled() -> bool:
    """True between :func:`enable` and :func:`disable`."""
    return _enabled


def messages_enabled() -> bool:
    """True between :func:`enable` ``(messages=True)`` and :func:`disable`: collectives and sends then
    record spans with their bytes (``minidist.distributed`` asks before each one)."""
    return _messages


def collectives_enabled() -> bool:
    """True while collective calls record :data:`COLLECTIVE` spans: after :func:`enable` with
    ``collectives=True`` or ``messages=True``, until :func:`disable`."""
    return _collectives


def now() -> float:
    """This rank's trace clock: seconds since :func:`enable` (``time.perf_counter`` based)."""
    return time.perf_counter() - _t0


def record(name: str, category: str, start: float, end: float, args: dict[str, Any] | None = None) -> None:
    """Add one span on the calling thread from ``start`` to ``end`` (seconds on the :func:`now` clock).

    For intervals that are not one ``with`` block (a training step measured by its caller); does
    nothing while tracing is off.
    """
    if not _enabled:
        return
    thread = threading.current_thread()
    event = {"name": name, "cat": category, "start": start, "end": end, "tid": thread.ident,
             "thread": thread.name}  # fmt: skip
    if args is not None:
        event["args"] = dict(args)
    _events.append(event)


# What span() returns while tracing is off: one shared do-nothing (also for callers that decide themselves
# whether to record, such as the point-to-point sends of minidist.distributed).
NO_SPAN: AbstractContextManager[None] = contextlib.nullcontext()


def span(
    name: str | Callable[[], str], category: str = "default", args: dict[str, Any] | None = None
) -> AbstractContextManager[None]:
    """Record the time spent inside the ``with`` block as one span on the calling thread.

    ``name`` labels the box in the timeline (e.g. ``"allreduce bucket 3"``); ``category`` groups spans
    (``"forward"``, ``"backward"``, ``COMM``, ``WAIT``, ``"optimizer"``...). A block that raises is still
    recorded. ``name`` may also be a function returning the label: it is called only while tracing is
    on, so a label that is costly to build (the pipeline's ``str(step)``) costs nothing otherwise.
    ``args``: details kept with the span (Perfetto shows them when it is clicked), e.g. ``{"bytes":
    4096}``; the dict is read when the block ends, so the block may still add to it.

    While tracing is disabled this returns one shared do-nothing context manager: a flag check, no
    generator (a generator-based context manager cost the pipeline 4-7 us per span).
    """
    if not _enabled:
        return NO_SPAN
    return _recorded(name() if callable(name) else name, category, args)


@contextmanager
def _recorded(name: str, category: str, args: dict[str, Any] | None) -> Iterator[None]:
    start = time.perf_counter()
    try:
        yield
    finally:
        end = time.perf_counter()
        thread = threading.current_thread()
        event = {"name": name, "cat": category, "start": start - _t0, "end": end - _t0,
                 "tid": thread.ident, "thread": thread.name}  # fmt: skip
        if args is not None:
            event["args"] = dict(args)
        _events.append(event)


def events(since: int = 0) -> list[Event]:
    """A copy of this rank's recorded spans, in the order they ended (times in seconds since enable).

    ``since``: skip the first ``since`` spans (a reader that polls, such as the straggler monitor,
    copies only what is new; :func:`event_count` says where to continue).
    """
    return [dict(e, args=dict(e["args"])) if "args" in e else dict(e) for e in _events[since:]]


def event_count() -> int:
    """How many spans have been recorded since :func:`enable`."""
    return len(_events)
