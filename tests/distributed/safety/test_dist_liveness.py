"""The default liveness watchdog (``liveness.py``) and tagged messages (``tags.py``), without any setting.

A rank that leaves the program while others wait in a collective, a sub-group whose ranks slip out of
step, and ranks that pass a different ``src``, ``op`` or dtype used to hang forever or give wrong
numbers with exit 0. Now every waiting rank prints an error naming the rank that left or disagrees,
and the job ends non-zero within seconds. Debug mode adds each rank's call site, so two same-shape
all-reduces made in a different order raise ``CollectiveMismatchError`` on every rank. The workers are
``tests/workers/distributed/dist_liveness.py``.
"""

from __future__ import annotations

import json
import socket
import time

import pytest
from mpi_utils import run_mpi

WORKER = "distributed/dist_liveness.py"
BOUND = 30  # seconds: the whole job, start-up and the 1 s abort grace included, on 2 loaded cores


def run(n: int, mode: str, out_dir, env: dict[str, str] | None = None):
    start = time.monotonic()
    result = run_mpi(n, "distributed/dist_liveness.py", mode, out_dir, timeout=60, env=env, check=False)
    return result, result.stdout + result.stderr, time.monotonic() - start


@pytest.mark.mpi
def test_a_rank_that_exits_is_named_by_every_waiting_rank(tmp_path):
    result, output, seconds = run(3, "exit", tmp_path)
    assert result.returncode != 0, output
    assert seconds < BOUND, f"the job took {seconds:.0f} s"
    for rank in (0, 2):
        assert (
            f"[rank {rank}] rank {rank}: rank 1 left the program (it exited) after calling 2 collectives on "
            "this group, while this rank waits in #3 all_reduce(op=sum, float32), which it never called."
        ) in output, output


# What rank 1 reports when rank 3 (its partner in the sub-group of world ranks [1, 3]) is gone.
RANK_3_LEFT_THE_SUB_GROUP = (
    "[rank 1] rank 0 of the group of world ranks [1, 3] (ranks named are group ranks): rank 1 (world "
    "rank 3) left the program (it exited) after calling 3 collectives on this group, while this rank "
    "waits in #4 all_reduce(op=avg, float32)"
)


@pytest.mark.mpi
@pytest.mark.parametrize("env", [{}, {"MINIDIST_DEBUG": "1"}], ids=["default", "debug"])
def test_a_rank_that_returns_early_on_a_sub_group_is_named(tmp_path, env):
    # In debug mode this hung even before: rank 3's end-of-program check waits on the world, which
    # rank 1, waiting on the sub-group, never joins.
    result, output, seconds = run(4, "return-subgroup", tmp_path, env)
    assert result.returncode != 0, output
    assert seconds < BOUND, f"the job took {seconds:.0f} s"
    assert RANK_3_LEFT_THE_SUB_GROUP in output, output


@pytest.mark.mpi
def test_a_rank_that_returns_early_from_a_function_owning_the_sub_group_is_named(tmp_path):
    # Rank 3 returns from the function that holds its sub-group and works on; once Python collected
    # that sub-group, its departure notice was never sent, so rank 1 waited for the 300 s deadline.
    result, output, seconds = run(4, "return-subgroup-gc", tmp_path)
    assert result.returncode != 0, output
    assert seconds < BOUND, f"the job took {seconds:.0f} s"
    assert RANK_3_LEFT_THE_SUB_GROUP in output, output


@pytest.mark.mpi
def test_ddp_whose_data_runs_out_early_on_one_rank_names_it(tmp_path):
    result, output, seconds = run(4, "ddp-short", tmp_path)
    assert result.returncode != 0, output
    assert seconds < BOUND, f"the job took {seconds:.0f} s"
    assert (
        "[rank 1] rank 0 of the group of world ranks [1, 3] (ranks named are group ranks): rank 1 (world "
        "rank 3) left the program (it exited) after calling "
    ) in output, output


@pytest.mark.mpi
@pytest.mark.parametrize(
    ("mode", "mine", "theirs"),
    [
        ("op", "all_reduce(op=sum, float32)", "all_reduce(op=max, float32)"),
        ("dtype", "all_reduce(op=sum, float32)", "all_reduce(op=sum, int32)"),
    ],
)
def test_ranks_that_pass_a_different_op_or_dtype_fail_instead_of_computing_garbage(
    tmp_path, mode, mine, theirs
):
    result, output, seconds = run(2, mode, tmp_path)
    assert result.returncode != 0, output
    assert seconds < BOUND, f"the job took {seconds:.0f} s"
    # Each rank's receive takes the other's message and raises CollectiveMismatchError (the watchdog, if
    # it looks first, prints the same words).
    assert f"rank 0: rank 1 is in #1 {theirs} while this rank is in #1 {mine}" in output, output
    assert f"rank 1: rank 0 is in #1 {mine} while this rank is in #1 {theirs}" in output, output


