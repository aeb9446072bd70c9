"""In-switch operations of NVLink SHARP at a leaf: a group's REDUCE, MCAST and LOAD_REDUCE checked (bound
members, the group's keys), reduced or copied on this switch, or handed to the spanning rooms when the group
spans nodes (partials: fabric.switch.spanning; stores and load-reduces: fabric.switch.multicast)."""

from typing import TYPE_CHECKING, Any, cast

import numpy as np

from ..errors import AccessViolation, FabricError, UnsupportedOperation
from ..packets import Kind, LoadInfo, McastInfo, Packet, ReduceInfo, raw_bytes
from ..reduction import check_dtype, check_op
from .ingress import check_requester
from .send import Send

if TYPE_CHECKING:  # for annotations only
    from ..config import FabricConfig, Timing
    from ..groups import GroupTable


class InSwitch:
    """A leaf's in-switch room: it keeps no state of its own (the groups and their held contributions are
    the leaf's GroupTable, shared with the control plane and the spanning room)."""

    leaf: Any  # the SwitchLogic (fabric.switch.leaf, which imports this module: no import back)
    config: "FabricConfig"
    network: bool
    groups: "GroupTable"
    timing: "Timing"
    _spine_faults: bool

    def __init__(self, leaf: Any) -> None:
        self.leaf = leaf  # the SwitchLogic (fabric.switch.leaf) whose groups these are
        self.config, self.network, self.groups, self.timing = leaf.config, leaf.network, leaf.groups, leaf.timing
        self._spine_faults = leaf.spine_faults

    def handle(self, ingress: int, packet: Packet, payload: np.ndarray | None) -> list[Send]:
        """What to send for GPU `ingress`'s REDUCE, MCAST or LOAD_REDUCE (`payload`: its bytes, if any)."""
        # this room's kinds' records (Packet checks that a packet carries its kind's)
        kind, info = packet.kind, cast("ReduceInfo | McastInfo | LoadInfo", packet.info)
        if not (self.network and self.config.sharp):
            raise UnsupportedOperation(f"{kind.name} from GPU {ingress}: fabric {self.config.name!r} has "
                                       f"no in-switch reduction or multicast (needs NVLink Network with SHARP)")
        group = self.groups.group(info.group, ingress, kind.name, bound=True)
        if not group.ready:  # a copy must go only to members that bound the group
            raise AccessViolation(f"{kind.name} from GPU {ingress}: group {info.group} is not bound by all members "
                                  f"yet ({sorted(group.bound)} of {list(group.members)})")
        keys = (info.key, info.source) if isinstance(info, LoadInfo) else (info.key,)
        for key in keys:
            if not key or key[0] != group.name:
                raise AccessViolation(f"{kind.name} from GPU {ingress}: key {list(key)} is not one of group "
                                      f"{info.group}'s (its keys start with {group.name!r})")
        if group.stage == "leaf" and self._spine_faults:
            raise UnsupportedOperation(f"{kind.name} from GPU {ingress}: group {info.group} spans nodes, and the "
                                       f"fault plan has faults on links between switches: in-switch reduction "
                                       f"across them is not modeled (use the ring, direct or hier algorithm)")
        if group.stage == "leaf" and kind is Kind.LOAD_REDUCE:
            return self.leaf.nvls.reduce_across(ingress, packet, group, cast(LoadInfo, info))  # type: ignore[no-any-return]
        if kind is Kind.MCAST and group.stage == "leaf":
            return self.leaf.stores.store_span(ingress, group, packet, payload)  # type: ignore[no-any-return]
        if kind is Kind.MCAST:
            # one packet in, a copy out of every member port, the sender's included
            out = self.leaf.through(packet)
            self.leaf.event({"ev": "mcast", "group": info.group, "from": ingress, "bytes": packet.nbytes,
                             "copies": len(group.members), "m": out.t_start})
            return [self.leaf.deliver(port, info.group, info.key, payload, out.t_start, out.t_end, None)
                    for port in group.members]
        info = cast("ReduceInfo | LoadInfo", info)  # not MCAST: REDUCE or LOAD_REDUCE
        try:  # before any contribution is held: the reduction must be one the switch can do
            check_op(info.op)
            check_dtype(info.dtype)
        except FabricError as exc:
            raise FabricError(f"{kind.name} from GPU {ingress}: {exc}") from None
        outside = [port for port in info.dest if port not in group.members]
        if outside or not info.dest:
            raise AccessViolation(f"{kind.name} from GPU {ingress}: result destinations {list(info.dest)}: "
                                  f"{' '.join(f'GPU {p}' for p in outside) or 'none'} not members of group "
                                  f"{info.group} ({list(group.members)})")
        if kind is Kind.LOAD_REDUCE:
            if tuple(info.dest) != (ingress,):  # members file a slot's LOAD under the slot alone: a result
                # for another member, of a range the requester picks, could take the place of its own
                raise AccessViolation(f"LOAD_REDUCE from GPU {ingress}: group {info.group} slot {list(info.slot)}: "
                                      f"a load-reduce's result goes to its requester only, not to {list(info.dest)}")
            check_requester(ingress, group, cast(LoadInfo, info))
            # NVLS: read the range from every member's bound buffer; the answers are REDUCE packets
            ready = packet.t_end + self.timing.switch_latency_ns
            load = Packet(Kind.LOAD, -1, 0, packet.address, packet.nbytes, packet.req, info, ready, ready)
            return [Send(port, load.but(dst=self.leaf.route_key(port)), origin=-1) for port in group.members]
        info = cast(ReduceInfo, info)  # REDUCE's
        if group.stage == "leaf":
            self.leaf.spanning.check_partial(ingress, group, info, payload)
        # a REDUCE carries its payload (Kind.has_payload: ranks/switch passes it)
        done = self.groups.contribute(info.group, info.slot, ingress, info.op, info.dtype, payload,  # type: ignore[arg-type]
                                      (info.dest, info.key), (packet.t_start, packet.t_end),
                                      self.leaf.buffer_share_bytes, self.leaf.held_parts_share)
        if group.stage == "leaf":
            self.leaf.spanning.member_part(ingress, group, info, packet, payload)
            self.leaf.nvls.load_done(info.group, tuple(info.slot), ingress)  # a member's answer to a LOAD, if one
        if done is None:
            self.leaf.peak_held_bytes = max(self.leaf.peak_held_bytes, self.groups.held_bytes)
            return []
        result, (dest, key), (first, last) = done
        # the reduced stream leaves once the latest contribution streams in, through the group's engine
        delay = self.timing.switch_latency_ns
        raw = raw_bytes(result.nbytes, self.config.mtu_bytes, self.config.header_bytes)
        start, end = self.groups.engine(info.group, self.timing).reduce(first + delay, last + delay, raw)
        self.leaf.event({"ev": "reduce", "group": info.group, "slot": list(info.slot), "op": info.op,
                         "bytes": result.nbytes, "members": len(group.inputs), "m_start": start, "m_end": end})
        if group.stage == "leaf":
            return [self.leaf.spanning.partial_up(group, info, dest, key, result, start, end, raw)]
        return [self.leaf.deliver(port, info.group, key, result, start, end, -1) for port in dest]
