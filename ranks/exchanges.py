"""A communicator's control exchanges (allgather_object, barrier, split, the call check before every collective):
every member's object to every member, out of band, by non-blocking MPI calls on the members' own MPI communicator
(ranks.transport.Exchange); members in different operations fail together, naming each one's operation."""

from nvlink_emu.fabric.control import MAX_CONTROL_BYTES, decode, encode
from nvlink_emu.fabric.errors import CollectiveMismatch, FabricError, FabricTimeout, ProtocolError

from .callcheck import is_integer
from .transport import Exchange, MemberComms

WHERE_WAIT_S = 1.0  # s: how long a timed-out exchange asks its members where they are, past its deadline


def exchange(gpu, mpi: MemberComms, members: tuple[int, ...], name: str, obj, op: str, seq: int) -> list:
    """allgather_object as operation number `seq` of communicator `name` (negative: of its group creation, on
    its own MPI communicator `mpi.groups`). Every member sends (seq, op, obj); an entry that is not one (too
    long, undecodable, not of that shape) is "(not a control exchange)", and members in different operations
    are a CollectiveMismatch on every member, naming each one's operation."""
    problem = refusal = None
    try:
        data = encode((seq, op, obj))
    except FabricError as exc:  # still take part, so that the others fail at once, naming this member
        problem, data = exc, encode((seq, f"{op} (not a control object)", None))
    on = mpi.groups if seq < 0 else mpi.comm
    step = Exchange(on, data, mpi.kept_of(on))
    others = [m for m in members if m != gpu.rank]

    def posted():
        gpu.wake_for_mpi(others)

    step.on_step = posted
    posted()
    what = f"{op} #{seq} on communicator {name!r}"
    gpu.control.exchange_at = (name, seq, op)
    try:
        while True:
            try:
                gpu.wait_for_mpi(step.test, what, _LazyText(lambda: missing(gpu, members, name, seq)))
                break
            except FabricTimeout:
                # MPI cannot cancel a collective: it stays posted, and its messages may wait at
                # the members for ever; close_communicators then keeps this run's MPI communicators
                gpu.control.abandoned_exchanges += 1
                raise
            except FabricError as exc:
                if step.failed is not None:
                    raise
                # a refusal raised in the wait: this member's MPI calls must stay in step with
                # the others', so the exchange completes first
                refusal = refusal or exc
    finally:
        gpu.control.exchange_at = None
    if refusal is not None:
        raise refusal
    if problem is not None:
        raise FabricError(f"GPU {gpu.rank}: {op} #{seq} on communicator {name!r}: {problem}")
    assert step.parts is not None  # the step completed
    got = [(op, obj) if member == gpu.rank and isinstance(part, bytes) else _entry(part, seq)
           for member, part in zip(members, step.parts)]
    if any(other != op for other, _ in got):
        listing = "; ".join(f"GPU {p}: {other}" for p, (other, _) in zip(members, got))
        raise CollectiveMismatch(f"GPU {gpu.rank}: control exchange #{seq} on communicator {name!r}: "
                                 f"members are in different operations: {listing}")
    return [value for _, value in got]


def missing(gpu, members: tuple[int, ...], name: str, seq: int) -> str:
    """Whom exchange `seq` of communicator `name` waits for, asked at its deadline: the members that do not say
    they are in it (a collective cannot tell who has not come), each with where it says it is."""
    others = [m for m in members if m != gpu.rank]
    answers = gpu.control.ask_where(others, name, seq, WHERE_WAIT_S)
    away, notes = [], []
    for member in others:
        at = answers.get(member)
        if isinstance(at, tuple) and at[:2] == (name, seq):
            continue
        away.append(member)
        notes.append(f"GPU {member}: {_where(at, WHERE_WAIT_S)}")
    if not away:
        return f"GPUs {others}, which all say they are in it"
    return f"GPUs {away} ({'; '.join(notes)})"


def _entry(part, seq: int) -> tuple:
    """(operation, object) of a member's part of exchange `seq`: its bytes, or the length it announced
    and did not send (outside 0..MAX_CONTROL_BYTES)."""
    if not isinstance(part, bytes):
        return f"(not a control exchange: {part} bytes, past the {MAX_CONTROL_BYTES} a control object may have)", None
    try:
        message = decode(part)
    except ProtocolError:
        return "(not a control exchange)", None
    if not (type(message) is tuple and len(message) == 3 and is_integer(message[0]) and type(message[1]) is str):
        return "(not a control exchange)", None
    if message[0] != seq:  # never among members of this emulator: MPI matches exchanges in call order
        return f"{message[1]} #{message[0]}", None
    return message[1], message[2]


def _where(at, wait_s: float) -> str:
    """What a member answered to "where are you?" (ControlPlane.ask_where), in words."""
    if at is None:
        return f"no answer within {wait_s:g} s (busy outside the emulator's calls, or gone)"
    if isinstance(at, tuple):
        return f"in {at[2]} #{at[1]} on communicator {at[0]!r}"
    return at


class _LazyText:
    """A string computed only when printed, once (whom an exchange waits for is asked at its deadline)."""

    def __init__(self, make):
        self._make = make
        self._text = None

    def __str__(self):
        if self._text is None:
            self._text = self._make()
        return self._text

    __format__ = lambda self, spec: format(str(self), spec)