@pytest.mark.mpi
def test_a_broadcast_with_different_src_is_raised_by_the_next_all_reduce(tmp_path):
    result, output, seconds = run(2, "broadcast-src", tmp_path)
    assert result.returncode != 0, output
    assert seconds < BOUND, f"the job took {seconds:.0f} s"
    for rank in (0, 1):
        other = 1 - rank
        assert (  # raised by the all-reduce's receive, which takes the stale message
            f"rank {rank}: rank {other} sent this rank a message of its call #1 "
            f"broadcast(src={other}, float32) on this group, which this rank never received"
        ) in output, output


@pytest.mark.mpi
def test_same_shape_calls_in_a_different_order_raise_in_debug_mode_with_each_call_site(tmp_path):
    result, output, _ = run(2, "order", tmp_path, env={"MINIDIST_DEBUG": "1"})
    assert result.returncode != 0, output
    lines = _worker_lines("dist.all_reduce(loss)", "dist.all_reduce(acc)")
    for rank in (0, 1):
        report = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert report["type"] == "CollectiveMismatchError", report
        assert report["message"].startswith(
            "collective #1 mismatch on a group of 2 ranks: "
            f"rank 0 called all_reduce(op=sum, shape=(4,), float64) at {WORKER}:{lines[0][0]}; "
            f"rank 1 called all_reduce(op=sum, shape=(4,), float64) at {WORKER}:{lines[1][1]}."
        ), report["message"]


def _worker_lines(*needles: str) -> list[list[int]]:
    """The line numbers of each of ``needles`` in the worker, in order of appearance."""
    from mpi_utils import WORKERS

    text = (WORKERS / "distributed" / "dist_liveness.py").read_text().splitlines()
    return [[i + 1 for i, line in enumerate(text) if line.strip() == needle] for needle in needles]


@pytest.mark.mpi
def test_a_numpy_integer_src_or_numpy_string_op_on_some_ranks_is_the_same_call(tmp_path):
    # src = np.argmin(...) passed on as an np.int64 by one rank and as an int by the others names the
    # same root: a correct program. Its tag used to say src=0 for the NumPy integer, so the watchdog
    # aborted the job ("rank 1 is in #1 broadcast(src=1) while this rank is in #1 broadcast(src=0)").
    result, output, _ = run(3, "numpy-src", tmp_path)
    assert result.returncode == 0, output
    for rank in range(3):
        seen = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert seen["x"] == [2.0] * 8  # rank 1's array
        assert seen["z"] == [3.0] * 4  # max over the ranks
        if rank == 1:
            assert seen["y"] == [3.0] * 4  # the reduce's result lands on dst = 1


def test_a_tag_names_its_call():
    import numpy as np

    from minidist.distributed.safety.tags import call_tag, describe, identity, seq_offset

    tag = call_tag(4097, identity("broadcast", None, 3, np.dtype(np.float32)))
    assert describe(tag) == "#1 broadcast(src=3, float32)"
    assert describe(tag, seq=4097) == "#4097 broadcast(src=3, float32)"
    assert identity("all_reduce", "sum", None, np.dtype("f4")) != identity(
        "all_reduce", "max", None, np.dtype("f4")
    )
    assert identity("all_reduce", "bogus", "x", None) == identity("all_reduce")  # never raises
    assert tag < 1 << 28  # below the departure notice's tag
    assert seq_offset(1, 4095) == 2 and seq_offset(4095, 1) == -2


@pytest.mark.mpi
def test_a_rank_stuck_in_a_computation_is_named_after_the_watchdog_deadline(tmp_path):
    # dist_checks.py "late": rank 3 sleeps 60 s instead of joining a ring all-reduce; rank 0 receives
    # from rank 3 in the ring. Without MINIDIST_TIMEOUT, the default watchdog's deadline applies.
    start = time.monotonic()
    env = {"MINIDIST_WATCHDOG": "2"}
    result = run_mpi(4, "distributed/dist_checks.py", "late", tmp_path, timeout=120, env=env, check=False)
    output, seconds = result.stdout + result.stderr, time.monotonic() - start
    assert result.returncode != 0, output
    assert seconds < BOUND, f"the job took {seconds:.0f} s"
    assert (
        "[rank 0] rank 0: #2 all_reduce(op=sum, float32) has not finished after MINIDIST_WATCHDOG=2 s; "
        "it was last waiting for rank 3."
    ) in output, output


@pytest.mark.mpi
def test_a_frozen_rank_is_named_with_its_host_after_the_peer_timeout(tmp_path):
    # Rank 1 SIGSTOPs itself: no exit, no departure notice, its watchdog thread stops too, as when its
    # node's link is cut (tests/tools/launch/test_failures_cluster.py cuts a real link). Its peers' heartbeats
    # go unanswered; after MINIDIST_PEER_TIMEOUT (+ the 1 s before the first ping) they end the job.
    result, output, seconds = run(3, "stop", tmp_path, env={"MINIDIST_PEER_TIMEOUT": "2"})
    assert result.returncode != 0, output
    assert seconds < BOUND, f"the job took {seconds:.0f} s"
    host = socket.gethostname()
    for rank in (0, 2):
        assert (
            f"[rank {rank}] rank {rank}: rank 1 (host {host}) did not answer the watchdog's heartbeat for "
        ) in output, output
    assert "while this rank waits in #3 all_reduce(op=sum, float32): that rank cannot be reached" in output


