"""The switch's decisions as pure code: route, translate, authorise, count; the switch rank only moves bytes.

`SwitchLogic.on_packet(ingress, packet)` returns the packets to send, each with the port it leaves by
and whether it carries the incoming payload on. The switch authorises by the ingress port it saw the
packet arrive on, never by a field the sender wrote.
"""

from dataclasses import dataclass, replace

import numpy as np

from .addressing import Handle, assign_network_addresses, decode_physical
from .config import FabricConfig
from .counters import LinkCounters, downlink, uplink
from .errors import AccessViolation, FabricError, ProtocolError, UnsupportedOperation
from .groups import GroupTable
from .packets import Kind, Packet, raw_bytes
from .tlb import LinkTLB


@dataclass(frozen=True)
class Send:
    """Send `packet` out of port `port` (a GPU index) with `payload` (uint8 bytes) if it carries one."""

    port: int
    packet: Packet
    payload: np.ndarray | None = None
    origin: int | None = None  # who the data comes from: the ingress GPU (None) or the switch itself (-1)


class SwitchLogic:
    """State and decisions of one switch: port map, Link TLBs (network mode), counters, violations."""

    def __init__(self, config: FabricConfig):
        self.config = config
        self.network = config.mode == "network"
        self.network_addresses = assign_network_addresses(config.gpus) if self.network else ()
        self._port_of_address = {na: gpu for gpu, na in enumerate(self.network_addresses)}
        self.tlbs = [LinkTLB(g, config.page_size_bytes, config.tlb_entries) for g in range(config.gpus)] \
            if self.network else []
        self.counters = LinkCounters(config.mtu_bytes, config.header_bytes)
        self.timing = config.timing
        self.violations = [0] * config.gpus
        self.groups = GroupTable()
        self.peak_held_bytes = 0  # most contribution bytes held at once by in-switch reductions
        self.tracing = False      # when set, decisions worth a trace record are appended to `events`
        self.events: list[dict] = []
        self._partition = [config.partition_of(g) for g in range(config.gpus)]

    # -- addressing -------------------------------------------------------------------------------
    def route_key(self, gpu: int) -> int:
        """What a packet's dst/src holds for GPU `gpu`: its network address, or its index in classic mode."""
        return self.network_addresses[gpu] if self.network else gpu

    def port_of(self, key: int) -> int:
        """The port (GPU index) a routing key leads to; AccessViolation if none."""
        if self.network:
            port = self._port_of_address.get(key)
        else:
            port = key if 0 <= key < self.config.gpus else None
        if port is None:
            kind = "network address" if self.network else "GPU index"
            raise AccessViolation(f"no GPU has {kind} {key:#x}")
        return port

    # -- the data plane ---------------------------------------------------------------------------
    def on_packet(self, ingress: int, packet: Packet, payload: np.ndarray | None = None) -> list[Send]:
        """What to send in answer to `packet` (with its `payload` bytes) arriving from GPU `ingress`."""
        if packet.kind.counted:
            self.counters.record(uplink(ingress), packet.payload_bytes)
            try:
                sends = self._data(ingress, packet, payload)
            except ProtocolError:
                raise  # an emulator bug: end the job rather than answer it
            except FabricError as exc:
                if isinstance(exc, AccessViolation):
                    self.violations[ingress] += 1  # counted on the requester's port
                self._event({"ev": "refused", "gpu": ingress, "kind": packet.kind.name, "error": type(exc).__name__,
                             "message": str(exc), "m": packet.t_end + self.timing.switch_latency_ns})
                sends = [Send(ingress, self.nack(ingress, packet, exc), origin=-1)]
        else:
            sends = self._control(ingress, packet)
        for send in sends:
            if send.packet.kind.counted:
                self.counters.record(downlink(send.port), send.packet.payload_bytes)
        return sends

    def nack(self, ingress: int, packet: Packet, error: FabricError) -> Packet:
        ready = packet.t_end + self.timing.switch_latency_ns
        return Packet(Kind.NACK, src=-1, dst=self.route_key(ingress), req=packet.req,
                      info={"error": type(error).__name__, "message": str(error), "kind": packet.kind.name},
                      t_start=ready, t_end=ready)

    def _through(self, packet: Packet, **changes) -> Packet:
        """`packet` leaving the switch: cut-through, each byte one switch traversal later."""
        delay = self.timing.switch_latency_ns
        return replace(packet, t_start=packet.t_start + delay, t_end=packet.t_end + delay, **changes)

    def _data(self, ingress: int, packet: Packet, payload: np.ndarray | None) -> list[Send]:
        src = self.route_key(ingress)
        kind = packet.kind
        if kind in (Kind.PUT, Kind.GET):
            write = kind is Kind.PUT
            target, phys = self._resolve(ingress, packet, write)
            return [Send(target, self._through(packet, src=src, dst=self.route_key(target), address=phys),
                         payload if write else None)]
        if kind in (Kind.PUT_ACK, Kind.GET_DATA, Kind.MSG):
            target = self._port_for(ingress, packet)
            # a genuine reply never crosses partitions (its request could not), so none may
            if self._partition[target] != self._partition[ingress]:
                raise AccessViolation(f"GPU {ingress} (partition {self._partition[ingress]}) may not send to "
                                      f"GPU {target} (partition {self._partition[target]})")
            return [Send(target, self._through(packet, src=src), payload)]
        if kind in (Kind.REDUCE, Kind.MCAST, Kind.LOAD_REDUCE):
            return self._in_switch(ingress, packet, payload)
        raise ProtocolError(f"switch: GPU {ingress} sent a {kind.name}, which only the switch sends")

    # -- NVLink SHARP: in-switch reduction and multicast ------------------------------------------
    def _in_switch(self, ingress: int, packet: Packet, payload: np.ndarray | None) -> list[Send]:
        if not (self.network and self.config.sharp):
            raise UnsupportedOperation(f"{packet.kind.name} from GPU {ingress}: fabric {self.config.name!r} has "
                                       f"no in-switch reduction or multicast (needs NVLink Network with SHARP)")
        info = packet.info
        group = self.groups.group(info["g"], ingress, packet.kind.name)
        if packet.kind is Kind.MCAST:
            # one packet in, a copy out of every member port, the sender's included
            out = self._through(packet)
            self._event({"ev": "mcast", "group": info["g"], "from": ingress, "bytes": packet.nbytes,
                         "copies": len(group.members), "m": out.t_start})
            return [self._deliver(port, info["key"], payload, out.t_start, out.t_end, None) for port in group.members]
        if packet.kind is Kind.LOAD_REDUCE:
            # NVLS: read the range from every member's bound buffer; the answers are REDUCE packets
            ready = packet.t_end + self.timing.switch_latency_ns
            load = Packet(Kind.LOAD, -1, 0, packet.address, packet.nbytes, packet.req, info, ready, ready)
            return [Send(port, replace(load, dst=self.route_key(port)), origin=-1) for port in group.members]
        outside = [port for port in info["dest"] if port not in group.members]
        if outside or not info["dest"]:
            raise AccessViolation(f"{packet.kind.name} from GPU {ingress}: result destinations {info['dest']}: "
                                  f"{' '.join(f'GPU {p}' for p in outside) or 'none'} not members of group "
                                  f"{info['g']} ({list(group.members)})")
        done = self.groups.contribute(info["g"], tuple(info["slot"]), ingress, info["op"], info["dtype"],
                                      payload, (tuple(info["dest"]), tuple(info["key"])),
                                      (packet.t_start, packet.t_end))
        if done is None:
            self.peak_held_bytes = max(self.peak_held_bytes, self.groups.held_bytes)
            return []
        result, (dest, key), (first, last) = done
        # the reduced stream leaves once the latest contribution streams in, through the group's engine
        delay = self.timing.switch_latency_ns
        raw = raw_bytes(result.nbytes, self.config.mtu_bytes, self.config.header_bytes)
        start, end = self.groups.engine(info["g"], self.timing).reduce(first + delay, last + delay, raw)
        self._event({"ev": "reduce", "group": info["g"], "slot": list(info["slot"]), "op": info["op"],
                     "bytes": result.nbytes, "members": len(self.groups.groups[info["g"]].members),
                     "m_start": start, "m_end": end})
        return [self._deliver(port, list(key), result, start, end, -1) for port in dest]

    def _deliver(self, port: int, key: list, payload: np.ndarray, t_start: float, t_end: float,
                 origin: int | None) -> Send:
        return Send(port, Packet(Kind.MCAST, -1, self.route_key(port), 0, payload.nbytes, info={"key": key},
                                 t_start=t_start, t_end=t_end), payload, origin)

    def _event(self, record: dict) -> None:
        if self.tracing:
            self.events.append(record)

    def _port_for(self, ingress: int, packet: Packet) -> int:
        try:
            return self.port_of(packet.dst)
        except AccessViolation as exc:
            raise AccessViolation(f"{packet.kind.name} of {packet.nbytes} bytes from GPU {ingress}: {exc}") from None

    def _resolve(self, ingress: int, packet: Packet, write: bool) -> tuple[int, int]:
        """(target GPU, physical offset) of a PUT/GET: Link TLB in network mode, address bits in classic."""
        if self.network:
            target = self._port_for(ingress, packet)
            tlb = self.tlbs[target]
            before = (tlb.hits, tlb.misses, tlb.faults)
            try:
                return target, tlb.translate(packet.address, packet.nbytes, ingress, self._partition[ingress], write)
            finally:
                if self.tracing:
                    hits, misses, faults = (now - was for now, was in zip((tlb.hits, tlb.misses, tlb.faults), before))
                    self._event({"ev": "tlb", "port": target, "by": ingress, "address": packet.address,
                                 "bytes": packet.nbytes, "hits": hits, "misses": misses, "faults": faults,
                                 "m": packet.t_start})
        target, offset = decode_physical(packet.address, self.config.gpus)
        if offset + packet.nbytes > self.config.memory_capacity_bytes:
            raise AccessViolation(f"physical range {packet.address:#x}+{packet.nbytes} runs past the "
                                  f"{self.config.memory_capacity_bytes} bytes of GPU {target}")
        return target, offset

    # -- the control plane (fabric manager) -------------------------------------------------------
    def _control(self, ingress: int, packet: Packet) -> list[Send]:
        handler = {Kind.EXPORT: self._export, Kind.REVOKE: self._revoke, Kind.GROUP: self._group}.get(packet.kind)
        if handler is None:
            raise ProtocolError(f"switch: unexpected {packet.kind.name} from GPU {ingress}")
        try:
            info = handler(ingress, packet.info or {})
        except FabricError as exc:
            info = {"error": type(exc).__name__, "message": str(exc)}
        return [Send(ingress, Packet(Kind.REPLY, src=-1, dst=self.route_key(ingress), req=packet.req, info=info))]

    def _export(self, ingress: int, info: dict) -> dict:
        if not self.network:
            raise UnsupportedOperation(f"export by GPU {ingress}: classic NVLink connections are fixed at "
                                       f"boot; use gpu.physical_address(array)")
        partition = self._partition[ingress]
        members = self.config.partitions[partition]
        allowed = members if info.get("to") is None else tuple(info["to"])
        for gpu in allowed:
            if not isinstance(gpu, int) or not 0 <= gpu < self.config.gpus:
                raise FabricError(f"export by GPU {ingress}: to= names {gpu!r}, not a GPU 0..{self.config.gpus - 1}")
            if self._partition[gpu] != partition:
                raise AccessViolation(f"export by GPU {ingress}: GPU {gpu} is in partition {self._partition[gpu]}, "
                                      f"GPU {ingress} in partition {partition}; partitions are isolated")
        window = self.tlbs[ingress].map(info["phys_offset"], info["size_bytes"], frozenset(allowed), partition,
                                        writable=info.get("writable", True), readable=info.get("readable", True))
        handle = Handle(self.route_key(ingress), window.address, window.size_bytes, ingress)
        return {"handle": [handle.network_address, handle.address, handle.size_bytes, handle.owner],
                "allowed": sorted(allowed)}

    def _revoke(self, ingress: int, info: dict) -> dict:
        if not self.network:
            raise UnsupportedOperation(f"revoke by GPU {ingress}: classic NVLink connections are fixed at boot")
        if info.get("network_address") != self.route_key(ingress):
            raise AccessViolation(f"revoke by GPU {ingress}: the window {info.get('network_address', 0):#x}:"
                                  f"{info.get('address', 0):#x} is not GPU {ingress}'s; only its owner may revoke it")
        window = self.tlbs[ingress].unmap(info["address"])
        return {"revoked": window.address}

    def _group(self, ingress: int, info: dict) -> dict:
        if not (self.network and self.config.sharp):
            raise UnsupportedOperation(f"multicast group call by GPU {ingress}: fabric {self.config.name!r} has no "
                                       f"multicast/SHARP groups (needs NVLink Network with a SHARP switch)")
        action = info.get("action")
        if action == "create":
            members = tuple(info["members"])
            for gpu in members:
                if type(gpu) is not int or not 0 <= gpu < self.config.gpus:
                    raise FabricError(f"group create by GPU {ingress}: member {gpu!r} is not a GPU "
                                      f"0..{self.config.gpus - 1}")
            outside = [g for g in members if self._partition[g] != self._partition[ingress]]
            if outside:
                raise AccessViolation(f"group create by GPU {ingress}: GPUs {outside} are in another partition")
            return {"group": self.groups.create(members, ingress)}
        if action == "bind":
            self.groups.bind(info["group"], ingress)
            return {"group": info["group"]}
        if action == "release":
            self.groups.release(info["group"], ingress)
            return {"group": info["group"]}
        raise ProtocolError(f"group call by GPU {ingress}: unknown action {action!r}")

    def port_stats(self) -> dict[int, dict[str, int]]:
        """Per-port TLB statistics and violations, for the report."""
        stats = {}
        for gpu in range(self.config.gpus):
            row = self.tlbs[gpu].stats() if self.network else {}
            row["violations"] = self.violations[gpu]
            stats[gpu] = row
        return stats
