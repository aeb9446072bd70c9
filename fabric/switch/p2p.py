"""Point-to-point through a leaf: PUT, GET, their replies and MSG, routed to the target's port (or up to
the leaf of its node), translated and authorised by the target port's Link TLB (NVLink Network; a classic
node: its registered windows, else the address bits), each reply matched with a request the leaf forwarded."""

from collections import Counter
from typing import TYPE_CHECKING, Any

import numpy as np

from ..addressing import decode_physical
from ..errors import AccessViolation, ResourceExhausted, UnsupportedOperation
from ..packets import Kind, Packet
from .send import Send

if TYPE_CHECKING:  # for annotations only
    from ..config import FabricConfig
    from ..tlb import LinkTLB

# the kinds this room decides (a GPU's other kinds go to the in-switch room or the control plane)
POINT_TO_POINT = frozenset({Kind.PUT, Kind.GET, Kind.PUT_ACK, Kind.GET_DATA, Kind.MSG})
# the reply each request kind is answered with, by the GPU it was forwarded to
REPLY_OF = {Kind.PUT: Kind.PUT_ACK, Kind.GET: Kind.GET_DATA}
SERVED_REPLIES = frozenset(REPLY_OF.values())  # sent as the host delivered their requests, not in program order
MAX_AWAITED = 1 << 16  # requests of one GPU forwarded and not yet answered; past it, new ones are refused


