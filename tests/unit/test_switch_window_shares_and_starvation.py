"""An attacker's second look at the trust fixes of trust4 and fix4, in one process: a switch
driven directly (fabric.switch.SwitchLogic), as test_switch_span_order_and_costs.py and test_switch_unserved_notices.py do."""

import numpy as np
import pytest

from nvlink_emu.fabric.budget import in_switch_chunk, in_switch_window, sharp_scatter_streams, sharp_streams
from nvlink_emu.fabric.config import FabricConfig
from nvlink_emu.fabric.packets import Kind
from nvlink_emu.fabric.budget import buffer_share_bytes
from nvlink_emu.fabric.switch import SwitchLogic

from switch_helpers import ready_group, reduce_packet
from switch_helpers import Intake

MiB = 1 << 20


def _honest_sharp_window(config, n: int, itemsize: int = 4) -> tuple[int, int]:
    """(window, chunk bytes) of ranks/collectives/sharp.py's allreduce by `n` members on one node:
    Call.in_switch_window(sharp_streams), i.e. fabric.budget.in_switch_window, the same rule."""
    return in_switch_window(config, n, sharp_streams(n, 1, config.nodes, 1), 1, None, itemsize)


def _bytes_window(config, n: int, itemsize: int = 4) -> int:
    """The window the rule gave before the fix (bytes alone: share // (streams x (n - 1)) // chunk)."""
    streams = sharp_streams(n, 1, config.nodes, 1)
    chunk = in_switch_chunk(config, n, streams, 1, None, itemsize)
    return max(1, buffer_share_bytes(config) // (streams * max(1, n - 1)) // chunk)


def _fill_window(sw, n: int, window: int, chunk: int):
    """Members 0 .. n-2 of a bound group each send their `window` first chunks of an allreduce (slots
    0 .. window-1, sharp.py's (c,), result to everyone under (AR, c)); member n-1 is late (slower host:
    an honest member may be a whole window behind). The first NACK's message, or None."""
    gid = ready_group(sw, members=tuple(range(n)))
    data = np.ones(chunk // 4, np.float32)
    for c in range(window):
        for gpu in range(n - 1):
            packet, payload = reduce_packet(gid, (c,), "sum", "float32", tuple(range(n)), ("world", 0, "AR", c), data, req=c)
            for send in sw.on_packet(gpu, packet, payload):
                if send.packet.kind is Kind.NACK:
                    return f"GPU {gpu} chunk {c}: {send.packet.info.error}: {send.packet.info.message}"
    return None


@pytest.mark.parametrize("chunk_bytes", [1000, 512], ids=["1000B", "512B"])
def test_an_honest_sharp_window_of_small_chunks_fits_its_share(chunk_bytes):
    """Found in this review. The credit window of an in-switch reduction (Call.in_switch_window, the cost
    model's in_switch_chunk) lets window x streams x (n - 1) chunks be held, so that their *bytes* fit the
    partition's share; the switch also counts each held contribution at least slot_bytes (share /
    held_parts_share: 1 KiB on shares of 4 MiB and more, fix4) and bounds them to held_parts_share. A
    chunk under slot_bytes - a config's chunk_bytes of 1000 or 512 bytes (config accepts any >= 1), or
    a chunk shrunk by in_switch_chunk on a small share - gives a window the switch refuses. Measured:
    4 GPUs, one partition, switch_buffer_bytes 4 MiB (share 4 MiB, slot_bytes 1024, held_parts_share
    4096): chunk 1000 B -> window 1,398 (4,194 contributions held at most, 4,194,000 bytes: within the
    share), refused at GPU 1's chunk 1,365, the 4,097th held ("ResourceExhausted: ... each counted at least
    1024 bytes; 4096000 bytes in 4096 held, counted 4194304"); chunk 512 B -> window 2,730 (8,190 held,
    4,193,280 bytes), refused at GPU 1's chunk 1,365 too (2,097,152 bytes held, counted 4,194,304), half its
    window. An honest member that is a window behind (a slower host) makes its tenant's allreduce fail with
    ResourceExhausted: no attacker needed, but it is the bound fix4 added (and held_parts_share before it)
    against what the honest rule allows. Proposed fix: the window rule counts each contribution at
    max(chunk, share // held_parts_share) bytes (in_switch_chunk and Call.in_switch_window alike), or the
    config refuses chunk_bytes / nvls_chunk_bytes under 1 KiB and in_switch_chunk never shrinks below it.
    Fixed: the window rule (fabric.budget.in_switch_window, Call.in_switch_window's) counts each chunk at
    least fabric.budget.held_slot_bytes, as the switch counts a held one: window 1,365 for both (4,095
    held, the 1 KiB chunks' window), filled without a refusal; the switch's bounds are unchanged."""
    n = 4
    config = FabricConfig(gpus=n, mode="network", sharp=True, mtu_bytes=256, header_bytes=16, page_size_bytes=4096,
                          memory_capacity_bytes=MiB, switch_buffer_bytes=4 * MiB, chunk_bytes=chunk_bytes)
    sw = SwitchLogic(config)
    assert _bytes_window(config, n) == {1000: 1398, 512: 2730}[chunk_bytes]  # before: refused at chunk 1,365
    assert (sw.groups.slot_bytes, sw.held_parts_share) == (1024, 4096)
    window, chunk = _honest_sharp_window(config, n)
    assert (window, chunk) == (1365, chunk_bytes)
    # what the honest rule lets the switch hold fits the share in bytes and in held contributions
    assert window * (n - 1) * max(chunk, sw.groups.slot_bytes) <= sw.buffer_share_bytes
    assert window * (n - 1) <= sw.held_parts_share
    assert _fill_window(sw, n, window, chunk) is None
    assert sw.groups.held_bytes == window * (n - 1) * chunk


def test_an_honest_sharp_window_of_1_kib_chunks_fits_its_share():
    """The path that holds (no test covered it at the bound's edge): chunks of exactly slot_bytes (1 KiB on
    a 4 MiB share) fill the window, 1,365 chunks x 3 members = 4,095 held contributions, without a refusal."""
    n = 4
    config = FabricConfig(gpus=n, mode="network", sharp=True, mtu_bytes=256, header_bytes=16, page_size_bytes=4096,
                          memory_capacity_bytes=MiB, switch_buffer_bytes=4 * MiB, chunk_bytes=1024)
    sw = SwitchLogic(config)
    window, chunk = _honest_sharp_window(config, n)
    assert (window, chunk, sw.groups.slot_bytes, sw.held_parts_share) == (1365, 1024, 1024, 4096)
    assert _fill_window(sw, n, window, chunk) is None
    assert sw.groups.held_bytes == window * (n - 1) * chunk


def test_an_honest_sharp_reduce_scatter_of_48_gpus_at_its_least_window_fits_its_share():
    """Finding 1's other edge: in_switch_chunk shrinks the chunk of a big group so that `least` chunks fit
    the share in bytes, but the window cannot go under `least`: sharp.py's reduce_scatter by 48 GPUs on one
    node (streams n, least 2, share 4 MiB) has chunks of 928 B (share / (48 x 47) / 2) and window 2, so
    2 rounds x 48 blocks x 47 members = 4,512 contributions held when one member is late - past 4,096, and
    past the share counted at 1 KiB each (measured before the fix: refused at round 1's block 39, GPU 7,
    the 4,097th held). Fixed: held_parts_share covers the least window of every group size
    (fabric.budget._least_parts: 4,512 here), slot_bytes = share // it (929 B), held_parts_share = share //
    slot_bytes (4,514); the whole least window is held without a refusal."""
    n = 48
    config = FabricConfig(gpus=n, mode="network", sharp=True, mtu_bytes=256, header_bytes=16, page_size_bytes=4096,
                          memory_capacity_bytes=MiB, switch_buffer_bytes=4 * MiB)
    sw = SwitchLogic(config)
    window, chunk = in_switch_window(config, n, sharp_scatter_streams(n, 1, 1, 1), 2, None, 4)
    assert (window, chunk) == (2, 928)
    assert (sw.groups.slot_bytes, sw.held_parts_share) == (929, 4514)
    gid = ready_group(sw, members=tuple(range(n)))
    data = np.ones(chunk // 4, np.float32)
    for c in range(window):  # sharp.py's rounds: slot (j, c, j + c), result to member j under (RS, j, c)
        for j in range(n):
            for gpu in range(n - 1):  # member n - 1 is late
                packet, payload = reduce_packet(gid, (j, c, j + c), "sum", "float32", (j,), ("world", 1, j, c),
                                                data, req=c)
                for send in sw.on_packet(gpu, packet, payload):
                    assert send.packet.kind is not Kind.NACK, f"round {c} block {j} GPU {gpu}: {send.packet.info}"
    assert sw.groups.held_bytes == window * n * (n - 1) * chunk
    assert window * n * (n - 1) * sw.groups.slot_bytes <= sw.buffer_share_bytes


class _Flooded(Intake):
    """A Transport stand-in for a one-node switch rank (test_switch_span_order_and_costs.py's, whose payloads never come):
    `headers[source]` are the header messages waiting from each GPU (GPU `flooder`'s never run out: it sends
    as fast as the switch reads). `asked` records each source a poll asked for (-1: any)."""

    def __init__(self, headers, flooder, flood):
        super().__init__()
        self.headers, self.flooder, self.flood = headers, flooder, flood
        self.asked: list[int] = []

    def poll(self, source=-1, limit=None):
        self.asked.append(source)
        if source in (-1, self.flooder):
            return self.flooder, bytearray(self.flood)
        return (source, self.headers[source].pop(0)) if self.headers.get(source) else None

    def header_waiting(self, source):
        return source == self.flooder or bool(self.headers.get(source))


def _served(rank, transport, polls: int = 10_000) -> list[int]:
    """The sources of the headers `polls` of the switch rank's polls took (each taken as the rank does). The
    receivers' programs take every message as it comes: their credits (transport.send_credit) leave no
    mailbox full (ranks/switch/ holds a sender's messages past transport.MAILBOX_PEER_* not taken)."""
    transport.asked.clear()
    served = []
    for _ in range(polls):
        got = rank._poll()
        if got is not None:
            served.append(got[0])
            rank._take(*got)
            rank.mailboxes.used.clear()
    return served


def test_a_gpu_s_flood_cannot_starve_another_tenant_s_gpu_while_one_is_not_read():
    """Found in this review. ranks/switch._poll reads any GPU's header (MPI's any-source match, in arrival
    order) unless some GPU is not read now (_not_read: a GPU behind a held transfer, past MAX_QUEUED
    packets or, since fix4, past MAX_QUEUED_BYTES waiting, or past MAX_UNREAD unread answers); then it asks
    `for source in self.sources` in index order and takes the first header found, every time. A tenant
    with two GPUs, 0 and 3 (partitions (0, 3), (1, 2)), makes GPU 3 not read with 10 packets (a PUT whose
    1 MiB payload never comes, then inline frames of 4 KiB with 61.5 KiB headers: past MAX_QUEUED_BYTES,
    as tests/unit/test_switch_span_order_and_costs.py; it stays so until its deadline, timeout_s, 30 s, and may start
    again), and GPU 0 sends zero-byte MSGs to GPU 3 as fast as the switch reads them (it reads its
    answers, so it is never backlogged). Measured (a stand-in transport, GPU 1 and 2 of the other tenant each
    with a header waiting): in 10,000 polls the switch asked for GPU 0's header 10,000 times and never for
    GPU 1's or 2's; their packets stay unread until their deadlines (FabricTimeout at the honest GPU, as a
    fabric failure would be). An honest GPU held by congestion (queue[0].held) opens the same window to any
    GPU of a lower index. docs/model/trust.md ("What remains outside the model") accepts that "the switch serves GPUs
    in arrival order with no per-GPU fairness" (a flood slows everyone); this is not arrival order: a GPU
    above the flooder in index is never served while the window lasts, not slowed. Proposed fix: in _poll, start the scan after the source served last (round
    robin over self.sources), or poll any source and set a not-read GPU's header aside (MAX_KEPT-style).
    Fixed: _poll's scan starts after the source served last (round robin); after, in the same 10,000 polls
    GPU 1's and GPU 2's headers are asked for and served (each at once: the scan reaches them next)."""
    from nvlink_emu.fabric.packets import MAX_TEXT, MsgInfo, Packet
    from nvlink_emu.ranks.switch import SwitchRank
    from nvlink_emu.ranks.switch.queues import MAX_QUEUED_BYTES
    from nvlink_emu.ranks.transport import frame
    from nvlink_emu.ranks.transport.packets import INLINE_PAYLOAD_BYTES

    config = FabricConfig(gpus=4, mode="network", sharp=True, mtu_bytes=256, header_bytes=16, page_size_bytes=4096,
                          memory_capacity_bytes=MiB, partitions=((0, 3), (1, 2)))
    to3 = SwitchLogic(config).network_addresses[3]
    flood = Packet(Kind.MSG, 0, to3, 0, 0, info=MsgInfo((0,))).to_wire()
    honest = {1: [bytearray(Packet(Kind.MSG, 1, SwitchLogic(config).network_addresses[2], 0, 0,
                                   info=MsgInfo((0,))).to_wire())],
              2: [bytearray(Packet(Kind.MSG, 2, SwitchLogic(config).network_addresses[1], 0, 0,
                                   info=MsgInfo((0,))).to_wire())]}
    transport = _Flooded(honest, 0, flood)
    rank = SwitchRank(config, transport, 30.0)
    # GPU 3 not read: a PUT whose payload never comes, then frames with the longest headers behind it
    rank._take(3, bytearray(Packet(Kind.PUT, 3, rank.logic.network_addresses[0], 0, 1 << 20).to_wire()))
    big = Packet(Kind.MSG, 3, rank.logic.network_addresses[0], 0, INLINE_PAYLOAD_BYTES,
                 info=MsgInfo(tuple("x" * MAX_TEXT for _ in range(15)))).to_wire()
    sent = 1
    while 3 not in rank._not_read():
        rank._take(3, bytearray(frame(big, np.zeros(INLINE_PAYLOAD_BYTES, np.uint8))))
        sent += 1
    assert sent == 10 and rank._waiting[3].nbytes > MAX_QUEUED_BYTES
    served = _served(rank, transport)
    assert rank.logic.refused[0] == 0 and served.count(0) >= 9_990
    asked = {s: transport.asked.count(s) for s in (0, 1, 2)}
    assert asked[1] and asked[2], f"in 10,000 polls the switch asked {asked} (source: times); GPU 1's and 2's " \
                                  f"headers wait unread ({len(honest[1])}, {len(honest[2])} left)"
    assert served[:3].count(1) == served[:3].count(2) == 1 and not honest[1] and not honest[2], served[:4]


def test_an_honest_gpu_held_by_congestion_does_not_hand_the_switch_to_gpu_0():
    """Finding 2, with no GPU of the attacker not read: honest GPU 2 (partitions (0, 3), (1, 2)) sends a
    4 KiB PUT to its peer GPU 1 while GPU 1's port has its share of forwarded bytes in flight
    (port_share_bytes: the stand-in's pending_bytes_to), as a busy honest exchange does; its PUT waits
    (queue[0].held), so GPU 2 is not read, and _poll scans from GPU 0 again. Measured (stand-in
    transport): while GPU 2 is held, in 10,000 polls GPU 0's flood was served 10,000 times and GPU 1's
    waiting header was never asked for. On a real switch the window lasts while the port is congested,
    which the flood does not relieve (the flood goes to GPU 3's port). Fixed (round robin, as above): GPU 1's
    header is served within the first two polls."""
    from nvlink_emu.fabric.packets import MsgInfo, Packet
    from nvlink_emu.ranks.switch import SwitchRank

    config = FabricConfig(gpus=4, mode="network", sharp=True, mtu_bytes=256, header_bytes=16, page_size_bytes=4096,
                          memory_capacity_bytes=MiB, partitions=((0, 3), (1, 2)))
    addresses = SwitchLogic(config).network_addresses
    flood = Packet(Kind.MSG, 0, addresses[3], 0, 0, info=MsgInfo((0,))).to_wire()
    honest = {1: [bytearray(Packet(Kind.MSG, 1, addresses[2], 0, 0, info=MsgInfo((0,))).to_wire())]}
    transport = _Flooded(honest, 0, flood)
    rank = SwitchRank(config, transport, 30.0)
    transport.pending_bytes_to[1] = rank.port_share_bytes  # GPU 1's port: its share in flight
    rank._take(2, bytearray(Packet(Kind.PUT, 2, addresses[1], 0, 4096).to_wire()))
    assert rank._not_read() == {2} and rank._waiting[2][0].held
    served = _served(rank, transport)
    assert rank.logic.refused[0] == 0 and rank._not_read() == {2}
    assert 1 in served[:2] and not honest[1], served[:3]
    assert transport.asked.count(1), f"in 10,000 polls the switch asked for GPU 0's header " \
                                     f"{transport.asked.count(0)} times, GPU 1's {transport.asked.count(1)}"


def test_spans_of_two_groups_of_one_creator_leaf_in_any_order_mpi_allows_answer_both_creates():
    """The path that holds (fix4's Spanning._span_in drops a span whose group id is at most the highest this leaf
    took of that creator leaf, as a released group's: could an earlier group's span, read after a later
    one's, be dropped, and its create never answered?). 3 nodes x 2 GPUs, 2 spines: GPU 0 creates group a
    (0, 2, 4), GPU 1 group b (1, 3, 5), at once, at leaf 0; every packet between switches is delivered in
    a random order that keeps each sender's order to each receiver (MPI's), and as soon as GPU 0 hears its
    create answered it binds and releases a (its unspan racing b's spans). 200 orders: both creates
    answered, no switch raised, and afterwards no leaf holds a, each of b's members binds b at its leaf,
    no span is still due anywhere. Each spine passes on spans in the order the creator's spreads came,
    which is the creates' order (a phase-1 answer of a spine for a comes before its answer for b)."""
    import random
    from collections import deque

    from switch_helpers import Switches, group_packet
    from switch_helpers import nvlink

    for seed in range(200):
        fabric = Switches(nvlink(nodes=3, spines=2))
        leaf0, links, replies = fabric.switches[0], {}, {}

        def put(frm, sends):
            for send in sends:
                if send.switch is None:
                    assert send.packet.kind is Kind.REPLY, send.packet.info
                    if send.port in replies:  # GPU 0's bind and release answered
                        assert send.port == 0 and send.packet.info == {"group": replies[0]}, send.packet.info
                        continue
                    replies[send.port] = send.packet.info["group"]
                    if send.port == 0:  # GPU 0 binds and releases a at once
                        for action in ("bind", "release"):
                            put(0, leaf0.on_packet(0, group_packet(action, group=replies[0])))
                else:
                    links.setdefault((frm, send.switch), deque()).append(send)

        put(0, leaf0.on_packet(0, group_packet("create", members=(0, 2, 4), name="a")))
        put(0, leaf0.on_packet(1, group_packet("create", members=(1, 3, 5), name="b")))
        rng = random.Random(seed)
        while any(links.values()):
            frm, to = rng.choice([k for k, q in links.items() if q])
            send = links[(frm, to)].popleft()
            put(to, fabric.switches[to].on_switch(frm, send.packet, send.payload))
        assert set(replies) == {0, 1}, (seed, replies)
        a, b = replies[0], replies[1]
        assert all(a not in s.groups.groups for s in fabric.switches), seed
        for gpu in (1, 3, 5):
            (reply,) = fabric.switches[gpu // 2].on_packet(gpu, group_packet("bind", group=b))
            assert reply.packet.kind is Kind.REPLY and reply.packet.info == {"group": b}, (seed, reply.packet.info)
        assert not any(s.spanning._spans_due for s in fabric.switches[:3]), seed
