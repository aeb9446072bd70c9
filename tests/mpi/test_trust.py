"""Multi-rank: the trust boundary holds against a GPU rank that sends whatever it likes (issue 8).

A workload script is arbitrary Python inside its GPU rank, so these tests reach for the rank's
internals (its transport, its control channel) exactly as a hostile script could.
"""

import pickle
import time
import runpy
from pathlib import Path

import msgpack
import numpy as np
import pytest

from nvlink_emu.fabric import control
from nvlink_emu.fabric.control import MAX_CONTROL_BYTES
from nvlink_emu.fabric.counters import downlink, uplink
from nvlink_emu.fabric.errors import AccessViolation, CollectiveMismatch, FabricError, ProtocolError
from nvlink_emu.fabric.packets import MAX_KEY_PARTS, Kind, McastInfo, MsgInfo, Packet
from nvlink_emu.ranks.transport.packets import INLINE_MARK

from mpi_helpers import gpus, run
from trust_helpers import lone_attacker, refusals, until

pytestmark = pytest.mark.mpi(min_size=4)
EXAMPLES = Path(__file__).resolve().parents[2] / "launch" / "examples"


def test_packets_sent_straight_to_a_gpu_are_dropped_unread():
    """Issue 8.1 and 8.2: a header-only PUT sent straight to GPU 2's rank, naming a buffer it never
    exported, must not pair with the payload of the next legal put; a MSG claiming to come from GPU 1
    must not complete GPU 2's receive from GPU 1."""
    victim = 2

    def main(gpu):
        raw = gpu.raw_port()
        private = gpu.alloc(4096, "uint8")
        private[:] = 0x11
        window = gpu.alloc(4096, "uint8")
        handle = gpu.export(window) if gpu.rank else None
        offsets = gpu.world.allgather_object(raw.offset_of(private))
        handles = gpu.world.allgather_object(handle)
        if gpu.rank == 0:
            put = Packet(Kind.PUT, raw.addresses[1], raw.addresses[victim], offsets[victim], 4096, 1)
            raw.transport.send_bytes(victim, put.to_wire())  # its payload would be the next one to come
            raw.transport.send_bytes(victim, put.to_wire(), np.full(4096, 0xEE, np.uint8))
            spoof = Packet(Kind.MSG, raw.addresses[1], raw.addresses[victim], 0, 64, info=MsgInfo(("k",)))
            raw.transport.send_bytes(victim, spoof.to_wire(), np.full(64, 0xEE, np.uint8))
        gpu.world.barrier()
        if gpu.rank == 1:
            data = gpu.alloc(4096, "uint8")
            data[:] = 0x22
            gpu.put(handles[victim], data)
            gpu.send_message(victim, ("k",), np.full(64, 0x33, np.uint8))
        if gpu.rank == victim:
            box = np.empty(64, np.uint8)
            gpu.receive_message(("k",), box, peer=1)
            assert (box == 0x33).all()
            until(gpu, lambda: gpu.strays >= 5, "dropping the 5 stray messages")
            assert gpu.strays == 5  # three headers, two payloads
        if gpu.rank:
            gpu.partition.barrier()
        if gpu.rank == victim:
            assert (private == 0x11).all() and (window == 0x22).all()

    report = run(main, **lone_attacker(gpus())).report
    assert all(report["ports"][g]["refused"] == 0 for g in range(gpus()))  # nothing reached the switch


