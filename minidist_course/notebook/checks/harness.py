"""The machinery every exercise check shares: the two markers, the escalating hints, the comparisons.

A check is a function decorated with :func:`exercise`. Called from a notebook's check cell it

* prints ``NOT DONE YET`` when the answer is still the placeholder (``None``, ``...``, or a function
  that raises ``NotImplementedError``), so a new user can run a notebook top to bottom first;
* prints ``CORRECT`` and what was checked (the first line of the check's docstring) when it passes;
* raises ``AssertionError`` when it fails: the message names the inputs, what the student returned and
  what was expected, then adds a hint. The first miss of an exercise gets hint 1, a *question* that
  points at the idea; every later miss gets hint 2, a *nudge* that names the ingredients. No hint states
  the formula: deriving it is the exercise (``tests/course/test_lessons.py`` checks that).

Misses are counted per check in this process (one kernel = one student); :func:`reset_hints` starts
the count over.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

_misses: dict[str, int] = {}  # wrong attempts per check, in this kernel


class NotDone(Exception):
    """Raised inside a check when the answer turns out to be the placeholder: prints NOT DONE YET."""


def reset_hints() -> None:
    """Forget the wrong attempts, so that the next miss of every exercise gets the first hint again."""
    _misses.clear()


def exercise(question: str, nudge: str) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Decorate a check: placeholders print NOT DONE YET, a pass prints CORRECT, a wrong answer raises
    ``AssertionError`` with hint 1 (``question``) on its first miss and hint 2 (``nudge``) after.

    The check itself raises ``AssertionError`` (a wrong answer) or :class:`NotDone`; its docstring's
    first line says what it checks, and is printed after CORRECT. The hints are kept on the wrapper as
    ``.hints = (question, nudge)`` for the tests.
    """

    def wrap(check: Callable[..., None]) -> Callable[..., None]:
        @functools.wraps(check)
        def run(*answers: Any) -> None:
            if any(a is None or a is Ellipsis for a in answers):
                print(f"NOT DONE YET: fill in the cell above, then re-run this one ({check.__name__}).")
                return
            try:
                check(*answers)
            except NotDone:
                print(f"NOT DONE YET: the answer is still the placeholder ({check.__name__}).")
                return
            except AssertionError as wrong:
                misses = _misses[check.__name__] = _misses.get(check.__name__, 0) + 1
                hint = f"Hint 1 of 2 (a question): {question}" if misses == 1 else f"Hint 2 of 2: {nudge}"
                raise AssertionError(f"{wrong}\n{hint}") from None  # the check's own traceback is noise
            print(f"CORRECT: {(check.__doc__ or '').strip().splitlines()[0]}")

        run.hints = (question, nudge)  # type: ignore[attr-defined]
        return run

    return wrap


def call(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``, with the placeholder's ``NotImplementedError`` turned into :class:`NotDone`."""
    try:
        return fn(*args)
    except NotImplementedError:
        raise NotDone() from None


def close(got: Any, want: Any, context: str, rtol: float = 1e-9, atol: float = 1e-12) -> None:
    """Assert that ``got`` has ``want``'s shape and is allclose to it; the message starts with ``context``
    (the call that produced ``got``)."""
    got_arr = np.asarray(got, dtype=float)
    want_arr = np.asarray(want, dtype=float)
    assert got_arr.shape == want_arr.shape, f"{context}: shape {got_arr.shape}, expected {want_arr.shape}."
    assert np.allclose(got_arr, want_arr, rtol=rtol, atol=atol), f"{context}: got {got}, expected {want}."
