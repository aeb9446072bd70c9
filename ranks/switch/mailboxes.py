"""A leaf's mailbox bounds between the GPUs of its node (transport.packets.MAILBOX_PEER_*): per (sender, receiver, class),
the MSG payload bytes and messages forwarded and not yet credited back by the receiver (it credits what its program
took); a sender's MSG past either bound is parked, with the later ones of its pair and class, until credit comes
(MAX_PARKED*); a message a receiver's program waits for goes past the bounds."""

from collections import deque
from typing import cast

from nvlink_emu.fabric.packets import MsgInfo, Packet

from ..transport import mailbox_class
from ..transport.packets import MAILBOX_PEER_BYTES, MAILBOX_PEER_MESSAGES, WANTED
from .queues import MAX_PARKED, MAX_PARKED_BYTES, MAX_WANTED, Waiting


class Mailboxes:
    """The mailboxes of the GPUs `gpus` (those attached here)."""

    def __init__(self, gpus):
        self.gpus = gpus
        self.used: dict[tuple[int, int, int], list[int]] = {}  # (sender, receiver, class) -> [bytes, messages]
        self.full = False  # a MSG waits for a mailbox credit: take the credits that came
        self.asked: set[tuple[int, int, int]] = set()  # asked the receiver for credit (CREDIT to it)
        self.parked: dict[tuple[int, int, int], deque] = {}  # Waiting MSGs per (sender, receiver, class)
        self.parked_size: dict[int, list[int]] = {}  # per sender: [bytes, packets] parked
        # per receiver here: the (sender, key) its program waits for, oldest first: they go past the bounds
        self.wanted: dict[int, dict[tuple, bool]] = {}

    def busy(self) -> bool:
        """Whether any mailbox holds or waits for anything (else a MSG cannot be held for one)."""
        return bool(self.used or self.parked)

    def take_credits(self, got: list) -> None:
        """Take the mailbox credits the GPUs here sent (transport.credits: (receiver, sender, class, bytes,
        messages), or a want: (receiver, sender, WANTED, key)): a GPU credits messages of a sender of this node
        that its program took; anything else is ignored (a GPU that credits more than it took only lets more
        into its own mailbox)."""
        self.full = False
        for receiver, sender, cls, *rest in got:
            if cls == WANTED:
                if receiver in self.gpus:
                    self.want(receiver, sender, rest[0])
                continue
            nbytes, messages = rest
            pair = (sender, receiver, cls)
            used = self.used.get(pair) if receiver in self.gpus else None
            if used is None or nbytes < 0 or messages < 0:
                continue
            used[0], used[1] = max(0, used[0] - nbytes), max(0, used[1] - messages)
            self.asked.discard(pair)
            if not used[1]:
                del self.used[pair]

    def must_wait(self, source: int, receiver, packet: Packet, parked_ok: bool = False) -> tuple[bool, bool]:
        """(over, ask): whether MSG `packet` from GPU `source` would take the mailbox of `receiver` past its
        bounds for `source` (a first message, of any size, always goes), or must wait behind parked ones of its
        pair and class (unless `parked_ok`: it is the first of them); and whether to ask the receiver for its
        credit now (once: it credits at half a bound, or when asked)."""
        key = cast(MsgInfo, packet.info).key  # a MSG carries a MsgInfo (Packet checks the record of its kind)
        if self.wanted:
            wanted = self.wanted.get(receiver)
            if wanted and (source, key) in wanted:
                return False, False
        pair = (source, receiver, mailbox_class(key))
        if not parked_ok and pair in self.parked:
            return True, False
        used = self.used.get(pair)
        if used is None or not used[1] or (used[0] + packet.payload_bytes <= MAILBOX_PEER_BYTES
                                          and used[1] < MAILBOX_PEER_MESSAGES):
            return False, False
        self.full = True
        if pair in self.asked:
            return True, False
        self.asked.add(pair)
        return True, True

    def sent(self, source: int, receiver: int, key, nbytes: int) -> None:
        """A MSG of `nbytes` from GPU `source` in slot `key` went to `receiver`: counted until it is credited."""
        if self.wanted:
            self.wanted.get(receiver, {}).pop((source, key), None)
        used = self.used.setdefault((source, receiver, mailbox_class(key)), [0, 0])
        used[0] += nbytes
        used[1] += 1

    def want(self, receiver: int, sender, key: tuple) -> None:
        """GPU `receiver`'s program waits for `sender`'s message in slot `key`: it goes whatever the mailbox
        bounds (MAX_WANTED kept per receiver, the oldest dropped); if parked, it goes first."""
        wanted = self.wanted.setdefault(receiver, {})
        wanted[(sender, key)] = True
        if len(wanted) > MAX_WANTED:
            del wanted[next(iter(wanted))]
        for cls in (0, 1):
            queue = self.parked.get((sender, receiver, cls))
            if queue is None:
                continue
            for entry in queue:
                if cast(MsgInfo, entry.packet.info).key == key:  # parked: MSGs
                    queue.remove(entry)  # behind one whose payload is being received (SwitchRank._unpark)
                    queue.insert(1 if queue and queue[0].request is not None else 0, entry)
                    return

    def room(self, source: int, entry: Waiting) -> bool:
        """Whether GPU `source` may park `entry` (MAX_PARKED, MAX_PARKED_BYTES)."""
        size = self.parked_size.get(source, (0, 0))
        return size[1] < MAX_PARKED and size[0] + entry.size <= MAX_PARKED_BYTES

    def park(self, source: int, receiver: int, entry: Waiting) -> None:
        """Set checked MSG `entry` of GPU `source` for `receiver` apart until its mailbox has room."""
        pair = (source, receiver, mailbox_class(cast(MsgInfo, entry.packet.info).key))  # parked: MSGs
        self.parked.setdefault(pair, deque()).append(entry)
        used = self.parked_size.setdefault(source, [0, 0])
        used[0] += entry.size
        used[1] += 1

    def unpark(self, source: int, queue: deque) -> None:
        """The first of `queue` (GPU `source`'s parked MSGs of one pair and class) leaves it."""
        entry = queue.popleft()
        used = self.parked_size[source]
        used[0] -= entry.size
        used[1] -= 1
        if not used[1]:
            del self.parked_size[source]