def test_a_reply_is_forwarded_only_if_it_answers_a_forwarded_request():
    """Issue 8.3: GPU 2 sends GET_DATA naming GPU 0's request numbers; GPU 0's get of GPU 1's window
    returns GPU 1's bytes, and every forgery is refused and counted on GPU 2's port."""
    forged = 64

    def main(gpu):
        raw = gpu.raw_port()
        window = gpu.alloc(1024, "uint8")
        window[:] = gpu.rank + 1
        handles = gpu.world.allgather_object(gpu.export(window))
        if gpu.rank == 2:
            for req in range(1, forged + 1):
                raw.send(Packet(Kind.GET_DATA, raw.addresses[2], raw.addresses[0], 0, 1024, req), np.full(1024, 0xEE, np.uint8))
            errors = refusals(gpu, forged)
            assert all(isinstance(e, AccessViolation) and "answers no request" in str(e) for e in errors)
            raw.send(Packet(Kind.PUT_ACK, raw.addresses[2], raw.addresses[0], req=1))
            assert "answers no request" in str(refusals(gpu, 1)[0])
        gpu.world.barrier()
        if gpu.rank == 0:
            got = gpu.alloc(1024, "uint8")
            gpu.get(handles[1], got)
            assert (got == 2).all()
        gpu.world.barrier()

    report = run(main).report
    assert report["ports"][2]["violations"] == forged + 1
    assert [report["ports"][g]["violations"] for g in range(gpus()) if g != 2] == [0] * (gpus() - 1)


def test_a_multicast_names_only_its_own_group_and_keys():
    """Issue 8.4: a GPU outside a sub-communicator multicasts through the world group with the
    sub-communicator's result key; the members' sharp AllReduce still returns the sum."""
    def main(gpu):
        x = np.ones(16, np.float32)
        gpu.world.allreduce(x, "sum", "sharp")  # the world group exists and is bound
        sub = gpu.world.split(0 if gpu.rank < 2 else None)
        name = gpu.world.allgather_object(sub.name if sub else None)[0]
        if gpu.rank == 2:
            world_group = gpu.world.group_id()
            for parts in ((0, 0), (0, 1)):  # sharp allreduce's result slots of the sub's first call
                gpu.switch_request(Kind.MCAST, McastInfo(world_group, (name, 0, *parts)),
                                   np.full(16, 999, np.float32))
            errors = refusals(gpu, 2)
            assert all(isinstance(e, AccessViolation) and "is not one of group" in str(e) for e in errors)
        gpu.world.barrier()
        if sub is not None:
            y = np.full(16, 1 + sub.rank, np.float32)
            sub.allreduce(y, "sum", "sharp")
            assert (y == 3).all()
        gpu.world.barrier()

    report = run(main).report
    assert report["ports"][2]["violations"] == 2


def test_freeing_an_empty_allocation_frees_only_it_and_a_second_free_is_refused():
    """Issue 8.5: free(alloc(0)) freed the allocation at offset 0, so the next alloc aliased a live array."""
    def main(gpu):
        empty = gpu.alloc(0, "float32")
        live = gpu.alloc(16, "uint8")
        live[:] = 7
        gpu.free(empty)
        fresh = gpu.alloc(16, "uint8")
        fresh[:] = 1
        assert (live == 7).all()
        with pytest.raises(FabricError, match="not a live allocation"):
            gpu.free(empty)
        gpu.free(live)
        with pytest.raises(FabricError, match="not a live allocation"):
            gpu.free(live)
        with pytest.raises(FabricError, match="not a live allocation"):
            gpu.free(fresh[4:])  # a view is not the allocation
        gpu.free(fresh)

    run(main)


def test_malformed_packets_are_refused_and_the_switch_serves_the_other_tenant():
    """Issue 8.6: a PUT claiming 2**40 bytes and a REDUCE without its fields crashed the switch; now
    they are refused (ProtocolError back to the sender, counted on its port) while the GPUs of the
    other partition run their AllReduce."""
    def main(gpu):
        raw = gpu.raw_port()
        if gpu.rank == 0:
            me = raw.addresses[0]
            raw.transport.send_bytes(gpu.size, Packet(Kind.PUT, me, raw.addresses[1], 0, 2 ** 40, 1).to_wire(),
                                      np.zeros(16, np.uint8))
            header = msgpack.unpackb(Packet(Kind.GET, me, -1).to_wire())
            header[0] = int(Kind.REDUCE)  # a REDUCE with no record at all
            raw.transport.send_bytes(gpu.size, msgpack.packb(header))
            errors = refusals(gpu, 2)
            assert all(isinstance(e, ProtocolError) for e in errors)
            texts = " | ".join(map(str, errors))
            assert "REDUCE header: its record needs 6 fields" in texts
            assert f"{2 ** 40} bytes is more than a GPU's" in texts
        else:
            x = np.full(1 << 16, gpu.rank, np.float32)
            gpu.partition.allreduce(x, "sum", "sharp")
            assert (x == sum(range(1, gpu.size))).all()

    report = run(main, **lone_attacker(gpus())).report
    assert report["ports"][0]["malformed"] == 2 and report["ports"][0]["refused"] == 2
    assert all(report["ports"][g]["refused"] == 0 for g in range(1, gpus()))


