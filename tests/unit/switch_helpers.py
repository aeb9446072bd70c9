"""Helpers shared by the switch-logic unit tests: packet builders, control calls, answer checks."""

import numpy as np

from nvlink_emu.fabric.addressing import Handle
from nvlink_emu.fabric.config import FabricConfig, preset
from nvlink_emu.fabric.packets import ExportInfo, GroupInfo, Kind, McastInfo, MsgInfo, Packet, ReduceInfo, raw_bytes, segments
from nvlink_emu.fabric.switch import SpineLogic, SwitchLogic

MTU, HEADER, PAGE = 256, 16, 4096
MEMORY = 1 << 20


def network(gpus=4, **kw):
    """A network-mode SHARP switch with small, round numbers (MTU 256, header 16, page 4 KiB, 1 MiB per GPU)."""
    settings = dict(gpus=gpus, mode="network", sharp=True, mtu_bytes=MTU, header_bytes=HEADER,
                    page_size_bytes=PAGE, memory_capacity_bytes=MEMORY)
    return SwitchLogic(FabricConfig(**{**settings, **kw}))


def link(payload, times=1, mtu=MTU, header=HEADER):
    """Counters of one link that carried `times` transfers of `payload` bytes each."""
    return {"payload_bytes": payload * times, "raw_bytes": raw_bytes(payload, mtu, header) * times,
            "packets": segments(payload, mtu) * times, "busy_ns": 0.0}  # busy time is kept by the GPU end


def payload_for(packet):
    """The uint8 bytes a sender hands the transport beside `packet`'s header (None for header-only kinds)."""
    if not packet.kind.has_payload:
        return None
    return (np.arange(packet.nbytes) % 251).astype(np.uint8)


def put(src, dst, address, nbytes, req=0):
    """A PUT header and the bytes that travel beside it."""
    packet = Packet(Kind.PUT, src, dst, address, nbytes, req=req)
    return packet, payload_for(packet)


def msg(src, dst, nbytes, req=0, key=(0,)):
    """A MSG header (MsgInfo) and its bytes."""
    packet = Packet(Kind.MSG, src=src, dst=dst, nbytes=nbytes, req=req, info=MsgInfo(tuple(key)))
    return packet, payload_for(packet)


def only_nack(sends, port, req):
    """The one NACK in `sends`, to `port`, answering request `req`, with no payload."""
    assert len(sends) == 1
    send = sends[0]
    assert send.port == port and send.packet.kind is Kind.NACK and send.packet.req == req
    assert send.payload is None
    return send.packet


def only_reply(sw, sends, port, req):
    """The info of the one REPLY in `sends`, to `port`, answering request `req`, with no payload."""
    assert len(sends) == 1
    send = sends[0]
    reply = send.packet
    assert send.port == port and send.payload is None
    assert reply.kind is Kind.REPLY and reply.req == req and reply.dst == sw.route_key(port) and reply.src == -1
    return reply.info


def export(sw, gpu, phys_offset=8192, size=4096, req=1, to=None, writable=True, readable=True):
    """EXPORT from `gpu`; returns the REPLY's info."""
    info = ExportInfo(phys_offset, size, None if to is None else tuple(to), writable, readable)
    return only_reply(sw, sw.on_packet(gpu, Packet(Kind.EXPORT, src=0, dst=-1, req=req, info=info)), gpu, req)


def handle_of(info):
    return Handle(*info["handle"])


def group_call(sw, gpu, req=1, action="create", group=0, members=(), name=""):
    """A GROUP control packet from `gpu`; returns the REPLY's info."""
    info = GroupInfo(action, group, tuple(members), name)
    return only_reply(sw, sw.on_packet(gpu, Packet(Kind.GROUP, src=0, dst=-1, req=req, info=info)), gpu, req)


def ready_group(sw, members=(0, 1, 2, 3), name="world"):
    """Create (by the first member, for communicator `name`) and bind (by every member) a group; its id."""
    gid = group_call(sw, members[0], action="create", members=members, name=name)["group"]
    for gpu in members:
        assert group_call(sw, gpu, action="bind", group=gid) == {"group": gid}
    return gid


def reduce_packet(gid, slot, op, dtype, dest, key, data, req=0):
    """A REDUCE as Call.reduce sends it (ReduceInfo); payload = the data's bytes."""
    payload = np.ascontiguousarray(data).view(np.uint8)
    info = ReduceInfo(gid, tuple(slot), op, dtype, tuple(dest), tuple(key))
    return Packet(Kind.REDUCE, src=0, dst=-1, nbytes=payload.nbytes, req=req, info=info), payload


def mcast_packet(gid, key, payload, req=0):
    """A multicast store through group `gid` (McastInfo), as Call.multicast sends it."""
    return Packet(Kind.MCAST, src=0, dst=-1, nbytes=payload.nbytes, req=req, info=McastInfo(gid, tuple(key))), payload


