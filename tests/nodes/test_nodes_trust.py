"""Multi-rank, several nodes: the trust boundary holds across nodes against a GPU rank that sends
whatever it likes (the one-node attacks are tests/mpi/test_trust.py).

A workload script is arbitrary Python inside its GPU rank, so these tests reach for the rank's
internals (its transport, its packets' stamps) exactly as a hostile script could. The attacker is
GPU 0, alone in partition 0 unless a test says otherwise; the victims are in partition 1.
"""

import runpy
import time
from pathlib import Path

import numpy as np
import pytest

from nvlink_emu.fabric.counters import LinkCounters
from nvlink_emu.fabric.errors import AccessViolation
from nvlink_emu.fabric.packets import GroupInfo, Kind, McastInfo, MsgInfo, Packet, ReduceInfo, raw_bytes

from nvlink_emu.launch.report import run_summary
from nvlink_emu.ranks.session import run_fabric

from nodes_helpers import config, peak_in_flight, run, shape
from trust_helpers import lone_attacker, refusals, until

pytestmark = pytest.mark.mpi(min_size=7)
EXAMPLES = Path(__file__).resolve().parents[2] / "launch" / "examples"


def gpus() -> int:
    nodes, per_node, _ = shape()
    return nodes * per_node


def victims_transfer(gpu, data, src: int, dst: int) -> float:
    """Once the attacker is done (its traffic booked the links first), the victims' transfer of `data`
    from GPU `src` to GPU `dst`; returns this GPU's modeled clock."""
    gpu.world.allgather_object(None)
    if gpu.rank == src:
        gpu.world.send(data, dst)
    elif gpu.rank == dst:
        gpu.world.recv(data, src)
    return gpu.now_ns


def test_a_forged_stamp_cannot_book_a_shared_leaf_spine_link_for_other_tenants():
    """A GPU's packet carries its own (t_start, t_end), and the links between switches are booked with
    them: a header-only GET stamped (0, 1e15 ns) to a GPU of another node (refused there, at its Link
    TLB) booked the leaf-spine links it crossed until 1e15 ns, so another tenant's transfer over the
    same links was modeled as ending after 1e15 ns. A stamp says when a transfer left its GPU, not for
    how long: it occupies the links for its bytes' time only, and the other tenant's transfer takes its
    route's unloaded time exactly."""
    _, per_node, _ = shape()
    src, dst, nbytes = 1, per_node + 1, 1 << 20  # partition 1: node 0 -> node 1, over the attacker's spine

    def main(gpu):
        raw = gpu.raw_port()
        data = gpu.alloc(nbytes, "uint8")
        if gpu.rank == 0:
            raw.send(Packet(Kind.GET, raw.addresses[0], raw.addresses[dst], 0, 0, 1), stamp=(0.0, 1e15))
            error, = refusals(gpu, 1)
            assert isinstance(error, AccessViolation)  # refused at the target's leaf, after crossing the spine
        return victims_transfer(gpu, data, src, dst)

    result = run(main, "superpod-h100-ib", **lone_attacker(gpus()))
    if result.role == "gpu" and result.rank == dst:
        cfg = config("superpod-h100-ib")
        raw = raw_bytes(nbytes, cfg.mtu_bytes, cfg.header_bytes)
        assert result.value == pytest.approx(cfg.topology.unloaded_ns(src, dst, raw), rel=1e-12)