def test_forged_inline_frames_are_refused_before_anything_is_forwarded():
    """A payload of at most 4 KiB travels in its header's message (ranks.transport's inline frames): the
    switch still checks the header before it takes the payload, sizes the payload by what arrived, and
    refuses a frame whose lengths do not add up, while the other tenant's small AllReduce (inline
    frames too) runs."""
    def main(gpu):
        raw = gpu.raw_port()
        if gpu.rank == 0:
            me, switch = raw.addresses[0], gpu.size
            transport = raw.transport
            transport.send_bytes(switch, Packet(Kind.PUT, me, raw.addresses[1], 0, 2 ** 40, 1).to_wire(),
                                 np.zeros(16, np.uint8), inline=True)
            transport.send_bytes(switch, Packet(Kind.MSG, me, raw.addresses[1], 0, 64, 2, MsgInfo(("k",))).to_wire(),
                                 np.zeros(32, np.uint8), inline=True)
            transport.send_bytes(switch, Packet(Kind.GET, me, raw.addresses[1], 0, 64, 3).to_wire(),
                                 np.zeros(8, np.uint8), inline=True)
            transport.send_bytes(switch, bytes([INLINE_MARK]) + (1000).to_bytes(4, "little") + b"x" * 10)
            errors = refusals(gpu, 4)
            assert all(isinstance(e, ProtocolError) for e in errors)
            texts = " | ".join(map(str, errors))
            assert f"{2 ** 40} bytes is more than a GPU's" in texts
            assert "header says 64 bytes, 32 came" in texts
            assert "GET from GPU 0: its header carries no payload, 8 bytes came with it" in texts
            assert "an inline frame of 15 bytes says its header has 1000" in texts
        else:
            x = np.full(256, gpu.rank, np.float32)
            gpu.partition.allreduce(x, "sum", "ring")
            assert (x == sum(range(1, gpu.size))).all()

    report = run(main, **lone_attacker(gpus())).report
    assert report["ports"][0]["malformed"] == 4 and report["ports"][0]["refused"] == 4
    assert all(report["ports"][g]["refused"] == 0 for g in range(1, gpus()))
    assert report["links"][uplink(0)]["payload_bytes"] == 0  # nothing of GPU 0's was taken on its link
    assert report["links"][downlink(0)]["payload_bytes"] == 0  # nothing went anywhere: only its NACKs came back


def test_put_and_get_beyond_the_64_bit_space_are_typed_errors_and_leave_nothing_pending():
    def main(gpu):
        window = gpu.alloc(256, "uint8")
        handles = gpu.world.allgather_object(gpu.export(window))
        data = gpu.alloc(16, "uint8")
        for offset in (2 ** 64, 2 ** 64 - 8, 2 ** 70):
            with pytest.raises(AccessViolation, match="outside the 64-bit address space"):
                gpu.put(handles[(gpu.rank + 1) % gpu.size], data, offset=offset)
            with pytest.raises(AccessViolation, match="outside the 64-bit address space"):
                gpu.get(handles[(gpu.rank + 1) % gpu.size], data, offset=offset)
        gpu.world.barrier()  # no put was left pending: the barrier's fence does not wait

    run(main, timeout_s=10)


