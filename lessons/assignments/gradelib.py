"""Helpers for assignment tests and their MPI workers: launch ranks, explain failures, check gradients.

Tests import it as ``gradelib`` (``conftest.py`` puts this folder on ``sys.path``); MPI workers insert
the folder themselves. It imports minidist only inside functions, so the minidist under test is the one
``PYTHONPATH`` finds (the grader puts the submission first).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

_FIRST_ERROR = re.compile(r"^((?:[\w]+\.)*\w*(?:Error|Exception)\b.*)$")


def rank_timeout(default: float = 20.0) -> float:
    """Seconds MPI ranks may run: ``default``, or less when the grader's per-test limit is shorter."""
    limit = os.environ.get("MINIDIST_GRADE_TIMEOUT")
    return default if not limit else max(3.0, min(default, 0.75 * float(limit)))


def _mpiexec_path() -> str:
    from minidist_tools.mpiexec import mpiexec_path  # noqa: PLC0415  (the submission's minidist, see above)

    return mpiexec_path()


_PREFIX = re.compile(r"^\[rank (\d+)\] ?")
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>\S+)')
_SYNTAX_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+)$')  # a SyntaxError's place
_CHAINED = ("The above exception was the direct cause", "During handling of the above exception")


def explain_crash(stderr: str) -> str:
    """``"SomeError: message (in f at minidist/x.py:12 -> g at minidist/y.py:40)"`` from ranks' output.

    Takes the traceback of the first rank that printed one (minidist prefixes rank output with
    ``[rank r]``; a crash while importing the student's code comes before that, unprefixed), and of a
    chain of exceptions the last one (the one that ended the program), with the outermost and innermost
    of its frames inside a minidist package (where the test called into it, and where it raised), or
    for a ``SyntaxError`` the line of minidist's file it points at. ``""`` if there is no Python
    exception.
    """
    found, first_rank, lines = False, None, []
    for raw in stderr.splitlines():
        match = _PREFIX.match(raw)
        rank = match.group(1) if match else None
        if not found and "Traceback" in raw:
            found, first_rank = True, rank
        if found and rank == first_rank:
            lines.append(_PREFIX.sub("", raw))
    segment: list[str] = []
    for line in lines:
        if line.startswith(_CHAINED):
            segment = []
        else:
            segment.append(line)
    error = next((m.group(1) for m in map(_FIRST_ERROR.match, segment) if m), "")
    if not error:
        return ""
    # Frames inside the minidist package under test, found by its folder rather than by the text
    # "/minidist/": a checkout that is itself called minidist/ would otherwise count the grader's own
    # workers (minidist/lessons/assignments/...) as student code.
    package = Path(importlib.util.find_spec("minidist").origin).resolve().parent
    frames = []
    for line in segment:
        match = _FRAME.match(line)
        if match and Path(match["file"]).resolve().is_relative_to(package):
            short = Path("minidist") / Path(match["file"]).resolve().relative_to(package)
            frames.append(f"{match['func']} at {short.as_posix()}:{match['line']}")
    if len(frames) > 2:
        frames = [frames[0], "...", frames[-1]]
    place = next(
        (
            m
            for m in map(_SYNTAX_FRAME.match, reversed(segment))
            if m and Path(m["file"]).resolve().is_relative_to(package)
        ),
        None,
    )
    if place:  # a SyntaxError (IndentationError, ...): the file does not compile; no function ran
        short = (Path("minidist") / Path(place["file"]).resolve().relative_to(package)).as_posix()
        return f"{error} (at {short}:{place['line']}: the file does not compile)"
    return error + (f" (in {' -> '.join(frames)})" if frames else "")


def explain_watchdog(stderr: str) -> str:
    """What minidist's liveness watchdog said when it ended the job, or ``""``.

    The watchdog (``minidist/distributed/safety/liveness.py``) ends a job whose ranks' messages can never pair
    up (a rank waiting for a neighbour that sends elsewhere, a rank that left) with ``MPI_Abort`` and a
    message, not a traceback. Without it such a run would hang, so the explanation says so.
    """
    first_rank, lines = None, []
    for raw in stderr.splitlines():
        match = _PREFIX.match(raw)
        if not match:
            continue
        if first_rank is None:
            first_rank = match.group(1)
        if match.group(1) != first_rank:
            continue
        line = _PREFIX.sub("", raw)
        if line.startswith("aborting all"):
            text = " ".join(lines).strip()
            return f"the ranks' messages could never pair up (without minidist's watchdog: a hang): {text}"
        lines.append(line)
    return ""


