"""Multi-rank: point-to-point send / recv / sendrecv on communicator ranks with tags - every fixed-size
dtype, exact link bytes and modeled time, MPI's non-overtaking order, key namespacing, and misuse."""

import ml_dtypes
import numpy as np
import pytest

from nvlink_emu.fabric.errors import AccessViolation, FabricError, ProtocolError
from nvlink_emu.fabric.packets import raw_bytes

from mpi_helpers import gpus, run

pytestmark = pytest.mark.mpi(min_size=4)

# every kind of fixed binary layout numpy has: they move as bytes
DTYPES = [np.dtype(d) for d in ("uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "int64",
                                "float16", "float32", "float64", "complex64", "complex128", "bool",
                                "datetime64[ns]", "S7")] + \
         [np.dtype(ml_dtypes.bfloat16), np.dtype([("id", "<u4"), ("w", "<f8")])]


def pattern(dtype, count, seed):
    """`count` elements of `dtype` whose bytes are random (any bit pattern is a valid element here)."""
    raw = np.random.default_rng(seed).integers(0, 256, count * dtype.itemsize, dtype=np.uint8)
    if dtype == np.bool_:
        raw &= 1  # numpy's bool holds 0 or 1
    return raw.view(dtype)


def same_bits(a, b):
    return a.dtype == b.dtype and a.tobytes() == b.tobytes()


def test_sendrecv_moves_every_fixed_size_dtype_around_a_ring():
    n = gpus()

    def main(gpu):
        comm, r = gpu.world, gpu.rank
        for i, dtype in enumerate(DTYPES):
            for count in (0, 1, 777):
                mine = pattern(dtype, count, 100 * i + r)
                got = np.empty(count, dtype)
                comm.sendrecv(mine, (r + 1) % n, got, (r - 1) % n, sendtag=i)
                assert same_bits(got, pattern(dtype, count, 100 * i + (r - 1) % n)), (dtype, count)
                assert same_bits(mine, pattern(dtype, count, 100 * i + r))  # the send buffer is untouched
        # 2-D arrays travel as their bytes, in C order
        grid = np.arange(12, dtype=np.int16).reshape(3, 4) * (r + 1)
        back = np.empty((4, 3), np.int16)
        comm.sendrecv(grid, (r + 1) % n, back, (r - 1) % n)
        assert same_bits(back.reshape(-1), (np.arange(12, dtype=np.int16) * ((r - 1) % n + 1)))

    run(main)


def test_send_and_recv_count_exactly_the_payload_and_take_the_modeled_time_of_one_hop():
    n = gpus()
    S = 100_003  # bytes: not a multiple of the MTU

    def main(gpu):
        config, t = gpu.config, gpu.config.timing
        B, a, s = t.bandwidth_gbytes_per_s, t.link_latency_ns, t.switch_latency_ns
        raw = raw_bytes(S, config.mtu_bytes, config.header_bytes)
        before = gpu.link_counters()
        gpu.world.barrier()  # nothing is sent before every GPU took its `before` (counted on arrival)
        start = gpu.now_ns
        assert start == 0.0
        data = np.arange(S, dtype=np.uint8)
        if gpu.rank == 0:
            gpu.world.send(data, n - 1, tag=3)
            assert gpu.now_ns == pytest.approx(raw / B)  # returns when the last byte left the uplink
        elif gpu.rank == n - 1:
            got = np.empty(S, np.uint8)
            gpu.world.recv(got, 0, tag=3)
            assert same_bits(got, data)
            assert gpu.now_ns == pytest.approx(raw / B + 2 * a + s)  # GPU -> switch -> GPU
        after = gpu.link_counters()
        delta = {k: after[k] - before[k] for k in after}
        sent, received = S if gpu.rank == 0 else 0, S if gpu.rank == n - 1 else 0
        assert delta["tx_bytes"] == sent and delta["rx_bytes"] == received, (gpu.rank, delta)
        assert delta["tx_raw_bytes"] == (raw if sent else 0) and delta["rx_raw_bytes"] == (raw if received else 0)
        # sendrecv between two members: each link carries exactly the two payloads (counted before the
        # barrier: a message is counted when it arrives, which may be while this GPU waits in it)
        before = gpu.link_counters()
        gpu.world.barrier()
        if gpu.rank in (1, 2):
            other = 3 - gpu.rank
            out = np.empty(1000 + other, np.float64)
            gpu.world.sendrecv(np.full(1000 + gpu.rank, gpu.rank, np.float64), other, out, other, sendtag=9)
            assert (out == other).all()
        gpu.world.barrier()
        after = gpu.link_counters()
        expect_tx = 8 * (1000 + gpu.rank) if gpu.rank in (1, 2) else 0
        expect_rx = 8 * (1000 + 3 - gpu.rank) if gpu.rank in (1, 2) else 0
        assert after["tx_bytes"] - before["tx_bytes"] == expect_tx
        assert after["rx_bytes"] - before["rx_bytes"] == expect_rx

    run(main)


