"""The machinery every exercise check shares: the two markers, the escalating feedback, the comparisons.

A check is a function decorated with :func:`exercise`. Called from a notebook's check cell it

* prints ``NOT DONE YET`` when the answer is still the placeholder (``None``, ``...``, or a function
  that raises ``NotImplementedError``), so a new user can run a notebook top to bottom first;
* prints ``CORRECT`` and what was checked (the first line of the check's docstring) when it passes;
* raises ``AssertionError`` when it fails. The feedback teaches without telling: every miss names the
  input that failed, what the student returned and which *property* of the right answer it breaks ("it
  grows with the number of nodes; the time between failures should shrink as nodes are added", "it is
  larger than it should be"), never the expected value. The first miss of an exercise adds hint 1, a
  *question* that points at the idea; later misses add hint 2, a *nudge* that names the ingredients;
  from the third miss on the message also gives the expected value for that one input, so that a
  student who is stuck can work backwards from a number. No hint states the formula: deriving it is the
  exercise (``tests/course/test_lessons.py`` checks that).

Misses are counted per check in this process (one kernel = one student); :func:`reset_hints` starts
the count over.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

_misses: dict[str, int] = {}  # wrong attempts per check, in this kernel
CHECKS: dict[str, Callable[..., None]] = {}  # every decorated check, by its name
REVEAL_AFTER = 3  # the miss from which the expected value of the failing input is shown


class NotDone(Exception):
    """Raised inside a check when the answer turns out to be the placeholder: prints NOT DONE YET."""


class Wrong(AssertionError):
    """A wrong answer: ``context`` (the call that failed), ``got`` (what it returned), ``broken`` (the
    property of the right answer it breaks, in words) and, if known, ``want`` (the expected value, which
    the message shows only after repeated misses)."""

    def __init__(self, context: str, got: Any, broken: str, want: Any = None) -> None:
        super().__init__(f"{context}: you returned {got!r}; {broken}.")
        self.context, self.got, self.broken, self.want = context, got, broken, want

    def message(self, misses: int) -> str:
        text = str(self.args[0])
        if self.want is not None and misses >= REVEAL_AFTER:
            text += f"\nAfter {misses} tries, the value expected there: {self.want!r}."
        return text


def reset_hints() -> None:
    """Forget the wrong attempts, so that the next miss of every exercise gets the first hint again."""
    _misses.clear()


def exercise(question: str, nudge: str) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Decorate a check: placeholders print NOT DONE YET, a pass prints CORRECT, a wrong answer raises
    ``AssertionError`` with what is wrong and hint 1 (``question``) on its first miss, hint 2
    (``nudge``) after.

    The check itself raises :class:`Wrong` (or a plain ``AssertionError``, shown as it is) or
    :class:`NotDone`; its docstring's first line says what it checks, and is printed after CORRECT. The
    hints are kept on the wrapper as ``.hints = (question, nudge)`` for the tests, and the undecorated
    check as ``.passes(*answers) -> bool`` (quiet, and not counted as a miss) for
    :func:`~minidist_course.notebook.checks.stand_ins.yours_or_minidists`.
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
                text = wrong.message(misses) if isinstance(wrong, Wrong) else str(wrong)
                raise AssertionError(f"{text}\n{hint}") from None  # the check's own traceback is noise
            print(f"CORRECT: {(check.__doc__ or '').strip().splitlines()[0]}")

        def passes(*answers: Any) -> bool:
            try:
                check(*answers)
            except Exception:  # the placeholder, a wrong answer, or an answer that crashes
                return False
            return True

        run.hints = (question, nudge)  # type: ignore[attr-defined]
        run.passes = passes  # type: ignore[attr-defined]
        CHECKS[check.__name__] = run
        return run

    return wrap


def call(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``, with the placeholder's ``NotImplementedError`` turned into :class:`NotDone`."""
    try:
        return fn(*args)
    except NotImplementedError:
        raise NotDone() from None


def holds(condition: bool, context: str, got: Any, broken: str, want: Any = None) -> None:
    """Raise :class:`Wrong` unless ``condition``: a property of the right answer (it shrinks as nodes
    are added, it is 0 on one node) that the answer ``got`` to ``context`` must have. Checks test such
    properties before the values, so that the first message says what is wrong, not what is right;
    ``want``, if given, is shown only after repeated misses."""
    if not condition:
        raise Wrong(context, got, broken, want)


def _how_it_differs(got: np.ndarray, want: np.ndarray) -> str:
    """What a wrong value breaks, in words that do not give the right value away."""
    if got.size == 1 and want.size == 1:
        g, w = float(got.ravel()[0]), float(want.ravel()[0])
        if not np.isfinite(g):
            return "the right value is a finite number"
        if w != 0 and g != 0 and np.sign(g) != np.sign(w):
            return "it has the wrong sign"
        if w == 0:
            return "the right value is 0 here"
        return "it is larger than the right value" if g > w else "it is smaller than the right value"
    wrong = ~np.isclose(got, want, rtol=1e-9, atol=1e-12)
    where = [tuple(int(i) for i in ix) for ix in np.argwhere(wrong)[:3]]
    return f"{int(wrong.sum())} of its {want.size} values are wrong (the first at index {where})"


def close(got: Any, want: Any, context: str, rtol: float = 1e-9, atol: float = 1e-12) -> None:
    """Assert that ``got`` has ``want``'s shape and is allclose to it; a miss raises :class:`Wrong`
    naming ``context`` (the call that produced ``got``) and how the value differs (larger, smaller,
    which elements), with ``want`` kept for the repeated-miss message."""
    try:
        got_arr = np.asarray(got, dtype=float)
    except (TypeError, ValueError):
        raise Wrong(context, got, "the right answer is a number or an array of numbers", want) from None
    want_arr = np.asarray(want, dtype=float)
    if got_arr.shape != want_arr.shape:
        raise Wrong(context, got, f"it has shape {got_arr.shape}; the right answer's shape differs", want)
    if not np.allclose(got_arr, want_arr, rtol=rtol, atol=atol):
        raise Wrong(context, got, _how_it_differs(got_arr, want_arr), want)


def same(got: Any, want: Any, context: str, broken: str = "that is not the right value") -> None:
    """Assert ``got == want`` (integers, tuples, names); a miss raises :class:`Wrong` saying ``broken``,
    never ``want`` (kept for the repeated-miss message)."""
    if got != want:
        raise Wrong(context, got, broken, want)