def run_ranks(n: int, worker: Path, config: dict, timeout: float | None = None) -> list[dict]:
    """Run ``mpiexec -n n python worker OUT_DIR`` with ``config`` in ``OUT_DIR/config.json``.

    Returns every rank's ``rank<r>.json`` (written by :func:`worker_main`). Raises ``AssertionError``
    in plain words when the ranks hang past ``timeout`` (default :func:`rank_timeout`), when a rank
    crashes (naming the first exception), or when the ranks imported another minidist than the grader's.
    """
    timeout = rank_timeout() if timeout is None else timeout
    with tempfile.TemporaryDirectory(prefix="minidist-ranks-") as tmp:
        (Path(tmp) / "config.json").write_text(json.dumps(config))
        env = {
            **os.environ,
            "OMP_NUM_THREADS": "1",
            "OPENBLAS_NUM_THREADS": "1",
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        cmd = [_mpiexec_path(), "-n", str(n), sys.executable, str(worker), tmp]
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True
        )
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise AssertionError(
                f"the {n} ranks did not finish within {timeout:.0f} s: a hang. Typical causes: a rank waits "
                "for a message nobody sends (wrong neighbour or step count), or ranks call collectives in "
                "different orders"
            ) from None
        if proc.returncode != 0:
            error = explain_crash(err) or explain_crash(out) or explain_watchdog(err) or err.strip()[-300:]
            raise AssertionError(f"a rank crashed (world size {n}): {error}")
        results = [json.loads((Path(tmp) / f"rank{r}.json").read_text()) for r in range(n)]
    expected = os.environ.get("MINIDIST_GRADE_PATH")
    for r in results:
        if expected and not Path(r["minidist"]).resolve().is_relative_to(Path(expected).resolve()):
            raise RuntimeError(f"rank {r['rank']} imported minidist from {r['minidist']}, not {expected}")
    return results


def run_body(world: Any, body: Callable[[Any, dict], list[str]], config: dict, rule: Any = None) -> list[str]:
    """``body(world, config)``'s failures, under ``rule``'s watch unless None: each forbidden call the
    student's code made comes first, explained."""
    if rule is None:
        return body(world, config)
    import rules  # here, not at the top: it imports mpi4py, which the pytest process must not

    with rules.watch(rule, [world]) as seen:
        failures = body(world, config)
    return seen.messages() + failures


def worker_main(body: Callable[[Any, dict], list[str]], rule: Any = None) -> None:
    """The main of an MPI worker: ``body(world, config)`` returns failure messages (empty: all good).

    Each rank writes ``rank<r>.json`` with its failures, into the folder given as ``sys.argv[1]``.
    ``rule`` (a ``rules.Rule``): the assignment's "Not allowed" rule, enforced while ``body`` runs;
    each forbidden call the student's code makes comes first among the failures, explained.
    """
    import minidist
    import minidist.distributed as dist

    out = Path(sys.argv[1])
    config = json.loads((out / "config.json").read_text())
    world = dist.init()
    failures = run_body(world, body, config, rule)
    result = {"rank": world.rank, "failures": failures, "minidist": minidist.__file__}
    (out / f"rank{world.rank}.json").write_text(json.dumps(result))


def assert_no_failures(results: list[dict]) -> None:
    """Fail with the first rank's first failure message (and how many different ones there were)."""
    failures = list(dict.fromkeys(f for r in results for f in r["failures"]))  # once, not once per rank
    if failures:
        more = f" (and {len(failures) - 1} more failures)" if len(failures) > 1 else ""
        raise AssertionError(failures[0] + more)


def show(a: Any, limit: int = 8) -> str:
    """A short rendering of an array for failure messages."""
    flat = np.asarray(a).reshape(-1)
    body = np.array2string(flat[:limit], precision=4, separator=", ")
    return body[:-1] + ", ...]" if flat.size > limit else body


