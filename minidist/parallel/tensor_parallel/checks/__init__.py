"""Argument checks for the tensor-parallel layers, agreed over the tp group before anything can fail.

A tensor-parallel layer is *one* layer spread over the ranks of a group: every rank must build it with
the same sizes and flags. A rank that builds ``RowParallelLinear(8, 4)`` while its peer builds
``RowParallelLinear(12, 4)`` would otherwise compute a different output with no error, and a
``gather_output`` on one rank only would fail much later in a collective with a message about
array lengths. So each layer describes its arguments and compares them across the group at
construction with the distributed layer's one agreement helper (``minidist/distributed/safety/agreement.py``);
an argument that is bad on *any* rank is reported by *every* rank, so no rank is left waiting in the
next collective. The same step makes the ranks' random generators agree (``random.share_generator``),
so that a per-rank seed cannot build a different layer on each rank.

The layers' code never opens with these checks: it meets them through one seam, the decorator
``@agreed_arguments(check)`` of ``minidist/parallel/agreed.py`` on every ``__init__`` and ``from_*``
classmethod. Reading order: ``layers.py`` (each layer's check, and ``@checked_input`` on the linear
layers' ``forward``) -> ``vocab.py`` (the vocabulary embedding's, at construction and on
every forward) -> ``arguments.py`` (the pieces they are made of: a size, a flag, the group, the agreement).
"""

from minidist.parallel.tensor_parallel.checks.arguments import already_agreed
from minidist.parallel.tensor_parallel.checks.layers import attention, block, checked_input, cut, linear, mlp
from minidist.parallel.tensor_parallel.checks.vocab import agreed_ids, embedding, table

__all__ = [
    "checked_input",
    "linear",
    "cut",
    "mlp",
    "attention",
    "block",
    "embedding",
    "table",
    "agreed_ids",
    "already_agreed",
]