@pytest.mark.parametrize("other", ["barrier", "allgather_object", "split"])
def test_a_communicator_stays_usable_after_a_caught_mismatch(other):
    """A member's barrier (or allgather_object, or split) met by the others' AllReduce is a
    CollectiveMismatch on every member; after it, every member's next calls match again."""
    def main(gpu):
        x = np.ones(8, np.float32)
        with pytest.raises(CollectiveMismatch):
            if gpu.rank == 0:
                getattr(gpu.world, other)(*{"barrier": (), "allgather_object": (1,), "split": (0,)}[other])
            else:
                gpu.world.allreduce(x)
        x[:] = 1
        gpu.world.allreduce(x)
        assert (x == gpu.size).all()
        sub = gpu.world.split(0)
        names = gpu.world.allgather_object(sub.name)
        assert len(set(names)) == 1  # every member names the new communicator alike
        sub.allreduce(x)
        assert (x == gpu.size ** 2).all()

    run(main, timeout_s=20)


def test_export_arguments_of_the_wrong_type_are_typed_errors():
    def main(gpu):
        b = gpu.alloc(64, "uint8")
        for kwargs, text in [({"writable": "no"}, "writable='no': must be True or False"),
                             ({"readable": 1}, "readable=1: must be True or False"),
                             ({"to": []}, "nobody may use"),
                             ({"to": "01"}, "GPU indices must be integers"),
                             ({"to": [gpu.size]}, "not a GPU")]:
            with pytest.raises(FabricError, match=text):
                gpu.export(b, **kwargs)
        gpu.free(b)  # nothing was exported

    run(main)


def test_a_poisoned_control_message_runs_nothing_and_is_dropped():
    """The control channel unpickled whatever a peer sent: a pickle that runs code ran it."""
    script = runpy.run_path(str(EXAMPLES / "hostile_gpu.py"))
    exploit = script["_Exploit"]
    Path(exploit.path).unlink(missing_ok=True)

    def main(gpu):
        raw = gpu.raw_port()
        if gpu.rank == 0:
            raw.control_channel.send_bytes(1, pickle.dumps(exploit()))
            raw.control_channel.send_bytes(1, pickle.dumps(("world", 0, "x", "extra")))
            raw.control_channel.send_bytes(1, b"\x80\x05garbage")
        if gpu.rank == 1:
            until(gpu, lambda: gpu.strays >= 3, "dropping 3 poisoned control messages")
        gpu.world.barrier()
        assert not Path(exploit.path).exists()

    run(main)


def test_a_hostile_gpu_harms_nobody_in_the_other_partition():
    """The fuzz tier: GPU 0 sends 10,000 bad packets (launch/examples/hostile_gpu.py) while the
    other partition works; their results are all right, their memory changed only by their own
    writes, nothing of theirs was refused, and the switch served to the end."""
    packets = 10_000
    script = runpy.run_path(str(EXAMPLES / "hostile_gpu.py"))
    Path(script["_Exploit"].path).unlink(missing_ok=True)
    result = run(lambda gpu: script["run"](gpu, packets, seed=gpus()), timeout_s=60, trusted=False, **lone_attacker(gpus()))
    figures, report = result.value, result.report
    if result.role == "switch":
        return
    attacker = figures["attacker"]
    assert attacker["sent"] == packets and attacker["sized"] > 0  # some of them sized around every limit
    assert [v["wrong"] for v in figures["victims"]] == [0] * (gpus() - 1)
    assert min(v["rounds"] for v in figures["victims"]) >= 3
    ports = report["ports"]
    assert ports[0]["refused"] > attacker["to_switch"] // 2  # most of the attack reached the switch and was refused
    assert all(ports[g]["refused"] == ports[g]["violations"] == 0 for g in range(1, gpus()))
    assert set(report["conservation"]) <= {0}  # only the attacker's own counts can be off
    assert not Path(script["_Exploit"].path).exists()
    print(f"hostile GPU: {attacker}, switch refused {ports[0]['refused']} ({ports[0]['malformed']} malformed)")


