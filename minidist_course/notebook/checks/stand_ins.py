"""Stand-ins: working versions of an exercise's function, for the cells after the exercise to use while
it is not done yet.

A figure after an exercise calls ``checks.yours_or_minidists(fn)``: the student's own function when it
passes its check (so the figure is theirs), else minidist's, and it prints which. The notebook then
holds no reference function one cell below the exercise; ``checks.stand_in(NAME)`` is for cells that
need a working function whatever the student wrote (a figure that must not bend with a slip).

A lesson runs top to bottom before its exercises are written, so a cell that needs an exercise's
function falls back on ``checks.stand_in(NAME)``. The stand-ins live here, in the installed package,
rather than in the notebook: a notebook that defined one two cells below the exercise would show the
answer to anyone scrolling on (``tests/course/test_lessons.py`` checks that no notebook cell defines a
function that passes an exercise's check).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from minidist_course.notebook.checks.harness import CHECKS
from minidist_tools.perfmodel import failures as perfmodel_failures
from minidist_tools.perfmodel import network as perfmodel_network


def _numerical_grad(f: Callable[[np.ndarray], float], x: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    # Central differences, one coordinate at a time; x is restored after each, as the exercise asks.
    grad = np.zeros_like(x, dtype=float)
    for i in range(x.size):
        kept = x[i]
        x[i] = kept + eps
        above = f(x)
        x[i] = kept - eps
        below = f(x)
        x[i] = kept
        grad[i] = (above - below) / (2 * eps)
    return grad


def _numeric_tanh_backward(out: float, out_grad: float) -> float:
    # The slope of tanh measured, not derived: lesson 01 uses it until the student writes the formula.
    x = math.atanh(out)
    slope = _numerical_grad(lambda v: math.tanh(v[0]), np.array([x]))[0]
    return slope * out_grad


_STAND_INS: dict[str, Callable[..., Any]] = {
    "numerical_grad": _numerical_grad,  # lesson 01, section 4
    "tanh_backward": _numeric_tanh_backward,  # lesson 01, section 3
    "inter_node_bytes": perfmodel_network.inter_node_bytes,  # lesson 12, section 5
    "powersgd_values": perfmodel_network.powersgd_values,  # lesson 12, section 6
    "system_mtbf": perfmodel_failures.system_mtbf,  # lesson 13, section 3
    "young_interval": perfmodel_failures.young_interval,  # lesson 13, section 3
}


def stand_in(name: str) -> Callable[..., Any]:
    """A working stand-in for exercise function ``name``, with the same signature as the exercise's.

    ``"numerical_grad"``: ``(f, x, eps=1e-6) -> ndarray`` of ``x``'s shape (central differences; ``x``
    is left as it was). ``"tanh_backward"``: ``(out, out_grad) -> float``, the slope of tanh measured
    numerically (accurate to about 1e-10), times ``out_grad``. ``"inter_node_bytes"``: ``(nbytes, nodes,
    ranks_per_node, algorithm) -> float`` bytes one node sends to the others in one all-reduce.
    ``"powersgd_values"``: ``(shapes, rank, min_compression_rate) -> int`` values PowerSGD all-reduces
    per step. ``"system_mtbf"``: ``(node_mtbf, nodes) -> float`` seconds between the job's failures.
    ``"young_interval"``: ``(save_cost, mtbf) -> float`` seconds of work between two checkpoints.

    Raises ``ValueError`` for a name that has no stand-in, listing those that do.
    """
    if name not in _STAND_INS:
        raise ValueError(
            f"no stand-in called {name!r}; there are stand-ins for: {', '.join(sorted(_STAND_INS))}"
        )
    return _STAND_INS[name]


def yours_or_minidists(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` (an exercise's function, found by its name) if it passes its exercise's check, else
    minidist's stand-in for it; prints which one the cells below use. The check runs quietly: a failing
    answer here counts as no miss and prints no hint (the check cell above gives those)."""
    name = getattr(fn, "__name__", "")
    check = CHECKS.get(name)  # the checks register themselves when the lesson modules are imported
    if name not in _STAND_INS or not hasattr(check, "passes"):
        raise ValueError(f"no exercise function {name!r} with a stand-in; those are: {', '.join(_STAND_INS)}")
    if check.passes(fn):
        print(f"the cells below use your {name} (it passes its check)")
        return fn
    print(f"the cells below use minidist's {name}: yours does not pass its check yet")
    reference = _STAND_INS[name]

    def minidists(*args: Any) -> Any:  # a plain wrapper: the library's docstring stays in the library
        return reference(*args)

    minidists.__name__ = minidists.__qualname__ = f"minidists_{name}"
    return minidists
