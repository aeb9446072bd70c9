"""Helpers shared by the switch-logic unit tests: packet builders, control calls, answer checks."""

import numpy as np

from nvlink_emu.fabric.addressing import Handle
from nvlink_emu.fabric.config import FabricConfig
from nvlink_emu.fabric.packets import ExportInfo, GroupInfo, Kind, McastInfo, MsgInfo, Packet, ReduceInfo, raw_bytes, segments
from nvlink_emu.fabric.switch import SwitchLogic

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