class _CountedRefusals(list):
    """A GPU's list of refusals that counts them and keeps none, so that its own wait never raises one."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def append(self, error) -> None:
        self.count += 1


def test_packets_a_gpu_sends_while_the_switches_end_the_run_are_refused_not_forwarded():
    """The switches agree that nothing is in flight between them (end of run), but a GPU that said DONE
    could still send: a MSG sent during the agreement's last round, or after it (once its leaf asked
    for its counters), went up to a spine that had already counted its links, and the report said byte
    conservation was broken on the leaf-spine link (the fabric's fault, not the GPU's). While the
    switches end the run, a done GPU's packets other than answers to requests are refused (on its own
    port), and a leaf is quiet only once every request it forwarded was answered."""
    _, per_node, _ = shape()
    partner = per_node  # the attacker's partition: GPU 0 and the first GPU of node 1

    def main(gpu):
        raw = gpu.raw_port()
        if gpu.rank != 0:
            return 0
        raw.refusals = sink = _CountedRefusals()
        data = gpu.alloc(4096, "uint8")

        def late():
            raw.send(Packet(Kind.MSG, raw.addresses[0], raw.addresses[partner], 0, 4096, info=MsgInfo(("late",))), data)
            gpu.poll()

        raw.transport.send(raw.switch, Packet(Kind.DONE, raw.addresses[0], -1))
        deadline = time.monotonic() + 20
        while raw.shutdown is None:  # till the switches agreed: a packet and DONE again, over and over
            late()
            raw.transport.send(raw.switch, Packet(Kind.DONE, raw.addresses[0], -1))
            assert time.monotonic() < deadline, "the switches never agreed that the run is over"
        after = 16
        for _ in range(after):  # and after they agreed
            late()
        until(gpu, lambda: sink.count >= after, f"{after} refusals after the end of run")
        return sink.count

    partitions = ((0, partner), tuple(g for g in range(gpus()) if g not in (0, partner)))
    result = run_fabric(config(partitions=partitions), main, timeout_s=30, abort_on_error=False)
    assert set(result.report["conservation"]) <= {0}  # the attacker's own count of its refused packets
    assert result.report["ports"][0]["malformed"] >= 16
    assert all(result.report["ports"][g]["refused"] == 0 for g in range(1, gpus()))


def test_a_gpu_that_stops_receiving_cannot_make_its_leaf_hold_more_than_its_port_s_share(monkeypatch):
    """On one node the switch holds a transfer bound for a port that has its share of
    switch_buffer_bytes in flight, so a GPU that does not receive costs the switch that share at most.
    Across nodes the answers come down from a spine, and the leaf takes and forwards whatever a spine
    sends (holding it would stall every tenant's traffic from that spine): GPU 0 asks its partner on
    node 1 for 48 x 1 MiB (raw GETs, all at once) and sleeps. Found in review: its leaf then held all
    48 MiB for it, three times its port's share. Now the partner's leaf stops at its credit for GPU 0's
    port (the share over the other nodes) until GPU 0's leaf credits the bytes back, and the answers
    all arrive once GPU 0 receives again."""
    from nvlink_emu.fabric.budget import port_share_bytes

    _, per_node, _ = shape()
    partner, chunk, count = per_node, 1 << 20, 48
    most = peak_in_flight(monkeypatch, 0, in_bytes=True)

    def main(gpu):
        raw = gpu.raw_port()
        window = gpu.alloc(chunk, "uint8")
        window[:] = 5
        handle = gpu.export(window, to=[0]) if gpu.rank == partner else None
        handle = gpu.world.allgather_object(handle)[partner]
        if gpu.rank == 0:
            outs = [gpu.alloc(chunk, "uint8") for _ in range(count)]
            reqs = []
            for out in outs:
                req = raw.new_request()
                raw.gets[req] = out
                raw.send(Packet(Kind.GET, raw.addresses[0], handle.network_address, handle.address, chunk, req))
                reqs.append(req)
            until(gpu, lambda: raw.transport.idle, "the GETs to leave")
            time.sleep(3.0)  # receives nothing meanwhile
            until(gpu, lambda: all(r not in raw.gets for r in reqs), "the answers")
            assert all((out == 5).all() for out in outs)
        gpu.world.barrier()

    cfg = config(partitions=((0, partner), tuple(g for g in range(gpus()) if g not in (0, partner))))
    run(main, partitions=cfg.partitions)
    peak = most()
    assert peak <= max(port_share_bytes(cfg), chunk), f"GPU 0's leaf held {peak} bytes in flight to it"


def test_a_run_longer_than_the_deadline_of_a_wait_ends_cleanly():
    """Found in review (not an attack): a spine has no GPUs, so it started the switches' end-of-run
    agreement at once, and its first round waited the deadline of one wait (timeout_s) for the leaves
    to join: any run whose GPUs worked longer than that (a bench sweep of minutes) ended with a
    FabricTimeout at the spines; and a leaf whose GPUs finished first timed out the same way on a
    node still at work. The first round waits as the one-node switch does: a spine as long as the
    leaves serve their GPUs, a leaf end_timeout_s after its GPUs finished."""
    timeout_s = 4.0
    _, per_node, _ = shape()

    def main(gpu):
        if gpu.rank >= per_node:  # node 0 finishes at once; the other nodes compute, waiting for nothing
            time.sleep(timeout_s + 2)
        return gpu.rank

    result = run(main, timeout_s=timeout_s)
    assert result.report["gpus"] == gpus()


def test_a_gpu_can_neither_pass_for_a_switch_nor_for_another_gpu_across_nodes():
    """GPU 0 (partition 0) writes into a window that GPU 1 (node 0) may write on a GPU of node 1: a PUT
    naming GPU 1 as its source, sent to its own leaf (which stamps the source from the port: refused
    at the window's leaf), and the same PUT sent straight to node 1's leaf and to every spine, as if a
    switch passed it on (a leaf takes packets from its GPUs and the spines only, a spine from the
    leaves only: dropped unread). The window holds GPU 1's bytes and nobody else's."""
    nodes, per_node, spines = shape()
    owner, friend = per_node, 1  # partition 1: node 1's first GPU exports to GPU 1 of node 0
    switches = [gpus() + 1] + [gpus() + nodes + k for k in range(spines)]  # node 1's leaf, the spines

    def main(gpu):
        raw = gpu.raw_port()
        window = gpu.alloc(4096, "uint8")
        window[:] = 0x11
        handle = gpu.export(window, to=[friend]) if gpu.rank == owner else None
        handle = gpu.world.allgather_object(handle)[owner]
        if gpu.rank == 0:
            forged = Packet(Kind.PUT, raw.addresses[friend], handle.network_address, handle.address, 4096, 1)
            bad = np.full(4096, 0xEE, np.uint8)
            for rank in switches:
                raw.transport.send_bytes(rank, forged.to_wire(), bad)
            raw.send(forged, bad)
            error, = refusals(gpu, 1)
            assert isinstance(error, AccessViolation) and "GPU 0" in str(error)
        gpu.world.barrier()
        if gpu.rank == friend:
            data = gpu.alloc(4096, "uint8")
            data[:] = 0x22
            gpu.put(handle, data)
        gpu.world.barrier()
        if gpu.rank == owner:
            assert (window == 0x22).all()

    report = run(main, **lone_attacker(gpus())).report
    assert report["ports"][0]["violations"] == 1  # the PUT through its own leaf; the others were never read
    assert all(report["ports"][g]["refused"] == 0 for g in range(1, gpus()))


@pytest.mark.parametrize("accomplice", [False, True])
def test_a_hostile_gpu_harms_nobody_in_the_other_partition_across_nodes(accomplice):
    """The fuzz tier (launch/examples/hostile_gpu.py, as tests/mpi/test_trust.py runs it) on several
    nodes: GPU 0 sends 10,000 bad packets to its leaf and straight to the victims' ranks while the
    other partition, which spans every node, runs ring, direct and auto collectives (auto's allreduce:
    in-switch, in two levels of switches), puts, gets and messages; their
    results are right, nothing of theirs was refused. With an accomplice (node 1's first GPU, in GPU 0's
    partition; 2,000 packets) the headers of sizes around the limits that a switch takes go to it,
    through a spine: those that grow on re-encode (src 0, integer times) at a GPU's limit too
    (issue 25: one ended the job at the spine)."""
    _, per_node, _ = shape()
    packets = 2_000 if accomplice else 10_000
    crew = (0, per_node) if accomplice else (0,)
    partitions = (crew, tuple(g for g in range(gpus()) if g not in crew))
    script = runpy.run_path(str(EXAMPLES / "hostile_gpu.py"))
    script["run"].__globals__["ALGORITHMS"] = ("ring", "direct", "auto")
    Path(script["_Exploit"].path).unlink(missing_ok=True)
    result = run_fabric(config(partitions=partitions), lambda gpu: script["run"](gpu, packets, seed=7 + gpus()),
                        timeout_s=60, abort_on_error=False)
    figures, report = result.value, result.report
    assert set(report["conservation"]) <= {0}  # only the attacker's own counts can be off
    ports = report["ports"]
    assert all(ports[g]["refused"] == ports[g]["violations"] == 0 for g in range(1, gpus()))
    if result.role == "gpu":
        assert figures["attacker"]["sent"] == packets and figures["attacker"]["sized"] > 0
        assert [v["wrong"] for v in figures["victims"]] == [0] * (gpus() - len(crew))
        assert min(v["rounds"] for v in figures["victims"]) >= 3
        assert ports[0]["refused"] > figures["attacker"]["to_switch"] // 2
    if accomplice:  # sized messages reached it over a spine (those under the limits), and it left them unread
        left = report["unconsumed"].get(per_node, [])
        assert sum(key[1] if key[0] == "..." else 1 for key in left) > 0, left
    assert not Path(script["_Exploit"].path).exists()


def test_refused_puts_of_a_tenant_alone_on_its_node_do_not_delay_another_tenant_across_nodes():
    """GPU 0, alone in its partition, has no window on another node it may write; on one node its
    refused PUTs cost only its own uplink. Across nodes 16 refused PUTs of 4 MiB to a GPU of node 1,
    stamped honestly, take the leaf-spine links before node 1's leaf refuses them, and the other
    tenant's transfer over the same links ends later than its route's unloaded time."""
    _, per_node, _ = shape()
    src, dst, nbytes, chunk = 1, per_node + 1, 1 << 20, 4 << 20

    def main(gpu):
        raw = gpu.raw_port()
        data = gpu.alloc(nbytes, "uint8")
        if gpu.rank == 0:
            junk = gpu.alloc(chunk, "uint8")
            for req in range(1, 17):
                raw.send(Packet(Kind.PUT, raw.addresses[0], raw.addresses[dst], 0, chunk, req), junk, at_ns=0.0)
            errors = refusals(gpu, 16)
            assert all(isinstance(e, AccessViolation) for e in errors)
        return victims_transfer(gpu, data, src, dst)

    result = run(main, "superpod-h100-ib", **lone_attacker(gpus()))
    cfg = config("superpod-h100-ib")
    expected = cfg.topology.unloaded_ns(src, dst, raw_bytes(nbytes, cfg.mtu_bytes, cfg.header_bytes))
    # the receiver's clock is the latest (its transfer ends last), and reaches every rank as elapsed_ns
    assert result.report["elapsed_ns"] == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("base", ["superpod-h100-nvlink", "superpod-a100-ib"])
def test_puts_refused_at_the_target_s_leaf_give_the_sender_s_leaf_its_credit_back(base):
    """Found in review: a PUT to a GPU of another node is checked at the target's leaf (its Link TLB,
    or a classic node's registered windows), after the sender's leaf counted its payload against its
    credit for the target's port; a refused PUT's payload never went down to the target, so its bytes
    were never credited back. An honest script that puts into a window its owner revoked (and takes
    the AccessViolation) used up its leaf's credit for that port: every later transfer of its node to
    that GPU was held for ever, here GPU 1's message (the run ended in a FabricTimeout). The target's
    leaf credits a refused payload back as soon as it refused it."""
    _, per_node, _ = shape()
    owner, nbytes = per_node, 16 << 20  # node 1's first GPU; the puts are the whole credit of its port

    def main(gpu):
        window = gpu.alloc(nbytes, "uint8")
        handle = gpu.export(window, to=[0]) if gpu.rank == owner else None
        handle = gpu.world.allgather_object(handle)[owner]
        if gpu.rank == owner:
            gpu.revoke(handle)
        gpu.world.barrier()
        if gpu.rank == 0:
            gpu.put(handle, window)
            with pytest.raises(AccessViolation):
                gpu.fence()
        gpu.world.barrier()
        message = gpu.alloc(1 << 20, "uint8")
        if gpu.rank == 1:
            message[:] = 7
            gpu.world.send(message, owner)
        elif gpu.rank == owner:
            gpu.world.recv(message, 1)
            assert (message == 7).all()
        gpu.world.barrier()

    report = run(main, base, timeout_s=10).report
    assert report["ports"][0]["violations"] >= 1
    assert all(report["ports"][g]["refused"] == 0 for g in range(1, gpus()))
    # node 0's cables up carry the refused puts and the message exactly (CREDITs are not NVLink data)
    cfg = config(base)
    expected = LinkCounters(cfg.mtu_bytes, cfg.header_bytes)
    for start in range(0, nbytes, cfg.chunk_bytes):
        expected.record("up", min(cfg.chunk_bytes, nbytes - start))
    expected.record("up", 1 << 20)
    up = [link.name for link in cfg.topology.links if link.level == "leaf-spine" and link.src == "sw0"]
    got = {field: sum(report["links"].get(name, {}).get(field, 0) for name in up)
           for field in ("payload_bytes", "raw_bytes", "packets")}
    assert got == {field: expected.snapshot()["up"][field] for field in got}


def test_a_gpu_cannot_forge_credits_between_leaves():
    """CREDIT is the leaves' own packet (through a spine): GPU 0 sends CREDITs returning 1 GiB of a
    victim's port, asking for credit, and naming no GPU at all, to its own leaf (refused as a GPU's
    packet that only switches send), and straight to node 1's leaf and every spine, as if a switch sent
    them (dropped unread: a leaf or spine that took one would miscount its credit, or end the run on the
    one naming no GPU). The other tenant's transfers between the nodes, of the credit's size, arrive."""
    nodes, per_node, spines = shape()
    src, dst = 1, per_node + 1  # partition 1: node 0 -> node 1
    switches = [gpus() + 1] + [gpus() + nodes + k for k in range(spines)]  # node 1's leaf, the spines

    def main(gpu):
        raw = gpu.raw_port()
        data = gpu.alloc(16 << 20, "uint8")
        if gpu.rank == 0:
            keys = raw.addresses
            forged = [Packet(Kind.CREDIT, keys[dst], keys[src], nbytes=1 << 30),
                      Packet(Kind.CREDIT, keys[src], keys[dst], nbytes=1 << 30),
                      Packet(Kind.CREDIT, keys[0], keys[dst]),
                      Packet(Kind.CREDIT, 12345, 54321, nbytes=1)]
            for packet in forged:
                for rank in switches:
                    raw.transport.send(rank, packet)
                raw.transport.send(raw.switch, packet)
            errors = refusals(gpu, len(forged))
            assert all("only the switch sends CREDIT" in str(e) for e in errors)
        gpu.world.barrier()
        for _ in range(3):
            data[:] = 3
            victims_transfer(gpu, data, src, dst)
            if gpu.rank == dst:
                assert (data == 3).all()
                data[:] = 0

    report = run(main, **lone_attacker(gpus())).report
    assert report["ports"][0]["malformed"] == 4
    assert all(report["ports"][g]["refused"] == 0 for g in range(1, gpus()))


def test_a_gpu_flooded_with_messages_it_never_receives_still_ends_the_run_with_its_report():
    """Found in review (a flood of zero-byte messages across nodes, which credits do not bound): a GPU
    reports the message slots it received and never consumed in its COUNTERS, and the switch takes
    lists of at most 4,096 entries in a header; GPU 0, sent 5,000 zero-byte messages by its partner on
    node 1 that it never receives, had its COUNTERS refused as malformed, and the run ended in a
    ProtocolError instead of its report. The GPU lists the first keys that fit, and a last entry
    ["...", n] counts the n it left out."""
    _, per_node, _ = shape()
    partner, count = per_node, 5000

    def main(gpu):
        gpu.world.barrier()
        if gpu.rank == partner:
            empty = np.empty(0, np.uint8)
            gpu.wait_sent([gpu.send_message(0, ("flood", i), empty) for i in range(count)], "the flood")
        gpu.world.barrier()

    report = run(main).report
    leftovers = report["unconsumed"][0]
    assert len(leftovers) <= 4096 and leftovers[-1][0] == "..."
    listed = leftovers[:-1]
    assert len(listed) + leftovers[-1][1] == count
    assert all(key[0] == "flood" and key[-1] == partner for key in listed)
    assert set(report["unconsumed"]) == {0}
    assert f"GPU 0 ended with {count} message(s) never received" in run_summary(report)


def test_a_flood_of_zero_byte_messages_keeps_a_bounded_number_of_sends_in_flight_at_the_leaf(monkeypatch):
    """Found in review: credits bound the bytes a leaf keeps in flight towards a GPU of another node, and
    a zero-byte message took none, while the leaf takes whatever a spine passes down. GPU 0's partner on
    node 1 sent it 4,000 zero-byte messages while GPU 0 slept: GPU 0's leaf kept up to 3,936 sends in
    flight to it at once (each a header, an MPI request and its bookkeeping in the leaf's memory),
    against the 1,024 unread answers past which a switch stops reading a GPU. Now every packet takes at
    least 1/1,024 of the credit, so the partner's leaf stops after 1,024 of them."""
    from nvlink_emu.ranks.switch.queues import MAX_UNREAD

    _, per_node, _ = shape()
    partner, count = per_node, 4000
    most = peak_in_flight(monkeypatch, 0)

    def main(gpu):
        gpu.world.barrier()
        if gpu.rank == partner:
            empty = np.empty(0, np.uint8)
            gpu.wait_sent([gpu.send_message(0, ("flood", i), empty) for i in range(count)], "the flood")
        if gpu.rank == 0:
            time.sleep(5.0)  # receives nothing meanwhile
        gpu.world.barrier()

    run(main)
    peak = most()
    assert peak <= 2 * MAX_UNREAD, f"GPU 0's leaf kept {peak} sends in flight to it"


def test_a_gpu_forges_no_partial_and_no_result_of_a_group_that_spans_nodes():
    """The victims' sharp allreduce runs in two levels of switches (its group in every leaf and spine).
    GPU 0, in another partition, knows the group's id and sends its leaf a contribution, a multicast
    store and a release of it (each refused there, AccessViolation naming GPU 0 and the group), and
    sends a spine's rank a forged partial, a forged result and a forged release straight, as a leaf
    would (the spine takes packets from leaves only: dropped unread). The victims' results stay right
    and none of their packets was refused."""
    n = gpus()
    spine_rank = n + shape()[0]  # the first spine, which relays a group's lifecycle between leaves

    def main(gpu):
        raw = gpu.raw_port()
        x = np.arange(4096, dtype=np.float32)
        victims = gpu.partition if gpu.rank else None
        gid = None
        if victims is not None:
            victims.allreduce(x, algorithm="sharp")
            gid = victims.group_id()
        gid = gpu.world.allgather_object(gid)[1]
        if gpu.rank == 0:
            info = ReduceInfo(gid, (0, 0), "sum", "float32", tuple(range(1, n)), ("forged", 0))
            forged = np.ones(16, np.float32).view(np.uint8)
            raw.send(Packet(Kind.REDUCE, raw.addresses[0], -1, 0, forged.nbytes, info=info), forged)
            raw.send(Packet(Kind.MCAST, raw.addresses[0], -1, 0, forged.nbytes, info=McastInfo(gid, ("forged", 1))),
                      forged)
            raw.transport.send(raw.switch, Packet(Kind.GROUP, raw.addresses[0], -1, req=99,
                                                    info=GroupInfo("release", gid, (), "")))
            transport = raw.transport
            transport.send(spine_rank, Packet(Kind.REDUCE, -1, -1, 0, forged.nbytes, info=info), forged)
            transport.send(spine_rank, Packet(Kind.MCAST, -1, -1, 0, forged.nbytes, info=McastInfo(gid, ("forged", 2))),
                           forged)
            transport.send(spine_rank, Packet(Kind.GROUP, -1, -1, info=GroupInfo("unspan", gid, (), "")))
            errors = refusals(gpu, 2)
            assert all(type(e) is AccessViolation and "GPU 0" in str(e) and f"group {gid}" in str(e) for e in errors)
            until(gpu, lambda: 99 in raw.replies, "the release's answer")
            assert raw.replies[99].info["error"] == "AccessViolation"
        gpu.world.barrier()
        if victims is not None:
            for _ in range(2):
                y = x * gpu.rank
                victims.allreduce(y, algorithm="sharp")
                assert np.array_equal(y, x * sum(range(1, n)))

    report = run(main, **lone_attacker(n)).report
    assert report["ports"][0]["refused"] == 3
    assert all(report["ports"][g]["refused"] == 0 for g in range(1, n))


def test_a_tenant_that_switches_tracing_off_leaves_out_its_own_traffic_only():
    """Found in the round-3 attack (issue 25): gpu.set_tracing(False) on GPU 0 stopped every switch's
    records, so another tenant's traffic matrix read zeros. Partition A is GPU 0 and node 1's first GPU,
    B the others (on every node). GPU 0 asks for no tracing and sends its partner 1 KiB; the partner
    answers 2 KiB; then each GPU of B sends every other one (100 + its index) bytes. Now the switches
    leave out GPU 0's own packets only: B's traffic matrix is whole, the partner's answer is there, GPU 0's
    message is not (on its own leaf and, through the spines, on node 1's)."""
    import shutil
    import tempfile

    from mpi4py import MPI

    from nvlink_emu.fabric.trace import read_directory
    from nvlink_emu.launch.traces import traffic_matrix

    _, per_node, _ = shape()
    partner, n = per_node, gpus()
    tenant_b = [g for g in range(1, n) if g != partner]
    directory = MPI.COMM_WORLD.bcast(tempfile.mkdtemp(prefix="nvlink-emu-tracing-") if MPI.COMM_WORLD.rank == 0
                                     else None)

    def main(gpu):
        if gpu.rank == 0:
            gpu.set_tracing(False)
            gpu.send_message(partner, ("a",), np.ones(1024, np.uint8))
        if gpu.rank == partner:
            got = np.empty(1024, np.uint8)
            gpu.receive_message(("a",), got, 0)  # it came after GPU 0's word, through the same switches
            gpu.send_message(0, ("b",), np.ones(2048, np.uint8))
        if gpu.rank == 0:
            gpu.receive_message(("b",), np.empty(2048, np.uint8), partner)
        gpu.world.barrier()  # no fabric bytes: a control-plane exchange
        if gpu.rank in tenant_b:
            for peer in tenant_b:
                if peer != gpu.rank:
                    gpu.send_message(peer, ("c",), np.ones(100 + gpu.rank, np.uint8))
            for peer in tenant_b:
                if peer != gpu.rank:
                    gpu.receive_message(("c",), np.empty(100 + peer, np.uint8), peer)

    try:
        run_fabric(config(partitions=((0, partner), tuple(tenant_b))), main, timeout_s=30.0, abort_on_error=False,
                   trace_dir=directory)
        MPI.COMM_WORLD.barrier()  # every rank closed its trace file
        matrix = traffic_matrix(read_directory(directory)[0])[1] if MPI.COMM_WORLD.rank == 0 else None
        matrix = MPI.COMM_WORLD.bcast(matrix)
    finally:
        MPI.COMM_WORLD.barrier()
        if MPI.COMM_WORLD.rank == 0:
            shutil.rmtree(directory, ignore_errors=True)
    expected = [[0] * n for _ in range(n + 1)]
    expected[partner][0] = 2048
    for b in tenant_b:
        for c in tenant_b:
            if b != c:
                expected[b][c] = 100 + b
    assert matrix == expected
