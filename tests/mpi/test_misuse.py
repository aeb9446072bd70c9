"""Multi-rank: misuse gets a typed error on every rank involved, and never corrupts later traffic."""

import math

import numpy as np
import pytest

from nvlink_emu.fabric.config import preset
from nvlink_emu.fabric.errors import (AccessViolation, CollectiveMismatch, ConfigError, FabricError, ProtocolError,
                           UnsupportedOperation)
from nvlink_emu.ranks.session import run_fabric

from mpi_helpers import gpus, run

pytestmark = pytest.mark.mpi(min_size=4)


def test_a_rejected_message_does_not_leave_its_bytes_for_the_next_one():
    def main(gpu):
        if gpu.rank == 0:
            gpu.send_message(1, ("a",), np.full(4, 1.0, np.float32))
            gpu.send_message(1, ("b",), np.full(4, 2.0, np.float32))
        if gpu.rank == 1:
            with pytest.raises(ProtocolError, match=r"message \('a',\) from GPU 0 has 16 bytes, the receive expects 8"):
                gpu.receive_message(("a",), np.empty(2, np.float32), peer=0)
            b = np.empty(4, np.float32)
            gpu.receive_message(("b",), b, peer=0)
            assert (b == 2.0).all()

    run(main)


def test_messages_are_matched_by_sender_and_key():
    def main(gpu):
        if gpu.rank in (0, 2):
            gpu.send_message(1, ("x",), np.full(4, float(gpu.rank), np.float32))
        if gpu.rank == 1:
            from_2, from_0 = np.empty(4, np.float32), np.empty(4, np.float32)
            gpu.receive_message(("x",), from_2, peer=2)
            gpu.receive_message(("x",), from_0, peer=0)
            assert (from_0 == 0.0).all() and (from_2 == 2.0).all()
        with pytest.raises(FabricError, match="flat tuple"):
            gpu.send_message(0, ("k", (1, 2)), np.zeros(1))
        with pytest.raises(FabricError, match="not a GPU"):
            gpu.send_message(gpu.size, ("k",), np.zeros(1))

    run(main)


def test_only_the_owner_revokes_and_exported_memory_cannot_be_freed():
    def main(gpu):
        block = gpu.alloc(1024, "uint8")
        first = gpu.export(block[256:512])
        second = gpu.export(block)
        handles = gpu.world.allgather_object(second)
        with pytest.raises(FabricError, match="still exported"):
            gpu.free(block)
        gpu.revoke(second)
        with pytest.raises(FabricError, match="still exported"):
            gpu.free(block)   # the slice's window is still live
        gpu.revoke(first)
        gpu.free(block)
        other = handles[(gpu.rank + 1) % gpu.size]
        with pytest.raises(AccessViolation, match="only its owner may revoke"):
            gpu.revoke(other)
        with pytest.raises(FabricError, match="revoke needs a Handle"):
            gpu.revoke(None)
        with pytest.raises(FabricError, match="offset must be a non-negative integer"):
            gpu.put(other, np.zeros(4, np.uint8), offset=1.5)
        with pytest.raises(FabricError, match="not a numpy dtype"):
            gpu.alloc(4, "nope")

    run(main)


def test_different_control_operations_are_a_mismatch_on_every_member():
    def main(gpu):
        with pytest.raises(CollectiveMismatch, match="different operations: GPU 0: barrier; GPU 1: allreduce call check"):
            if gpu.rank == 0:
                gpu.world.barrier()
            else:
                gpu.world.allreduce(np.ones(4, np.float32), "sum", "ring")

    run(main)


def test_one_members_bad_buffer_is_reported_by_every_member():
    def main(gpu):
        n = gpu.size
        send = np.ones(5 if gpu.rank == 1 else 4, np.float32)
        with pytest.raises(CollectiveMismatch, match="GPU 1's allgather send has 5 elements"):
            gpu.world.allgather(send, np.empty(4 * n, np.float32), "ring")
        counts = [1] * n if gpu.rank != 2 else [-1] * n
        with pytest.raises(CollectiveMismatch, match="GPU 2's all2allv send_counts"):
            gpu.world.all2allv(np.zeros(n), counts, np.zeros(n), [1] * n)
        recv = np.empty(4, np.float64 if gpu.rank == 0 else np.float32)
        with pytest.raises(CollectiveMismatch, match="GPU 0's reduce_scatter send is float32, recv is float64"):
            gpu.world.reduce_scatter(np.ones(4 * n, np.float32), recv)
        with pytest.raises(FabricError, match="root 1.0"):
            gpu.world.broadcast(np.zeros(4), root=1.0)
        x = np.ones(4, np.float32)
        gpu.world.allreduce(x, "sum", "ring")  # the communicator still works
        assert (x == n).all()

    run(main)


