"""Multi-rank: the control plane (barrier, allgather_object, split, call checks) runs as MPI's own
collectives on an MPI communicator of each communicator's members (issue 10)."""

import time

import numpy as np
import pytest

from nvlink_emu.fabric.control import MAX_CONTROL_BYTES
from nvlink_emu.fabric.errors import CollectiveMismatch, FabricError, FabricTimeout, ResourceExhausted
from nvlink_emu.ranks import comm as comm_module
from nvlink_emu.ranks.transport import channels as transport_channels

from mpi_helpers import gpus, run
from trust_helpers import until

pytestmark = pytest.mark.mpi(min_size=4)


def test_a_forged_control_message_takes_no_part_in_an_exchange():
    """A member sends another member, straight over the control channel, what an exchange carried when
    exchanges were point-to-point messages: a barrier entry with a clock of 1e30. It is a stray; the
    barrier gives the real latest clock."""
    def main(gpu):
        raw = gpu.raw_port()
        gpu.compute(100.0 * (gpu.rank + 1))
        if gpu.rank == 1:
            for seq in range(4):
                raw.control_channel.send(2, ("world", seq, ("barrier", 1e30)))
                raw.control_channel.send(2, ("world", seq, (seq, "barrier", 1e30)))
        if gpu.rank == 2:
            until(gpu, lambda: gpu.strays >= 8, "dropping 8 forged exchange messages")
            assert gpu.strays == 8 and not raw.control_box
        gpu.world.barrier()
        assert gpu.now_ns == 100.0 * gpu.size

    run(main)


def test_control_objects_of_every_size_round_trip_and_too_long_ones_name_their_member():
    """Small objects travel in the first collective, larger ones in a second (an Iallgatherv sized by
    the lengths); one over MAX_CONTROL_BYTES is never allocated for at the others: every member raises
    CollectiveMismatch naming its sender, and the communicator stays usable."""
    def main(gpu):
        for n in (0, 10, 600, 70_000):
            got = gpu.world.allgather_object(np.arange(n * (gpu.rank + 1), dtype=np.uint8))
            assert [g.size for g in got] == [n * (m + 1) for m in range(gpu.size)]
            assert all((g == np.arange(g.size, dtype=np.uint8)).all() for g in got)
        mixed = gpu.world.allgather_object("x" * (1000 if gpu.rank % 2 else 3))  # some inline, some not
        assert mixed == ["x" * (1000 if m % 2 else 3) for m in range(gpu.size)]
        big = np.zeros(MAX_CONTROL_BYTES + 1 if gpu.rank == 1 else 1, np.uint8)
        with pytest.raises(CollectiveMismatch, match=r"GPU 0: allgather_object; GPU 1: \(not a control exchange: "
                                                     rf"\d+ bytes, past the {MAX_CONTROL_BYTES}"):
            gpu.world.allgather_object(big)
        assert gpu.world.allgather_object(gpu.rank) == list(range(gpu.size))

    run(main)


@pytest.mark.parametrize("round_members", [1, 2, 64])
def test_both_first_steps_carry_every_size_and_meet_a_member_in_another_operation(monkeypatch, round_members):
    """An exchange's first step is one round of messages up to transport.channels.ROUND_MEMBERS members, an
    Iallgather above: both carry inline and long entries, and both meet a member in another operation
    (a CollectiveMismatch on every member, naming each one's); the limit is lowered or raised here so
    that both run at every world size, and a split's new communicators (fewer members) mix them."""
    monkeypatch.setattr(transport_channels, "ROUND_MEMBERS", round_members)

    def main(gpu):
        for n in (0, 600):
            got = gpu.world.allgather_object(np.arange(n * (gpu.rank + 1), dtype=np.uint8))
            assert [g.size for g in got] == [n * (m + 1) for m in range(gpu.size)]
        if gpu.rank == 1:
            with pytest.raises(CollectiveMismatch, match=r"GPU 0: allgather_object; GPU 1: barrier; GPU 2: "
                                                         r"allgather_object"):
                gpu.world.barrier()
        else:
            with pytest.raises(CollectiveMismatch, match=r"members are in different operations: GPU 0: "
                                                         r"allgather_object; GPU 1: barrier"):
                gpu.world.allgather_object(gpu.rank)
        half = gpu.world.split(gpu.rank % 2)
        assert half.allgather_object(gpu.rank) == list(range(gpu.rank % 2, gpu.size, 2))
        x = np.full(4, gpu.rank + 1, np.float32)
        gpu.world.allreduce(x, "sum", "ring")
        assert (x == gpu.size * (gpu.size + 1) / 2).all()

    run(main)


