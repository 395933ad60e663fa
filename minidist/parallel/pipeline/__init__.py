"""Pipeline parallelism: a ``Sequential`` cut into stages that microbatches flow through.

Reading order: ``partition.py`` (cutting the model into stages) -> ``schedules.py`` (GPipe and 1F1B as
plain lists of instructions per stage, and why they cannot deadlock) -> ``simulate.py`` (running a
schedule on paper: timeline, bubble, deadlock check) -> ``interleaved.py`` (v model chunks per stage)
-> ``gantt.py`` (text grid and matplotlib chart) -> ``messages.py`` (what stages send each other: a
shape header, then activations and gradients, on known tags) -> ``executor.py`` (``StageExecutor``:
one rank's instructions for any schedule; GPipe/1F1B messages as blocking send/recv) ->
``batched_messaging.py`` (the interleaved schedule's messages, as non-blocking batches) ->
``pipeline_parallel.py`` (``PipelineParallel``: the user-facing wrapper, with data parallelism over a
dp group; ``groups.py`` resolves its groups, ``tied.py`` keeps a weight used on two stages, such as
a GPT's tied token table, equal) -> ``inference.py`` (forward-only passes for
``PipelineParallel.predict``).
"""

from minidist.parallel.pipeline.batched_messaging import BatchedMessaging
from minidist.parallel.pipeline.executor import StageExecutor, StepStats
from minidist.parallel.pipeline.gantt import draw_gantt, text_grid
from minidist.parallel.pipeline.interleaved import interleaved, make_schedule
from minidist.parallel.pipeline.messaging import BlockingMessaging
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
    "SCHEDULES",
    "Batch",
    "BatchedMessaging",
    "BlockingMessaging",
    "Exchange",
    "Instruction",
    "PipelineChunks",
    "PipelineParallel",
    "PipelineStage",
    "Schedule",
    "ScheduleDeadlockError",
    "StageExecutor",
    "StepStats",
    "Timeline",
    "balanced_cuts",
    "draw_gantt",
    "gpipe",
    "interleaved",
    "make_schedule",
    "one_f_one_b",
    "partition",
    "peak_activations",
    "simulate",
    "text_grid",
]