def test_a_message_with_the_longest_key_left_unreceived_ends_the_run_cleanly():
    """Found by the fuzz tier's sized headers (issue 25): a message whose key has MAX_KEY_PARTS parts, the
    most a MSG may have, left in a GPU's mailbox at the end: its COUNTERS listed it with its sender, one
    part too many, so the switch refused them and the GPU's end of run raised ProtocolError (the job
    ended with an error after every GPU finished). Its last parts are shown as "..." now."""
    key = tuple(f"k{i}" for i in range(MAX_KEY_PARTS))

    def main(gpu):
        if gpu.rank == 1:
            gpu.send_message(2, key, np.ones(8, np.uint8))
        gpu.world.barrier()
        if gpu.rank == 2:
            until(gpu, lambda: gpu.raw_port().mailbox, "the message")

    report = run(main).report
    assert report["unconsumed"][2] == [[*key[:MAX_KEY_PARTS - 2], "...", 1]]
    assert all(port["refused"] == 0 for port in report["ports"].values())


def test_control_messages_too_long_undecodable_or_from_non_members_are_dropped():
    """Found in review: the control channel took any size from anyone and kept non-members' messages
    for ever, and its unpickler could be made to build huge objects from a few bytes. Control objects
    are msgpack now (fabric.control): the bombs are a message claiming an array of 10**8 float64s in
    no bytes, and a pickle (never run)."""
    bombs = [msgpack.packb(msgpack.ExtType(control._ARRAY, msgpack.packb(["<f8", [10 ** 8], b""]))),
             pickle.dumps(np.zeros(3))]

    def main(gpu):
        raw = gpu.raw_port()
        if gpu.rank == 0:
            raw.control_channel.send_bytes(1, b"\x00" * (MAX_CONTROL_BYTES + 1))  # too long: dropped unread
            for bomb in bombs:
                raw.control_channel.send_bytes(1, bomb)
            for seq in range(50):  # well-formed, but GPU 0 is no member of partition 1's communicator
                raw.control_channel.send(1, ("partition1", seq, ("barrier", 0.0)))
        if gpu.rank == 1:
            until(gpu, lambda: gpu.strays >= 53, "dropping 53 control messages")
            assert gpu.strays == 53 and not [key for key in raw.control_box if key[2] == 0]
        if gpu.rank:
            gpu.partition.barrier()

    run(main, **lone_attacker(gpus()))


def test_a_member_cannot_park_objects_as_credits_in_another_tenant_s_gpu():
    """Found in the round-4 attack (F2, /tmp/attack/a9.py): GPU 0 sent GPU 3 of another partition 40
    control messages (world's name, a credit's number, 4 MiB of bytes); GPU 3 filed each as a sharp reduce
    credit of world (both are members) and kept them for ever: RSS 59 -> 236 MiB. Now a credit is kept
    only if it has a credit's shape (("credit", count)) and its number is within MAX_CONTROL_WAITING of the
    next one GPU 1 takes of GPU 0: 10 blobs, 5 credits numbered too far, 5 malformed credits are strays;
    one well-formed credit, the next due, is kept."""
    from nvlink_emu.ranks.comm import CREDIT_SEQ
    from nvlink_emu.ranks.control import MAX_CONTROL_WAITING

    def main(gpu):
        raw = gpu.raw_port()
        name = gpu.world.name
        if gpu.rank == 0:
            for seq in range(10):
                raw.control_channel.send(1, (name, CREDIT_SEQ - 1 - seq, b"W" * (16 << 10)))
            for seq in range(5):
                raw.control_channel.send(1, (name, CREDIT_SEQ - MAX_CONTROL_WAITING - seq, ("credit", 1)))
            for bad in (("credit", -1), ("credit", 1.5), ("credit",), ("credit", 1, 2), ["credit", 1]):
                raw.control_channel.send(1, (name, CREDIT_SEQ - 2, bad))
            raw.control_channel.send(1, (name, CREDIT_SEQ, ("credit", 3)))
        if gpu.rank == 1:
            until(gpu, lambda: gpu.strays + len(raw.control_box) >= 21, "filing 21 control messages")
            assert gpu.strays == 20 and raw.control_box == {(name, CREDIT_SEQ, 0): ("credit", 3)}
            gpu.control.take(name, CREDIT_SEQ, 0)
        if gpu.rank:
            gpu.partition.barrier()

    run(main, **lone_attacker(gpus()))


