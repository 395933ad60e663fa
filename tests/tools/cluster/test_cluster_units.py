"""The parts of ``minidist_tools.cluster`` that need no root: rates, names, the subnet choice, the mpiexec
line.

These run everywhere (the tests that make namespaces are tests/tools/cluster/test_cluster_cli.py and
tests/tools/cluster/test_cluster_training.py, skipped without root).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from minidist_tools.cluster import Cluster, ClusterError, launch, shaping, state
from minidist_tools.cluster.cluster import _plan


@pytest.mark.parametrize(
    "rate, bits",
    [("100mbit", 10**8), ("1gbit", 10**9), ("10gbit", 10**10), ("1.5Gbit", 1.5e9), ("2mbps", 16 * 10**6),
     ("512kbit", 512_000), ("none", None), (None, None)],
)  # fmt: skip
def test_rates_are_read_as_tc_reads_them(rate, bits):
    assert shaping.parse_rate(rate) == bits


@pytest.mark.parametrize("rate", ["fast", "100", "100 furlongs", "-1gbit", "0mbit", "1gbitt"])
def test_a_rate_tc_would_not_take_is_an_error_naming_the_units(rate):
    with pytest.raises(ClusterError, match="unknown link rate .* e.g. 100mbit, 1gbit, 10gbit, or none"):
        shaping.parse_rate(rate)


def test_the_token_bucket_holds_a_whole_gso_segment_and_1_ms_at_high_rates():
    burst = {rate: int(shaping.tbf_args(rate)[4]) for rate in (10**8, 10**9, 10**10)}
    assert burst[10**8] == burst[10**9] == 256 * 1024  # > 64 KiB, the largest packet veth hands tc
    assert burst[10**10] == 10**10 // 8 // 1000  # 1 ms at 10 Gbit/s


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(nodes=0), "nodes must be a positive integer, got 0"),
        (dict(nodes=2.0), "nodes must be a positive integer, got 2.0"),
        (dict(ranks_per_node=True), "ranks_per_node must be a positive integer, got True"),
        (dict(nodes=65), "nodes=65 is more than 64"),
        (dict(name="n" * 9), "must be 1-8 lowercase letters or digits"),
        (dict(name="9lives"), "must be 1-8 lowercase letters or digits"),
        (dict(bandwidth="warp"), "unknown link rate 'warp'"),
    ],
)
def test_bad_arguments_are_refused_before_anything_is_made(kwargs, message):
    with pytest.raises(ClusterError, match=message):
        Cluster.up(**kwargs)


def test_the_longest_interface_name_fits_linux():
    record = _plan("abcdefgh", 255, 64, 1, None)
    assert max(len(n) for n in [record["bridge"], *record["veths"]]) <= 15  # IFNAMSIZ - 1
    assert record["addresses"][-1] == "198.18.255.73" and record["bridge_ip"] == "198.18.255.1"


def test_the_first_free_subnet_is_chosen(monkeypatch):
    monkeypatch.setattr(state, "subnets_in_use", lambda: {0, 1, 3})
    assert state.choose_subnet(None) == 2
    assert state.choose_subnet(None, clash=lambda k: k == 2) == 4
    assert state.choose_subnet(7) == 7
    with pytest.raises(ClusterError, match="subnet 198.18.3.0/24 is in use"):
        state.choose_subnet(3)
    monkeypatch.setattr(state, "subnets_in_use", lambda: set(range(256)))
    with pytest.raises(ClusterError, match="every subnet .* is in use"):
        state.choose_subnet(None)


def test_ranks_fill_the_nodes_in_blocks():
    cluster = Cluster(_plan("ca", 10, 3, 2, None))
    command = cluster.mpiexec_command()
    assert command[command.index("-hosts") + 1] == "can0:2,can1:2,can2:2"  # Hydra: 2 slots per host
    assert command[command.index("-localhost") + 1] == "198.18.10.1"  # the proxies call back here
    assert command[command.index("-launcher-exec") + 1] == str(cluster.launcher)
    assert command[-2:] == ["-n", "6"] and cluster.mpiexec_command(3)[-2:] == ["-n", "3"]
    assert cluster.env()["UCX_TLS"] == "tcp,self"


def test_python_means_this_environments_python(monkeypatch):
    here = str(Path(sys.executable).parent)
    assert launch.python_first(f"/usr/bin{os.pathsep}{here}") == f"{here}{os.pathsep}/usr/bin"
    assert launch.python_first("") == here
    monkeypatch.setenv("PATH", "/usr/bin")
    assert Cluster(_plan("ca", 10, 1, 1, None)).env()["PATH"].split(os.pathsep) == [here, "/usr/bin"]
