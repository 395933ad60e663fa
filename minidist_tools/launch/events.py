"""The launcher's log: one JSON object per line in a file, and the same events as human lines on stderr.

Every event is ``{"time": <unix seconds>, "event": <kind>, "run_id": ..., "message": <the human line>,
...fields}``. The kinds, in the order a launch produces them:

==========  ========================================================================================
nodes       (on a cluster) nodes left out of the next attempt: ``dead`` = ``{node: problem}``
start       an attempt begins: ``restart`` (0 first), ``n`` ranks, ``nodes`` (on a cluster), ``argv``
ranks       every rank of the attempt runs: ``pids`` = ``{rank: pid}``, ``nodes`` = ``{rank: node}``
            (on a cluster); printed ``rank 0: pid 123, rank 1: pid 124, ...`` (ranks.py)
checkpoint  progress: a new committed checkpoint appeared (``step``, ``path``)
failure     the attempt failed: ``reason`` (exit | stall | node), ``returncode``, ``detail`` (for an
            exit: ``rank 2 (pid 30449) was killed by signal 9``), ``dead_ranks`` (the rank(s) that
            ended first), ``output_tail`` (the last lines the job printed)
kill        every process of the attempt is gone: ``killed`` (how many were signalled),
            ``seconds`` (from the failure's detection until none was left)
verify      the newest checkpoint that verifies (``path``, ``step``; both None: start from scratch)
            and the newer ones ``skipped`` as damaged (``[[path, problem], ...]``)
restart     the next attempt is about to start (``restart`` = its number, ``nodes``)
done        the command succeeded (``returncode`` 0, ``restarts``)
give_up     no restart left, or too few nodes: ``returncode``, ``detail``
interrupted the launcher got Ctrl-C or SIGTERM and ended the job
reaped      written by the reaper (reaper.py): the launcher died without ending the job (SIGKILL, the
            OOM killer) and the reaper killed every process of it: ``killed``, ``seconds``,
            ``launcher_pid`` (``error`` and ``killed`` None if some survived SIGKILL)
==========  ========================================================================================

JSON lines (one ``json.loads`` per line) so that a test, a notebook or ``jq`` can read a log that is
still being written: a line is written whole and flushed before the launcher goes on.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any, TextIO


class EventLog:
    """Append events to ``path`` (JSON lines) and print each one's ``message`` on ``stream``.

    ``events`` keeps every event written by this object, in order (``LaunchResult.events``).
    """

    def __init__(self, path: str | os.PathLike, run_id: str, stream: TextIO | None = None) -> None:
        self.path = Path(path)
        self.run_id = run_id
        self.stream = stream
        self.events: list[dict[str, Any]] = []
        self._lock = threading.Lock()  # the rank watch (ranks.py) writes from a thread of its own
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, event: str, message: str, **fields: Any) -> dict[str, Any]:
        """Record ``event`` with ``fields`` (JSON-serialisable) and print ``message``; returns the record."""
        record = {"time": time.time(), "event": event, "run_id": self.run_id, **fields, "message": message}
        with self._lock:
            with open(self.path, "a", encoding="utf-8") as log:
                log.write(json.dumps(record) + "\n")
            self.events.append(record)
            stream = self.stream if self.stream is not None else sys.stderr
            print(f"[minidist launch] {message}", file=stream, flush=True)
        return record


def read_log(path: str | os.PathLike, run_id: str | None = None) -> list[dict[str, Any]]:
    """The events in the log at ``path`` (only those of ``run_id`` if given); [] if there is no log yet.

    A last line still being written (no newline yet) is left out rather than raising.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    events = [json.loads(line) for line in text.splitlines(keepends=True) if line.endswith("\n")]
    return [e for e in events if run_id is None or e.get("run_id") == run_id]
