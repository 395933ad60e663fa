"""Pipeline parallelism: a ``Sequential`` cut into stages that microbatches flow through.

Reading order: ``naive.py`` (one GPipe step with plain blocking sends and receives: the whole idea on
a page, and why it is slow) -> ``schedules.py`` (GPipe and 1F1B as plain lists of instructions per
stage, and why they cannot deadlock) -> ``simulate.py`` (running a schedule on paper: timeline, bubble,
deadlock check; ``minidist_tools/gantt.py`` draws it) -> ``executor.py``
(``StageExecutor``: one rank's instructions for any schedule) -> ``messages.py`` (what stages send
each other: a shape header, then activations and gradients, on known tags) -> ``messaging.py`` (how
they travel: GPipe's and 1F1B's blocking send/recv) -> ``partition.py`` (cutting the model into
stages) -> ``pipeline_parallel.py`` (``PipelineParallel``: the user-facing wrapper, with data
parallelism over a dp group; ``groups.py`` resolves its groups, ``tied.py`` keeps a weight used on
two stages, such as a GPT's tied token table, equal) -> ``inference.py`` (forward-only passes for
``PipelineParallel.predict``) -> ``interleaved.py`` (v model chunks per stage; ``make_schedule``
picks any schedule by name) -> ``batched_messaging.py`` (the interleaved schedule's messages, as
non-blocking batches). Checks last: ``checks.py`` (wrong arguments, and user code that fails
mid-schedule: the stand-ins that let every rank finish the step) and ``step_checks.py`` (the small
exchange that begins every step, so that the ranks agree on the call).
"""

from minidist.parallel.pipeline.batched_messaging import BatchedMessaging
from minidist.parallel.pipeline.executor import StageExecutor, StepStats
from minidist.parallel.pipeline.interleaved import interleaved, make_schedule
from minidist.parallel.pipeline.messaging import BlockingMessaging
from minidist.parallel.pipeline.naive import naive_gpipe_step
from minidist.parallel.pipeline.partition import PipelineChunks, PipelineStage, balanced_cuts, partition
from minidist.parallel.pipeline.pipeline_parallel import PipelineParallel
from minidist.parallel.pipeline.schedules import (
    SCHEDULES,
    Batch,
    Exchange,
    Instruction,
    Schedule,
    gpipe,
    one_f_one_b,
    peak_activations,
)
from minidist.parallel.pipeline.simulate import ScheduleDeadlockError, Timeline, simulate

__all__ = [
    "naive_gpipe_step",
    "Instruction", "Batch", "Exchange", "Schedule", "gpipe", "one_f_one_b", "peak_activations", "SCHEDULES",
    "simulate", "Timeline", "ScheduleDeadlockError", "StageExecutor", "StepStats",
    "BlockingMessaging", "BatchedMessaging", "partition", "balanced_cuts", "PipelineStage", "PipelineChunks",
    "PipelineParallel", "interleaved", "make_schedule",
]  # fmt: skip