class Fabric:
    """Every switch of `config` in one process; `gpu(g, packet, payload)` hands GPU g's packet to its leaf
    and passes the switches' sends between them until only sends to GPUs are left, which it returns."""

    def __init__(self, config):
        self.config = config
        n = config.nodes
        self.switches = [SwitchLogic(config, k) for k in range(n)] + \
                        [SpineLogic(config, n + i) for i in range(config.spines)]
        self.hops: list[tuple[int, int, Packet]] = []  # (from switch, to switch, packet), in order

    def gpu(self, g: int, packet: Packet, payload=None) -> list:
        leaf = g // self.config.gpus_per_node
        return self.flow(leaf, self.switches[leaf].on_packet(g, packet, payload))

    def flow(self, here: int, sends: list) -> list:
        out, queue = [], [(here, send) for send in sends]
        while queue:
            frm, send = queue.pop(0)
            if send.switch is None:
                out.append(send)
                continue
            self.hops.append((frm, send.switch, send.packet))
            got = self.switches[send.switch].on_switch(frm, send.packet, send.payload)
            queue += [(send.switch, s) for s in got]
        return out

    def call(self, g: int, action: str, group: int = 0, members=(), name: str = "") -> dict:
        sends = self.gpu(g, Packet(Kind.GROUP, 0, -1, req=7, info=GroupInfo(action, group, tuple(members), name)))
        assert len(sends) == 1 and sends[0].packet.kind is Kind.REPLY and sends[0].port == g
        return sends[0].packet.info

    def group(self, members, name: str = "c") -> int:
        gid = self.call(members[0], "create", members=members, name=name)["group"]
        for g in members:
            assert self.call(g, "bind", gid) == {"group": gid}
        return gid

    def reduce(self, g: int, gid: int, slot, data: np.ndarray, dest, key, op="sum") -> list:
        info = ReduceInfo(gid, tuple(slot), op, data.dtype.name if data.dtype.name != "bfloat16" else "bfloat16",
                          tuple(dest), tuple(key))
        payload = data.view(np.uint8).ravel()
        return self.gpu(g, Packet(Kind.REDUCE, 0, -1, 0, payload.nbytes, info=info, t_start=0.0, t_end=0.0), payload)


def nvlink(nodes=2, per_node=2, spines=2, **kw):
    return preset("superpod-h100-nvlink", nodes=nodes, gpus=nodes * per_node, spines=spines, **kw)


def group_packet(action, group=0, members=(), name=""):
    return Packet(Kind.GROUP, 0, -1, req=7, info=GroupInfo(action, group, tuple(members), name))


class Switches:
    """Every switch of `config`; `send(frm, s)` hands switch `frm`'s Send `s` to its switch and returns
    what that one sends (not passed on: the test picks the order)."""

    def __init__(self, config):
        n = config.nodes
        self.config = config
        self.switches = [SwitchLogic(config, k) for k in range(n)] + \
                        [SpineLogic(config, n + i) for i in range(config.spines)]

    def send(self, frm, send):
        return [(send.switch, s) for s in self.switches[send.switch].on_switch(frm, send.packet, send.payload)]

    def flow(self, pending, hold=lambda frm, send: False):
        """Deliver `pending` [(from switch, Send)] and everything they cause, but the sends `hold` keeps
        back (returned, with the sends to GPUs)."""
        held, to_gpus = [], []
        while pending:
            frm, send = pending.pop(0)
            if send.switch is None:
                to_gpus.append(send)
            elif hold(frm, send):
                held.append((frm, send))
            else:
                pending += self.send(frm, send)
        return held, to_gpus


class Intake:
    """A Transport stand-in for a one-node switch rank whose GPUs' payloads never come: nothing is sent
    on, no payload message is ever waiting."""

    rank = 4

    def __init__(self):
        self.pending_bytes_to: dict[int, int] = {}

    def send(self, dest, packet, payload=None):
        return []

    def probe_payload(self, source):
        return None

    def sends_pending_to(self, dest):
        return 0

    def backlogged(self, limit):
        return []


def serves_put(sw, gpu, window, req=77):
    """GPU `gpu` still gets a valid 100-byte PUT into `window` (exported at physical 8192) through, exactly."""
    packet, payload = put(0, window.network_address, window.address + 8, 100, req=req)
    sends = sw.on_packet(gpu, packet, payload)
    assert len(sends) == 1 and sends[0].port == window.owner and sends[0].payload is payload
    out = sends[0].packet
    assert (out.kind, out.src, out.dst, out.address, out.nbytes, out.req) == \
        (Kind.PUT, sw.route_key(gpu), window.network_address, 8192 + 8, 100, req)
