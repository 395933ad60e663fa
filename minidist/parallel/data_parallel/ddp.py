"""``DistributedDataParallel`` (DDP): the two rules of ``naive.py``, made fast.

As ``DataParallelNaive``, DDP broadcasts rank 0's parameters when it wraps a model (the replicas start
identical) and leaves every rank with the *average* of all ranks' gradients after backward (they take
identical steps: with equal shares of the global batch, exactly the steps of one process on the whole
batch, up to float rounding). What it adds is how the gradients travel, and the checks.

**Buckets and overlap** (Li et al., "PyTorch Distributed", VLDB 2020, §3.2). Gradients are grouped into
buckets of about ``bucket_cap_mb`` (``buckets.py``). A hook on every parameter fires when backward has
finished its gradient; when the last gradient of a bucket arrives, the bucket's all-reduce starts at once (on
the communication thread, see "Where each bucket runs"), while backward goes on computing earlier layers.
Buckets start strictly in index order: a bucket that fills early waits until every earlier bucket has started,
so all ranks issue the same collectives in the same order even if their gradients arrive in different orders.
A callback queued with ``autograd.queue_callback`` runs when backward ends; it waits for the buckets the
thread has, all-reduces the others itself, and only then does ``loss.backward()`` return. ``overlap=False``
keeps the simple version for teaching and comparison: nothing is sent during backward, and the callback
all-reduces the buckets one after another. Overlap needs an autograd engine that accumulates each parameter's
gradient (and runs its hook) right after its layer's backward; one that accumulates every leaf only at the end
of backward leaves nothing to overlap with (the timeline from ``minidist.trace`` shows which case you are in).

**Where each bucket runs** (``launch.py``, which also says why a thread and not MPI's non-blocking requests):
big buckets on the communication thread during backward; the last bucket and every bucket under
``small_bucket_bytes`` on the calling thread at its end (the lean path: handing a small bucket to the thread
costs more than its all-reduce), in an order that depends only on the bucket plan and the options.

**Checks** (``checks.py``, read last). ``__init__`` runs only once the ranks agree on the options
(``@agreed_arguments(checks.options)``): ranks with different ones would start different all-reduces and hang.
A parameter without a gradient on some rank, or a rank that ran out of batches (and called :meth:`join`),
would do the same; flags carried in the last bucket tell every rank the same counts instead, so every rank
raises the same error, at no extra message per step.

**Communication hooks** (``comm_hooks/``, PyTorch's ``register_comm_hook``). A registered hook replaces
the bucket's all-reduce, wherever it runs (the thread or the lean path), and may compress: float16,
bfloat16, PowerSGD. ``ddp.comm_stats`` counts the bytes every bucket sent, with or without a hook.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import minidist.distributed as dist
from minidist import autograd, trace
from minidist.nn.module import Module, Parameter
from minidist.parallel.agreed import agreed_arguments
from minidist.parallel.comm_hooks.bucket import CommStats
from minidist.parallel.comm_hooks.registration import CommHook, register
from minidist.parallel.data_parallel import checks
from minidist.parallel.data_parallel.buckets import Bucket, flatten, plan_buckets, unflatten_into
from minidist.parallel.data_parallel.launch import Launcher


class DistributedDataParallel(Module):
    """Wrap ``module`` so that ``loss.backward()`` returns with gradients averaged over ``group``.

    Args:
        module: the model; ``ddp(x)`` calls ``module(x)``. Its parameters are overwritten with rank
            0's when wrapping (a collective: every rank of ``group`` must construct DDP together).
        group: the data-parallel communicator from ``dist`` (default: the world).
        bucket_cap_mb: bucket size limit in MiB (2**20 bytes) of gradients; a parameter bigger than
            the cap gets a bucket of its own. Every bucket is one ``dist.all_reduce(op="avg")``.
        overlap: start each bucket's all-reduce during backward, in a communication thread (True), or
            all-reduce every bucket after backward on the calling thread (False).
        find_unused_parameters: if False, a backward pass in which some parameter got no gradient on some rank
            raises ``RuntimeError`` on every rank. If True, a missing gradient counts as zeros: that
            parameter's ``.grad`` becomes the average over ranks with zeros for the ranks that lacked it (all
            zeros if no rank had one). Buckets after such a parameter start only at the end of backward.
        small_bucket_bytes: a bucket of fewer gradient bytes than this is all-reduced on the calling thread at
            the end of backward, not on the communication thread during it (the lean path, ``launch.py``; 0:
            every bucket but the last overlaps). The default, 1 MiB, is about where an all-reduce on 2 ranks
            takes as long as the hand-off to the thread on the benchmark machine.

    Memory: one flat buffer per bucket, as many bytes as all gradients together (plus ``P + 1`` elements of
    bookkeeping). After a synchronising backward each ``.grad`` is a *view* of its bucket (no copy back, like
    PyTorch's ``gradient_as_bucket_view=True``): the next backward overwrites it, so ``.copy()`` a gradient
    you want to keep. ``state_dict()`` names start with ``"module."``, as in PyTorch.

    Raises (from ``loss.backward()``, identically on every rank):
        RuntimeError: some parameter got no gradient on some rank (names it; see above).
        CollectiveMismatchError: some rank had called :meth:`join` (it had no batches left) while
            this one ran another backward pass.
        At construction, on every rank: ValueError for ``bucket_cap_mb <= 0``, ``small_bucket_bytes
            < 0``, or ranks that passed different ``bucket_cap_mb``, ``overlap`` or ``small_bucket_bytes``
            (they would all-reduce in different orders and hang); RuntimeError for a module without a
            parameter that requires a gradient (torch's message). TypeError: ``module`` is not a Module.

    Limitation: a rank whose backward reaches *none* of the parameters runs no hook, so it does not
    take part at all and the other ranks wait for it.
    """

    @agreed_arguments(checks.options)  # first, collectively: a bad or differing option raises on every rank
    def __init__(
        self,
        module: Module,
        group: Any = None,
        bucket_cap_mb: float = 25,
        overlap: bool = True,
        find_unused_parameters: bool = False,
        small_bucket_bytes: int = 2**20,
    ) -> None:
        super().__init__()
        self.group = group  # (the world if None was passed: checks.options resolved it)
        self.module = module
        self.bucket_cap_mb, self.small_bucket_bytes = bucket_cap_mb, small_bucket_bytes
        self.find_unused_parameters = find_unused_parameters
        self._named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        params = [p for _, p in self._named]

        # Rule 1: identical start. One broadcast of all parameters packed together (checks.options: >= 1).
        all_params = [p.data for p in module.parameters()]
        flat = flatten(all_params)
        dist.broadcast(flat, src=0, group=self.group)
        unflatten_into(flat, all_params)

        # The same plan on every rank: it depends only on the parameters' sizes and dtypes.
        plan = plan_buckets([p.data.nbytes for p in params], [p.dtype for p in params], bucket_cap_mb * 2**20)
        self._buckets = [
            Bucket(b, [params[i] for i in idx], extra=len(params) + 1 if b == len(plan) - 1 else 0)
            for b, idx in enumerate(plan)
        ]
        self._bucket_of = {i: b for b, idx in enumerate(plan) for i in idx}
        self._index_of = {id(p): i for i, p in enumerate(params)}

        # A private channel for gradient traffic (collective: every rank duplicates together), and the
        # thread that uses it. A group of one rank has nothing to communicate. (Named for traces.)
        self._comm = self.group.dup(name=self.group.name) if self.group.size > 1 else None
        # Which buckets the thread all-reduces during backward, and the order of all (launch.py).
        self._launcher = Launcher(self._buckets, overlap, self._comm is not None, small_bucket_bytes)
        self.overlap = self._launcher.overlap  # False without MPI_THREAD_MULTIPLE (with a warning)
        self._order, self._last = self._launcher.order, self._launcher.order[-1]
        if self._launcher.thread is not None:  # stop the thread when DDP is garbage-collected (or at exit)
            weakref.finalize(self, self._launcher.thread.close, False)

        self._comm_hook: CommHook | None = None
        self._backward_ran = False  # register_comm_hook is refused after the first backward
        self.comm_stats = CommStats()  # bytes sent per bucket (comm_hooks/bucket.py)
        self._sync_enabled = True
        # The state of one backward pass: made once here and changed in place, never assigned anew, because
        # DDP is a Module, whose __setattr__ (which registers parameters and submodules) costs ~4,500
        # instructions per attribute (docs/performance.md, "DDP's bookkeeping, counted"): this runs each step.
        self._pass = SimpleNamespace(number=None)  # autograd.backward_pass_count() of the running pass
        self._ready = [False] * len(params)  # which gradients this pass has finished
        self._bucket_sizes = [len(b.params) for b in self._buckets]
        self._missing = list(self._bucket_sizes)  # per bucket: gradients not yet ready
        self._started: list[Bucket] = []  # buckets started this pass, in index order
        for p in params:
            p.register_post_accumulate_grad_hook(self._on_grad_ready)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Skip gradient communication inside this block: gradients accumulate locally in ``.grad``.

        The first backward outside the block all-reduces the accumulated sums: k micro-steps of local batch b
        on N ranks, each micro-step's mean loss divided by k (k - 1 of them inside ``no_sync``), give the
        gradient of one step on one process with the mean loss over the k*N*b samples. Nothing is sent inside,
        so :meth:`join` and the unused-parameter check only look at the synchronising backward.
        """
        previous, self._sync_enabled = self._sync_enabled, False
        try:
            yield
        finally:
            self._sync_enabled = previous

    def register_comm_hook(self, state: Any, hook: Any) -> None:
        """Average each bucket with ``hook(state, bucket)`` instead of a plain all-reduce (PyTorch's name).

        ``hook`` gets ``state`` and a :class:`~minidist.parallel.comm_hooks.bucket.GradBucket` (the bucket's
        flat local gradient, its parameters, ``bucket.group`` to communicate on) and returns the averaged flat
        gradient, an array of the bucket's shape and dtype: synchronously (PyTorch's hooks return a
        ``torch.futures.Future``). Built-in hooks in ``minidist.parallel.comm_hooks``: ``allreduce_hook``,
        ``fp16_compress_hook``, ``bf16_compress_hook`` (state: None) and ``powerSGD_hook`` (state: a
        ``PowerSGDState``). On a group of one rank DDP communicates nothing, so the hook never runs.

        Collective over the group: call it on every rank, once, before the first backward pass. Raises on
        every rank (``comm_hooks/registration.py``): ``RuntimeError`` (a hook is registered already, or a
        backward pass ran), ``TypeError`` (``hook`` not callable), ``ValueError`` (the ranks' hooks or
        PowerSGD arguments differ, or ``state``'s process group is not DDP's group).
        """
        self._comm_hook = register(
            self.group, state, hook, registered=self._comm_hook is not None, backward_ran=self._backward_ran
        )

    def join(self) -> None:
        """Declare that this rank has no batches left; call it on every rank after its last batch.

        Collective over the group. If every rank calls it, it costs one all-reduce of zeros per bucket and
        returns. If some rank instead runs another backward pass (it had more batches), this rank takes part
        in its all-reduces with zeros, and both sides raise the same ``CollectiveMismatchError`` rather than
        hang. Raises ``RuntimeError`` if called during backward.
        """
        if self._pass.number is not None:
            raise RuntimeError("join() was called during a backward pass; call it after the last batch")
        if self._comm is None:
            return
        with trace.span("join", trace.WAIT):
            checks.join_pass(self._order, self._buckets[-1].extra, self._comm, self._comm_hook)

    # -- called by the autograd engine during loss.backward() -----------------------------------
    def _reset_pass(self) -> None:
        self._pass.number = None
        self._ready[:] = [False] * len(self._ready)
        self._missing[:] = self._bucket_sizes
        self._started.clear()
        self._launcher.reset()

    def _on_grad_ready(self, param: Parameter) -> None:
        if not self._sync_enabled:
            return
        if self._pass.number != autograd.backward_pass_count():  # the first gradient of this pass
            if self._pass.number is not None:  # an earlier backward raised: its callback never ran
                self._abandon_failed_pass()
            self._pass.number = autograd.backward_pass_count()
            if not self._backward_ran:  # (set once: see self._pass)
                self._backward_ran = True
            autograd.queue_callback(self._finish_pass)
        # BEGIN SOLUTION A3.3: mark the gradient ready; start every full bucket, strictly in index order
        i = self._index_of[id(param)]
        if self._ready[i]:
            return
        self._ready[i] = True
        self._missing[self._bucket_of[i]] -= 1
        if self.overlap and self._comm is not None:
            # Strict index order: start bucket b only when it is full and buckets 0..b-1 have started.
            while len(self._started) < len(self._buckets) and self._missing[len(self._started)] == 0:
                self._start_next_bucket()
        # END SOLUTION

    def _abandon_failed_pass(self) -> None:
        """Forget a pass whose backward raised, after letting its started buckets finish (errors dropped).
        Without this, the flag "callback queued" would stay set forever and every later backward would
        skip communication: replicas would drift apart silently."""
        self._launcher.discard()
        self._reset_pass()

    def _start_next_bucket(self) -> None:
        bucket = self._buckets[len(self._started)]
        if bucket is self._buckets[-1]:
            # Final now: if this runs during backward, every gradient is ready (all earlier buckets
            # started and this one is full), so the flags cannot change any more.
            checks.write_flags(bucket.extra, self._ready, training=True)
        self._started.append(bucket)
        self._launcher.start(bucket, self._communicate)  # on the thread, or kept for _finish_pass

    def _communicate(self, bucket: Bucket) -> None:
        """Average one bucket (on either thread): plainly or with the hook, counting the bytes sent."""
        channel, is_last = self._comm.collective_channel, bucket is self._last
        sent = channel.bytes_sent  # (the thread and the lean path never run at the same time)
        if self._comm_hook is None:
            self._all_reduce_bucket(bucket)
        else:
            with trace.span(bucket.name, trace.COMM), bucket.device:
                bucket.pack()
                self._comm_hook.run(bucket, self._comm, is_last, self.comm_stats)
                bucket.unpack()
        plain = self._comm_hook is None
        self.comm_stats.record(bucket.gradient_bytes, channel.bytes_sent - sent, is_last, plain)

    def _all_reduce_bucket(self, bucket: Bucket) -> None:
        """Rule 2 for one bucket: average its gradients over the group, in place (on either thread)."""
        with trace.span(bucket.name, trace.COMM), bucket.device:  # (bucket.device: its GPU, if any)
            # BEGIN SOLUTION A3.2: average the bucket's gradients over the group
            bucket.pack()
            dist.all_reduce(bucket.flat, op="avg", group=self._comm)
            bucket.unpack()
            # END SOLUTION

    def _finish_pass(self) -> None:
        """End of backward: start what is left, finish every bucket, then check the bookkeeping."""
        try:
            if self._comm is None:  # one rank: nothing to average, only the local check
                checks.check_alone(self._named, self._ready, self.find_unused_parameters)
                return
            with trace.span("wait for gradients", trace.WAIT):
                while len(self._started) < len(self._buckets):
                    self._start_next_bucket()
                self._launcher.finish(self._communicate)  # in self._order, the same on every rank
            extra, n = self._buckets[-1].extra, self._comm.size  # the flags, averaged with the last bucket
            checks.check_flags(extra, n, self._named, self.find_unused_parameters)
        finally:
            self._reset_pass()
