"""The small exchange that begins every ``train_step`` and ``predict``: do the ranks agree on the call?

A rank cannot see what the others were passed, and a pipeline whose ranks disagree hangs or garbles its
messages: one rank runs ``predict`` while another trains, or stage 0 has no inputs. So every step
begins with one small exchange over the pipeline group (an all-gather, done as an all-reduce:
:func:`gather_ints`): each rank sends which operation it called and a few ints (for ``train_step`` its
batch sizes, whether the inputs and targets it needs are there, whether ``loss_fn`` is callable), and
every rank reaches the same verdict, so every rank raises the same error before the step. With a dp
group a second exchange shares the verdicts (and batch sizes) over it, so that every replica raises
before its step and no gradient changes. (Carrying the verdict in the all-reduce that ends the step
instead saves one collective, but then the other replicas raise only after their backward, leaving
partial gradients behind.)

This is check code, like ``checks.py``: the mechanism of a step does not depend on it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

import minidist.distributed as dist
from minidist.distributed import Communicator

OPERATIONS = ("train_step", "predict")
STEP_FIELDS = 3  # integers per rank after the operation code (the same for every operation)
_MISSING, _NOT_CALLABLE = 1, 2  # bit flags in train_step's agreement (check_batch)


def gather_ints(group: Communicator, values: Sequence[int]) -> list[list[int]]:
    """Every rank's ``values`` (as many ints on every rank), in rank order, as Python lists.

    One all-reduce (sum) of an int64 table with one row per rank, each rank filling its own row: the
    same result as an all-gather in one collective, where ``dist.all_gather`` (whose chunks may differ
    in length) runs two: the lengths first, then the data (twice the messages and Python for these few
    ints, every step).
    """
    table = np.zeros((group.size, len(values)), np.int64)
    table[group.rank] = values
    return dist.all_reduce(table, op="sum", group=group).tolist()


def gather_step(
    group: Communicator, operation: str, fields: Sequence[int]
) -> tuple[list[list[int]], ValueError | None]:
    """Gather ``operation`` and up to ``STEP_FIELDS`` ints from every rank of ``group``.

    Returns ``(fields of every rank: group.size lists of STEP_FIELDS ints, padded with -1; error)``,
    where ``error`` is a ``ValueError`` (the same on every rank) if the ranks called different
    operations. One all-reduce of a (group.size, 4) int64 table (:func:`gather_ints`), whatever the
    operation, so mismatched calls still pair up.
    """
    padding = [-1] * (STEP_FIELDS - len(fields))
    everyone = gather_ints(group, [OPERATIONS.index(operation), *fields, *padding])
    codes = [row[0] for row in everyone]
    error = None
    if len(set(codes)) > 1:
        calls = "; ".join(f"rank {r}: {OPERATIONS[c]}" for r, c in enumerate(codes))
        error = ValueError(
            f"PipelineParallel: the ranks of the pipeline group called different operations ({calls}); "
            "every rank of the group must call train_step or predict together, in the same order"
        )
    return [row[1:] for row in everyone], error


def check_batch(
    group: Communicator, dp_group: Communicator | None, m: int, inputs: Any, targets: Any, loss_fn: Any
) -> tuple[int, int]:
    """``train_step``'s agreement: (this replica's batch size, the global batch over the dp group).

    Two small exchanges (pp group, then dp group) for ``m`` microbatches; the same error on every rank
    of both groups (``PipelineParallel.train_step`` lists them).
    """
    s, p = group.rank, group.size
    n_in = -1 if inputs is None else len(inputs)
    n_tg = -1 if targets is None else len(targets)
    missing = (s == 0 and inputs is None) or (s == p - 1 and targets is None)
    flags = (_MISSING if missing else 0) | (0 if callable(loss_fn) else _NOT_CALLABLE)
    rows, mismatch = gather_step(group, "train_step", [n_in, n_tg, flags])
    error: Exception | None = mismatch  # the ranks called different operations
    # rows, per rank: [len(inputs), len(targets), flags]. Plain Python on a few ints: NumPy's calls on
    # a 2 x 3 array cost ~6x more.
    sizes = sorted({n for row in rows for n in row[:2] if n >= 0})
    not_callable = [r for r, row in enumerate(rows) if row[2] & _NOT_CALLABLE]
    missing_data = [r for r, row in enumerate(rows) if row[2] & _MISSING]
    if error is not None:
        pass
    elif not_callable:
        error = TypeError(
            f"train_step: loss_fn must be callable (loss_fn(output, targets) -> scalar Tensor), "
            f"but ranks {not_callable} passed something else; pass e.g. nn.functional.cross_entropy"
        )
    elif missing_data:
        error = ValueError(
            f"train_step: ranks {missing_data} passed None where the first stage needs inputs / "
            "the last stage needs targets; pass the batch on those ranks"
        )
    elif len(sizes) != 1:
        error = ValueError(
            f"train_step: inputs and targets must have the same batch size on every rank of "
            f"the pipeline group, got (inputs, targets) per rank {[row[:2] for row in rows]} "
            "(-1: None)"
        )
    elif sizes[0] % m != 0 or sizes[0] == 0:
        error = ValueError(
            f"train_step: batch size {sizes[0]} is not divisible by microbatches={m}; use a "
            f"batch size that is a positive multiple of {m}, or another microbatch count"
        )
    batch = sizes[0] if error is None else 0
    if dp_group is None or dp_group.size == 1:
        if error is not None:
            raise error
        return batch, batch
    # A replica whose pipeline group raises must not leave the other replicas waiting in the
    # gradient all-reduce: share the verdicts (and the batch sizes, needed for the weights).
    shares = gather_ints(dp_group, [int(error is not None), batch])  # per replica: [failed, B]
    if any(failed for failed, _ in shares):
        dist.raise_if_any(error, dp_group, label="data-parallel group")
    return batch, sum(b for _, b in shares)
