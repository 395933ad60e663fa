"""Ending a training script on an error: each message printed once, naming the ranks that raised it.

Why this exists. Under ``mpirun -n 8``, a script that prints its error and exits on every rank shows
the same message eight times, and one that calls ``dist.abort`` on every rank adds eight "aborting"
lines. Most errors that end a training script are *shared*: a bad flag, a missing data folder, a
checkpoint that does not load are seen by every rank, at the same line. But a rank cannot tell alone
whether its error is shared: the data folder may be missing on one node only, and then the other ranks
are already waiting in the next collective, where they would wait forever if this rank just left.

So :func:`exit_with_error` holds a short *meeting* of the failing ranks before it decides:

1. every rank other than 0 sends rank 0 its own error text (one small message on ``COMM_WORLD`` with a
   tag no collective and no user message can have) and waits for rank 0's answer;
2. rank 0 collects the texts for at most ``MINIDIST_ERROR_WAIT`` seconds (default 5);
3. if every rank arrived, the error is shared: rank 0 prints each distinct message once,
   ``error on ranks 0-7: <message>``, answers everyone, and all ranks exit with ``code`` (no
   ``MPI_Abort``: nobody is left waiting);
4. if some rank did not arrive (it is healthy, waiting in a collective), each failing rank prints its
   own ``[rank r] error: <message>`` once, with its true rank, and ends the job with ``dist.abort``
   (after the grace period), so nobody waits forever.

An error that :func:`~minidist.distributed.safety.agreement.agree` (``raise_if_any``) made every rank raise
carries ``own_error``, what this rank itself raised (None on a rank that only learned of another's):
the meeting lists each rank under its own message, so a folder missing on rank 2 alone prints
``error on rank 2: ...``, once, and the job exits cleanly. (MPI offers nothing like this: its
``MPI_Abort`` prints per rank; PyTorch's ``torchrun`` gathers a failure summary in the launcher.)
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from typing import NoReturn

import numpy as np
from mpi4py import MPI

from minidist.distributed.safety.tags import DEPARTURE_TAG, tags_supported
from minidist.distributed.safety.watchdog import abort_job, seconds_setting

WAIT_ENV = "MINIDIST_ERROR_WAIT"
REPORT_TAG = DEPARTURE_TAG + 1  # above every collective tag and every user tag (<= 32767)
POLL = 0.01  # seconds between two looks for a message: sleep, so waiting ranks leave the cores free


def exit_with_error(error: BaseException, code: int = 2) -> NoReturn:
    """End this rank because of ``error``: print every distinct message once, then exit with ``code``.

    Call it on each rank that caught the error (an ``except`` around the script's ``main()``). With one
    process it prints ``error: <message>`` to stderr. With several, see the module docstring: when all
    ranks fail, rank 0 prints ``error on ranks 0-3: <message>`` (one line per distinct message, ranks
    listed as ranges) and every rank exits with ``code``; when only some fail, each of them prints
    ``[rank r] error: <message>`` and the job ends through ``dist.abort`` (``MPI_Abort``, exit ``code``).
    Needs only MPI, not ``dist.init()``, so it also reports an ``init`` that failed. When every rank
    fails it returns as soon as the last one arrives; when only some do, the job ends after at most
    twice ``MINIDIST_ERROR_WAIT`` seconds (default 5) plus the abort grace period. Never returns.
    """
    world = MPI.COMM_WORLD
    own = _own_text(error)
    if world.Get_size() == 1:
        _print(f"error: {own if own is not None else _text(error)}\n")
        sys.exit(code)
    wait = _wait_seconds()
    if tags_supported() and _meet(world, own, wait):
        # Every rank leaves now, through the normal exit: MPI_Finalize makes them leave together (a rank
        # ending with os._exit before the others would make mpiexec kill them and print a banner).
        sys.exit(code)
    abort_job(world, f"error: {own if own is not None else _text(error)}\n", code)
    os._exit(code)  # (abort_job does not return; this line only makes that plain to the reader)


def exit_interrupted(code: int = 130) -> NoReturn:
    """End this rank after Ctrl-C: one line for the whole job, then exit ``code`` (130).

    ``mpiexec`` passes Ctrl-C on to every rank, and a ``KeyboardInterrupt`` left alone prints a traceback
    on each (about 95 lines for a 4-rank GPT run). Call it in an ``except KeyboardInterrupt`` around the
    script's ``main()``. No MPI message can be exchanged (a rank may be stuck in a collective its peers
    have left), so the first rank of each machine to get here prints (:func:`_first_here`): on one
    machine, one line. Every rank leaves at once, through ``os._exit``: ``MPI_Finalize`` would wait for
    the ranks stuck in a collective, and once one rank has ended, mpiexec SIGKILLs those still running
    (a rank that catches Ctrl-C late, on a loaded machine, then adds MPICH's 10-line banner). Waiting for
    the other ranks first makes that worse, not better: measured with 8 ranks, ranks that leave together
    after a meeting (even through ``MPI_Finalize``) got the banner in every run, ranks that leave at once
    in none (``mpirun -n 8``, Ctrl-C after 4 s, 4 runs each).
    """
    if MPI.COMM_WORLD.Get_size() == 1 or _first_here():
        _print("interrupted (Ctrl-C): every rank stopped; a checkpoint being written may be incomplete\n")
    sys.stdout.flush()
    os._exit(code)


def _first_here() -> bool:
    """Whether this rank is the first of its machine to claim the job's interrupt report.

    The claim is an abstract Unix socket name (no file to clean up: the kernel drops it when the process
    ends) made of the ranks' parent, Hydra's proxy, of which each machine has one per job, and its start
    time, which tells it from an older process with the same pid.
    """
    parent = os.getppid()
    try:
        with open(f"/proc/{parent}/stat") as f:
            started = f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return MPI.COMM_WORLD.Get_rank() == 0  # no /proc (not Linux): rank 0 reports
    claim = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        claim.bind(f"\0minidist-interrupt-{parent}-{started}")
    except OSError:  # another rank of this machine holds it
        claim.close()
        return False
    _CLAIMS.append(claim)  # kept open until the process ends
    return True


_CLAIMS: list[socket.socket] = []


def describe(texts: dict[int, str | None]) -> str:
    """The summary rank 0 prints: one line per distinct message, with the ranks that raised it.

    ``{0: "x", 1: "x", 2: "y", 3: None}`` -> ``"error on ranks 0-1: x\\nerror on rank 2: y\\n"``. A rank
    with None (it stopped because of another rank's error) is not listed.
    """
    ranks: dict[str, list[int]] = {}
    for rank in sorted(texts):
        if texts[rank] is not None:
            ranks.setdefault(texts[rank], []).append(rank)
    return "".join(f"error on {rank_ranges(r)}: {text}\n" for text, r in ranks.items())


def rank_ranges(ranks: list[int]) -> str:
    """``[0, 1, 2, 5, 7, 8]`` -> ``"ranks 0-2, 5, 7-8"``; ``[3]`` -> ``"rank 3"``."""
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    parts, start = [], ranks[0]
    for i, rank in enumerate(ranks):
        if i + 1 == len(ranks) or ranks[i + 1] != rank + 1:  # the end of a run of consecutive ranks
            parts.append(str(start) if start == rank else f"{start}-{rank}")
            start = ranks[i + 1] if i + 1 < len(ranks) else rank
    return "ranks " + ", ".join(parts)


def _meet(world: MPI.Comm, own: str | None, wait: float) -> bool:
    """Steps 1-3 of the module docstring. True if every rank arrived (rank 0 has printed the summary)."""
    rank, size = world.Get_rank(), world.Get_size()
    if rank != 0:
        record = np.frombuffer(json.dumps(own).encode(), dtype=np.uint8)
        request = world.Isend([record, MPI.BYTE], dest=0, tag=REPORT_TAG)  # small: goes out at once
        # Rank 0 may arrive up to `wait` after us and then takes up to `wait` itself: wait for both.
        if _arrived(world, 0, 2 * wait) is None:
            return False
        request.Wait()  # rank 0 answered, so it has our message: this returns at once
        return True
    texts: dict[int, str | None] = {0: own}
    deadline = time.monotonic() + wait
    while len(texts) < size and time.monotonic() < deadline:
        status = MPI.Status()
        if world.Iprobe(source=MPI.ANY_SOURCE, tag=REPORT_TAG, status=status):
            texts[status.Get_source()] = json.loads(_receive(world, status))
        else:
            time.sleep(POLL)
    if len(texts) < size:
        return False
    _print(describe(texts) or f"error on rank 0: {own}\n")
    answer = np.zeros(1, dtype=np.uint8)
    MPI.Request.Waitall([world.Isend([answer, MPI.BYTE], dest=r, tag=REPORT_TAG) for r in range(1, size)])
    return True


def _arrived(world: MPI.Comm, source: int, seconds: float) -> bytes | None:
    """The next report-tagged message from ``source`` within ``seconds``, or None."""
    deadline = time.monotonic() + seconds
    status = MPI.Status()
    while not world.Iprobe(source=source, tag=REPORT_TAG, status=status):
        if time.monotonic() >= deadline:
            return None
        time.sleep(POLL)
    return _receive(world, status)


def _receive(world: MPI.Comm, status: MPI.Status) -> bytes:
    buffer = np.empty(status.Get_count(MPI.BYTE), dtype=np.uint8)
    world.Recv([buffer, MPI.BYTE], source=status.Get_source(), tag=REPORT_TAG)
    return buffer.tobytes()


def _own_text(error: BaseException) -> str | None:
    """What this rank itself raised: for an error agreed across ranks, its ``own_error`` (maybe None)."""
    if hasattr(error, "own_error"):
        own = error.own_error
        return None if own is None else _text(own)
    return _text(error)


def _text(error: BaseException) -> str:
    try:
        return str(error) or type(error).__name__
    except Exception:  # noqa: BLE001  (an exception whose __str__ fails must still be reported)
        return type(error).__name__


def _wait_seconds() -> float:
    try:
        return seconds_setting(WAIT_ENV, 5.0) or 0.0
    except ValueError:
        return 5.0  # a malformed value must not hide the error being reported


def _print(text: str) -> None:
    sys.stdout.flush()  # what the script printed before comes first
    sys.stderr.write(text)
    sys.stderr.flush()
