"""A GPU's mailbox: the receive side of its two-sided traffic (messages, the switch's deliveries to a
group) and the credit it owes its leaf.

A message lands where its receive was posted, or, if none was, in the mailbox until the program takes it.
The leaf holds a sender's messages to this GPU past transport.packets.MAILBOX_PEER_BYTES / _MESSAGES not taken
(per sender of its node and mailbox class), so what the program takes is credited back to it: once half
a bound is due, or at once when the switch asked (it holds the sender's next message: a CREDIT packet).
Modeled time is not here: a message's downlink turn comes when the program consumes it (Gpu).
"""

import numpy as np

from .transport import mailbox_class
from .transport.packets import MAILBOX_FABRIC, MAILBOX_P2P, MAILBOX_PEER_BYTES, MAILBOX_PEER_MESSAGES


class Mailbox:
    """arrived: (key, sender) -> bytes of a message no receive was posted for, not yet taken; posted:
    (key, sender) -> where a posted receive puts its message. A sender is a GPU index, or a string for a
    group's switch delivery (Gpu's _sender)."""

    def __init__(self, transport, switch: int, leaf: int, gpus_per_node: int):
        self._transport, self._switch = transport, switch
        self._leaf, self._per_node = leaf, gpus_per_node
        self.arrived: dict[tuple, np.ndarray] = {}
        self.posted: dict[tuple, np.ndarray] = {}
        # per (sender GPU of this node, mailbox class): [payload bytes, messages] the program took and the
        # switch was not told of yet
        self._taken: dict[tuple[int, int], list[int]] = {}
        self._credit_asked: set[tuple[int, int]] = set()  # the switch holds their next message: credit at once
        self._ever_held: set[tuple[int, int]] = set()  # (sender, class) the switch held once: a wait says what it wants

    def post(self, slot: tuple, dest: np.ndarray) -> np.ndarray | None:
        """Post a receive of `slot` into `dest`; the message's bytes instead if it is here already (taken)."""
        got = self.arrived.pop(slot, None)
        if got is None:
            self.posted[slot] = dest
        return got

    def took(self, sender, key: tuple, nbytes: int) -> None:
        """The program took a message of `nbytes` in slot `key` from GPU `sender` (an int; a multicast's
        sender is the switch): credited back to the switch once half a bound is due, or at once if the switch
        holds the sender's next message for want of it."""
        if type(sender) is not int or sender // self._per_node != self._leaf:
            return  # the switch bounds the messages of its own GPUs only
        bound = (sender, mailbox_class(key))
        taken = self._taken.setdefault(bound, [0, 0])
        taken[0] += nbytes
        taken[1] += 1
        if bound in self._credit_asked or taken[0] >= MAILBOX_PEER_BYTES // 2 or \
                taken[1] >= MAILBOX_PEER_MESSAGES // 2:
            self._credit(bound)

    def credit_asked(self, sender: int | None, cls: int) -> None:
        """The switch holds a message of GPU `sender`'s of mailbox class `cls` for want of credit (CREDIT):
        credit what was taken at once, or as soon as something is."""
        bound = (sender, cls)
        if sender is not None and cls in (MAILBOX_P2P, MAILBOX_FABRIC):
            self._ever_held.add((sender, cls))
        if bound in self._taken:
            self._credit(bound)
        elif sender is not None and cls in (MAILBOX_P2P, MAILBOX_FABRIC):
            self._credit_asked.add((sender, cls))

    def _credit(self, bound: tuple[int, int]) -> None:
        """Tell the switch what the program took of a (sender, mailbox class)'s messages
        (transport.send_credit)."""
        self._credit_asked.discard(bound)
        nbytes, messages = self._taken.pop(bound)
        self._transport.send_credit(self._switch, *bound, nbytes, messages)

    def wanting(self, slot: tuple):
        """A check for a wait on `slot` (key, sender): False always; once the switch held a message of the
        sender's class for want of credit, it tells the switch, once, that the program waits for this one
        (transport.send_want: it goes past the bounds, as a receive of another tag than the sender's backlog
        must not wait for that backlog)."""
        key, sender = slot
        asked = [False]

        def want() -> bool:
            if not asked[0] and (sender, mailbox_class(key)) in self._ever_held:
                asked[0] = True
                self._transport.send_want(self._switch, sender, key)
            return False
        return want
