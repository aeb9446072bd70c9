"""A GPU's control plane: the point-to-point control channel between GPU ranks, its live communicators
and the exchange it waits in.

Nothing here is counted on a link or timed: credits (sharp's reduce) and "where are you?" questions of
an exchange that timed out (the requests to the fabric manager are Gpu.ask_fabric_manager's).
Every message from another GPU is checked before it is kept: a member cannot park big objects here, nor
numbers never taken (MAX_CONTROL_WAITING a sender), and anything else is dropped as a stray.
"""

import collections
import itertools
import time

from nvlink_emu.fabric.packets import WIRE_INT_MAX

from .callcheck import is_integer
from .comm import CREDIT_SEQ

MAX_CONTROL_WAITING = 1024  # control messages one GPU may have waiting here (for calls not made yet)
# control messages a stray sweep takes and files (each progress call takes one): what a flood of them
# costs one sweep is bounded (transport.MAX_P2P_CONTROL_BYTES each); honest ones are a few per reduce
CONTROL_PER_SWEEP = 16
MAX_ANSWERS_IN_FLIGHT = 4  # "where are you?" answers to one GPU not yet sent: one that asks and never reads costs no more


class ControlPlane:
    """One GPU's control plane. channel: its ranks.transport.ControlChannel to the other GPU ranks;
    communicators: name -> its live communicators; exchange_at: (communicator, seq, op) of the control
    exchange it waits in, or None; abandoned_exchanges: exchanges that timed out (ranks.comm.
    close_communicators); strays: control messages dropped."""

    def __init__(self, channel, serve):
        self.channel = channel
        self._serve = serve  # serves the GPU's traffic once, napping if nothing moved (ask_where's wait)
        self.communicators: dict = {}
        self.exchange_at: tuple | None = None
        self.abandoned_exchanges = 0
        self.strays = 0
        self._box: dict[tuple, object] = {}             # (comm name, credit number, source) -> credit (sharp reduce)
        self._waiting = collections.Counter()          # source -> its messages in the box
        self._where_token = itertools.count(1)          # numbers this GPU's "where are you?" questions
        self._where_answers: dict[int, object] = {}     # GPU -> its answer to the latest question
        self._where_asked: tuple = (0, ())              # (that question's number, whom it asked)

    # -- messages from the other GPU ranks --------------------------------------------------------
    def take_in(self, budget: int = 1) -> bool:
        """File up to `budget` control messages that wait on the channel; True if any came."""
        came = False
        for _ in range(budget):
            got = self.channel.poll()
            if got is None:
                break
            self.file(*got)
            came = True
        return came

    def file(self, source: int, message) -> None:
        """Take a point-to-point control message: a credit of a communicator this GPU and `source` are
        members of (kept until take()), a "where are you?" question from a timed-out exchange
        (answered), or an answer to this GPU's own question. Anything else is dropped as a stray:
        exchanges are MPI collectives on the members' own communicator, so nothing sent here can
        take part in one."""
        if type(message) is tuple and len(message) == 4 and message[0] in ("?", "!"):
            (self._answer_where if message[0] == "?" else self._take_answer)(source, *message[1:])
            return
        if not (type(message) is tuple and len(message) == 3 and type(message[0]) is str
                and is_integer(message[1]) and message[1] <= CREDIT_SEQ):
            self.strays += 1  # not a credit of this emulator's
            return
        name, seq, obj = message
        comm = self.communicators.get(name)
        # only what a credit is (("credit", count): a few bytes), numbered from the next one this GPU
        # takes of `source` on MAX_CONTROL_WAITING: a member cannot park big objects here, nor numbers
        # never taken (kept for ever)
        if comm is None or source not in comm.members or self._waiting[source] >= MAX_CONTROL_WAITING \
                or not (type(obj) is tuple and len(obj) == 2 and obj[0] == "credit" and is_integer(obj[1])
                        and 0 <= obj[1] <= WIRE_INT_MAX) \
                or not 0 <= CREDIT_SEQ - seq - comm.credits_taken(source) < MAX_CONTROL_WAITING \
                or (name, seq, source) in self._box:
            self.strays += 1
            return
        self._box[(name, seq, source)] = obj
        self._waiting[source] += 1

    def has(self, name: str, seq: int, source: int) -> bool:
        """Whether credit number `seq` on communicator `name` from GPU `source` is here."""
        return (name, seq, source) in self._box

    def take(self, name: str, seq: int, source: int):
        """The credit number `seq` on communicator `name` from GPU `source` (it must be here)."""
        self._waiting[source] -= 1
        return self._box.pop((name, seq, source))

    @property
    def box(self) -> dict:
        """(communicator, credit number, source) -> a credit filed, not yet taken (for the raw port)."""
        return self._box

    # -- "where are you?" -------------------------------------------------------------------------
    def _answer_where(self, source: int, token, name, seq) -> None:
        """Answer GPU `source`'s "where are you?" (its exchange `seq` on communicator `name` timed out):
        the exchange this GPU waits in, if `source` is a member of its communicator; at most
        MAX_ANSWERS_IN_FLIGHT answers to one GPU in flight."""
        if not (is_integer(token) and type(name) is str and is_integer(seq)) \
                or self.channel.backlog(source) >= MAX_ANSWERS_IN_FLIGHT:
            self.strays += 1
            return
        at = self.exchange_at
        answer: tuple | str
        if at is not None and source in getattr(self.communicators.get(at[0]), "members", ()):
            answer = at
        elif name not in self.communicators:
            answer = f"not in a control exchange, and has no communicator {name!r} yet"
        else:
            answer = (f"in a control exchange of a communicator GPU {source} is not in" if at is not None
                      else "not in a control exchange (running its own code or another wait)")
        self.channel.send(source, ("!", token, answer, None))

    def _take_answer(self, source: int, token, answer, _) -> None:
        number, asked = self._where_asked
        if token != number or source not in asked or source in self._where_answers:
            self.strays += 1  # late, or not asked for
            return
        if type(answer) is tuple and len(answer) == 3 and type(answer[0]) is str and is_integer(answer[1]) \
                and type(answer[2]) is str:
            self._where_answers[source] = answer
        elif type(answer) is str:
            self._where_answers[source] = answer[:200]  # its own word, in its own words
        else:
            self._where_answers[source] = f"answered {str(answer)[:120]!r}"

    def ask_where(self, members: list[int], name: str, seq: int, wait_s: float) -> dict:
        """Ask `members` where they are (this GPU's exchange `seq` on communicator `name` timed out) and
        wait up to `wait_s` for their answers: {GPU: (comm name, seq, op) of the exchange it is in, or
        a sentence}; a GPU that did not answer is absent."""
        token = next(self._where_token)
        self._where_asked, self._where_answers = (token, frozenset(members)), {}
        for member in members:
            self.channel.send(member, ("?", token, name, seq))
        deadline = time.monotonic() + wait_s
        while len(self._where_answers) < len(members) and time.monotonic() < deadline:
            self._serve()
        return dict(self._where_answers)