class PointToPoint:
    """A leaf's point-to-point room; its state: the requests it forwarded and that are not yet answered."""

    leaf: Any  # the SwitchLogic (fabric.switch.leaf, which imports this module: no import back)
    config: "FabricConfig"
    local: range
    network: bool
    tlbs: "dict[int, LinkTLB]"
    switch: int
    _partition: list[int]

    def __init__(self, leaf: Any) -> None:
        self.leaf = leaf  # the SwitchLogic (fabric.switch.leaf) whose ports, keys and Link TLBs these are
        self.config, self.local, self.network, self.tlbs = leaf.config, leaf.local, leaf.network, leaf.tlbs
        self.switch, self._partition = leaf.switch, leaf.partition_of_gpu
        # requests forwarded and not yet answered: (replier port, requester port, req, reply kind) -> the
        # byte counts the replies must carry -> how many (a reply is matched in O(1), however many a GPU
        # keeps awaited under one number: a scan of them made each forged reply cost the switch O(MAX_AWAITED))
        self._awaited: dict[tuple[int, int, int, Kind], Counter[int]] = {}
        self._awaiting = [0] * self.config.gpus  # per requester port: its forwarded requests not yet answered

    def data(self, ingress: int, packet: Packet, payload: np.ndarray | None) -> list[Send]:
        """What to send for a PUT, GET, their replies or a MSG of GPU `ingress` (one of POINT_TO_POINT)."""
        src = self.leaf.route_key(ingress)
        kind = packet.kind
        if kind in (Kind.PUT, Kind.GET):
            by_window = self.network or (self.tlbs and packet.dst != -1)  # classic: a registered window's handle
            target = self._port_for(ingress, packet) if by_window else self._physical_target(ingress, packet)
            if target not in self.local and self._partition[target] != self._partition[ingress]:
                # the target's Link TLB would refuse it (a window is its partition's): refused here, its bytes
                # never take the links between switches that other tenants share
                raise AccessViolation(f"{kind.name} from GPU {ingress} (partition {self._partition[ingress]}) to GPU "
                                      f"{target} (partition {self._partition[target]}): partitions are isolated")
            if target not in self.local:  # translated at the target's leaf: pass it on with its source
                return [Send(target, self.leaf.through(packet, src=src), payload if kind is Kind.PUT else None)]
            return self.request(ingress, target, packet, payload)
        if kind in (Kind.PUT_ACK, Kind.GET_DATA):
            target = self._port_for(ingress, packet)
            self._answered(ingress, target, packet)
            return [Send(target, self.leaf.through(packet, src=src), payload)]
        if kind is Kind.MSG:
            target = self._port_for(ingress, packet)
            if self._partition[target] != self._partition[ingress]:
                raise AccessViolation(f"MSG from GPU {ingress} (partition {self._partition[ingress]}) to GPU "
                                      f"{target} (partition {self._partition[target]}): partitions are isolated")
            return [Send(target, self.leaf.through(packet, src=src), payload)]
        raise AssertionError(f"{kind.name} is no point-to-point kind")  # the leaf sends only POINT_TO_POINT here

    def request(self, ingress: int, target: int, packet: Packet, payload: np.ndarray | None) -> list[Send]:
        """A PUT/GET of GPU `ingress` for GPU `target`, a port of this switch: translated, authorised,
        and remembered, so that only its own answer is forwarded back."""
        kind = packet.kind
        write = kind is Kind.PUT
        phys = self._resolve(ingress, target, packet, write)
        if self._awaiting[ingress] >= MAX_AWAITED:
            raise ResourceExhausted(f"{kind.name} from GPU {ingress}: {MAX_AWAITED} of its requests are still "
                                    f"unanswered")
        self._awaiting[ingress] += 1
        self._awaited.setdefault((target, ingress, packet.req, REPLY_OF[kind]), Counter())[
            0 if write else packet.nbytes] += 1
        leaf = self.leaf
        out = leaf.through(packet, src=leaf.route_key(ingress), dst=leaf.route_key(target), address=phys)
        return [Send(target, out, payload if write else None)]

    def _answered(self, replier: int, requester: int, packet: Packet) -> None:
        """Retire the forwarded request that `packet` (a PUT_ACK or GET_DATA of GPU `replier`) answers;
        AccessViolation if it answers none (a forged or repeated reply)."""
        key = (replier, requester, packet.req, packet.kind)
        sizes = self._awaited.get(key)
        if not sizes or not sizes.get(packet.nbytes):
            raise AccessViolation(f"{packet.kind.name} of {packet.nbytes} bytes from GPU {replier} to GPU "
                                  f"{requester} for request {packet.req}: it answers no request the switch "
                                  f"forwarded from GPU {requester} to GPU {replier}")
        sizes[packet.nbytes] -= 1
        if not sizes[packet.nbytes]:
            del sizes[packet.nbytes]
        self._awaiting[requester] -= 1
        if not sizes:
            del self._awaited[key]

    @property
    def awaited_replies(self) -> int:
        """Forwarded requests whose answer has not come (the end-of-run report shows them)."""
        return sum(sizes.total() for sizes in self._awaited.values())

    def _port_for(self, ingress: int, packet: Packet) -> int:
        try:
            return self.leaf.port_of(packet.dst)  # type: ignore[no-any-return]  # (leaf: Any)
        except AccessViolation as exc:
            raise AccessViolation(f"{packet.kind.name} of {packet.nbytes} bytes from GPU {ingress}: {exc}") from None

    def _resolve(self, ingress: int, target: int, packet: Packet, write: bool) -> int:
        """Physical offset in GPU `target` (a port of this switch) of a PUT/GET by GPU `ingress`: Link
        TLB in network mode and for a classic node's registered window (by handle), address bits otherwise."""
        if self.network or packet.dst != -1:
            tlb = self.tlbs[target]
            before = (tlb.hits, tlb.misses, tlb.faults)
            try:
                return tlb.translate(packet.address, packet.nbytes, ingress, self._partition[ingress], write)
            finally:
                if self.leaf.tracing:
                    hits, misses, faults = (now - was for now, was in zip((tlb.hits, tlb.misses, tlb.faults), before))
                    self.leaf.event({"ev": "tlb", "port": target, "by": ingress, "address": packet.address,
                                     "bytes": packet.nbytes, "hits": hits, "misses": misses, "faults": faults,
                                     "m": packet.t_start})
        offset = decode_physical(packet.address, self.config.gpus)[1]
        if offset + packet.nbytes > self.config.memory_capacity_bytes:
            raise AccessViolation(f"physical range {packet.address:#x}+{packet.nbytes} runs past the "
                                  f"{self.config.memory_capacity_bytes} bytes of GPU {target}")
        return offset

    def _physical_target(self, ingress: int, packet: Packet) -> int:
        """The GPU a classic PUT/GET's physical address names: one of this node's (the shared physical
        space ends at the node; another node is reached through a registered window, as RDMA does)."""
        if packet.dst != -1:
            raise AccessViolation(f"{packet.kind.name} from GPU {ingress}: classic NVLink routes requests by "
                                  f"physical address (dst -1), got dst {packet.dst}")
        target = decode_physical(packet.address, self.config.gpus)[0]
        if target not in self.local:
            raise UnsupportedOperation(f"{packet.kind.name} from GPU {ingress} to physical {packet.address:#x}: "
                                       f"GPU {target} is in node {target // self.config.gpus_per_node}, and a "
                                       f"classic physical address names a GPU of the same node only (node "
                                       f"{self.switch})")
        return target

