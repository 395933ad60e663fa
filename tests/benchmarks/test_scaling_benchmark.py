"""benchmarks/scaling.py --quick on a real cluster (network namespaces over TCP, one link shaped to
100 Mbit/s): the study runs end to end, the traffic crossed the links, the link calibration finds the
rate tc set, and the model's predictions come out for every measured step. Timings are not asserted
beyond what a 100 Mbit/s link decides by itself (the machine is shared)."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
from cluster_utils import skip_reason
from mpi_utils import REPO, mpi_env

from minidist_tools.perfmodel import network as pn

pytestmark = [
    pytest.mark.mpi,
    pytest.mark.cluster,
    pytest.mark.skipif(skip_reason() is not None, reason=str(skip_reason())),
]


def test_quick_scaling_study(tmp_path):
    out, plot = tmp_path / "quick.json", tmp_path / "quick.png"
    cmd = [
        sys.executable,
        str(REPO / "benchmarks" / "scaling.py"),
        "--quick",
        "--out",
        str(out),
        "--plot",
        str(plot),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=mpi_env(), cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    study = json.loads(out.read_text())
    assert plot.stat().st_size > 0 and "| 2 x 1 | 100mbit | after |" in proc.stdout
    two = next(r for r in study["rows"] if (r["nodes"], r["ranks_per_node"]) == (2, 1))
    assert two["link"] == "100mbit"
    # Every DDP step (1 warm-up + 2 timed per variant) all-reduced all gradients across the link (fp16:
    # half the bytes): each of the 2 nodes received at least its ring share (inter_node_bytes) each time.
    grad_bytes = sum(4 * math.prod(s) for s in two["shapes"])
    sent = {"after": grad_bytes, "fp16": grad_bytes / 2}
    least = sum(2 * 3 * pn.inter_node_bytes(sent[v], 2, 1) for v in two["steps"])
    assert two["link_tx_bytes"] >= least, (two["link_tx_bytes"], least)
    # The calibration finds tc's 100 Mbit/s within what explains the difference: TCP/IP headers (-5 %),
    # tbf's 256 KiB bucket letting part of a message through at host speed (measured up to +12 % in the
    # quick sweep's 2 repeats), timing noise on a loaded machine.
    sizes, seconds = zip(*two["sweep"])
    cal = pn.calibrate_link(sizes, seconds, nodes=2, gamma=two["gamma"])
    assert 60e6 < 8 / cal.beta < 130e6, f"fitted {8 / cal.beta / 1e6:.0f} Mbit/s on a 100mbit link"
    # The link-bound sizes (>= 0.5 MiB) must fit; the 4 KiB point is a few scheduling delays on a loaded
    # machine (its error reached 51 % in one CI run while the others stayed under 0.3 %), so it is not held.
    link_bound = [e for n, e in zip(sizes, cal.errors) if n >= 512 * 1024]
    assert link_bound and max(link_bound) < 0.5, cal.errors
    # A prediction for each measured step; at 100 Mbit/s the all-reduce dominates, so it is within 2x.
    preds = {(p["nodes"], p["variant"]): p for p in study["predictions"]}
    assert set(preds) == {(1, "after")} | {(2, v) for v in two["steps"]}
    for (nodes, _), p in preds.items():
        assert p["predicted_s"] > 0 and p["measured_s"] > 0
        if nodes == 2:
            assert 0.5 < p["predicted_s"] / p["measured_s"] < 2.0, p
    if "fp16" in two["steps"]:  # with the comm hooks: half the bytes on a link-bound step is faster
        assert two["steps"]["fp16"] < two["steps"]["after"]
