"""Non-blocking point-to-point batches (``minidist.distributed.p2p_batch``): what the interleaved pipeline
uses.

On 2 ranks (``tests/workers/distributed/pp_p2p_batch.py``): messages started in crossed orders arrive by
tag without deadlock; a message shorter or longer than its receive buffer raises ``DistributedError``, with
and without ``MINIDIST_TIMEOUT`` (the two paths wait differently: ``MPI_Waitall`` vs the watchdog's
test loop); a message that never comes raises ``CollectiveTimeoutError`` after the timeout.
"""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
from mpi_utils import run_mpi

import minidist.distributed as dist
from minidist.distributed.p2p_batch import batch_send_recv, irecv, isend, wait_all

SHORT = "rank 1 expected 4 elements of float64 (32 bytes) from rank 0 (tag 7), but rank 0 sent 24 bytes"


def read(tmp_path):
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.mark.mpi
def test_crossed_batches_arrive_and_wrong_lengths_raise(tmp_path):
    run_mpi(2, "distributed/pp_p2p_batch.py", tmp_path, timeout=60)
    r0, r1 = read(tmp_path)
    # rank r sent 10 r + 1 with tag 1 and 10 r + 2 with tag 2: each buffer got its own tag's message
    assert r0["crossed"] == [None, [11.0, 11.0, 12.0, 12.0]]
    assert r1["crossed"] == [None, [1.0, 1.0, 2.0, 2.0]]
    assert r0["short"] == r0["long"] == [None, "no error"]  # the sender cannot tell
    assert r1["short"][0] == "DistributedError" and r1["short"][1].startswith(SHORT), r1["short"]
    assert r1["long"][0] == "DistributedError", r1["long"]
    assert "from rank 0 (tag 7), but rank 0 sent a longer message" in r1["long"][1], r1["long"]


@pytest.mark.mpi
def test_with_a_timeout_lengths_are_checked_and_a_missing_message_times_out(tmp_path):
    start = time.monotonic()
    result = run_mpi(
        2, "distributed/pp_p2p_batch.py", tmp_path, "timeout", env={"MINIDIST_TIMEOUT": "1"}, timeout=60
    )
    assert time.monotonic() - start < 15, result.stdout + result.stderr
    r0, r1 = read(tmp_path)
    assert r1["crossed"] == [None, [1.0, 1.0, 2.0, 2.0]]
    assert r1["short"][0] == "DistributedError" and r1["short"][1].startswith(SHORT), r1["short"]
    # the watchdog tests one request at a time; MPI then does not say which receive was too short
    assert r1["long"][0] == "DistributedError" and "longer than its receive buffer" in r1["long"][1]
    assert "a message from rank 0 (tag 7) into 4 x float64" in r1["long"][1], r1["long"]
    kind, message = r1["timeout"]
    assert kind == "CollectiveTimeoutError", r1["timeout"]
    assert (
        "did not finish within MINIDIST_TIMEOUT=1 s; it was waiting for a message from rank 0 (tag 9)"
        in message
    )
    assert r0["timeout"] == [None, "no error"]


def test_one_process_sends_to_itself_and_arguments_are_checked():
    world = dist.init()
    if world.size != 1:
        pytest.skip("runs in a single process")
    into = np.empty((2, 3))
    batch_send_recv(world, sends=[(np.arange(6.0).reshape(2, 3), 0, 4)], recvs=[(into, 0, 4)])
    np.testing.assert_array_equal(into, np.arange(6.0).reshape(2, 3))
    request = irecv(world, np.empty(4), 0, 5)
    with pytest.raises(dist.DistributedError, match="expected 4 elements of float64"):
        wait_all(world, [request, isend(world, np.ones(3), 0, 5)])
    with pytest.raises(TypeError, match="host NumPy arrays, got list"):
        isend(world, [1.0, 2.0], 0)
    with pytest.raises(ValueError, match="not C-contiguous"):
        irecv(world, np.empty((4, 4))[:, 0], 0)
    with pytest.raises(ValueError, match="tag=40000 is outside"):
        isend(world, np.ones(2), 0, tag=40000)
    with pytest.raises(ValueError, match="dst=1 is not a rank of this group"):
        isend(world, np.ones(2), 1)
