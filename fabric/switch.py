"""The switch's decisions as pure code: route, translate, authorise, count; the switch rank only moves bytes.

`SwitchLogic.on_packet(ingress, packet)` returns the packets to send, each with the port it leaves by
and whether it carries the incoming payload on. The switch authorises by the ingress port it saw the
packet arrive on, never by a field the sender wrote.
"""

from dataclasses import dataclass, replace

from .addressing import Handle, assign_network_addresses, decode_physical
from .config import FabricConfig
from .counters import LinkCounters, downlink, uplink
from .errors import AccessViolation, FabricError, ProtocolError, UnsupportedOperation
from .packets import Kind, Packet
from .tlb import LinkTLB


@dataclass(frozen=True)
class Send:
    """Send `packet` out of port `port` (a GPU index); `forward_payload` carries the incoming payload on."""

    port: int
    packet: Packet
    forward_payload: bool = False


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
        self.violations = [0] * config.gpus
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
    def on_packet(self, ingress: int, packet: Packet) -> list[Send]:
        """What to send in answer to `packet` arriving from GPU `ingress`."""
        if packet.kind.counted:
            self.counters.record(uplink(ingress), packet.payload_bytes)
            try:
                sends = self._data(ingress, packet)
            except AccessViolation as exc:
                self.violations[ingress] += 1  # counted on the requester's port
                sends = [Send(ingress, self.nack(ingress, packet, exc))]
        else:
            sends = self._control(ingress, packet)
        for send in sends:
            if send.packet.kind.counted:
                self.counters.record(downlink(send.port), send.packet.payload_bytes)
        return sends

    def nack(self, ingress: int, packet: Packet, error: FabricError) -> Packet:
        return Packet(Kind.NACK, src=-1, dst=self.route_key(ingress), req=packet.req,
                      info={"error": type(error).__name__, "message": str(error), "kind": packet.kind.name})

    def _data(self, ingress: int, packet: Packet) -> list[Send]:
        src = self.route_key(ingress)
        if packet.kind in (Kind.PUT, Kind.GET):
            write = packet.kind is Kind.PUT
            target, phys = self._resolve(ingress, packet, write)
            return [Send(target, replace(packet, src=src, dst=self.route_key(target), address=phys),
                         forward_payload=write)]
        if packet.kind in (Kind.PUT_ACK, Kind.GET_DATA, Kind.MSG):
            target = self._port_for(ingress, packet)
            if packet.kind is Kind.MSG and self._partition[target] != self._partition[ingress]:
                raise AccessViolation(f"GPU {ingress} (partition {self._partition[ingress]}) may not send to "
                                      f"GPU {target} (partition {self._partition[target]})")
            return [Send(target, replace(packet, src=src), forward_payload=packet.kind.has_payload)]
        raise ProtocolError(f"switch: GPU {ingress} sent a {packet.kind.name}, which only the switch sends")

    def _port_for(self, ingress: int, packet: Packet) -> int:
        try:
            return self.port_of(packet.dst)
        except AccessViolation as exc:
            raise AccessViolation(f"{packet.kind.name} of {packet.nbytes} bytes from GPU {ingress}: {exc}") from None

    def _resolve(self, ingress: int, packet: Packet, write: bool) -> tuple[int, int]:
        """(target GPU, physical offset) of a PUT/GET: Link TLB in network mode, address bits in classic."""
        if self.network:
            target = self._port_for(ingress, packet)
            phys = self.tlbs[target].translate(packet.address, packet.nbytes, ingress, self._partition[ingress],
                                               write)
            return target, phys
        target, offset = decode_physical(packet.address, self.config.gpus)
        if offset + packet.nbytes > self.config.memory_capacity_bytes:
            raise AccessViolation(f"physical range {packet.address:#x}+{packet.nbytes} runs past the "
                                  f"{self.config.memory_capacity_bytes} bytes of GPU {target}")
        return target, offset

    # -- the control plane (fabric manager) -------------------------------------------------------
    def _control(self, ingress: int, packet: Packet) -> list[Send]:
        handler = {Kind.EXPORT: self._export, Kind.REVOKE: self._revoke}.get(packet.kind)
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
        window = self.tlbs[ingress].unmap(info["address"])
        return {"revoked": window.address}

    def port_stats(self) -> dict[int, dict[str, int]]:
        """Per-port TLB statistics and violations, for the report."""
        stats = {}
        for gpu in range(self.config.gpus):
            row = self.tlbs[gpu].stats() if self.network else {}
            row["violations"] = self.violations[gpu]
            stats[gpu] = row
        return stats
