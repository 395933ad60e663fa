"""A run's record: its metrics as JSON lines, to compare runs and plot them (``minidist plot``).

``--metrics FILE`` in the examples writes, from rank 0, one JSON object per line:

* first a header record, ``{"kind": "header", "script", "label", "world_size", "layout", "modes",
  "flags", "started"}``: what ran (the layout as a dict, e.g. ``{"dp": 2, "tp": 2}``, the modes of
  ``minidist_tools.header``, every flag);
* then step records, ``{"kind": "step", "step", "wall_time", ...}`` with what the script measured at
  that step: ``loss``, ``train_loss`` and ``val_loss`` (an evaluation), ``accuracy``, ``lr``,
  ``tokens_per_s`` or ``samples_per_s``, ``mfu``, ``max_rss_mib`` (rank 0's peak resident memory, where
  the system tells it). A key that was not measured is left out, never written as null. ``wall_time`` is
  seconds since the header.

The file is appended to: a resumed run adds a new header and continues the steps, so one file holds the
whole history (``read_run`` keeps the records in order). Off by default: a record nobody asked for would
pile up files.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

# What the examples record (a step record holds those measured at its step, after kind, step, wall_time).
STEP_KEYS = (
    "loss",
    "train_loss",
    "val_loss",
    "accuracy",
    "lr",
    "tokens_per_s",
    "samples_per_s",
    "mfu",
    "max_rss_mib",
)
HEADER_KEYS = ("kind", "script", "label", "world_size", "layout", "modes", "flags", "started")


class MetricsLog:
    """Writes a run's records to ``path`` (None: writes nothing). Rank 0 makes one; others pass None."""

    def __init__(self, path: str | os.PathLike | None) -> None:
        self.path = Path(path) if path else None
        self._start = time.time()
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)

    def header(
        self, script: str, args: argparse.Namespace, world_size: int, layout: dict[str, int],
        modes: list[str], label: str | None = None,
    ) -> None:  # fmt: skip
        """The header record; ``label`` names the run in plots (default: the modes, or the layout)."""
        self._start = time.time()
        flags = {name: _jsonable(value) for name, value in sorted(vars(args).items())}
        default = ", ".join(modes) if modes else " x ".join(f"{k} {v}" for k, v in layout.items())
        self._write({
            "kind": "header", "script": script, "label": label or default, "world_size": world_size,
            "layout": layout, "modes": modes, "flags": flags, "started": round(self._start, 3),
        })  # fmt: skip

    def step(self, step: int, **measured: float | None) -> None:
        """A step record: ``step``, the wall time, and every measured value that is not None."""
        record = {"kind": "step", "step": int(step), "wall_time": round(time.time() - self._start, 3)}
        record.update({key: float(value) for key, value in measured.items() if value is not None})
        self._write(record)

    def _write(self, record: dict[str, Any]) -> None:
        if self.path is None:
            return
        with open(
            self.path, "a", encoding="utf-8"
        ) as file:  # one line at a time: a killed run keeps its past
            file.write(json.dumps(record) + "\n")


def max_rss_mib() -> float | None:
    """This process's peak resident memory in MiB, or None where the system does not tell it."""
    try:
        import resource
    except ImportError:  # (Windows)
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 1024**2 if sys.platform == "darwin" else peak / 1024  # bytes on macOS, KiB on Linux


def read_run(path: str | os.PathLike) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """``(header, steps)`` of a record file: its first header and all its step records in order. A resumed
    run's later header is skipped, and its steps' ``wall_time`` continues from the last step before it
    (the time between the runs is not counted). ``ValueError`` naming the line if one is not an object."""
    header, steps, offset = None, [], 0.0
    with open(path, encoding="utf-8") as file:
        for number, line in enumerate(file, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{path}, line {number}: not a JSON line ({error.msg})") from None
            if not isinstance(record, dict):
                raise ValueError(f"{path}, line {number}: a record is a JSON object, got {line.strip()[:40]}")
            if record.get("kind") == "header":
                header = header or record
                offset = steps[-1].get("wall_time", 0.0) if steps else 0.0
            elif record.get("kind") == "step":
                steps.append({**record, "wall_time": record.get("wall_time", 0.0) + offset})
    if header is None:
        raise ValueError(f"{path}: no header record (is it a --metrics file of the examples?)")
    return header, steps


def _jsonable(value: Any) -> Any:
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return str(value)