def test_a_control_message_longer_than_any_point_to_point_one_is_dropped_unread():
    """Found in the round-4 attack (F1, /tmp/attack/a1.py): GPU 0 kept 16 undecodable 8 MiB control
    messages in flight to GPU 1 of another partition; each was received in full and copied before its
    decode failed (up to 16 MiB each), and partition 1's 64 KiB allreduce took 367 ms (median) against
    14 ms. Now a control message past MAX_P2P_CONTROL_BYTES (64 KiB: credits and "where are you?" carry
    a name and a few numbers) is dropped unread: GPU 1 reads GPU 0's well-formed object of one byte more
    as nothing (source, None), and the next, just short enough, whole."""
    from nvlink_emu.ranks.transport.channels import MAX_P2P_CONTROL_BYTES

    def blob(nbytes):  # a msgpack bytes object `nbytes` long, its header (3 or 5 bytes) included
        data = msgpack.packb(b"x" * (nbytes - 3), use_bin_type=True)
        return data if len(data) == nbytes else msgpack.packb(b"x" * (nbytes - 5), use_bin_type=True)

    assert len(blob(MAX_P2P_CONTROL_BYTES)) == MAX_P2P_CONTROL_BYTES

    ready = 999  # a tag of this test's own: GPU 1 waits in its loop below, where nothing else takes them

    def main(gpu):
        raw = gpu.raw_port()
        comm = raw.control_channel.comm
        if gpu.rank == 0:
            deadline = time.monotonic() + 10.0
            while not comm.Iprobe(1, ready):  # no progress here: nothing of GPU 0's drops it meanwhile
                assert time.monotonic() < deadline, "GPU 0: GPU 1 did not get ready"
            comm.recv(source=1, tag=ready)
            raw.control_channel.send_bytes(1, blob(MAX_P2P_CONTROL_BYTES + 1))
            raw.control_channel.send_bytes(1, blob(MAX_P2P_CONTROL_BYTES))
            until(gpu, lambda: raw.control_channel.idle, "the two control messages to go")
        if gpu.rank == 1:
            comm.send(None, 0, ready)
            got, deadline = [], time.monotonic() + 10.0
            while len(got) < 2:  # straight from the channel: no sweep takes them first
                assert time.monotonic() < deadline, f"GPU 1: the two control messages did not come: {got!r:.200}"
                message = raw.control_channel.poll()
                if message is not None:
                    got.append(message)
            assert got == [(0, None), (0, b"x" * (MAX_P2P_CONTROL_BYTES - 3))]
        if gpu.rank:
            gpu.partition.barrier()

    run(main, **lone_attacker(gpus()))


