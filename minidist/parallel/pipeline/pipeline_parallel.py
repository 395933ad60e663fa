"""``PipelineParallel``: a ``Sequential`` cut into stages, one per rank of the pipeline group.

Each rank of ``group`` (the pp group) builds the whole model from the same seed, keeps only its stage's
layers (``partition.py``), and trains them with a schedule (``schedules.py``) run by an executor
(``executor.py``)::

    pipe = PipelineParallel(model, group=world, microbatches=4, schedule="1f1b")
    opt = optim.SGD(pipe.parameters(), lr=0.1)           # this stage's parameters only
    opt.zero_grad()
    loss = pipe.train_step(x, y, nn.functional.cross_entropy)   # mean loss, on every rank
    opt.step()
    logits = pipe.predict(x_test)                       # forward only, on every rank

**Interleaved 1F1B** (``schedule="interleaved", virtual_stages=v``; Narayanan et al. 2021, §2.2.2):
the model is cut into ``p * v`` chunks and rank r holds chunks ``r, r + p, r + 2p, ...``, so a
microbatch goes round the ranks ``v`` times. The bubble shrinks ``v``-fold, to ``(p-1)/(v m)`` of the
compute time, for ``v`` times as many (smaller) messages; ``m`` must be a multiple of ``p``
(``interleaved.py``). The same executor runs it, with non-blocking messages (``batched_messaging.py``).

The batch is cut into ``m`` equal microbatches; the last stage scales each microbatch's mean loss by
``1/m``, so the accumulated gradients equal those of one step on the whole batch and ``m`` stages
train the same model as one process would.

**With data parallelism** (``dp_group``, or ``mesh.dp_group``): every dp replica of a stage gets a different
share of the global batch; after the *last* microbatch's backward, the stage's gradients are combined over
``dp_group`` once, with one ``dist.all_reduce`` of a flat buffer per dtype (Narayanan et al. 2021, §3: the
data-parallel all-reduce happens once per batch, after the pipeline flush). Replica d's gradient (of the mean
loss over its ``B_d`` samples) is weighted by ``B_d / sum(B)`` before the sum, so unequal shares (100 samples
on 3 replicas: 34 + 33 + 33, with ``m = 1``) still give the gradient of the mean over the global batch; with
equal shares this is the plain average. We do not reuse ``DistributedDataParallel``: its hooks reduce at the
end of *every* backward call, i.e. once per microbatch here, and overlapping with backward would need
``no_sync`` around all but the last microbatch, which the executor does not know about; a single flat
all-reduce at the end is simpler and costs one collective per step. At construction, each stage's parameters
are broadcast from dp rank 0, as DDP does, so the replicas start equal.

**Tied weights** (a GPT's token table, read by the embedding on the first stage and by the output head
on the last; ``GPT.pipeline_layers()``): a Parameter used by layers on two ranks. The later rank gets
its own copy under the same name, flagged ``is_tied_copy = True``, checked equal to the original at
construction; after each step's backward (after the dp combine) the two gradients are summed over a
group of just those two ranks, so both get the gradient of the shared weight and, under the same
optimizer, stay equal, as Megatron-LM keeps its embedding and output layer in sync (Shoeybi et al.
2019, §3; Narayanan et al. 2021). Middle stages take no part (``tied.py``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

import minidist.distributed as dist
from minidist import backend
from minidist.autograd import Tensor, tensor
from minidist.distributed import Communicator
from minidist.nn.layers import Sequential
from minidist.nn.module import Parameter
from minidist.parallel.data_parallel.buckets import flatten, unflatten_into
from minidist.parallel.pipeline.checks import check_arguments, check_chunks, first_failure
from minidist.parallel.pipeline.executor import StageExecutor, StepStats
from minidist.parallel.pipeline.groups import as_count, resolve_groups
from minidist.parallel.pipeline.inference import forward_only
from minidist.parallel.pipeline.interleaved import make_schedule
from minidist.parallel.pipeline.partition import PipelineChunks, build_stage, partition
from minidist.parallel.pipeline.step_checks import check_batch
from minidist.parallel.pipeline.tied import (
    find_tied,
    make_groups,
    put_back_tied_gradients,
    set_aside_tied_gradients,
    sum_tied_gradients,
    untie,
)


class PipelineParallel:
    """Train a ``Sequential`` split into ``group.size`` pipeline stages, one per rank of ``group``.

    Args:
        model: an ``nn.Sequential`` built identically (same seed) on every rank.
        group: the pipeline communicator (rank s runs stage s), ``None`` for the world, or a mesh: any
            object with ``.pp_group`` (and ``.dp_group``, used when ``dp_group`` is not given).
        microbatches: ``m >= 1`` (an int or NumPy integer); every batch size must be divisible by it.
        schedule: ``"1f1b"``, ``"gpipe"`` (``schedules.py``) or ``"interleaved"`` (``interleaved.py``).
        dp_group: data-parallel communicator over the replicas of this stage, or None.
        cuts: explicit cut points (where stages 1..p-1 start; with interleaving the ``p v - 1`` points
            where virtual stages 1..pv-1 start); default: balanced by parameter count.
        virtual_stages: ``v``, model chunks per rank; more than 1 only with ``schedule="interleaved"``.

    **Errors during a step.** ``train_step`` and ``predict`` begin with one small exchange over the group that
    checks what can be checked before the schedule (the batch sizes, inputs on stage 0 and targets on the last
    stage, a callable ``loss_fn``, and that every rank called the same operation), and with a dp group a
    second one over the dp group, so that every replica raises such an error before its step and no gradient
    changes (``step_checks.py``: carrying the verdict in the all-reduce that ends the step instead saves one
    collective, but the other replicas then raise only after their backward, leaving partial gradients behind;
    "nothing is lost" comes first). ``loss_fn`` itself runs on the last stage only, in the middle of the
    schedule: if it raises (e.g. targets out of range, or layers that changed the batch size) or returns
    anything but a one-element Tensor, the last stage finishes the schedule sending zero gradients, and the
    error is then reported on every rank of the group (and of the dp group), so no rank is left waiting; the
    step's gradients are incomplete then: call ``zero_grad`` before the next step. The same happens when a
    stage's output changes shape or dtype from one microbatch to the next (a layer whose output shape depends
    on the data): the stage sends zeros of the first microbatch's shape instead, and every rank raises a
    ``ValueError`` naming the stage, the microbatch and both shapes; and when a stage's layers raise in
    forward (e.g. an output that does not fit the next stage's first layer): every rank raises that error's
    class (``RuntimeError`` for classes other than ``TypeError``/``ValueError``) naming the stage, the
    microbatch and the input's shape (``checks.py``). Errors of the communication itself
    (``minidist.distributed``) still end the job through minidist's excepthook
    (``minidist/distributed/safety/watchdog.py``).

    Attributes: ``stage_module`` (this rank's layers, with the full model's parameter names: a
    :class:`PipelineStage`, or with ``v > 1`` a :class:`PipelineChunks` holding all ``v`` chunks),
    ``chunks`` (this rank's chunks in order; one without interleaving), ``stage_index``,
    ``num_stages``, ``virtual_stages``, ``bounds`` (every (virtual) stage's ``(start, stop)`` layer
    range; virtual stage ``k p + r`` is chunk k of rank r), ``schedule`` (the :class:`Schedule`),
    ``stats`` (:class:`StepStats` of the last step), ``tied`` (the weights used on two ranks, as
    ``tied.TiedParameter``: name, holder ranks, this rank's copy and their group).

    Raises (on every rank of ``group``, agreed with a collective): ``TypeError`` for a model that is
    not a Sequential or a group that is not a Communicator or mesh; ``ValueError`` for fewer layers
    than stages (or than ``p v`` chunks), bad ``cuts``, ``microbatches``, ``schedule`` or
    ``virtual_stages`` (``v < 1``; ``v > 1`` without ``"interleaved"``; ``m`` not a multiple of ``p``
    for ``"interleaved"``), a mesh whose ``pp`` differs from its pp group's size, or ranks that
    disagree about any of these.
    """

    def __init__(
        self,
        model: Sequential,
        group: Any = None,
        microbatches: int = 1,
        schedule: str = "1f1b",
        dp_group: Communicator | None = None,
        cuts: Sequence[int] | None = None,
        virtual_stages: int = 1,
    ) -> None:
        group, dp_group = resolve_groups(group, dp_group)
        self.group, self.dp_group = group, dp_group
        self.stage_index, self.num_stages = group.rank, group.size
        microbatches = as_count(microbatches)  # NumPy integers are fine: from here on a Python int
        p, v = group.size, as_count(virtual_stages)
        error, bounds, plan, tied = None, [], None, []
        try:  # every check below raises TypeError or ValueError (checks.py)
            check_arguments(microbatches, v, schedule)
            plan = make_schedule(schedule, p, microbatches, v)  # unknown name, m % p for interleaved
            check_chunks(model, p, v)  # at least one layer per chunk
            bounds = partition(model, p * v, cuts)
            tied = find_tied(model, bounds, p)  # weights used on two ranks: a copy on the later one
        except (TypeError, ValueError) as e:
            error = e
        layers = len(model) if isinstance(model, Sequential) else type(model).__name__
        built = {"layers": layers, "microbatches": microbatches, "schedule": schedule, "virtual_stages": v}
        dist.agree(
            {**built, "stages": bounds, "tied": [[t.name, list(t.ranks)] for t in tied]},
            error,
            group,
            what="PipelineParallel",
            label="pipeline group",
            fix="build the same model with the same arguments on every rank",
        )
        assert plan is not None  # agree raised otherwise
        self.microbatches, self.bounds, self.virtual_stages, self.schedule = microbatches, bounds, v, plan
        self.chunks = tuple(build_stage(model, bounds[k * p + group.rank]) for k in range(v))
        self.tied = tied
        untie(self.chunks, model, tied, group.rank)
        self.stage_module = self.chunks[0] if v == 1 else PipelineChunks(self.chunks)
        self._executor = StageExecutor(self.chunks, group, plan)  # messaging chosen by the schedule
        if dp_group is not None and dp_group.size > 1:
            for param in self.parameters():  # the dp replicas of this stage start from dp rank 0's weights
                dist.broadcast(param.data, src=0, group=dp_group)
        if self.tied:
            make_groups(self.tied, group)  # (collective over the pp group; checks the copies)

    # -- parameters ------------------------------------------------------------------------------
    def named_parameters(self) -> Iterator[tuple[str, Parameter]]:
        """This stage's parameters under the full model's names (``"4.weight"``)."""
        return self.stage_module.named_parameters()

    def parameters(self) -> Iterator[Parameter]:
        """This stage's parameters (the ones to give the optimizer)."""
        return self.stage_module.parameters()

    def zero_grad(self) -> None:
        """Clear this stage's gradients, as ``Module.zero_grad``."""
        self.stage_module.zero_grad()

    @property
    def stats(self) -> StepStats:
        """The last step's busy and idle seconds, bubble fraction and peak activations on this stage."""
        return self._executor.stats

    # -- one step --------------------------------------------------------------------------------
    def train_step(self, inputs: Any, targets: Any, loss_fn: Callable[[Tensor, Any], Tensor]) -> float:
        """Forward and backward of one batch through the pipeline; return the mean loss on every rank.

        Args:
            inputs: the batch, shape ``(B, ...)``: a Tensor, or an array converted like ``md.tensor``
                (its dtype kept, as torch never casts a batch: a float64 model trains in float64, and a
                float32 one raises on float64 data). Needed on stage 0; other stages may pass None.
            targets: shape ``(B, ...)``, what ``loss_fn`` takes as its second argument. Needed on the
                last stage; others may pass None.
            loss_fn: ``loss_fn(output, targets_of_microbatch) -> scalar Tensor``, a *mean* over the
                microbatch (e.g. ``nn.functional.cross_entropy``).

        Gradients accumulate into ``.grad`` (call ``zero_grad`` before, as in PyTorch); with a
        ``dp_group`` they are averaged over it after the last microbatch (then a tied weight's two
        gradients are summed between its stages, class docstring), and the returned loss is the
        mean over the global batch (the replicas' shares may differ; each must be divisible by ``m``).

        Raises ``ValueError`` on every rank of the group and of the dp group if the batch size is not
        divisible by ``microbatches``, the ranks' batch sizes differ, inputs/targets lengths differ,
        stage 0 lacks inputs / the last stage lacks targets, some rank called ``predict`` instead, or
        ``loss_fn`` raised on the last stage, or a stage's output changed shape or dtype between
        microbatches; ``TypeError`` if ``loss_fn`` is not callable or returned
        anything but a one-element Tensor (class docstring: the step runs to its end first).
        """
        m, p, s = self.microbatches, self.num_stages, self.stage_index
        batch, global_batch = check_batch(self.group, self.dp_group, m, inputs, targets, loss_fn)
        error: Exception | None = None
        start = time.perf_counter()
        size = batch // m
        xs = ys = None
        if s == 0:
            data = inputs.data if isinstance(inputs, Tensor) else tensor(inputs).data
            xs = [Tensor(data[i * size : (i + 1) * size]) for i in range(m)]
        if s == p - 1:
            ys = [targets[i * size : (i + 1) * size] for i in range(m)]
        earlier = set_aside_tied_gradients(self.tied)  # summed by an earlier step: not to be summed again
        # The mean loss is known on the last stage only; with it goes whether any stage failed (a loss_fn
        # on the last stage, an activation whose shape changed between microbatches on any stage).
        loss = self._executor.run(xs, ys, loss_fn)
        result = np.array([loss if s == p - 1 else 0.0, self._executor.error is not None])
        dist.all_reduce(result, op="sum", group=self.group)
        self.stats.step_s = time.perf_counter() - start
        if result[1]:
            try:  # the first failure in the data flow, to every rank of the pipeline group
                ex = self._executor
                dist.raise_if_any(
                    first_failure(ex.error, ex.error_at, self.group), self.group, label="pipeline group"
                )
            except Exception as e:  # noqa: BLE001  (whatever it is, the dp group must learn of it)
                error = e
        if self.dp_group is None or self.dp_group.size == 1:
            if error is not None:
                put_back_tied_gradients(self.tied, earlier)
                raise error
            sum_tied_gradients(self.tied, earlier)
            return float(result[0])
        weight = batch / global_batch  # this replica's share of the global batch
        result[0] *= weight  # sum over the dp group: the mean over the global batch; and any failure
        dist.all_reduce(result, op="sum", group=self.dp_group)
        if result[1]:
            put_back_tied_gradients(self.tied, earlier)
            dist.raise_if_any(error, self.dp_group, label="data-parallel group")
        self._combine_gradients_over_dp(weight)
        sum_tied_gradients(self.tied, earlier)  # the embedding's and the tied head's gradients, summed
        return float(result[0])

    def predict(self, inputs: Any) -> Any:
        """Forward-only pass of ``inputs`` through all stages (no grad, eval mode); for evaluation.

        ``inputs``: shape ``(B, ...)``, a Tensor or an array (converted like ``md.tensor``); needed on
        stage 0, others may pass None. Returns the last stage's output (e.g. logits, shape ``(B, C)``)
        as a backend array on every rank of the pipeline group (``inference.py``: the batch travels
        down the stages once, then the last stage broadcasts). Raises ``ValueError`` on every rank of
        the group if stage 0 has no inputs.
        """
        return forward_only(self.chunks, self.group, None if inputs is None else tensor(inputs).data)

    def _combine_gradients_over_dp(self, weight: float) -> None:
        """One all-reduce(sum) per dtype of ``weight`` x this stage's flat gradients, after the backward."""
        by_dtype: dict[Any, list[Parameter]] = {}
        for p in self.parameters():
            if not p.requires_grad:  # frozen: no gradient, as on one process (a zero one would be decayed)
                continue
            if p.grad is None:  # every replica must send the same buffer: missing gradients count as 0
                p.grad = backend.xp().zeros_like(p.data)
            by_dtype.setdefault(p.grad.dtype, []).append(p)
        for params in by_dtype.values():
            grads = [p.grad for p in params]
            flat = flatten(grads)
            flat *= weight
            unflatten_into(dist.all_reduce(flat, op="sum", group=self.dp_group), grads)