def forging(comm, forge):
    """Make this member write its own call checks: each goes out as forge(call, counts) (a hostile member's
    entry); returns the honest exchange, to put back."""
    honest = comm._exchange
    comm._exchange = lambda obj, op, seq: honest(forge(*obj) if op.endswith("call check") else obj, op, seq)
    return honest


def test_forged_counts_in_the_call_check_are_a_mismatch_on_every_member():
    """A member that writes its own all2allv call check (its counts are data it sends: a string, an
    integer past the wire's, a short row) fails every member with CollectiveMismatch naming it, before any
    count is used (the review of issue 26 found TypeError, OverflowError and IndexError on every member)."""
    def forged_counts(value):
        def forge(call, counts):
            sends, recvs = list(counts[0]), list(counts[1])
            if value == "short":
                sends, recvs = sends[:-1], recvs[:-1]
            else:
                sends[1] = recvs[1] = value
            return call, (sends, recvs)
        return forge

    def main(gpu):
        comm, n = gpu.world, gpu.size
        honest = comm._exchange
        for value in ("x", 10 ** 40, float("inf"), -3, "short"):
            if gpu.rank == 1:
                forging(comm, forged_counts(value))
            with pytest.raises(CollectiveMismatch, match=f"member 1's counts are not {n} integers"):
                comm.all2allv(np.zeros(2 * n, np.float32), [2] * n, np.zeros(2 * n, np.float32), [2] * n)
            comm._exchange = honest
        x = np.ones(4, np.float32)
        comm.allreduce(x, "sum", "ring")  # the communicator still works
        assert (x == n).all()

    run(main)


def test_a_call_check_entry_of_any_shape_is_a_mismatch_naming_its_member():
    """Member 0's entry decides nothing for the others (the second review of issue 26): counts of None on an
    all2allv, counts on an allreduce, or an entry that is no (call, counts) pair fail every member with
    CollectiveMismatch naming the member that sent it, not a TypeError or another member."""
    def main(gpu):
        comm, n = gpu.world, gpu.size
        honest = comm._exchange
        cases = [("all2allv", lambda call, counts: (call, None), "member 0's counts are not"),
                 ("allreduce", lambda call, counts: (call, ([1] * n, [1] * n)), "member 0 sent counts with a allreduce"),
                 ("allreduce", lambda call, counts: "junk", "member 0's call check is not a call"),
                 ("allreduce", lambda call, counts: ["not a dict", None], "member 0's call check is not a call")]
        for name, forge, words in cases:
            if gpu.rank == 0:
                forging(comm, forge)
            # the honest members name the forger; the forger (its own entry forged) fails too
            with pytest.raises(CollectiveMismatch, match=words if gpu.rank else None):
                if name == "all2allv":
                    comm.all2allv(np.zeros(2 * n, np.float32), [2] * n, np.zeros(2 * n, np.float32), [2] * n)
                else:
                    comm.allreduce(np.ones(4, np.float32), "sum", "ring")
            comm._exchange = honest
        x = np.ones(4, np.float32)
        comm.allreduce(x, "sum", "ring")  # the communicator still works
        assert (x == n).all()

    run(main)


def test_one_members_invalid_arguments_fail_every_member_at_once():
    # the offender raises its own typed error; the others do not wait for it to the deadline
    def main(gpu):
        n, odd = gpu.size, gpu.rank == 1
        x = np.ones(4, np.float32)
        frozen = np.empty(4 * n, np.float32)
        frozen.flags.writeable = not odd
        cases = [
            (lambda: gpu.world.allreduce(x, "mean" if odd else "sum"), FabricError, "op 'mean'"),
            (lambda: gpu.world.allreduce(x, "sum", "butterfly" if odd else "ring"), UnsupportedOperation,
             "unknown algorithm 'butterfly'"),
            (lambda: gpu.world.allreduce(np.ones(4, np.bool_) if odd else x), FabricError, "dtype bool"),
            (lambda: gpu.world.allreduce(np.ones(8, np.float32)[::2] if odd else x), FabricError, "contiguous"),
            (lambda: gpu.world.allgather(x, frozen), FabricError, "allgather recv is a read-only array"),
            (lambda: gpu.world.broadcast(x, root=n if odd else 0), FabricError, f"root {n}"),
            (lambda: gpu.world.all2all(np.ones(n + 1 if odd else n), np.ones(n + 1 if odd else n)),
             FabricError, "all2all needs send and recv"),
        ]
        for call, error, text in cases:
            if odd:
                with pytest.raises(error, match=text):
                    call()
            else:
                with pytest.raises(CollectiveMismatch, match=f"GPU 1's {error.__name__}: .*{text}"):
                    call()
        gpu.world.allreduce(x, "sum", "ring")  # the communicator still works
        assert (x == n).all()
        ro = np.zeros(4, np.float32)
        ro.flags.writeable = False
        window = gpu.world.allgather_object(gpu.export(gpu.alloc(4, "float32")))
        with pytest.raises(FabricError, match=f"GPU {gpu.rank}: get into a read-only array"):
            gpu.get(window[(gpu.rank + 1) % n], ro)

    run(main, timeout_s=20)


