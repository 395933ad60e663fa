"""Byte sizes as people write them: ``parse_size("64MiB")`` and ``format_bytes(67108864)``.

The budget comes from a flag or an environment variable (``MINIDIST_MEMORY_BUDGET``), so it is read from
text: a plain number of bytes, or a number with a unit. Binary units (KiB, MiB, GiB, TiB: powers of
1024, IEC 80000-13) and decimal ones (kB, MB, GB, TB: powers of 1000) mean what their names say; a bare
``K``, ``M``, ``G`` is read as binary, as ``ulimit`` and PyTorch's allocator settings do.
"""

from __future__ import annotations

import re
from fractions import Fraction

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1024,
    "kib": 1024,
    "kb": 1000,
    "m": 1024**2,
    "mib": 1024**2,
    "mb": 1000**2,
    "g": 1024**3,
    "gib": 1024**3,
    "gb": 1000**3,
    "t": 1024**4,
    "tib": 1024**4,
    "tb": 1000**4,
}
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str | int) -> int:
    """Bytes in ``text``: ``"1048576"``, ``"64MiB"``, ``"1.5 GiB"``, ``"500MB"``, ``"512k"`` (any case).

    Returns an int number of bytes (a fractional result is rounded down). An int is returned as is.

    Raises:
        ValueError: not a non-negative number with an optional known unit (the message lists them).
        TypeError: neither a str nor an int.
    """
    if isinstance(text, bool) or not isinstance(text, (str, int)):
        raise TypeError(f"a memory size must be a str such as '64MiB' or an int of bytes, got {text!r}")
    if isinstance(text, int):
        if text < 0:
            raise ValueError(f"a memory size must be >= 0 bytes, got {text}")
        return text
    match = _SIZE.match(text)
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _UNITS:
        raise ValueError(
            f"cannot read the memory size {text!r}: write a number of bytes with an optional unit, "
            "e.g. '1048576', '64MiB', '1.5GiB', '500MB' (units: B, KiB, MiB, GiB, TiB = powers of 1024; "
            "kB, MB, GB, TB = powers of 1000; K, M, G, T = KiB, MiB, GiB, TiB)"
        )
    # Exact decimal arithmetic: float would read "1.001MB" as 1000999 bytes and overflow to an
    # OverflowError (not this ValueError) on a number of 309 digits or more.
    return int(Fraction(match.group(1)) * _UNITS[unit])


def format_bytes(n: int) -> str:
    """``n`` bytes for people: ``"512 B"``, ``"3.0 KiB"``, ``"41.2 MiB"``, ``"1.50 GiB"`` (powers of 1024)."""
    sign = "-" if n < 0 else ""
    n = abs(n)
    if n < 1024:
        return f"{sign}{n} B"
    for unit, scale in (("KiB", 1024), ("MiB", 1024**2), ("GiB", 1024**3)):
        if n < 1024 * scale or unit == "GiB":
            value = n / scale
            return f"{sign}{value:.2f} {unit}" if unit == "GiB" else f"{sign}{value:.1f} {unit}"
    raise AssertionError("unreachable")
