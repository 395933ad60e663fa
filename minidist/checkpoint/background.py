"""``save(..., async_save=True)``: training waits only for a copy of the state; a thread writes and commits.

A synchronous save stops training for the whole write: serialise, sha256, fsync, manifest, rename.
An asynchronous save splits it in two, the "snapshot, then persist" of Mohan et al., "CheckFreq:
Frequent, Fine-Grained DNN Checkpointing" (FAST 2021, the two-phase checkpoint of its design section):
only the snapshot must stop training. PyTorch's ``torch.distributed.checkpoint.async_save`` works so:

1. in ``save``, on the training thread: the argument checks, the temporary folder, and ``stage.py``'s
   copy of everything this rank writes into fresh host memory. Then ``save`` returns a
   :class:`SaveHandle`; training may change the parameters at once.
2. on a thread of its own (``minidist-checkpoint``): ``save._persist``, the very steps a synchronous
   save runs after staging (write + fsync the shard, the agreement that every rank wrote, the
   all-gather of every rank's sha256, the manifest, the atomic commit, ``latest``, ``keep_last``).
   Same code, so the same files and every atomicity and verification rule.

**Which communicator the thread uses, and why.** The commit needs every rank's sha256 record, which
exists only after that rank's write, so at least one collective must run *after* the background
write: it cannot all be done before ``save`` returns. Running it on the world communicator while the
training thread runs its own collectives there would let messages of two calls match each other's
receives, and would number the calls of two threads in one sequence (``tags.py``). So the thread
talks only over a private duplicate of the world (``MPI_Comm_dup``, made once per world communicator,
collectively, inside the first asynchronous save), exactly as DDP's communication thread does
(``parallel/data_parallel/ddp.py``; PyTorch's recipe likewise gives ``async_save`` a process group of its
own). Two threads calling MPI at once needs ``MPI_THREAD_MULTIPLE``, which mpi4py requests and MPICH
grants; where MPI was initialised with less, the save runs synchronously with a warning and returns
a finished handle.

**One save at a time.** The next ``save`` (synchronous or not), ``load``, ``load_latest`` and
:func:`wait_pending` first wait for the pending one. So at most one extra copy of this rank's shard
sits in host memory, and two saves never race for ``latest`` or for pruning.

**Errors.** The thread's steps raise the same ``CheckpointError`` on every rank (their agreements run
on the private communicator); it is stored and raised by :meth:`SaveHandle.wait` (every call), or, if
``wait`` never raised it, by the next ``save``/``load``/``wait_pending``. A failed save leaves the
folder as it was, as a synchronous failure does.

**At interpreter exit** a pending save *finishes*: the thread is not a daemon, and Python joins such
threads before it runs ``atexit`` handlers (mpi4py's ``MPI_Finalize`` is one), so the communicator
is still alive. A save that failed without anyone waiting for it has its error printed at exit. A
killed process kills the thread with it: the temporary folder stays (the next save deletes it), and
nothing committed is touched (``atomic.py``).
"""

from __future__ import annotations

import atexit
import sys
import threading
import warnings
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

from minidist import trace


class SaveHandle:
    """A checkpoint being written in the background, returned by ``save(..., async_save=True)``.

    ``path`` is the folder it commits (``DIR/step_<n>``). Like PyTorch's ``Future`` of ``async_save``.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._finished = threading.Event()
        self._error: BaseException | None = None
        self._raised = False  # wait() raised the error: the next save must not raise it again

    def __repr__(self) -> str:
        state = "running" if not self.done() else "failed" if self._error else "committed"
        return f"SaveHandle({str(self.path)!r}, {state})"

    def done(self) -> bool:
        """Whether this rank's background thread has finished (committed, or failed).

        Not collective: one rank may see True while another still sees False, so a loop that runs
        collectives "until done()" must first agree on it (e.g. an all-reduce of the flag with "min").
        """
        return self._finished.is_set()

    def wait(self) -> Path:
        """Block until the checkpoint is committed; return its folder.

        Raises ``CheckpointError`` (the same on every rank) if the save failed; the folder is then as
        it was before the save. Not collective: every rank's thread finishes on its own.
        """
        self._finished.wait()
        if self._error is not None:
            self._raised = True
            raise self._error
        return self.path

    def _run(self, persist: Callable[[Any], None], comm: Any) -> None:
        try:
            with trace.span(f"checkpoint write {self.path.name}", "checkpoint"):
                persist(comm)
        except BaseException as err:  # noqa: BLE001  (handed to wait(), raised on the training thread)
            self._error = err
        finally:
            self._finished.set()


_pending: SaveHandle | None = None  # the save in flight, or the last one until someone waited for it
_channels: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # world Communicator -> its duplicate
_warned = False


def wait_pending() -> Path | None:
    """Block until the pending asynchronous save (if any) has finished; return its folder (None if none).

    Raises its ``CheckpointError`` unless its handle's ``wait()`` has raised it already. ``save``,
    ``load`` and ``load_latest`` call it first; call it yourself before reading the checkpoint folder
    with other tools, or at the end of training to learn of a failure.
    """
    global _pending
    handle = _pending
    if handle is None:
        return None
    handle._finished.wait()
    _pending = None
    if handle._error is not None:
        if handle._raised:
            return None
        handle._raised = True
        raise handle._error
    return handle.path


def start(comm: Any, persist: Callable[[Any], None], path: Path) -> SaveHandle:
    """Run ``persist(channel)`` on a new thread over the private duplicate of ``comm``; its handle.

    Collective the first time for ``comm`` (the duplicate is made then). Without MPI_THREAD_MULTIPLE,
    ``persist(comm)`` runs here, synchronously, with a warning.
    """
    global _pending
    handle = SaveHandle(path)
    channel = _private_channel(comm)
    if channel is None:
        handle._run(persist, comm)
    else:
        threading.Thread(target=handle._run, args=(persist, channel), name="minidist-checkpoint").start()
    _pending = handle
    return handle


def _private_channel(comm: Any) -> Any:
    """The duplicate of ``comm`` that background saves talk over (made on first use: collective), or
    None if MPI cannot be called from two threads at once."""
    global _warned
    from mpi4py import MPI  # noqa: PLC0415  (initialised already: comm exists)

    if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
        if not _warned:
            warnings.warn(
                "checkpoint.save(async_save=True): MPI was initialised without MPI_THREAD_MULTIPLE, so "
                "the save cannot run on a background thread; saving synchronously",
                stacklevel=4,
            )
            _warned = True
        return None
    channel = _channels.get(comm)
    if channel is None:
        channel = comm.dup(name=f"{comm.name or 'world'}-checkpoint")
        _channels[comm] = channel
    return channel


@atexit.register
def _report_unwaited() -> None:
    """At exit (after Python joined the thread): a failed save nobody waited for must not go unnoticed."""
    handle = _pending
    if handle is not None and handle.done() and handle._error is not None and not handle._raised:
        print(
            f"checkpoint.save(async_save=True) of {handle.path} failed and nothing waited for it "
            f"(SaveHandle.wait, checkpoint.wait_pending): {handle._error}",
            file=sys.stderr,
            flush=True,
        )
