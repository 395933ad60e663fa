"""One attempt: ``mpiexec ... COMMAND`` as a child, its output passed through and watched for silence.

The launcher reads the job's stdout and stderr through pipes (one thread each) and writes every chunk
on to its own stdout and stderr at once, unchanged (a progress bar's ``\\r`` updates too). Reading them
itself gives it two things: the time of the last output, a heartbeat that needs no change to the
script (``--stall-timeout``: a job silent for that long has stopped making progress), and the last
lines printed, kept for the ``failure`` event (ranks.py names the rank that died).
"""

from __future__ import annotations

import collections
import os
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from typing import BinaryIO

TAIL_BYTES = 4096  # output kept for the failure event


class Job:
    """A running ``argv`` (normally an mpiexec command line) in a session of its own."""

    def __init__(self, argv: list[str], env: Mapping[str, str], cwd: str | None = None) -> None:
        self.argv = argv
        self.started = time.monotonic()
        self.last_output = self.started
        self._tail: collections.deque[bytes] = collections.deque()
        self._tail_bytes = 0
        self._lock = threading.Lock()
        # A session of its own: Ctrl-C in the launcher's terminal reaches the launcher only, which then
        # ends the job in order (processes.kill_job) instead of every process dying half-way at once.
        self.proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=dict(env),
            cwd=cwd,
            start_new_session=True,
        )
        self._pumps = [
            threading.Thread(target=self._pump, args=(pipe, out), daemon=True, name="minidist-launch-pipe")
            for pipe, out in (
                (self.proc.stdout, _binary(sys.stdout)),
                (self.proc.stderr, _binary(sys.stderr)),
            )
        ]
        for pump in self._pumps:
            pump.start()

    def _pump(self, pipe: BinaryIO, out: BinaryIO) -> None:
        fd = pipe.fileno()
        while chunk := os.read(fd, 65536):  # whatever is there: no waiting for a full line
            self.last_output = time.monotonic()
            out.write(chunk)
            out.flush()
            with self._lock:
                self._tail.append(chunk)
                self._tail_bytes += len(chunk)
                while self._tail_bytes - len(self._tail[0]) >= TAIL_BYTES:
                    self._tail_bytes -= len(self._tail.popleft())
        pipe.close()

    def wait(self, timeout: float) -> int | None:
        """The exit code if the job ended within ``timeout`` seconds, else None."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def elapsed(self) -> float:
        """Seconds since the job started."""
        return time.monotonic() - self.started

    def silent_for(self) -> float:
        """Seconds since the job last printed anything (or since it started)."""
        return time.monotonic() - self.last_output

    def finish_output(self, timeout: float = 5.0) -> None:
        """Wait for the pipes to drain (after the job ended): the last lines reach the terminal first."""
        for pump in self._pumps:
            pump.join(timeout)

    def output_tail(self, lines: int = 20) -> str:
        """The last ``lines`` lines the job printed (stdout and stderr, as they came)."""
        with self._lock:
            text = b"".join(self._tail).decode(errors="replace")
        return "\n".join(text.replace("\r", "\n").splitlines()[-lines:])


def _binary(stream: object) -> BinaryIO:
    """The byte stream under a text stream (sys.stdout.buffer), or an adapter for one without (pytest)."""
    buffer = getattr(stream, "buffer", None)
    return buffer if buffer is not None else _TextAdapter(stream)


class _TextAdapter:
    def __init__(self, stream: object) -> None:
        self.stream = stream

    def write(self, data: bytes) -> None:
        self.stream.write(data.decode(errors="replace"))  # type: ignore[attr-defined]

    def flush(self) -> None:
        self.stream.flush()  # type: ignore[attr-defined]
