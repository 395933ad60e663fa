"""The header a training script prints first: what is trained, on how many ranks, and every mode that is on.

A run with ``--fsdp`` or ``MINIDIST_DEBUG=1`` that printed the same first line as plain DDP would leave
its log silent about what it measured. :func:`modes` reads the flags (whichever of them a script has)
and the environment settings of the safety net, and names each non-default one; :func:`header_lines`
puts them under the script's own first line. Both examples (``examples/train_mlp.py``,
``examples/train_gpt.py``) call it, so their headers say the same thing in the same words.

    GPT: 812,353 parameters, 65 characters, 4 ranks (dp 4)
    modes: FSDP (5 units over 4 ranks), debug mode (MINIDIST_DEBUG=1)

The same list goes into the header record of a run's metrics (``minidist_tools.metrics``).
"""

from __future__ import annotations

import argparse
import os

# The environment settings of minidist's safety net, by name (the tools read them as a user sets them;
# the framework's own constants live in minidist/distributed/safety/, which the tools leave alone).
DEBUG_ENV = "MINIDIST_DEBUG"
TIMEOUT_ENV = "MINIDIST_TIMEOUT"  # a deadline for every collective (off by default)
WATCHDOG_ENV = "MINIDIST_WATCHDOG"  # the liveness watchdog's deadline
DEFAULT_WATCHDOG_SECONDS = 300.0  # minidist/distributed/safety/liveness.py, DEFAULT_DEADLINE
OFF = ("", "0", "false", "no", "off")


def plural(count: int, noun: str, nouns: str | None = None) -> str:
    """``1 rank``, ``4 ranks``: the count and its noun, in the number the count needs (``nouns``: the
    plural when it is not ``noun + "s"``)."""
    return f"{count:,} {noun}" if count == 1 else f"{count:,} {nouns or noun + 's'}"


def modes(args: argparse.Namespace, world_size: int, fsdp_units: int | None = None) -> list[str]:
    """Every non-default mode of a run, in words (an empty list: plain data parallelism, float32).

    ``args`` is a script's parsed flags; a flag the script does not have counts as off. ``fsdp_units``
    is the number of FSDP units (``len(model.units)``), named when given.
    """
    flag = lambda name, default=None: getattr(args, name, default)  # noqa: E731  (a script may lack one)
    found = []
    layout = [(name, flag(name, 1) or 1) for name in ("tp", "pp", "cp")]
    if any(size > 1 for _, size in layout):
        found.append(" x ".join(f"{name} {size}" for name, size in layout if size > 1))
    if flag("sequence_parallel"):
        found.append("sequence parallel")
    if flag("pp", 1) > 1 and flag("schedule"):
        microbatches = plural(flag("microbatches") or 0, "microbatch", "microbatches")
        found.append(f"pipeline {flag('schedule')} with {microbatches}")
    if flag("fsdp"):
        units = f"{plural(fsdp_units, 'unit')} over " if fsdp_units is not None else "over "
        found.append(f"FSDP ({units}{plural(world_size // _weights_split(args), 'rank')})")
    if flag("zero"):
        found.append(f"ZeRO stage {flag('zero')}")
    hook = flag("comm_hook")
    if hook and hook != "none":
        found.append(f"comm hook {hook}" + (f" (rank {flag('powersgd_rank')})" if hook == "powersgd" else ""))
    if flag("autocast"):
        found.append(f"mixed precision ({flag('autocast')}, float32 master weights)")
    elif flag("dtype") not in (None, "float32"):
        found.append(f"parameters in {flag('dtype')}")
    if flag("recompute"):
        found.append("recompute")
    if (flag("grad_accum") or 1) > 1:
        found.append(f"gradient accumulation {flag('grad_accum')}")
    found += environment_modes()
    return found


def environment_modes(environ: dict[str, str] | None = None) -> list[str]:
    """The safety-net settings that differ from the defaults: debug mode, a collective deadline, the
    watchdog's deadline (a value that is not a number is named as given: the framework reports it)."""
    env = os.environ if environ is None else environ
    found = []
    if env.get(DEBUG_ENV, "").strip().lower() not in OFF:
        found.append(f"debug mode ({DEBUG_ENV}={env[DEBUG_ENV]})")
    timeout = env.get(TIMEOUT_ENV, "").strip()
    if timeout and timeout not in ("0", "0.0"):
        found.append(f"collective deadline {timeout} s ({TIMEOUT_ENV})")
    watchdog = env.get(WATCHDOG_ENV, "").strip()
    if watchdog:
        try:
            seconds = float(watchdog)
        except ValueError:
            seconds = None
        if seconds is None or seconds != DEFAULT_WATCHDOG_SECONDS:
            value = "off" if seconds == 0 else f"{watchdog} s"
            found.append(f"watchdog deadline {value} ({WATCHDOG_ENV})")
    return found


def header_lines(first: str, active: list[str]) -> list[str]:
    """The header: the script's first line, then ``modes: ...`` when any mode is on."""
    return [first] + ([f"modes: {', '.join(active)}"] if active else [])


def _weights_split(args: argparse.Namespace) -> int:
    """tp x pp: the ranks that split one copy of the weights between them (cp ranks hold the same weights,
    so FSDP shards over dp x cp = world / (tp x pp))."""
    size = 1
    for name in ("tp", "pp"):
        size *= getattr(args, name, 1) or 1
    return size
