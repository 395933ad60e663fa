"""Debug mode (``MINIDIST_DEBUG=1``): ranks that disagree about a collective fail on every rank, at once.

The MPI tests run ``tests/workers/distributed/dist_checks.py`` on 4 ranks, where one rank calls a different
collective, passes a different length, or skips the last call. Every rank must raise
``CollectiveMismatchError`` naming who called what, and the job must end non-zero instead of hanging.
A correct program gives bit-identical results with the checks on and off. The other tests check the
fingerprints and messages in this process, without MPI ranks.
"""

from __future__ import annotations

import concurrent.futures
import json
import time

import numpy as np
import pytest
from mpi_utils import WORKERS, run_mpi

from minidist.distributed.safety.debug import (
    EXIT,
    FINGERPRINT_BYTES,
    call_site,
    describe_call,
    fingerprint,
    mismatch_message,
)

DEBUG = {"MINIDIST_DEBUG": "1"}


def run_checks(mode: str, out_dir, env: dict[str, str], check: bool = False):
    start = time.monotonic()
    result = run_mpi(4, "distributed/dist_checks.py", mode, out_dir, timeout=60, env=env, check=check)
    return result, time.monotonic() - start


def at(code: str) -> str:
    """`` at distributed/dist_checks.py:LINE``: the call site debug mode reports for the worker's ``code``."""
    lines = (WORKERS / "distributed" / "dist_checks.py").read_text().splitlines()
    line = next(i + 1 for i, text in enumerate(lines) if text.strip() == code)  # the first such line
    return f" at distributed/dist_checks.py:{line}"


SAME_LINE = at("dist.all_reduce(np.ones(99 if rank == 1 else 100, dtype=np.float32))")
SKIPPED = at("dist.all_reduce(np.ones(4))")  # skip-last's `if rank != 3:` call, the first bare one


def reports(out_dir, ranks) -> dict[int, dict]:
    return {rank: json.loads((out_dir / f"rank{rank}.json").read_text()) for rank in ranks}


@pytest.mark.mpi
@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        (
            "other-collective",
            "collective #2 mismatch on a group of 4 ranks: ranks [0, 1, 3] called all_reduce(op=sum, "
            f"shape=(100,), float32){at('dist.all_reduce(np.ones(100, dtype=np.float32))')}; rank 2 called "
            f"all_gather(float32){at('dist.all_gather(np.ones(50, dtype=np.float32))')}.",
        ),
        (
            "other-length",
            "collective #2 mismatch on a group of 4 ranks: ranks [0, 2, 3] called all_reduce(op=sum, "
            f"shape=(100,), float32){SAME_LINE}; rank 1 called all_reduce(op=sum, shape=(99,), "
            f"float32){SAME_LINE}.",
        ),
    ],
)
def test_a_mismatch_raises_the_same_error_on_every_rank(tmp_path, mode, expected):
    result, seconds = run_checks(mode, tmp_path, DEBUG)
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert seconds < 30, f"took {seconds:.0f} s: the job should abort at once"
    for rank, report in reports(tmp_path, range(4)).items():
        assert report["type"] == "CollectiveMismatchError", (rank, report)
        assert report["message"].startswith(expected), (rank, report["message"])
        # The excepthook of dist.init() printed it, prefixed with the rank, before aborting.
        assert f"[rank {rank}] minidist.distributed.errors.CollectiveMismatchError: {expected}" in output, (
            output
        )


@pytest.mark.mpi
def test_a_rank_that_skips_the_last_collective_and_exits_is_named(tmp_path):
    result, seconds = run_checks("skip-last", tmp_path, DEBUG)
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert seconds < 30, f"took {seconds:.0f} s: the job should abort at once"
    expected = (
        "collective #2 mismatch on a group of 4 ranks: ranks [0, 1, 2] called all_reduce(op=sum, shape=(4,), "
        f"float64){SKIPPED}; rank 3 reached the end of the program."
    )
    for rank, report in reports(tmp_path, range(3)).items():
        assert report["message"].startswith(expected), (rank, report["message"])
    # Rank 3 finds out in its exit handler, where it cannot raise: it prints the error and aborts.
    assert f"[rank 3] CollectiveMismatchError: {expected}" in output, output


@pytest.mark.mpi
def test_checks_on_give_the_same_results_as_checks_off(tmp_path):
    (tmp_path / "off").mkdir()
    (tmp_path / "on").mkdir()
    run_checks("results", tmp_path / "off", {}, check=True)
    run_checks("results", tmp_path / "on", {**DEBUG, "MINIDIST_TIMEOUT": "30"}, check=True)
    for rank in range(4):
        off, on = np.load(tmp_path / "off" / f"rank{rank}.npz"), np.load(tmp_path / "on" / f"rank{rank}.npz")
        assert sorted(off.files) == sorted(on.files)
        for name in off.files:
            np.testing.assert_array_equal(off[name], on[name], err_msg=f"rank {rank}: {name}")
    parity = np.load(tmp_path / "on" / "rank1.npz")["parity_all_reduce"]
    np.testing.assert_allclose(parity, np.arange(12) * (2 + 4) / 2)  # ranks 1 and 3 multiply by 2 and 4


# ------------------------------------------------------------------------ fingerprints, in this process


def test_describe_call_shows_what_must_agree():
    a = np.zeros((2, 3), dtype=np.float32)
    assert (
        describe_call("all_reduce", a, op="sum", algorithm="auto")
        == "all_reduce(op=sum, shape=(2, 3), float32)"
    )
    assert describe_call("all_gather", a, same_shape=False) == "all_gather(float32)"
    assert (
        describe_call("broadcast", a, src=1, algorithm="tree")
        == "broadcast(src=1, shape=(2, 3), float32, algorithm=tree)"
    )
    assert describe_call("barrier") == "barrier()"
    assert describe_call("all_reduce", [1, 2], op="sum") == "all_reduce(op=sum, array=list)"


def test_fingerprints_have_a_fixed_size_and_compare_exactly():
    long_a, long_b = "x" * 300 + "a", "x" * 300 + "b"  # differ only after the cut
    records = [fingerprint(7, text, [0, 1]) for text in ("all_reduce(op=sum)", long_a, long_b)]
    assert all(len(record) == FINGERPRINT_BYTES for record in records)
    assert records[1] != records[2]
    assert fingerprint(7, "barrier()", [0, 1]) != fingerprint(7, "barrier()", [0, 2])  # another group
    assert fingerprint(7, "barrier()", [0, 1]) != fingerprint(8, "barrier()", [0, 1])  # another call


def test_mismatch_message_groups_ranks_by_what_they_called():
    records = [fingerprint(3, text, [0, 1, 2, 3]).rstrip(b"\0").decode() for text in
               ("barrier()", "barrier()", describe_call(EXIT), "barrier()")]  # fmt: skip
    message = mismatch_message(records)
    assert message.startswith(
        "collective #3 mismatch on a group of 4 ranks: ranks [0, 1, 3] called barrier(); "
        "rank 2 reached the end of the program."
    ), message


def test_the_call_site_is_the_users_line_or_else_the_thread_that_ran_it():
    assert call_site().startswith("safety/test_dist_debug.py:")  # this very line's file
    # A thread that runs no line of the user (all its frames are the standard library's here; DDP's
    # ddp-comm thread in a job) has no user line to name: the thread is named instead.
    with concurrent.futures.ThreadPoolExecutor(thread_name_prefix="comm") as pool:
        assert pool.submit(call_site).result() == "thread 'comm_0'"
