"""Reference answers (and wrong answers the checks must reject) for lesson 13. See lessons/README.md."""
# ruff: noqa: E402, F811


# %% [solution waits]
def waits(entries):
    last = max(entries)  # nobody leaves before the slowest rank's data is in
    return [last - t for t in entries]


# %% [wrong waits]
def waits(entries):
    return [t - min(entries) for t in entries]  # measured from the first to enter: the straggler looks idle


# %% [wrong waits]
def waits(entries):
    return [0.0 for _ in entries]  # as if a collective started when each rank called it


# %% [solution mtbf]
def system_mtbf(node_mtbf, nodes):
    rate = nodes / node_mtbf  # failures per second: independent nodes' rates add up
    return 1 / rate


# %% [wrong mtbf]
def system_mtbf(node_mtbf, nodes):
    return node_mtbf  # as if more nodes did not fail more often


# %% [wrong mtbf]
import math


def system_mtbf(node_mtbf, nodes):
    return node_mtbf / math.sqrt(nodes)  # failures do not average out: any one of them stops the job


# %% [solution young]
import math


def young_interval(save_cost, mtbf):
    # waste per second of work: save_cost / tau (saves) + tau / (2 mtbf) (half an interval redone per
    # failure); its derivative -save_cost / tau**2 + 1 / (2 mtbf) is zero at:
    return math.sqrt(2 * save_cost * mtbf)


# %% [wrong young]
import math


def young_interval(save_cost, mtbf):
    return math.sqrt(save_cost * mtbf)  # forgot that a failure costs half an interval on average, not all


# %% [wrong young]
def young_interval(save_cost, mtbf):
    return mtbf  # once per MTBF: saves far too rarely when saves are cheap


# %% [wrong young]
def young_interval(save_cost, mtbf):
    return 2 * save_cost * mtbf  # the square root is missing: the units are seconds squared
