"""Enforce an assignment's "Not allowed" rules while its tests run: record forbidden calls from student code.

A2's handout asks for a ring built on send/recv; a ring that calls MPI's own ``Allreduce`` passes every
correctness test. So the MPI workers run the student's code under :class:`watch`, which records each
call of a forbidden function made by the student's code, with the file and line it came from; the
worker turns each record into a failure that explains the deduction.

Why at run time, and not by reading the source: text search flags dead code and comments, and misses
``getattr(comm, "All" + "reduce")``, an alias, or a helper. Watching the calls sees what really ran.

Which calls count. Only calls whose *caller* is the student's code (a function in one of the rule's
``files``) count, so minidist's own collectives around the student's code (argument agreement,
liveness, group creation, ``dist.all_reduce`` inside DDP) never do. A call made from a module of
``through`` (``mpi_builtin``: MPI's own collectives under minidist names) counts for whoever called
that module.

How. mpi4py's communicator types are C types whose methods cannot be replaced, so :class:`watch`
replaces the communicator *objects* the ranks use (``group.mpi``, ``MPI.COMM_WORLD``) by instances of a
subclass whose data-moving collectives note the caller, then do the real call. Communicators split,
created or duplicated from them are made instances of the subclass too (mpi4py's ``Dup`` keeps the
subclass, ``Split`` and ``Create`` would not), so sub-groups made meanwhile are watched as well.
Python functions (``dist.all_reduce`` and friends) are seen with :func:`sys.setprofile` (and
:func:`threading.setprofile` for threads started meanwhile).
Limitation: a call made from C (``map(comm.Allreduce, ...)``) has no Python caller, and an unbound call
(``MPI.Intracomm.Allreduce(comm, ...)``) skips the subclass: neither is seen. What is seen instead is
that no message arrived: :attr:`watch.received` counts point-to-point receives, and a worker fails a
function whose result needed other ranks' data although it received nothing (A2's ``ring_check.py``).

Cost (docs/performance.md, "What other features cost"): the profile hook makes a worker's body
1.5-2x slower, tens of milliseconds next to the second or two it takes to start the ranks; rules
without ``functions`` (A3, A4) install no hook.
"""

from __future__ import annotations

import functools
import inspect
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from mpi4py import MPI

# The collectives that move data (the ones a hand-written algorithm replaces), upper-case (buffers) and
# lower-case (pickled objects), blocking and non-blocking. Barrier, Dup, Split, probes and
# point-to-point messages are not in the list: a ring needs them.
MPI_COLLECTIVES = tuple(
    prefix + name
    for name in (
        "Allreduce", "allreduce", "Reduce_scatter", "Reduce_scatter_block", "Allgather", "allgather",
        "Allgatherv", "Reduce", "reduce", "Bcast", "bcast", "Gather", "gather", "Gatherv", "Scatter",
        "scatter", "Scatterv", "Alltoall", "alltoall", "Alltoallv", "Scan", "scan", "Exscan", "exscan",
    )
    for prefix in ("", "I")
    if prefix == "" or name[0].isupper()
)  # fmt: skip


# Point-to-point receives: counted, not forbidden (``watch.received``). An unbound call such as
# ``MPI.Intracomm.Allreduce(group.mpi, ...)`` goes straight to C past the recording subclass, so no
# record names it; but data from other ranks cannot arrive without a receive, so a worker can tell
# that a correct result on n > 1 ranks with no receive at all came from something it could not see.
MPI_RECEIVES = (
    "Recv", "recv", "Irecv", "irecv", "Sendrecv", "sendrecv", "Sendrecv_replace", "Isendrecv",
    "Isendrecv_replace", "Recv_init", "Precv_init", "Mprobe", "mprobe", "Improbe", "improbe",
)  # fmt: skip


@dataclass(frozen=True)
class Rule:
    """One "Not allowed" rule: which calls the student's code must not make, and why (the handout's words).

    ``files``: module names of the student's code (``"minidist.distributed.algorithms.ring"``); ``callers``:
    only these functions of those modules (empty: all); ``mpi_methods``: mpi4py communicator methods;
    ``functions``: Python functions as ``"module:name"``; ``through``: modules whose calls are traced
    back to their caller; ``tasks``: function name (``"run"`` or ``"BlockingMessaging.run"``) -> task
    id, to name the task in the message.
    """

    files: tuple[str, ...]
    why: str
    mpi_methods: tuple[str, ...] = MPI_COLLECTIVES
    functions: tuple[str, ...] = ()
    through: tuple[str, ...] = ("minidist.distributed.algorithms.mpi_builtin",)
    callers: tuple[str, ...] = ()
    tasks: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Violation:
    """A forbidden call: what was called, and from which function, file and line of the student's code."""

    called: str
    function: str
    file: str
    line: int


def _module_file(name: str) -> str:
    module = __import__(name, fromlist=["_"])
    return str(Path(module.__file__).resolve())


@functools.cache
def _resolved(path: str) -> str:
    return str(Path(path).resolve())


def _file(frame: FrameType) -> str:
    """The resolved path of the file ``frame`` runs in (cached: the same few files come up again)."""
    return _resolved(frame.f_code.co_filename)


def _short(path: str) -> str:
    parts = Path(path).parts
    return "/".join(parts[parts.index("minidist") :]) if "minidist" in parts else Path(path).name


