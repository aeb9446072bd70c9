"""Credits between leaves: how a leaf bounds what it forwards towards one GPU of another node.

A leaf keeps at most credit_bytes (the port's share over the other nodes) forwarded towards one GPU of another
node and not yet credited back, each packet taking its payload bytes or credit_per_packet, whichever is more (so
at most MAX_UNREAD packets), and holds its GPU's transfer past that. The destination's leaf credits them back (a
CREDIT packet through a spine) once its sends of them to the GPU completed (or at once if it refused them): by
itself when half the credit has left, at once when the sender's leaf asks. A multicast store of a group spanning
nodes goes up once but reaches every member of the other nodes, so it takes that credit for each of them at the
sender's leaf, and each destination leaf credits its members' copies back the same way: a member that does not
receive cannot make another node's leaf hold the group's stores for it.
"""

from collections import deque

from nvlink_emu.fabric.budget import port_share_bytes
from nvlink_emu.fabric.config import FabricConfig
from nvlink_emu.fabric.errors import ProtocolError
from nvlink_emu.fabric.packets import Kind, Packet

from .queues import MAX_UNREAD


class LeafCredits:
    """One switch rank's credits. As the sender's leaf: `used` per GPU of another node, `asked` the GPUs it
    asked credit for. As a destination leaf: per local GPU the transit packets posted to it (position in its
    sends, origin leaf, credit), what of them left per (origin leaf rank, GPU), and the credits asked for.
    to_switch(switch, packet): the rank sends a packet to switch index `switch`."""

    def __init__(self, config: FabricConfig, index: int, logic, gpus, to_switch):
        self.config, self.index, self.logic, self.gpus = config, index, logic, gpus
        self.to_switch = to_switch
        self.active = config.nodes > 1 and index < config.nodes  # a leaf with other nodes to credit
        self.credit_bytes = max(1, port_share_bytes(config) // max(1, config.nodes - 1))
        # every packet takes at least this much credit, so that at most MAX_UNREAD of them (zero-byte
        # messages, requests, answers) are in flight towards one GPU from one leaf
        self.credit_per_packet = max(1, self.credit_bytes // MAX_UNREAD)
        self.used: dict[int, int] = {}
        self.asked: set[int] = set()
        self.posted_to: dict[int, int] = {}  # per local GPU: sends posted to it (a position in its queue)
        self.transit: dict[int, deque] = {}
        self.drained: dict[tuple[int, int], int] = {}
        self.wanted: set[tuple[int, int]] = set()

    def leaf_rank(self, gpu: int) -> int:
        """The rank of GPU `gpu`'s leaf."""
        return self.config.gpus + gpu // self.config.gpus_per_node

    def charge(self, payload_bytes: int) -> int:
        """Credit a packet of `payload_bytes` takes (bytes, at least credit_per_packet)."""
        return max(payload_bytes, self.credit_per_packet)

    def take(self, port: int, nbytes: int) -> None:
        """A packet of `nbytes` forwarded up towards GPU `port` of another node takes its credit."""
        self.used[port] = self.used.get(port, 0) + self.charge(nbytes)

    def must_wait(self, port: int, switch: int, nbytes: int) -> bool:
        """Whether a packet of `nbytes` towards GPU `port` of another node (through switch `switch`) must
        wait for credit; if so, the destination's leaf is asked (once) for what has left it."""
        used = self.used.get(port, 0)
        if not used or used + self.charge(nbytes) <= self.credit_bytes:
            return False
        if port not in self.asked:
            self.asked.add(port)
            self.to_switch(switch, Packet(Kind.CREDIT, self.logic.route_key(self.gpus[0]), self.logic.route_key(port)))
        return True

    def on_credit(self, packet: Packet) -> None:
        """A CREDIT from another leaf (passed on by a spine) at this leaf."""
        here, there = self.logic.gpu_of_key(packet.dst), self.logic.gpu_of_key(packet.src)
        if here not in self.gpus or there is None:
            raise ProtocolError(f"switch {self.index}: CREDIT {packet.src!r} -> {packet.dst!r} names no GPU of node "
                                f"{self.index}")
        if packet.nbytes:  # bytes forwarded towards GPU `there` that have left its leaf
            self.used[there] -= packet.nbytes
            self.asked.discard(there)
        else:  # the leaf of GPU `there` asks for the credit of this leaf's port `here`
            self.wanted.add((self.leaf_rank(there), here))
            self.return_drained()

    def posted(self, port: int, origin: int, transit: int | None) -> None:
        """A send to local GPU `port` was posted; `transit`: a packet of GPU `origin` of another node that
        took that much credit at its leaf, credited back to it once sent."""
        end = self.posted_to[port] = self.posted_to.get(port, 0) + 1
        if transit is not None:
            self.transit.setdefault(port, deque()).append((end, self.leaf_rank(origin), transit))

    def owe(self, origin: int, port: int, nbytes: int) -> None:
        """Credit `nbytes` to GPU `origin`'s leaf for local port `port` (a packet that will not go down)."""
        key = (self.leaf_rank(origin), port)
        self.drained[key] = self.drained.get(key, 0) + nbytes

    def drain(self, sends_pending_to) -> bool:
        """Move the transit packets whose sends to their GPU completed (sends_pending_to(port): the sends
        still in flight) to the credit of their origin leaf; whether any moved."""
        moved = False
        for port in list(self.transit):
            queue, sent = self.transit[port], self.posted_to[port] - sends_pending_to(port)
            while queue and queue[0][0] <= sent:  # a destination's sends retire in order
                _, leaf, nbytes = queue.popleft()
                self.drained[(leaf, port)] = self.drained.get((leaf, port), 0) + nbytes
                moved = True
            if not queue:
                del self.transit[port]
        if moved:
            self.return_drained()
        return moved

    def return_drained(self) -> None:
        """Return to each origin leaf the bytes of a port that left, if half its credit did or it asked."""
        for (leaf, port), nbytes in list(self.drained.items()):
            if nbytes * 2 >= self.credit_bytes or (leaf, port) in self.wanted:
                del self.drained[(leaf, port)]
                self.wanted.discard((leaf, port))
                origin = self.config.gpus_per_node * (leaf - self.config.gpus)  # any GPU of that node routes there
                spine = self.logic.next_switch(origin)
                self.to_switch(spine, Packet(Kind.CREDIT, self.logic.route_key(port), self.logic.route_key(origin),
                                             nbytes=nbytes))