def test_raw_mpi_messages_around_the_fabric_are_swept_and_counted():
    """Issue 25.2: GPU 0, alone in its partition, floods GPU 1 of the other partition with small raw MPI
    messages on every MPI communicator they share: the run's own (MPI_COMM_WORLD), the GPU ranks' control
    channel under another tag, and world's members' two communicators under another tag and under the
    exchanges' own tag. Nothing swept them: the victims' allreduces crawled and GPU 1's memory grew. Each is
    dropped and counted in gpu.strays, but for one exchange slot kept on world's communicator (the next world
    exchange's, if it were one); what waits afterwards is nothing."""
    from mpi4py import MPI

    from nvlink_emu.ranks.transport.packets import TAG_EXCHANGE
    each, victim = 500, 1

    def main(gpu):
        if gpu.rank == 0:
            junk = np.zeros(64, np.uint8)
            world = gpu.world._mpi
            floods = [(MPI.COMM_WORLD, 5), (gpu.raw_port().control_channel.comm, 99), (world.comm, 77), (world.groups, 77),
                      (world.comm, TAG_EXCHANGE)]
            sends = [comm.Isend([junk, MPI.BYTE], victim, tag) for comm, tag in floods for _ in range(each)]
            sends += [MPI.COMM_WORLD.Isend([junk, MPI.BYTE], gpu.size, 5) for _ in range(each)]  # the switch's too
            gpu.wait(lambda: MPI.Request.Testall(sends), "the flood", "MPI")
            return None
        flag, rounds, start = np.zeros(1, np.float32), 0, time.monotonic()
        while True:
            flag[:] = gpu.rank == victim and gpu.strays >= 5 * each - 1
            gpu.partition.allreduce(flag, "max")
            rounds += 1
            if flag[0]:
                break
            assert time.monotonic() - start < 60, f"GPU {gpu.rank}: the flood not swept after {rounds} allreduces"
        if gpu.rank == victim:
            assert gpu.strays == 5 * each - 1
            kept = gpu.world._mpi.kept
            assert list(kept[0]) == [0] and kept[1] == {}
            assert not any(comm.Iprobe(0, MPI.ANY_TAG) for comm in (MPI.COMM_WORLD, gpu.raw_port().control_channel.comm,
                                                                     gpu.world._mpi.comm, gpu.world._mpi.groups))
        return rounds / (time.monotonic() - start)

    result = run(main, timeout_s=90, **lone_attacker(gpus()))
    if result.role == "gpu" and result.rank:
        assert result.value > 5, f"{result.value:.1f} allreduces a second during the flood"  # a loose sanity bound


def test_a_mailbox_holds_a_bounded_backlog_per_sender_and_the_sender_waits():
    """Issue 25.8: GPU 1 floods GPU 2, of its own partition, with messages GPU 2's program does not take
    while it serves the fabric: they all went into its mailbox (60 -> 702 MiB). The switch forwards a
    sender's messages to a GPU of its node until MAILBOX_PEER_BYTES or MAILBOX_PEER_MESSAGES of them wait
    untaken, then holds the sender's next (its sends stay incomplete); once GPU 2 takes them, every message
    arrives, intact and in order. Two GPUs each sending the other past the bounds, then taking all, finish."""
    from nvlink_emu.ranks.transport.packets import MAILBOX_PEER_BYTES, MAILBOX_PEER_MESSAGES
    mib = 1 << 20
    big = MAILBOX_PEER_BYTES // mib + 16  # 1 MiB messages: the byte bound holds the last 16
    small = MAILBOX_PEER_MESSAGES + 476   # empty messages: the count bound holds the last 476

    def waiting(gpu, peer):
        slots = [slot for slot in gpu.raw_port().mailbox if slot[1] == peer]
        return len(slots), sum(gpu.raw_port().mailbox[slot].nbytes for slot in slots)

    def main(gpu):
        for tag, count, size in (("big", big, mib), ("small", small, 0)):
            fits = count - (16 if size else 476)
            if gpu.rank == 1:
                sends = [gpu.send_message(2, (tag, i), np.full(size, i % 251, np.uint8)) for i in range(count)]
                until(gpu, lambda: sum(map(gpu.raw_port().transport.sent, sends)) >= fits, "the switch to take what fits",
                      timeout_s=30)
                for _ in range(500):  # serve on
                    gpu.poll()
                if size:  # the payload of the first message past the bound is not taken: the sender waits
                    assert sum(map(gpu.raw_port().transport.sent, sends)) == fits
            if gpu.rank == 2:
                until(gpu, lambda: waiting(gpu, 1)[0] >= fits, f"{fits} messages in the mailbox", timeout_s=30)
                for _ in range(500):  # serve on: nothing more comes in
                    gpu.poll()
                assert waiting(gpu, 1) == (fits, fits * size)
            gpu.world.barrier()
            if gpu.rank == 2:
                for i in range(count):
                    got = gpu.take_message((tag, i), 1, "receive", "GPU 1")
                    assert got.nbytes == size and (got == i % 251).all()
            if gpu.rank == 1:
                gpu.wait_sent(sends, "the flood")
        if gpu.rank in (1, 2):  # both past the bound at once, then both take: MPI's isend, then recv
            other = 3 - gpu.rank
            sends = [gpu.send_message(other, ("both", i), np.full(mib, i % 251 + gpu.rank, np.uint8)) for i in range(big)]
            for i in range(big):
                got = gpu.take_message(("both", i), other, "receive", f"GPU {other}")
                assert (got == i % 251 + other).all()
            gpu.wait_sent(sends, "the exchange")
        gpu.world.barrier()

    run(main, timeout_s=60)