def test_a_member_whose_object_is_no_control_object_fails_every_member_at_once():
    def main(gpu):
        if gpu.rank == 1:
            with pytest.raises(FabricError, match="GPU 1: allgather_object #0 .* control objects are plain values"):
                gpu.world.allgather_object(object())
        else:
            with pytest.raises(CollectiveMismatch, match=r"GPU 1: allgather_object \(not a control object\)"):
                gpu.world.allgather_object(gpu.rank)
        gpu.world.barrier()

    run(main)


def test_a_timed_out_exchange_says_where_each_missing_member_is():
    """A collective cannot tell who has not come: at the deadline the GPU asks the members, and names
    those that are not in its exchange, with where they say they are (or that they did not answer)."""
    def main(gpu):
        every = gpu.world.split(0)  # world #0; its name is "world.0:0"
        others = [m for m in range(gpu.size) if m != gpu.rank]
        if gpu.rank == 0:
            with pytest.raises(FabricTimeout, match=r"GPU 0: barrier #1 on communicator 'world' timed out after 1 s "
                                                    r"waiting for GPUs \[1, 2\] \(GPU 1: in barrier #0 on communicator "
                                                    r"'world.0:0'; GPU 2: no answer within 1 s"):
                gpu.world.barrier()
        elif gpu.rank == 1:
            with pytest.raises(FabricTimeout, match=rf"GPU 1: barrier #0 on communicator 'world.0:0' .* waiting for "
                                                    rf"GPUs \[{', '.join(map(str, others))}\] \(GPU 0: in barrier #1 "
                                                    rf"on communicator 'world'; GPU 2: no answer"):
                every.barrier()
        elif gpu.rank == 2:
            time.sleep(3.5)  # in its own code: it cannot answer
        else:
            with pytest.raises(FabricTimeout, match=r"barrier #1 on communicator 'world' .* waiting for GPUs \[1, 2\]"):
                gpu.world.barrier()

    run(main, timeout_s=1.0)


def test_communicators_are_freed_and_their_number_is_bounded(monkeypatch):
    """Each communicator holds two MPI communicators and MPICH has 2048 per process: free() gives them
    back (the mpi4py layer's Comm.Free calls it), and past MAX_COMMUNICATORS a split is
    ResourceExhausted on every member, before MPI runs out (the limit lowered here, for time)."""
    # 2060 MPI communicators in all, more than MPICH has, at the smaller world size (a split costs
    # ~10-50 ms of 2 loaded cores at 8 GPUs: there, fewer)
    rounds = 1030 if gpus() <= 4 else 60

    def main(gpu):
        for _ in range(rounds):
            comm = gpu.world.split(0)
            comm.free()
        with pytest.raises(FabricError, match=f"barrier on communicator 'world.{rounds - 1}:0', which was freed"):
            comm.barrier()
        with pytest.raises(FabricError, match="world and partition live for the whole run"):
            gpu.world.free()
        monkeypatch.setattr(comm_module, "MAX_COMMUNICATORS", 12)
        held = []
        with pytest.raises(ResourceExhausted, match="already has 12 communicators, the most one GPU may have"):
            while True:
                held.append(gpu.world.split(gpu.rank % 2))
        assert len(held) == 10  # world and partition are two of them
        held.pop().free()
        x = np.ones(4, np.float32)
        gpu.world.split(0).allreduce(x, "sum", "ring")
        assert (x == gpu.size).all()

    run(main, timeout_s=60)