def test_messages_with_one_tag_are_received_in_send_order_and_tags_are_independent():
    def main(gpu):
        comm = gpu.world
        if gpu.rank == 0:
            for i in range(20):  # sizes vary, so a message taken out of order would not even fit
                comm.send(np.full(i + 1, i, np.int32), 1, tag=5)
            comm.send(np.array([-1.5]), 1, tag=6)
            comm.send(np.array([-2.5]), 1, tag=6)
        elif gpu.rank == 1:
            late = np.empty(2)
            comm.recv(late[:1], 0, tag=6)  # tag 6 was sent after every tag-5 message: tags do not block
            comm.recv(late[1:], 0, tag=6)
            assert list(late) == [-1.5, -2.5]
            for i in range(20):
                got = np.empty(i + 1, np.int32)
                comm.recv(got, 0, tag=5)
                assert (got == i).all(), (i, got)
        elif gpu.rank == 2:
            comm.send(np.array([2], np.int64), 1, tag=5)  # same tag, another sender: a stream of its own
        if gpu.rank == 1:
            got = np.empty(1, np.int64)
            comm.recv(got, 2, tag=5)
            assert got[0] == 2

    run(main)


def test_ranks_are_communicator_ranks_and_keys_never_meet_collectives_or_other_communicators():
    n = gpus()

    def main(gpu):
        # odd GPUs in reverse order: member ranks differ from GPU indices
        half = gpu.world.split(gpu.rank % 2, key=-gpu.rank)
        assert half.members == tuple(sorted((g for g in range(n) if g % 2 == gpu.rank % 2), reverse=True))
        m = half.size
        got = np.empty(4, np.int64)
        half.sendrecv(np.full(4, gpu.rank, np.int64), (half.rank + 1) % m, got, (half.rank - 1) % m, sendtag=0)
        assert (got == half.members[(half.rank - 1) % m]).all()
        # the same pair and tag on world: a separate stream, and world's collectives still in step
        # (point to point takes no sequence number: only two members take part)
        if gpu.rank == 0:
            gpu.world.send(np.array([7.0]), 2, tag=0)
        if gpu.rank == 2:
            x = np.empty(1)
            gpu.world.recv(x, 0, tag=0)
            assert x[0] == 7.0
        total = np.array([float(gpu.rank)])
        gpu.world.allreduce(total, algorithm="direct")
        assert total[0] == sum(range(n))

    run(main)


def test_sendrecv_with_a_pair_exchanging_and_in_place_and_large_messages():
    n = gpus()

    def main(gpu):
        comm, r = gpu.world, gpu.rank
        partner = r ^ 1
        if partner < n:  # an odd GPU count leaves the last one out
            big = np.arange(3 << 20, dtype=np.float32) + r  # 12 MiB: more than a chunk, more than a port's share
            comm.sendrecv(big, partner, big, partner, sendtag=1, recvtag=1)  # in place, as Sendrecv_replace
            assert same_bits(big, np.arange(3 << 20, dtype=np.float32) + partner)

    run(main, chunk_bytes=1 << 20)


def test_p2p_misuse_raises_typed_errors_and_later_messages_still_match():
    n = gpus()

    def main(gpu):
        comm, r = gpu.world, gpu.rank
        x = np.zeros(4, np.float32)
        for bad in (-1, 2 ** 31, 1.0, True, "0", None):
            with pytest.raises(FabricError, match=r"tag .* tags are integers 0\.\.2147483647"):
                comm.send(x, (r + 1) % n, tag=bad)
        for bad in (n, -1, 0.0, None):
            with pytest.raises(FabricError, match=r"is not a member rank 0\.\."):
                comm.recv(x, bad)
        with pytest.raises(FabricError, match="with itself"):
            comm.send(x, r)
        with pytest.raises(FabricError, match="with itself"):
            comm.sendrecv(x, (r + 1) % n, x.copy(), r)
        with pytest.raises(FabricError, match="sends tag 1 and receives tag 2: it would wait forever"):
            comm.sendrecv(x, r, x.copy(), r, sendtag=1, recvtag=2)
        with pytest.raises(ProtocolError, match="it sends 16 bytes, its receive buffer has 8"):
            comm.sendrecv(x, r, np.empty(1), r)
        before = gpu.link_counters()["tx_bytes"]
        y = np.arange(4, dtype=np.float32)
        comm.sendrecv(y, r, y, r)  # with itself as both ends: a local copy, nothing on the links
        assert list(y) == [0, 1, 2, 3] and gpu.link_counters()["tx_bytes"] == before
        with pytest.raises(FabricError, match="strided view"):
            comm.send(np.zeros(8)[::2], (r + 1) % n)
        with pytest.raises(FabricError, match="read-only"):
            ro = np.zeros(4)
            ro.flags.writeable = False
            comm.recv(ro, (r + 1) % n)
        # a size mismatch: the receiver raises naming both GPUs, the tag and the sizes
        if r == 0:
            comm.send(np.zeros(10, np.float32), 1, tag=4)
            comm.send(np.full(3, 9, np.int16), 1, tag=4)
        if r == 1:
            with pytest.raises(ProtocolError, match=r"recv from GPU 0 \(member 0\) tag 4 on communicator 'world': "
                                                    r"GPU 0 sent 40 bytes, GPU 1's receive buffer has 32"):
                comm.recv(np.empty(4, np.float64), 0, tag=4)
            after = np.empty(3, np.int16)
            comm.recv(after, 0, tag=4)  # the mismatched message was consumed: the next one matches
            assert (after == 9).all()

    run(main)


def test_p2p_between_partitions_is_refused():
    def main(gpu):
        # partitions [0, 1] and the rest; world spans both
        if gpu.rank == 0:
            with pytest.raises(AccessViolation, match=r"GPU 2 \(member 2\): it is in partition 1.*isolated"):
                gpu.world.send(np.zeros(1), 2)

    run(main, partitions=((0, 1), tuple(range(2, gpus()))))
