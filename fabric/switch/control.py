"""The control plane at a leaf (the fabric manager's part): a GPU's export and revoke of a memory window
in its port's Link TLB, and its group calls (create, bind, release; a group spanning nodes is created and
released through the spanning room). A refused call is answered with its error, not counted a violation."""

from typing import TYPE_CHECKING, Any, Callable, cast

from ..addressing import Handle
from ..errors import AccessViolation, FabricError, ProtocolError, ResourceExhausted, UnsupportedOperation
from ..packets import ExportInfo, GroupInfo, Kind, Packet, RevokeInfo
from .send import Send

if TYPE_CHECKING:  # for annotations only
    from ..config import FabricConfig
    from ..groups import GroupTable
    from ..tlb import LinkTLB
    from ..topology import Topology


class ControlPlane:
    """A leaf's control plane; its state is the leaf's: the Link TLBs' windows and the group table."""

    leaf: Any  # the SwitchLogic (fabric.switch.leaf, which imports this module: no import back)
    config: "FabricConfig"
    topology: "Topology"
    switch: int
    network: bool
    groups: "GroupTable"
    tlbs: "dict[int, LinkTLB]"
    _partition: list[int]

    def __init__(self, leaf: Any) -> None:
        self.leaf = leaf  # the SwitchLogic (fabric.switch.leaf) whose windows and groups these are
        self.config, self.topology, self.switch, self.network = leaf.config, leaf.topology, leaf.switch, leaf.network
        self.groups, self.tlbs, self._partition = leaf.groups, leaf.tlbs, leaf.partition_of_gpu

    def handle(self, ingress: int, packet: Packet) -> list[Send]:
        """What to send for GPU `ingress`'s EXPORT, REVOKE or GROUP call: its REPLY, and first, for a group
        spanning nodes, the other switches' part; ProtocolError for a kind that is no fabric-manager call."""
        # each handler takes its kind's record (Packet checks that a packet carries its kind's; mypy joins the
        # three methods' types to `function`)
        handler: Callable[[int, Any], dict[str, Any] | tuple[GroupInfo, list[int]]] | None = {
            Kind.EXPORT: self._export, Kind.REVOKE: self._revoke, Kind.GROUP: self._group}.get(packet.kind)  # type: ignore[assignment]
        if handler is None:  # DONE, TRACE, COUNTERS: the switch rank's own business
            raise ProtocolError(f"switch: {packet.kind.name} from GPU {ingress} is not a fabric-manager call")
        # a notice, which nothing answers
        if packet.kind is Kind.GROUP and cast(GroupInfo, packet.info).action == "unserved":
            try:
                return [self.leaf.out(send) for send in self.leaf.nvls.unserved(ingress, packet.info)]
            except FabricError as exc:
                return self.leaf.refuse(ingress, exc, "GROUP", packet.req, packet.t_end)  # type: ignore[no-any-return]
        try:
            info = handler(ingress, packet.info)
            if isinstance(info, tuple):  # a spanning group: the other switches' part comes first
                return [self.leaf.out(send) for send in self.leaf.spanning.span(ingress, packet, *info)]
        except FabricError as exc:  # a refused call is answered, not a data-plane violation
            self.leaf.refused[ingress] += 1
            info = {"error": type(exc).__name__, "message": str(exc)}
        sends = []
        if isinstance(info, dict) and "unspan" in info:
            sends = [Send(-1, Packet(Kind.GROUP, -1, -1, req=self.switch, info=GroupInfo("unspan", info["group"], (), "")),
                          switch=spine) for spine in range(self.topology.nodes, self.topology.nodes + self.topology.spines)]
            info = {"group": info["group"]}
        reply = Packet(Kind.REPLY, src=-1, dst=self.leaf.route_key(ingress), req=packet.req, info=info)
        return sends + [Send(ingress, reply)]

    def _export(self, ingress: int, info: ExportInfo) -> dict[str, Any]:
        if not self.tlbs:
            raise UnsupportedOperation(f"export by GPU {ingress}: classic NVLink connections are fixed at "
                                       f"boot; use gpu.physical_address(array)")
        capacity = self.config.memory_capacity_bytes
        if not (0 <= info.phys_offset and 0 < info.size_bytes <= capacity - info.phys_offset):
            raise AccessViolation(f"export by GPU {ingress}: bytes {info.phys_offset:#x}+{info.size_bytes} are "
                                  f"not inside its {capacity} bytes of memory")
        partition = self._partition[ingress]
        members = self.config.partitions[partition]
        allowed = members if info.to is None else info.to
        if not allowed:
            raise FabricError(f"export by GPU {ingress}: to= names no GPU; nobody could use the window")
        for gpu in allowed:
            if not 0 <= gpu < self.config.gpus:
                raise FabricError(f"export by GPU {ingress}: to= names {gpu!r}, not a GPU 0..{self.config.gpus - 1}")
            if self._partition[gpu] != partition:
                raise AccessViolation(f"export by GPU {ingress}: GPU {gpu} is in partition {self._partition[gpu]}, "
                                      f"GPU {ingress} in partition {partition}; partitions are isolated")
        window = self.tlbs[ingress].map(info.phys_offset, info.size_bytes, frozenset(allowed), partition,
                                        writable=info.writable, readable=info.readable)
        handle = Handle(self.leaf.route_key(ingress), window.address, window.size_bytes, ingress)
        return {"handle": [handle.network_address, handle.address, handle.size_bytes, handle.owner],
                "allowed": sorted(set(allowed))}

    def _revoke(self, ingress: int, info: RevokeInfo) -> dict[str, Any]:
        if not self.tlbs:
            raise UnsupportedOperation(f"revoke by GPU {ingress}: classic NVLink connections are fixed at boot")
        if info.network_address != self.leaf.route_key(ingress):
            raise AccessViolation(f"revoke by GPU {ingress}: the window {info.network_address:#x}:"
                                  f"{info.address:#x} is not GPU {ingress}'s; only its owner may revoke it")
        window = self.tlbs[ingress].unmap(info.address)
        return {"revoked": window.address}

    def _group(self, ingress: int, info: GroupInfo) -> dict[str, Any] | tuple[GroupInfo, list[int]]:
        if not (self.network and self.config.sharp):
            raise UnsupportedOperation(f"multicast group call by GPU {ingress}: fabric {self.config.name!r} has no "
                                       f"multicast/SHARP groups (needs NVLink Network with a SHARP switch)")
        if info.action == "create":
            for gpu in info.members:
                if not 0 <= gpu < self.config.gpus:
                    raise FabricError(f"group create by GPU {ingress}: member {gpu!r} is not a GPU "
                                      f"0..{self.config.gpus - 1}")
            nodes = sorted({g // self.config.gpus_per_node for g in info.members})
            outside = [g for g in info.members if self._partition[g] != self._partition[ingress]]
            if outside:
                raise AccessViolation(f"group create by GPU {ingress}: GPUs {outside} are in another partition")
            if not info.name:
                raise ProtocolError(f"group create by GPU {ingress}: the group needs its communicator's name")
            partition = self._partition[ingress]
            if self.groups.count_in(partition) >= self.leaf.group_share:
                raise ResourceExhausted(f"GPU {ingress}: cannot create a multicast/SHARP group for GPUs "
                                        f"{list(info.members)}: partition {partition} holds {self.leaf.group_share} "
                                        f"groups, its share (the limit is {self.groups.limit} per switch, shared "
                                        f"by {len(self.config.partitions)} partitions); release one first")
            if nodes != [self.switch]:
                if not self.config.spine_sharp:
                    raise UnsupportedOperation(f"group create by GPU {ingress}: GPUs {list(info.members)} are in nodes "
                                               f"{nodes}, and the spines of fabric {self.config.name!r} do not reduce "
                                               f"or multicast (spine_sharp false); use ring, direct or hier")
                if ingress not in info.members or len(set(info.members)) != len(info.members):
                    raise FabricError(f"GPU {ingress}: group members {list(info.members)} must be distinct and "
                                      f"include it")
                return (info, nodes)  # a spanning group (spanning.Spanning.span)
            return {"group": self.groups.create(info.members, ingress, info.name, partition)}
        if info.action == "bind":
            if self.leaf.spanning.pending(info.group):
                raise AccessViolation(f"group bind by GPU {ingress}: group {info.group} is not created yet")
            self.groups.bind(info.group, ingress)
            return {"group": info.group}
        if info.action == "release":
            group = self.groups.group(info.group, ingress, "release", bound=True)
            if group.stage == "leaf":
                if info.group % self.topology.nodes != self.switch:
                    raise AccessViolation(f"group release by GPU {ingress}: group {info.group} spans nodes and was "
                                          f"created at node {info.group % self.topology.nodes}'s switch, which alone "
                                          f"releases it (its first member does)")
                self.leaf.spanning.drop_span(info.group)
                return {"group": info.group, "unspan": True}
            self.groups.release(info.group, ingress)
            return {"group": info.group}
        raise ProtocolError(f"group call by GPU {ingress}: unknown action {info.action!r}")