def test_a_backlog_past_the_mailbox_bound_holds_only_that_pairs_later_messages():
    """Issue 25.8: the switch held a sender's message past the mailbox bound in the sender's in-order queue,
    so everything the sender sent later waited behind it: its collectives' messages, its messages to other
    GPUs. Legal MPI programs then deadlocked: GPU 0 isends more than MAILBOX_PEER_MESSAGES messages to GPU 1,
    then every GPU runs a ring allreduce (GPU 0's ring messages go to GPU 1: a collective's messages have a
    bound of their own) and a barrier, then GPU 0 sends GPU 2 a message, which GPU 2 receives, and GPU 1 one
    of another tag, which GPU 1 receives before the backlog, then the backlog, in order (then 8 messages of
    1 MiB behind it, whose sends stay incomplete). A held message now holds only the later messages of its
    pair and class, and a message the receiver's program waits for goes whatever the bounds."""
    from nvlink_emu.ranks.transport.packets import MAILBOX_PEER_MESSAGES
    count = MAILBOX_PEER_MESSAGES + 76
    mib = 1 << 20
    big = 8  # then 1 MiB messages: held (parked) too, their payloads wait with the sender

    def main(gpu):
        world = gpu.world
        sends = bigs = []
        if gpu.rank == 0:
            sends = [world._post_send(np.full(8, i % 251, np.uint8), 1, 5) for i in range(count)]
            bigs = [world._post_send(np.full(mib, i, np.uint8), 1, 4) for i in range(big)]
        total = np.full(1024, gpu.rank + 1, np.float32)
        world.allreduce(total, algorithm="ring")
        assert (total == sum(range(1, world.size + 1))).all()
        world.barrier()
        if gpu.rank == 0:  # the held ones' payloads wait with their sender, as before: their sends are not done
            for _ in range(500):
                gpu.poll()
            assert not any(map(gpu.raw_port().transport.sent, bigs))
            world.send(np.full(16, 7, np.uint8), 2, 6)
            world.send(np.full(16, 9, np.uint8), 1, 7)  # another tag, behind the backlog to GPU 1
        if gpu.rank == 2:
            got = np.empty(16, np.uint8)
            world.recv(got, 0, 6)
            assert (got == 7).all()
        if gpu.rank == 1:  # received first: it goes past the bound (GPU 1's program waits for it)
            got = np.empty(16, np.uint8)
            world.recv(got, 0, 7)
            assert (got == 9).all()
        world.barrier()
        if gpu.rank == 1:
            got = np.empty(8, np.uint8)
            for i in range(count):
                world.recv(got, 0, 5)
                assert (got == i % 251).all()
            got = np.empty(mib, np.uint8)
            for i in range(big):
                world.recv(got, 0, 4)
                assert (got == i).all()
        if gpu.rank == 0:
            gpu.wait_sent(sends + bigs, "the backlog")
        world.barrier()

    run(main, timeout_s=30)
