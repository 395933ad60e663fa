"""Where and when DDP all-reduces each bucket: on the communication thread during backward, or on the
calling thread at its end (the lean path). The order is fixed by the bucket plan and the options.

**The lean path: buckets that overlap cannot pay for.** Handing a bucket to the thread and waiting for
it costs ~155-200 µs on 2 cores (waking the thread, passing the GIL back and forth; docs/performance.md,
"Buckets on the calling thread"), more than the whole all-reduce of a bucket under 1 MiB takes there.
So two kinds of bucket never go to the thread; they are all-reduced at the end of backward, after the
thread's buckets: the last bucket, which fills only when backward is (nearly) over, so there is nothing
left to overlap it with; and every bucket under ``small_bucket_bytes``. A model whose gradients fit in
one bucket, or whose buckets are all small, never wakes the thread. The launch order (the thread's
buckets in index order, then the others in index order) depends only on the bucket plan and the
options, so it is the same on every rank.

**Why a communication thread, not non-blocking requests.** The all-reduce has to make progress while the
main thread is inside a matmul. With non-blocking MPI requests, MPICH moves data only while some thread
is inside an MPI call; our hooks run a few times per backward (once per parameter), so a non-blocking
all-reduce would progress in a few bursts and mostly finish in the final wait. It would also have to be
MPI's ``Iallreduce``, not our hand-written ring. A thread instead runs the ordinary, blocking
``dist.all_reduce`` and progresses continuously. It needs ``MPI_THREAD_MULTIPLE`` (:class:`Launcher`
checks ``MPI.Query_thread()`` and falls back to ``overlap=False`` with a warning) and its own
communicator (DDP's duplicate of its group), so its messages can never be matched by a collective the
main thread calls meanwhile. The GIL is no obstacle: BLAS matmuls and mpi4py calls release it. The price
is CPU time: a blocking MPI call *spins* while it waits for the peer (MPICH yields the core only every
1000 polls, ``MPIR_CVAR_POLLS_BEFORE_YIELD``), and on a machine with one core per rank that spinning
thread competes with the compute thread. So overlap helps most when the ranks are in step (a bucket's
partners are ready when it starts) and the cores are not oversubscribed.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Sequence

from mpi4py import MPI

from minidist import trace
from minidist.parallel.data_parallel.buckets import Bucket
from minidist.parallel.data_parallel.comm_thread import CommThread, Job


class Launcher:
    """Starts each bucket's all-reduce on the communication thread or keeps it for the end of backward.

    Args:
        buckets: the bucket plan, in index order.
        overlap: DDP's option: may buckets go to the thread? Warns (``UserWarning``) and takes False if
            MPI was initialised without ``MPI_THREAD_MULTIPLE``.
        communicates: False if DDP has nothing to communicate (one rank): no bucket goes to a thread.
        small_bucket_bytes: a bucket of fewer bytes than this stays off the thread (the lean path).

    Attributes: ``overlap`` (the option as it applies), ``order`` (every bucket in the order all ranks
    all-reduce them, the thread's first), ``thread`` (the :class:`CommThread`, or None if no bucket goes
    to it: none is started then).
    """

    def __init__(
        self, buckets: Sequence[Bucket], overlap: bool, communicates: bool, small_bucket_bytes: int
    ) -> None:
        if overlap and communicates and MPI.Query_thread() < MPI.THREAD_MULTIPLE:
            warnings.warn(
                "DistributedDataParallel: MPI was initialised without MPI_THREAD_MULTIPLE, so gradients "
                "cannot be all-reduced from a communication thread; using overlap=False",
                stacklevel=3,  # the line that constructs DistributedDataParallel
            )
            overlap = False
        self.overlap = overlap
        big = {b.index for b in buckets[:-1] if b.nbytes >= small_bucket_bytes}
        self._threaded = big if overlap and communicates else set()
        self.order = sorted(buckets, key=lambda b: b.index not in self._threaded)  # a stable sort
        self.thread = CommThread("ddp-comm") if self._threaded else None
        self._queued: list[Job] = []  # this pass's buckets handed to the thread, in index order
        self._here: list[Bucket] = []  # this pass's buckets left to finish(), in index order

    def start(self, bucket: Bucket, communicate: Callable[[Bucket], None]) -> None:
        """Hand ``bucket`` to the thread, which runs ``communicate(bucket)`` now, or keep it for
        :meth:`finish`. Buckets must be started in index order."""
        if bucket.index in self._threaded:
            job = Job(functools.partial(communicate, bucket))
            self._queued.append(job)
            # A mark on the main thread's timeline: the gap to "allreduce bucket i" on the comm thread
            # is the time the job waited for the thread (and the thread for a core).
            with trace.span(bucket.start_name, trace.LAUNCH):
                self.thread.submit(job)
        else:
            self._here.append(bucket)

    def finish(self, communicate: Callable[[Bucket], None]) -> None:
        """Wait for the thread's buckets, then run ``communicate`` on the kept ones: :attr:`order`.

        The kept buckets run directly, without a :class:`Job`: nothing waits for them on another thread,
        and an error simply propagates. Re-raises the first error of the thread's jobs.
        """
        for job in self._queued:  # the thread's first: the channel carries one collective at a time
            job.wait()  # re-raises its error
        for bucket in self._here:
            communicate(bucket)

    def discard(self) -> None:
        """Forget a pass whose backward raised, after letting the thread finish its buckets (their errors
        are dropped with the pass)."""
        for job in self._queued:  # (the kept ones never ran)
            try:
                job.wait()
            except Exception:  # noqa: BLE001  (the failed pass is discarded, its errors with it)
                pass
        self.reset()

    def reset(self) -> None:
        """Ready for the next pass (in place: this runs every step)."""
        self._queued.clear()
        self._here.clear()
