"""Link speed: a token bucket filter (``tc qdisc ... tbf``, tc-tbf(8)) on both ends of every node's link.

A qdisc shapes what an interface *sends*, so one link needs two: on the host side of the veth (traffic
into the node) and on the node's ``eth0`` (traffic out of it). A token bucket lets a packet pass when
enough tokens (bytes) have accumulated at ``rate``; ``burst`` is the bucket size, ``latency`` how long a
packet may wait in the queue before it is dropped (TCP then slows down, as on a congested real link).
"""

from __future__ import annotations

import re

from minidist_tools.cluster import netns
from minidist_tools.cluster.errors import ClusterError

# tc's rate units (tc(8), "RATES"): bits per second, and bytes per second for the "bps" forms.
_UNITS = {
    "bit": 1,
    "kbit": 10**3,
    "mbit": 10**6,
    "gbit": 10**9,
    "tbit": 10**12,
    "bps": 8,
    "kbps": 8 * 10**3,
    "mbps": 8 * 10**6,
    "gbps": 8 * 10**9,
}
_RATE = re.compile(r"(\d+(?:\.\d+)?)\s*([a-z]+)")

# veth hands tc whole GSO segments of up to 64 KiB, and a bucket smaller than one packet never passes it;
# a bucket of 1 ms at the rate keeps 10gbit links from waiting on the timer between small buckets.
_MIN_BURST_BYTES = 256 * 1024
_BURST_SECONDS = 1e-3
_LATENCY = "50ms"


def parse_rate(rate: str | None) -> int | None:
    """Bits per second of a tc rate (``"100mbit"``, ``"1gbit"``, ``"10gbit"``); ``None`` for ``None`` or
    ``"none"`` (unshaped). Raises ``ClusterError`` naming the accepted forms."""
    if rate is None or rate.strip().lower() == "none":
        return None
    match = _RATE.fullmatch(rate.strip().lower())
    if match is None or match.group(2) not in _UNITS or float(match.group(1)) <= 0:
        raise ClusterError(
            f"unknown link rate {rate!r}: give a positive number with a tc unit "
            f"({', '.join(_UNITS)}), e.g. 100mbit, 1gbit, 10gbit, or none for an unshaped link"
        )
    return round(float(match.group(1)) * _UNITS[match.group(2)])


def tbf_args(bits_per_second: int) -> list[str]:
    burst = max(_MIN_BURST_BYTES, round(bits_per_second / 8 * _BURST_SECONDS))
    return ["tbf", "rate", f"{bits_per_second}bit", "burst", str(burst), "latency", _LATENCY]


def shape(node: str, veth: str, bits_per_second: int | None) -> None:
    """Set both directions of ``node``'s link to ``bits_per_second``, or remove the shaping for ``None``."""
    for dev, inside in ((veth, None), ("eth0", node)):
        if bits_per_second is None:
            if "tbf" in netns.command(["tc", "qdisc", "show", "dev", dev], netns=inside):
                netns.command(["tc", "qdisc", "del", "dev", dev, "root"], netns=inside)
        else:
            tbf = tbf_args(bits_per_second)
            netns.command(["tc", "qdisc", "replace", "dev", dev, "root", *tbf], netns=inside)