@pytest.mark.mpi
def test_a_frozen_rank_is_named_while_another_waits_for_its_message(tmp_path):
    # A point-to-point wait (a pipeline stage's) gets heartbeats too.
    result, output, seconds = run(2, "stop-p2p", tmp_path, env={"MINIDIST_PEER_TIMEOUT": "2"})
    assert result.returncode != 0, output
    assert seconds < BOUND, f"the job took {seconds:.0f} s"
    assert (
        f"[rank 0] rank 0: rank 1 (host {socket.gethostname()}) did not answer the watchdog's heartbeat for "
    ) in output, output
    assert "while this rank waits in a send or receive with rank 1: that rank cannot be reached" in output


@pytest.mark.mpi
def test_a_rank_that_is_only_slow_still_answers_the_heartbeat(tmp_path):
    # Rank 1 sleeps 5 s in a step while ranks 0 and 2 wait in the all-reduce with a 2 s peer timeout:
    # its watchdog thread answers their pings, so the job finishes with the right sum.
    result, output, _ = run(3, "slow", tmp_path, env={"MINIDIST_PEER_TIMEOUT": "2"})
    assert result.returncode == 0, output
    for rank in range(3):
        # x starts at rank + 1; four in-place sums over 3 ranks: 6, 18, 54, 162.
        assert json.loads((tmp_path / f"rank{rank}.json").read_text())["x"] == [162.0] * 8


def test_peer_timeout_setting_is_parsed_strictly():
    from minidist.distributed.safety import heartbeat

    cases = {"": 30.0, "off": None, "0": None, "4.5": 4.5}
    try:
        for value, expected in cases.items():
            heartbeat.peer_timeout.cache_clear()
            with pytest.MonkeyPatch.context() as patch:
                patch.setenv("MINIDIST_PEER_TIMEOUT", value)
                assert heartbeat.peer_timeout() == expected, value
        for bad in ("soon", "-1", "nan"):
            heartbeat.peer_timeout.cache_clear()
            with pytest.MonkeyPatch.context() as patch, pytest.raises(ValueError, match="PEER_TIMEOUT"):
                patch.setenv("MINIDIST_PEER_TIMEOUT", bad)
                heartbeat.peer_timeout()
    finally:
        heartbeat.peer_timeout.cache_clear()


def test_watchdog_setting_is_parsed_strictly():
    from minidist.distributed.safety import liveness

    cases = {"": 300.0, "off": None, "0": None, "12.5": 12.5}
    for value, expected in cases.items():
        liveness.deadline_seconds.cache_clear()
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("MINIDIST_WATCHDOG", value)
            assert liveness.deadline_seconds() == expected, value
    for bad in ("ten", "-1", "inf"):
        liveness.deadline_seconds.cache_clear()
        with pytest.MonkeyPatch.context() as patch, pytest.raises(ValueError, match="MINIDIST_WATCHDOG"):
            patch.setenv("MINIDIST_WATCHDOG", bad)
            liveness.deadline_seconds()
    liveness.deadline_seconds.cache_clear()


def test_a_message_is_judged_by_how_far_its_call_lies_from_this_ranks_calls():
    from types import SimpleNamespace

    import numpy as np

    from minidist.distributed.safety.liveness import STALE_WINDOW, _stray
    from minidist.distributed.safety.tags import call_tag, identity

    f32 = np.dtype(np.float32)
    channel = SimpleNamespace(rank=0, calls=SimpleNamespace(world_ranks=[0, 1]))
    reduce_sum = identity("all_reduce", "sum", None, f32)
    mine = call_tag(5, reduce_sum)
    # Finished call #5, idle: a message of #5 was never received (stale); one of #6 is early (fine).
    assert "never received" in _stray(channel, 1, call_tag(5, reduce_sum), 5, None, mine)
    assert _stray(channel, 1, call_tag(6, reduce_sum), 5, None, mine) is None
    # Far "behind" modulo 4096 is more likely far ahead: not called stale.
    assert _stray(channel, 1, call_tag(5 - STALE_WINDOW - 1, reduce_sum), 5, None, mine) is None
    # Running #5: a message of #5 with another op is a mismatch; one of #5 with the same identity is ours.
    other = call_tag(5, identity("all_reduce", "max", None, f32))
    assert "while this rank is in #5 all_reduce(op=sum, float32)" in _stray(channel, 1, other, 5, 5, mine)
    assert _stray(channel, 1, mine, 5, 5, mine) is None
    # A message of no numbered collective (tag_base 0: ring.py's functions called directly on the
    # channel, as the lessons and assignment A2 do) names no call: never judged. It was read as
    # "call #0 ?(bool)", stale, and the watchdog aborted A2's reference about one run in three.
    assert _stray(channel, 1, 0, 5, None, mine) is None
    assert _stray(channel, 1, 3, 5, 5, mine) is None
