"""Progress that suits where it goes: a live bar on a terminal, plain lines in a file or a pipe.

A tqdm bar redraws itself with ``\\r``: on a terminal that is one line that moves, but in a log file (``>
log.txt``, ``minidist launch``'s captured output, ``| tee``) every redraw stays, and a 1000-step run
leaves a thousand frames on one "line". :func:`progress` asks ``stream.isatty()``: a terminal gets the
bar, anything else :class:`PlainProgress`, which prints ``train: step 40/200 (20 %), 3.1 steps/s`` every
``every`` steps and nothing else (no ``\\r``, no escape codes). Both have tqdm's ``update()``,
``write(text)`` and ``close()``, so a script calls them alike::

    bar = progress(total=200, initial=0, enabled=rank == 0, desc="train")
    bar.update(); bar.write("step 50: loss 2.31"); bar.close()
"""

from __future__ import annotations

import sys
import time
from typing import IO, Any

from tqdm import tqdm


class PlainProgress:
    """tqdm's interface as whole lines: one every ``every`` steps and one at the end, nothing between."""

    def __init__(
        self, total: int, initial: int = 0, enabled: bool = True, desc: str = "train",
        every: int | None = None, file: IO[str] | None = None,
    ) -> None:  # fmt: skip
        self.total, self.n, self.enabled, self.desc = total, initial, enabled, desc
        # About ten lines per run by default: enough to see it move, few enough to read.
        self.every = every or max(1, total // 10)
        self.file = file or sys.stdout
        self._since, self._start, self._printed = time.perf_counter(), initial, initial

    def update(self, n: int = 1) -> None:
        self.n += n
        if self.n % self.every == 0 or self.n == self.total:
            self._line()

    def write(self, text: str) -> None:
        if self.enabled:
            print(text, file=self.file, flush=True)

    def close(self) -> None:
        if self.n != self._printed and self.n == self.total:
            self._line()

    def _line(self) -> None:
        if not self.enabled or self.n == self._printed:
            return
        seconds = time.perf_counter() - self._since
        rate = f", {(self.n - self._start) / seconds:.2f} steps/s" if seconds > 0 else ""
        share = f" ({self.n / self.total:.0%})" if self.total else ""
        print(f"{self.desc}: step {self.n}/{self.total}{share}{rate}", file=self.file, flush=True)
        self._since, self._start, self._printed = time.perf_counter(), self.n, self.n


def progress(
    total: int, initial: int = 0, enabled: bool = True, desc: str = "train", every: int | None = None,
    file: IO[str] | None = None,
) -> Any:  # fmt: skip
    """A tqdm bar when ``file`` (stdout by default) is a terminal, else a :class:`PlainProgress`.

    ``enabled=False`` (every rank but 0) prints nothing either way; ``every`` is the plain lines'
    interval in steps (default: a tenth of ``total``)."""
    stream = file or sys.stdout
    if _is_terminal(stream):
        return tqdm(total=total, initial=initial, disable=not enabled, file=stream, desc=desc, unit="step")
    return PlainProgress(total, initial, enabled=enabled, desc=desc, every=every, file=stream)


def _is_terminal(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or stand-in stream: not a terminal
        return False
