"""Check of lesson 14 (models too big for one device): the activation bytes one GPT block keeps for
backward in minidist's engine, counted op by op (compared with ``minidist_tools.perfmodel.memory``, which the
memory tracker's measurements match exactly in ``tests/memory/test_memory.py``)."""

from __future__ import annotations

from collections.abc import Callable

from minidist_course.notebook.checks.harness import call, close, exercise
from minidist_tools.perfmodel.memory import gpt_layer_activation_bytes


@exercise(
    "Which arrays does each op of the block keep until its backward, and how many values is each one: "
    "a multiple of s b h, of s b, of h, or the attention's square of scores per head?",
    "Go down the list of the lesson op by op, write each kept array's size in values, add them up, and "
    "multiply by the bytes of one value; keep the attention's scores as their own term.",
)
def block_activation_bytes(fn: Callable[..., float]) -> None:
    """block_activation_bytes(s, b, h, a, itemsize) is what the tracker measures for one GPT Block."""
    for s, b, h, a, itemsize in [(16, 8, 64, 2, 4), (8, 2, 16, 2, 4), (128, 4, 256, 8, 2), (32, 1, 96, 3, 8)]:
        got = call(fn, s, b, h, a, itemsize)
        want = gpt_layer_activation_bytes(b, s, h, a, itemsize=itemsize)
        close(got, want, f"block_activation_bytes(s={s}, b={b}, h={h}, a={a}, itemsize={itemsize})")