def test_a_refused_put_surfaces_at_fence_not_inside_a_collective():
    def main(gpu):
        window = gpu.alloc(64, "uint8")
        handle = gpu.world.allgather_object(gpu.export(window, to=[0]) if gpu.rank == 1 else None)[1]
        if gpu.rank == 2:
            gpu.put(handle, np.ones(64, np.uint8))
        x = np.ones(1000, np.float32)
        gpu.world.allreduce(x, "sum", "sharp")  # the refusal arrives meanwhile; the collective is not hit
        assert (x == gpu.size).all()
        if gpu.rank == 2:
            with pytest.raises(AccessViolation, match="not in the allowed set"):
                gpu.fence()
        gpu.world.barrier()

    run(main)


def test_collectives_do_not_cross_partitions():
    n = gpus()

    def main(gpu):
        with pytest.raises(AccessViolation, match="span partitions"):
            gpu.world.allreduce(np.ones(4, np.float32))
        part = gpu.world.split(gpu.config.partition_of(gpu.rank))
        x = np.ones(4, np.float32)
        part.allreduce(x)
        assert (x == part.size).all()

    run(main, partitions=[[0, 1], list(range(2, n))])


def test_one_sided_modeled_time_does_not_depend_on_host_order():
    import time

    def main(gpu):
        w = gpu.alloc(1 << 16, "uint8")
        handles = gpu.world.allgather_object(gpu.export(w))
        data = gpu.alloc(1 << 16, "uint8")
        times = []
        for delay_first in (False, True):  # the other GPU's put waits at GPU 1 first, or not
            gpu.world.barrier()
            start = gpu.now_ns
            if gpu.rank == 1 and delay_first:
                time.sleep(0.2)
            if gpu.rank < 2:
                gpu.put(handles[1 - gpu.rank], data)
                gpu.fence()
            gpu.world.barrier()
            times.append(gpu.now_ns - start)
        assert times[0] == times[1]

    run(main)


def test_a_deadline_must_be_finite():
    config = preset("dgx-h100", gpus=gpus())
    for bad in (math.nan, math.inf, 0.0):
        with pytest.raises(ConfigError, match="finite number of seconds"):
            run_fabric(config, lambda gpu: None, timeout_s=bad)


def test_bad_arguments_to_memory_and_messages_are_typed_and_leak_nothing():
    def main(gpu):
        free = gpu.free_bytes
        for count, dtype, text in [(1 << 10, object, "no fixed-size binary layout"), (2.7, "float32", "count"),
                                   (-1, "uint8", "count"), ("abc", "uint8", "count"), (5, "V0", "no fixed-size")]:
            with pytest.raises(FabricError, match=f"GPU {gpu.rank}: alloc: .*{text}"):
                gpu.alloc(count, dtype)
        assert gpu.free_bytes == free  # a refused alloc takes no memory
        for bad in ([1, 2, 3], "x"):
            with pytest.raises(FabricError, match="expected an array from gpu.alloc"):
                gpu.export(bad)
            with pytest.raises(FabricError, match="not a live allocation"):
                gpu.free(bad)
        window = gpu.alloc(64, "uint8")
        with pytest.raises(FabricError, match="GPU indices must be integers"):
            gpu.export(window, to=[1.7])
        with pytest.raises(FabricError, match="not inside one allocation"):
            gpu.export(gpu.memory[-64:])
        with pytest.raises(FabricError, match=r"receive_message from 99: not a GPU"):
            gpu.receive_message(("x",), np.empty(1, np.uint8), peer=99)
        with pytest.raises(FabricError, match=r"compute\('5'\)"):
            gpu.compute("5")
        gpu.world.barrier()

    run(main, timeout_s=20)
