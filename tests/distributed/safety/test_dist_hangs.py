"""Mistakes that used to end late or never with the default settings now end early, naming their cause.

* A message of another call (a broadcast whose ranks disagree about ``src`` leaves one unreceived) is
  taken by the next receive of a collective on that group and raised there (``watched.py``), before the
  first optimizer step; it used to wait in MPI's queue until the watchdog's look, a thousand steps later.
* Two ranks each waiting for the other in a different call (one in DDP's gradient all-reduce, one in a
  logging all-reduce on the world; or both in a 16 MiB ``send``) tell each other so in their heartbeats
  (``waits.py``): the job ends within seconds with both waits named, not at the 300 s deadline or never.

The workers are ``tests/workers/distributed/dist_hangs.py``.
"""

from __future__ import annotations

import json
import re
import time

import pytest
from mpi_utils import run_mpi

from minidist.distributed.safety.waits import CYCLE_AFTER

BOUND = 30  # seconds: the whole job, start-up and the 1 s abort grace included, on 2 loaded cores


def run(mode: str, out_dir, env: dict[str, str] | None = None):
    start = time.monotonic()
    result = run_mpi(2, "distributed/dist_hangs.py", mode, out_dir, timeout=90, env=env, check=False)
    return result, result.stdout + result.stderr, time.monotonic() - start


def reports(out_dir) -> dict[int, dict]:
    return {r: json.loads(p.read_text()) for r in (0, 1) if (p := out_dir / f"rank{r}.json").exists()}


@pytest.mark.mpi
@pytest.mark.parametrize("watchdog", ["default", "off"])
def test_the_broadcast_from_self_slip_is_refused_before_the_first_optimizer_step(tmp_path, watchdog):
    # Each rank's first gradient all-reduce takes the other's stale broadcast message and raises. With
    # the watchdog on, its look may name the message first (the first step is slow to start): either
    # way, on both ranks, before any step completes. With it off, the receive alone raises it.
    env = {"MINIDIST_WATCHDOG": "off"} if watchdog == "off" else None
    result, output, seconds = run("broadcast-self", tmp_path, env)
    assert result.returncode != 0, output
    assert seconds < BOUND, f"the job took {seconds:.0f} s"
    seen = reports(tmp_path)
    if watchdog == "off":
        assert set(seen) == {0, 1}, output  # both ranks raised in their own code
    for rank in (0, 1):
        other = 1 - rank
        assert (
            f"rank {rank}: rank {other} sent this rank a message of its call #1 broadcast(src={other}, "
            "float64) on this group, which this rank never received"
        ) in output, output
        if rank in seen:
            assert seen[rank]["type"] == "CollectiveMismatchError" and seen[rank]["steps"] == 0, seen


@pytest.mark.mpi
def test_the_broadcast_from_self_slip_before_ddp_is_refused_by_ddps_constructor(tmp_path):
    # DDP's constructor first compares its options across the group (an all-gather on the same group):
    # there each rank takes the other's stale message and raises, and nothing else is reported (the
    # all-gather's own message, left unreceived, would read as a second mismatch).
    result, output, seconds = run("broadcast-self-ddp", tmp_path)
    assert result.returncode != 0, output
    assert seconds < BOUND, f"the job took {seconds:.0f} s"
    seen = reports(tmp_path)
    assert set(seen) == {0, 1}, output
    for rank, report in seen.items():
        assert report["type"] == "CollectiveMismatchError" and report["steps"] == 0, report
        assert f"its call #1 broadcast(src={1 - rank}, float64) on this group" in report["message"]
    assert output.count("sent this rank a message") == 2, output


def named_pair(mode: str, tmp_path, pattern: str) -> tuple[tuple[str, ...], str]:
    """Run ``mode``, which must fail within the cycle bound, and return the groups of ``pattern`` (the
    message naming both waits) and the output. Whichever rank judges first names both waits (the other
    may be aborted before it does too), so one match is enough."""
    result, output, seconds = run(mode, tmp_path)
    assert result.returncode != 0, output
    assert seconds < BOUND + CYCLE_AFTER, f"the job took {seconds:.0f} s"
    found = re.search(pattern, output)
    assert found, output
    return found.groups(), output


@pytest.mark.mpi
def test_a_rank_done_with_ddp_and_one_still_in_it_are_named_waiting_for_each_other(tmp_path):
    # Rank 0 (one batch short) waits in the logging all-reduce on the world, rank 1 in DDP's gradient
    # all-reduce on DDP's channel: each rank's heartbeat tells the other, and after CYCLE_AFTER both
    # name the pair. It used to end only at MINIDIST_WATCHDOG's 300 s, with a generic message.
    pattern = (
        r"rank (\d): rank (\d) has waited \d+ s for this rank in (.*), while this rank has waited \d+ s "
        r"for rank \d in (.*): neither can finish before the other"
    )
    (me, them, theirs, mine), output = named_pair("ddp-short-log", tmp_path, pattern)
    # Rank 0's logging all-reduce is #4 on the world (DDP's constructor made three calls there), rank 1's
    # wait #4 on DDP's channel (its 4th step's gradients): the same words, on two groups of the same ranks.
    assert {me, them} == {"0", "1"}, output
    assert theirs == "#4 all_reduce(op=avg, float64) on another group (world ranks [0, 1])", output
    assert mine == "#4 all_reduce(op=avg, float64) on this group", output
    assert "call join() after the last batch" in output, output


@pytest.mark.mpi
def test_two_ranks_each_sending_a_large_message_to_the_other_first_are_named(tmp_path):
    pattern = (
        r"rank (\d): rank (\d) has waited \d+ s for this rank in a send to rank (\d), while this rank has "
        r"waited \d+ s for rank (\d) in a send to rank (\d): neither can finish before the other"
    )
    (me, them, to_me, waited_for, to_them), output = named_pair("send-send", tmp_path, pattern)
    assert {me, them} == {"0", "1"} and to_me == me and waited_for == to_them == them, output
    assert "let one rank receive first, or use sendrecv" in output, output


@pytest.mark.mpi
def test_a_large_send_to_a_rank_that_is_only_busy_is_no_cycle(tmp_path):
    # Rank 0 waits 7 s in its send while rank 1 computes: rank 1 waits for nothing, so no verdict.
    result, output, _ = run("send-slow-recv", tmp_path)
    assert result.returncode == 0, output
    assert json.loads((tmp_path / "rank1.json").read_text())["received"] == 0.0
