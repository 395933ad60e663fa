"""The pieces of DDP that need no MPI: the bucket plan, bucket buffers and the communication thread.

This process never imports ``minidist.distributed`` (which initialises MPI), so the two modules are loaded
from their files instead of through ``minidist.parallel`` (whose ``__init__`` imports DDP and dist).
"""

from __future__ import annotations

import importlib.util
import threading
import time

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from mpi_utils import REPO

import minidist as md


def load(name: str):
    spec = importlib.util.spec_from_file_location(
        f"ddp_unit_{name}", REPO / "minidist" / "parallel" / "data_parallel" / f"{name}.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


buckets = load("buckets")
comm_thread = load("comm_thread")
F32, F64 = np.dtype("float32"), np.dtype("float64")


def test_plan_fills_buckets_in_reverse_registration_order():
    # 4 parameters of 40, 8, 40, 8 bytes; cap 50: [3, 2] = 48 bytes, then [1, 0] = 48 bytes.
    assert buckets.plan_buckets([40, 8, 40, 8], [F32] * 4, 50) == [[3, 2], [1, 0]]
    assert buckets.plan_buckets([40, 8, 40, 8], [F32] * 4, 1e9) == [[3, 2, 1, 0]]


def test_a_cap_smaller_than_every_parameter_gives_one_bucket_each():
    assert buckets.plan_buckets([40, 8, 40, 8], [F32] * 4, 1e-6 * 2**20) == [[3], [2], [1], [0]]


def test_a_parameter_bigger_than_the_cap_gets_its_own_bucket():
    assert buckets.plan_buckets([8, 100, 8, 8], [F32] * 4, 20) == [[3, 2], [1], [0]]


def test_a_dtype_change_starts_a_new_bucket():
    assert buckets.plan_buckets([8, 8, 8], [F64, F32, F32], 1e9) == [[2, 1], [0]]


def test_plan_rejects_a_non_positive_cap():
    with pytest.raises(ValueError, match="bucket_cap_mb must be positive"):
        buckets.plan_buckets([8], [F32], 0)


@given(sizes=st.lists(st.integers(1, 100), min_size=1, max_size=12), cap=st.integers(1, 300))
def test_plan_covers_every_parameter_once_in_reverse_order_within_the_cap(sizes, cap):
    plan = buckets.plan_buckets(sizes, [F32] * len(sizes), cap)
    assert [i for b in plan for i in b] == list(reversed(range(len(sizes))))
    for b in plan:
        assert len(b) == 1 or sum(sizes[i] for i in b) <= cap
    for b, following in zip(plan, plan[1:]):  # a bucket was closed only because the next did not fit
        assert sum(sizes[i] for i in b) + sizes[following[0]] > cap


def test_bucket_pack_and_unpack_round_trip_with_zeros_for_missing_gradients():
    a = md.tensor(np.zeros((2, 3)), dtype=np.float64, requires_grad=True)
    b = md.tensor(np.zeros(4), dtype=np.float64, requires_grad=True)
    a.grad = np.arange(6.0).reshape(2, 3)
    bucket = buckets.Bucket(0, [a, b], extra=2)
    assert bucket.flat.shape == (12,) and bucket.extra.shape == (2,) and bucket.nbytes == 96
    bucket.pack()
    np.testing.assert_array_equal(bucket.flat[:10], [0, 1, 2, 3, 4, 5, 0, 0, 0, 0])
    bucket.flat[:10] *= 2  # stands in for the all-reduce
    bucket.unpack()
    np.testing.assert_array_equal(a.grad, np.arange(6.0).reshape(2, 3) * 2)
    np.testing.assert_array_equal(b.grad, np.zeros(4))  # created where it was None
    # no copy back: the gradients are views of the bucket (PyTorch's gradient_as_bucket_view)
    assert np.shares_memory(a.grad, bucket.flat) and np.shares_memory(b.grad, bucket.flat)
    assert a.grad.shape == (2, 3) and b.grad.shape == (4,)
    bucket.pack()  # packing a view of the bucket into the bucket changes nothing
    np.testing.assert_array_equal(bucket.flat[:6], np.arange(6.0) * 2)
    bucket.pack_zeros()
    assert not bucket.flat[:10].any()


def test_comm_thread_runs_jobs_in_submission_order_off_the_main_thread():
    thread = comm_thread.CommThread("test-comm")
    ran: list[tuple[int, str]] = []
    jobs = [comm_thread.Job(lambda i=i: ran.append((i, threading.current_thread().name))) for i in range(20)]
    for job in jobs:
        thread.submit(job)
    for job in jobs:
        job.wait()
    thread.close()
    assert ran == [(i, "test-comm") for i in range(20)]


def test_comm_thread_error_reaches_the_waiter_and_later_jobs_are_skipped():
    thread = comm_thread.CommThread()
    ran = []

    def fail():
        time.sleep(0.01)
        raise ValueError("bucket 1 broke")

    jobs = [
        comm_thread.Job(lambda: ran.append(0)),
        comm_thread.Job(fail),
        comm_thread.Job(lambda: ran.append(2)),
    ]
    for job in jobs:
        thread.submit(job)
    jobs[0].wait()
    with pytest.raises(ValueError, match="bucket 1 broke"):
        jobs[1].wait()
    with pytest.raises(RuntimeError, match="skipped: an earlier communication job failed"):
        jobs[2].wait()
    assert ran == [0]
    thread.close()


def test_job_wait_blocks_until_the_job_ran_and_may_be_called_again():
    """Job waits on a bare lock held until it has run (not an Event): a waiter started first must block,
    and a second wait() (DDP's _abandon_failed_pass waits again on jobs already waited for) must not."""
    started, ran = threading.Event(), []
    job = comm_thread.Job(lambda: ran.append(1))
    waiter = threading.Thread(target=lambda: (started.set(), job.wait(), ran.append(2)))
    waiter.start()
    started.wait()
    waiter.join(timeout=0.05)
    assert waiter.is_alive() and ran == []  # still waiting: the job has not run
    job.run()
    waiter.join(timeout=5)
    assert not waiter.is_alive() and ran == [1, 2]
    job.wait()  # finished jobs never block
    job.wait()
