"""A background thread that runs communication jobs one at a time, in the order they were submitted.

DDP hands it one job per gradient bucket while backward is still running on the main thread. Jobs run
strictly first-in first-out, so the order in which a rank *submits* its all-reduces is the order in
which it *runs* them; DDP submits buckets in bucket-index order on every rank, so every rank's thread
enters the same collectives in the same order, which collectives require.

Why a thread can overlap at all in Python: a thread holds the GIL only while it runs Python bytecode.
mpi4py releases the GIL inside every blocking MPI call, and NumPy releases it inside BLAS matmuls and
large element-wise loops, so the main thread's matmuls and this thread's sends, receives and additions
run at the same time on different cores.

This file knows nothing of MPI: a job is any callable.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable


class Job:
    """One unit of work: ``fn()``, run by a :class:`CommThread` or inline with :meth:`run`.

    :meth:`wait` blocks (without holding the GIL or spinning) until the job has run, and re-raises in the
    waiting thread any exception ``fn`` raised, so errors of the communication thread surface in the
    training loop instead of being printed and forgotten.
    """

    def __init__(self, fn: Callable[[], None]) -> None:
        self.fn = fn
        self.error: BaseException | None = None
        # Held until the job has finished; wait() blocks on it. A bare lock (any thread may release it)
        # does what threading.Event would in two C calls, not a Condition's ten Python calls: DDP makes a
        # job per bucket per step (docs/performance.md, "DDP's bookkeeping, counted").
        self._unfinished = threading.Lock()
        self._unfinished.acquire()

    def run(self) -> None:
        try:
            self.fn()
        except BaseException as error:  # noqa: BLE001  (handed to the waiting thread, re-raised there)
            self.error = error
        finally:
            self._unfinished.release()

    def fail(self, error: BaseException) -> None:
        """Mark the job finished without running it (an earlier job failed)."""
        self.error = error
        self._unfinished.release()

    def wait(self) -> None:
        """Block until the job has finished; re-raise its exception, if any."""
        with self._unfinished:  # free once the job has finished; given back at once, for the next wait()
            pass
        if self.error is not None:
            raise self.error


class CommThread:
    """A daemon thread that runs submitted :class:`Job` s first-in first-out.

    After a job fails, every later job fails too without running (with a ``RuntimeError`` naming the
    first failure): a collective that failed half-way leaves its communicator in an unknown state, and
    starting the next one on it could hang or mix up messages. :meth:`close` stops the thread.
    """

    def __init__(self, name: str = "minidist-comm") -> None:
        self._queue: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def submit(self, job: Job) -> Job:
        """Queue ``job`` to run after every job submitted before it; returns ``job``."""
        self._queue.put(job)
        return job

    def close(self, wait: bool = True) -> None:
        """Stop the thread once the jobs queued so far have run; with ``wait``, block until it has stopped.

        ``wait=False`` is for finalizers at interpreter exit: a thread stuck in a collective that a
        crashed peer never joined must not keep the process from exiting (it is a daemon thread).
        """
        if self._thread.is_alive():
            self._queue.put(None)
            if wait:
                self._thread.join()

    def _loop(self) -> None:
        first_error: BaseException | None = None
        while (job := self._queue.get()) is not None:
            if first_error is not None:
                job.fail(RuntimeError(f"skipped: an earlier communication job failed with {first_error!r}"))
                continue
            job.run()
            first_error = job.error
