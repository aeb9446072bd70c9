"""The switch rank's limits on what it holds of each GPU, and a GPU's packets waiting in order (Waiting, Queue)."""

from collections import deque

from nvlink_emu.fabric.packets import Kind, Packet

MAX_UNREAD = 1024  # answers a GPU may leave unread before the switch stops reading its packets
MAX_QUEUED = 256   # packets of one GPU waiting behind one that cannot go on yet
# ... and their bytes (Queue.nbytes: each packet's message and its decoded header, about as long again):
# a header may be MAX_HEADER_BYTES long, so MAX_QUEUED alone let a GPU's waiting packets hold 32 MiB of its
# switch (tests/unit/test_switch_span_order_and_costs.py); honest ones (inline payloads of 4 KiB at most, headers of tens
# of bytes to ~1 KiB) are about MAX_QUEUED of them (4 KiB inline MSGs: 250)
MAX_QUEUED_BYTES = 1 << 20
SWEEP_STEPS = 1024  # every this many intake steps, drop stray messages of every GPU
CREDIT_STEPS = 16  # every this many intake steps (and at once while a MSG waits for one), take mailbox credits
# A MSG held for its receiver's mailbox (_mailbox_over) is parked apart, with the later MSGs of its pair and
# class, so that it holds nothing else of its sender's (its collectives, its traffic to other GPUs): its header
# kept, its payload matched and not received (its send stays incomplete, as it did in line), per sender at most
# MAX_PARKED packets and MAX_PARKED_BYTES of their messages (as Queue's sizes); past that they wait in line
MAX_PARKED = MAX_QUEUED
MAX_PARKED_BYTES = MAX_QUEUED_BYTES
MAX_WANTED = 64  # messages a GPU here said its program waits for (transport.send_want), kept until they go
# fabric messages of a GPU the switch does not read now that a sweep keeps matched, to reach what it sent
# behind them (transport.drop_other_tags): a header and a payload for each packet that may wait, and one more
MAX_KEPT = 2 * (MAX_QUEUED + 1)
# what a GPU that said DONE still sends while the switches end the run: answers to requests forwarded to it
ANSWERS = frozenset({Kind.PUT_ACK, Kind.GET_DATA})
# what switches send each other for a group that spans nodes (partials, results, its lifecycle)
SPANNING = frozenset({Kind.REDUCE, Kind.MCAST, Kind.GROUP, Kind.LOAD_REDUCE})  # + nvls load-reduce requests


class Waiting:
    """A header whose payload is still to come (or still being received, or came inline and waits for
    its turn), with its deadline."""

    __slots__ = ("packet", "deadline", "request", "buffer", "held", "inline", "size", "parks", "message")

    def __init__(self, packet: Packet, deadline: float, inline=None, size: int = 0):
        self.packet, self.deadline, self.size = packet, deadline, size  # size: what it holds of the switch
        self.request = self.buffer = None
        self.held = False  # its payload is not taken yet: a port it goes to has too much in flight
        self.inline = inline  # its payload, if it came in the header's message (not checked yet)
        self.parks = False  # a MSG for a full mailbox: parked (SwitchRank._park) once its payload is matched
        self.message = None  # a parked MSG's payload, matched and not received yet (MPI keeps it: at its sender)


class Queue(deque):
    """A GPU's waiting packets (Waiting), in order, with the bytes they hold (`nbytes`, their sizes)."""

    def __init__(self):
        super().__init__()
        self.nbytes = 0

    def append(self, entry: Waiting) -> None:
        super().append(entry)
        self.nbytes += entry.size

    def popleft(self) -> Waiting:
        entry = super().popleft()
        self.nbytes -= entry.size
        return entry
