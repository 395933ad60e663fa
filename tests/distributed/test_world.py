"""The world and the seam, in one process: ``init()``, its shortcuts, and what the safety net installs.

``import minidist.distributed`` installs the safety net around the mechanism (``seam.py``): the world
and every group split or duplicated from it are watched communicators, and every public collective
runs through the safety net's wrapper. The plain classes and functions stay what they are.
"""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import minidist.distributed as dist
from minidist import trace
from minidist.distributed import comm, seam
from minidist.distributed.algorithms.ring import ring_all_reduce
from minidist.distributed.safety.watched import WatchedCommunicator
from minidist.distributed.world import group_or_world


def test_init_is_idempotent_and_its_shortcuts_describe_one_process():
    world = dist.init()
    assert dist.init() is world and dist.is_initialized()
    assert (dist.get_rank(), dist.get_world_size(), dist.get_local_rank()) == (0, 1, 0)
    assert (dist.get_rank(world), dist.get_world_size(world)) == (0, 1)


def test_every_communicator_is_watched_and_keeps_its_class_when_split_or_duplicated():
    world = dist.init()
    assert seam.communicator_class is WatchedCommunicator is dist.Communicator
    for group in (
        world,
        world.split(0, name="half"),
        world.dup(name="copy"),
        dist.Communicator(MPI.COMM_WORLD),
    ):
        assert type(group) is WatchedCommunicator and type(group.collective_channel) is WatchedCommunicator
        assert group.calls is group.collective_channel.calls and group.tag_base == 0
    assert world.split(None) is None  # "join no group"


def test_the_plain_communicator_runs_the_same_algorithm_without_the_safety_net():
    plain = comm.Communicator(MPI.COMM_WORLD.Dup(), name="plain")
    assert type(plain.collective_channel) is comm.Communicator
    assert not hasattr(plain, "calls") and not hasattr(plain, "tag_base")
    x = np.arange(5.0)
    ring_all_reduce(plain, x, "sum")  # one rank: nothing to send, the sum of one array
    np.testing.assert_array_equal(x, np.arange(5.0))
    out, into = np.arange(3.0), np.empty(3)
    plain.sendrecv(out, 0, into, 0)  # to and from this very rank: one MPI_Sendrecv
    np.testing.assert_array_equal(into, out)
    assert plain.bytes_sent == out.nbytes


def test_a_raw_mpi_communicator_is_refused_where_a_group_is_expected():
    assert group_or_world(None) is dist.init()
    with pytest.raises(
        TypeError, match="wrap a raw mpi4py communicator with minidist.distributed.Communicator"
    ):
        dist.all_reduce(np.ones(2), group=MPI.COMM_WORLD)


def test_a_bare_communicator_built_by_hand_is_refused_by_the_collectives_with_what_to_build():
    # It lacks the call numbers and deadlines the installed wrapper runs every collective with: refused
    # in so many words, never half-run (and never silently without MINIDIST_TIMEOUT's deadline).
    plain = comm.Communicator(MPI.COMM_WORLD.Dup())
    for call in (lambda: dist.all_reduce(np.ones(2), group=plain), lambda: dist.barrier(plain)):
        with pytest.raises(
            TypeError, match=r"bare minidist\.distributed\.comm\.Communicator .*Communicator\(comm\)"
        ):
            call()


def test_a_users_subclass_makes_watched_groups_whatever_its_constructor_takes():
    class Labelled(dist.Communicator):  # a constructor of another shape than the package's classes
        def __init__(self, mpi_comm, label):
            super().__init__(mpi_comm, name=label)

    group = Labelled(MPI.COMM_WORLD, "labelled")
    assert group.name == "labelled" and type(group.collective_channel) is WatchedCommunicator
    assert (
        type(group.split(0, name="half")) is WatchedCommunicator and type(group.dup()) is WatchedCommunicator
    )
    np.testing.assert_array_equal(dist.all_reduce(np.ones(2), group=group), np.ones(2))


def test_a_send_refused_for_its_arguments_leaves_no_message_in_the_trace():
    world = dist.init()
    trace.enable(messages=True)
    try:
        start = trace.event_count()
        with pytest.raises(ValueError, match="not a rank of this group"):
            dist.send(np.ones(3, np.float32), 7)
        with pytest.raises(ValueError, match="this rank itself"):
            dist.send(np.ones(3, np.float32), 0)
        with pytest.raises(ValueError, match="not a rank of this group"):
            world.sendrecv(np.ones(3), 9, np.empty(3), 0)
        assert trace.events(start) == []
        world.sendrecv(np.ones(3), 0, np.empty(3), 0)  # a valid one is traced, with its bytes
        (event,) = trace.events(start)
        assert event["name"] == "sendrecv" and event["args"]["bytes"] == 24
    finally:
        trace.disable()


def test_a_collective_of_ones_own_can_wear_the_safety_nets_wrapper():
    world = dist.init()

    @dist.collective_call("sum_twice")
    def sum_twice(a, group=None):
        dist.all_reduce(a, group=group)
        return dist.all_reduce(a, group=group)

    before = world.collective_channel.calls_started
    np.testing.assert_array_equal(sum_twice(np.ones(3)), np.ones(3))  # one rank: the sum is the array
    assert world.collective_channel.calls_started == before + 3  # numbered: the call and its two inside
    assert world.collective_channel.tag_base == 0  # and finished
