"""Hangs become errors: ``MINIDIST_TIMEOUT`` and the abort-on-uncaught-exception hook of ``dist.init()``.

With ``MINIDIST_TIMEOUT=2`` (and no debug mode), ranks waiting for a rank that never joins a collective
raise ``CollectiveTimeoutError`` after about 2 s, naming the collective, its sequence number and the
missing rank; an uncaught exception on one rank ends the whole job within seconds even without a
timeout. The workers (``tests/workers/distributed/dist_checks.py``) run on 4 ranks.
"""

from __future__ import annotations

import json
import time

import pytest
from mpi_utils import run_mpi

from minidist.distributed.safety.arrivals import describe_arrivals
from minidist.distributed.safety.watchdog import seconds_setting

TIMEOUT = 2


def run_checks(mode: str, out_dir, env: dict[str, str]):
    start = time.monotonic()
    result = run_mpi(4, "distributed/dist_checks.py", mode, out_dir, timeout=60, env=env, check=False)
    return result, time.monotonic() - start


@pytest.mark.mpi
@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("late", "not yet arrived: rank 3 (last entered #1 all_reduce)"),
        # ("barrier-instead" used to time out here too: now the liveness watchdog catches it at once,
        # see the next test.)
    ],
)
def test_a_rank_that_does_not_arrive_is_named_after_the_timeout(tmp_path, mode, expected):
    result, seconds = run_checks(mode, tmp_path, {"MINIDIST_TIMEOUT": str(TIMEOUT)})
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert seconds < TIMEOUT + 10, f"the job took {seconds:.0f} s with a {TIMEOUT} s timeout"
    for rank in range(3):
        report = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert report["type"] == "CollectiveTimeoutError", (rank, report)
        message = report["message"]
        start = (
            f"rank {rank}: all_reduce (collective #2 on this group) did not finish within MINIDIST_TIMEOUT="
        )
        assert message.startswith(f"{start}{TIMEOUT} s; it was waiting for "), message
        assert f"Arrival record of #2 all_reduce: ranks [0, 1, 2] entered it; {expected}." in message, message
        assert TIMEOUT <= report["seconds"] < TIMEOUT + 3, report["seconds"]
        assert (
            f"[rank {rank}] minidist.distributed.errors.CollectiveTimeoutError: rank {rank}: all_reduce"
            in output
        )


@pytest.mark.mpi
def test_a_rank_in_another_collective_is_named_at_once_without_waiting_for_the_timeout(tmp_path):
    # Rank 3 calls barrier while the others all-reduce: the others' all-reduce messages, tagged with
    # their call, wait unreceived at rank 3, whose liveness watchdog (liveness.py) names them.
    result, seconds = run_checks("barrier-instead", tmp_path, {"MINIDIST_TIMEOUT": "30"})
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert seconds < 25, f"the job took {seconds:.0f} s, as if it waited for the 30 s timeout"
    assert "[rank 3] rank 3: rank " in output, output
    assert (
        "is in #2 all_reduce(op=sum, float32) while this rank is in #2 barrier() on the same group" in output
    )


@pytest.mark.mpi
def test_a_rank_that_only_finishes_later_is_not_a_hang(tmp_path):
    result, _ = run_checks("slow-finish", tmp_path, {"MINIDIST_TIMEOUT": "1", "MINIDIST_DEBUG": "1"})
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("finished") == 4, result.stdout


@pytest.mark.mpi
def test_an_uncaught_exception_on_one_rank_ends_the_job(tmp_path):
    # No timeout: the other ranks would wait in all_reduce forever if rank 1 just exited.
    result, seconds = run_checks("crash", tmp_path, {})
    assert result.returncode != 0, result.stdout + result.stderr
    assert seconds < 15, f"took {seconds:.0f} s"
    assert "[rank 1] RuntimeError: rank 1 fails on purpose" in result.stderr, result.stderr
    assert "[rank 1] Traceback (most recent call last):" in result.stderr, result.stderr


@pytest.mark.mpi
def test_abort_on_one_rank_ends_every_rank_with_its_message(tmp_path):
    result, seconds = run_checks("abort", tmp_path, {})
    assert result.returncode != 0, result.stdout + result.stderr
    assert seconds < 15, f"took {seconds:.0f} s"
    assert "[rank 1] rank 1 gives up on purpose" in result.stderr, result.stderr
    assert "[rank 1] aborting all 4 ranks" in result.stderr, result.stderr


def test_timeout_values_are_checked(monkeypatch):
    for value, seconds in (("", None), ("0", None), ("off", None), ("2.5", 2.5), (" 60 ", 60.0)):
        monkeypatch.setenv("MINIDIST_TIMEOUT", value)
        assert seconds_setting("MINIDIST_TIMEOUT", 0.0) == seconds, value
    monkeypatch.setenv("MINIDIST_TIMEOUT", "")
    assert seconds_setting("MINIDIST_TIMEOUT", 300.0) == 300.0  # unset: the default
    for bad in ("soon", "-1", "nan", "inf"):
        monkeypatch.setenv("MINIDIST_TIMEOUT", bad)
        with pytest.raises(ValueError, match="MINIDIST_TIMEOUT"):
            seconds_setting("MINIDIST_TIMEOUT", 0.0)


def test_arrival_record_sorts_ranks_by_where_they_are():
    slots = [(5, "all_reduce"), (4, "broadcast"), (5, "barrier"), None, (0, "")]
    assert describe_arrivals(slots, 5, "all_reduce") == (
        "Arrival record of #5 all_reduce: rank 0 entered it; not yet arrived: rank 1 (last entered #4 "
        "broadcast), rank 4 (entered no collective on it yet); in a different collective: rank 2 (in #5 "
        "barrier); rank 3 (its record could not be read)."
    )