def numerical_gradient(f: Callable[[], float], x: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """Central differences of the scalar ``f()`` with respect to ``x`` (float64, changed in place)."""
    grad = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        old = x[i]
        x[i] = old + eps
        up = f()
        x[i] = old - eps
        down = f()
        x[i] = old
        grad[i] = (up - down) / (2 * eps)
    return grad


def assert_close(got: Any, want: np.ndarray, what: str, rtol: float = 1e-5, atol: float = 1e-7) -> None:
    """``got`` has ``want``'s shape and values (allclose), else a message naming ``what`` and the values."""
    if got is None:
        raise AssertionError(f"{what}: got None instead of an array of shape {want.shape}")
    got = np.asarray(got)
    if got.shape != want.shape:
        raise AssertionError(f"{what}: got shape {got.shape}, expected {want.shape}")
    if not np.allclose(got, want, rtol=rtol, atol=atol):
        raise AssertionError(f"{what}: got {show(got)}, expected {show(want)}")


def expected_unbroadcast(grad: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Brute force: every element of the input receives the sum of the gradients of all its copies."""
    index = np.arange(int(np.prod(shape, dtype=int))).reshape(shape)
    copies = np.broadcast_to(index, grad.shape)
    return np.bincount(copies.reshape(-1), weights=grad.reshape(-1), minlength=index.size).reshape(shape)


def check_op(op_class, inputs, what: str, seed: int = 0, **options) -> None:
    """Compare ``op_class().backward(g)`` with the numerical gradient of ``sum(g * forward(inputs))``."""
    rng = np.random.default_rng(seed)
    fn = op_class()
    out = fn.forward(*inputs, **options)
    g = rng.standard_normal(np.shape(out))
    grads = fn.backward(g)
    if not isinstance(grads, tuple) or len(grads) != len(inputs):
        raise AssertionError(
            f"{what}: backward must return a tuple with one gradient per input, got {grads!r}"
        )
    for i, x in enumerate(inputs):
        if not isinstance(x, np.ndarray) or x.dtype.kind != "f":
            continue  # integer targets etc. get no gradient

        def f():
            return float(np.sum(g * op_class().forward(*inputs, **options)))

        assert_close(grads[i], numerical_gradient(f, x), f"{what}: gradient of input {i} (shape {x.shape})")


def _record_part(name: str, passed: bool, message: str) -> None:
    """Tell the grader (one JSON line in ``MINIDIST_GRADE_REPORT``) how part ``name`` of the running test
    went; without a grader (a plain pytest run) nothing is written."""
    path = os.environ.get("MINIDIST_GRADE_REPORT")
    nodeid = os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0]
    if path and nodeid:
        event = {"event": "part", "nodeid": nodeid, "part": name, "passed": passed, "message": message}
        with open(path, "a") as f:
            f.write(json.dumps(event) + "\n")


class _Parts:
    def __init__(self) -> None:
        self.failures: dict[str, str] = {}  # part -> its first failure message

    @contextmanager
    def part(self, name: str) -> Iterator[None]:
        try:
            yield
        except AssertionError as wrong:
            self.failures.setdefault(name, str(wrong))
            _record_part(name, False, str(wrong))
        else:
            _record_part(name, True, "")


@contextmanager
def parts() -> Iterator[Callable[[str], Any]]:
    """Grade a test by property: ``with parts() as part:`` then ``with part("dx"): ...`` per property.

    A failing ``assert`` inside ``part(NAME)`` is recorded for that part (the grader scores each part
    of the task file's ``[[test.part]]`` on its own) and the test goes on to the next part; at the end
    the test fails, naming every failed part, if any did. Anything but an ``AssertionError`` (a crash)
    ends the test at once, and the parts not reached score nothing.
    """
    book = _Parts()
    yield book.part
    if book.failures:
        first, *more = book.failures.items()
        others = f" (also wrong: {', '.join(n for n, _ in more)})" if more else ""
        raise AssertionError(f"{first[0]}: {first[1]}{others}")