class watch:
    """``with watch(rule, [world]) as seen: ...`` records in ``seen.violations`` every forbidden call.

    ``comms``: the minidist Communicators the code under test may use (their ``mpi`` and their
    collective channel's ``mpi`` are watched; groups split from them inherit the watch). Everything is
    restored on exit. Not re-entrant.
    """

    _active: watch | None = None  # the watch the recording communicators report to

    def __init__(self, rule: Rule, comms: list[Any]) -> None:
        self.rule = rule
        self.comms = comms
        self.violations: list[Violation] = []
        self.received = 0  # point-to-point receives started on the watched communicators, by anyone
        self._student = {_module_file(m) for m in rule.files}
        self._through = {_module_file(m) for m in rule.through}
        # A public collective runs through two wrappers (seam.collective's call, and the safety net's
        # calls.collective_call) whose code every collective shares: watch the function inside, and look
        # past the wrappers' frames for the caller.
        self._wrappers = {
            _module_file("minidist.distributed.seam"),
            _module_file("minidist.distributed.safety.calls"),
        }
        self._codes = {}
        for spec in rule.functions:
            module, name = spec.split(":")
            found = functools.reduce(getattr, name.split("."), __import__(module, fromlist=["_"]))
            function = inspect.unwrap(found)
            short = module.rsplit(".", 1)[-1]
            if module == "minidist.distributed.collectives":
                short = "dist"  # as students call it: dist.all_reduce
            self._codes[function.__code__] = f"{short}.{name}"
        self._saved: list[tuple[Any, Any]] = []

    def __enter__(self) -> watch:
        recording = _recording_class(self.rule.mpi_methods)
        targets = [MPI]  # MPI.COMM_WORLD itself, for code that talks to MPI without minidist
        for comm in self.comms:
            targets += [comm, comm.collective_channel]
        for target in targets:
            name = "COMM_WORLD" if target is MPI else "mpi"
            old = getattr(target, name)
            self._saved.append((target, old))
            setattr(target, name, recording(old))
        watch._active = self
        if self._codes:
            sys.setprofile(self._profile)
            threading.setprofile(self._profile)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._codes:
            sys.setprofile(None)
            threading.setprofile(None)  # type: ignore[arg-type]
        watch._active = None
        for target, old in reversed(self._saved):
            setattr(target, "COMM_WORLD" if target is MPI else "mpi", old)

    def _profile(self, frame: FrameType, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code in self._codes and frame.f_back is not None:
            self.note(self._codes[frame.f_code], frame.f_back, self._wrappers)

    def note(self, called: str, caller: FrameType | None, wrappers: set[str] = frozenset()) -> None:
        """Record ``called`` if ``caller`` (or, past ``through`` modules and ``wrappers``, its caller) is
        student code."""
        while caller is not None and _file(caller) in self._through | wrappers:
            caller = caller.f_back
        if caller is None or _file(caller) not in self._student:
            return
        function = caller.f_code.co_qualname  # "BlockingMessaging.run": the class says which run
        if self.rule.callers and not self._inside_callers(caller):
            return
        found = Violation(called, function, _short(caller.f_code.co_filename), caller.f_lineno)
        if found not in self.violations:
            self.violations.append(found)

    def _inside_callers(self, frame: FrameType | None) -> bool:
        """Is ``frame`` in one of ``rule.callers``, or in a helper of the student's that one called?"""
        while frame is not None and _file(frame) in self._student:
            if frame.f_code.co_name in self.rule.callers:
                return True
            frame = frame.f_back
        return False

    def messages(self) -> list[str]:
        """One failure message per forbidden call: what was called, from where, and what it costs."""
        out = []
        for v in self.violations:
            task = self.rule.tasks.get(v.function) or self.rule.tasks.get(v.function.rsplit(".", 1)[-1])
            who = f"{task} ({v.function})" if task else v.function
            out.append(
                f"{who} uses {v.called} (called from {v.file} line {v.line}): {self.rule.why}; "
                "the handout's 'Not allowed' section forbids it, so this test scores 0 points."
            )
        return out


def _recording_class(names: tuple[str, ...]) -> type:
    """A subclass of ``MPI.Intracomm`` whose methods ``names`` report their caller to the watch."""

    def recorder(name: str) -> Any:
        real = getattr(MPI.Intracomm, name)

        def method(self: Any, *args: Any, **kwargs: Any) -> Any:
            if watch._active is not None:
                watch._active.note(f"MPI's own {name}", sys._getframe(1))
            return real(self, *args, **kwargs)

        method.__name__ = name
        return method

    def counter(name: str) -> Any:
        real = getattr(MPI.Intracomm, name)

        def method(self: Any, *args: Any, **kwargs: Any) -> Any:
            if watch._active is not None:
                watch._active.received += 1
            return real(self, *args, **kwargs)

        method.__name__ = name
        return method

    def inheritor(name: str) -> Any:
        real = getattr(MPI.Intracomm, name)

        def method(self: Any, *args: Any, **kwargs: Any) -> Any:
            new = real(self, *args, **kwargs)
            return new if new == MPI.COMM_NULL else type(self)(new)  # a rank in no group gets COMM_NULL

        method.__name__ = name
        return method

    methods = {name: counter(name) for name in MPI_RECEIVES if hasattr(MPI.Intracomm, name)}
    methods.update({name: recorder(name) for name in names if hasattr(MPI.Intracomm, name)})
    methods.update({name: inheritor(name) for name in ("Split", "Split_type", "Create", "Create_group")})
    return type("RecordingIntracomm", (MPI.Intracomm,), methods)
