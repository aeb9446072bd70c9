"""The call check before every collective: each member's call, as every member sent it in one control exchange,
compared before any data moves; and the argument checks it needs."""

import numpy as np

from nvlink_emu.fabric.errors import CollectiveMismatch
from nvlink_emu.fabric.packets import WIRE_INT_MAX


def is_integer(value) -> bool:
    """Whether an argument is an integer, Python's or numpy's (a bool is not)."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def counts_fit(counts, n: int) -> bool:
    """Whether a member's all2all(v) counts are (what it sends, what it receives): n integers 0..WIRE_INT_MAX
    each."""
    return (isinstance(counts, (tuple, list)) and len(counts) == 2
            and all(isinstance(side, (tuple, list)) and len(side) == n
                    and all(is_integer(x) and 0 <= x <= WIRE_INT_MAX for x in side) for side in counts))


def check_calls(*, gpu_rank: int, comm_name: str, members: tuple[int, ...], rank: int, name: str, seq: int,
                calls: list) -> None:
    """CollectiveMismatch on every member, listing each member's call, before any data moves. `calls`: each
    member's (call, counts) of collective `name` #`seq` on communicator `comm_name` (`members`; this member is
    `rank` of them, GPU `gpu_rank`). Every entry is data a member sent: its shape is checked before anything in
    it is used."""
    n = len(members)
    # whether this call carries counts (all2all(v) but a plan's): this member's own entry says, never another's
    counted = calls[rank][1] is not None
    problem = None
    shaped = [isinstance(entry, (tuple, list)) and len(entry) == 2 and isinstance(entry[0], dict)
              for entry in calls]
    if not all(shaped):
        problem = f"member {shaped.index(False)}'s call check is not a call and its counts"
    else:
        fingerprints = [c for c, _ in calls]
        own = [(m, c["problem"]) for m, (c, _) in zip(members, calls) if c.get("problem")]
        if own:
            problem = "; ".join(f"GPU {m}'s {text}" for m, text in own)
        elif any(f != fingerprints[0] for f in fingerprints):
            problem = "members called different collectives or arguments"
        else:
            # a member's counts: n integers 0..WIRE_INT_MAX each way on an all2all(v), none otherwise
            malformed = [i for i, (_, counts) in enumerate(calls)
                         if (counts is not None) != counted or counted and not counts_fit(counts, n)]
            if malformed:
                problem = (f"member {malformed[0]}'s counts are not {n} integers from 0 to {WIRE_INT_MAX} each "
                           f"way (what it sends, what it receives)" if counted else
                           f"member {malformed[0]} sent counts with a {name} that has none")
            elif counted:
                sends, recvs = [c[1][0] for c in calls], [c[1][1] for c in calls]
                bad = [(i, j) for i in range(n) for j in range(n) if sends[i][j] != recvs[j][i]]
                if bad:
                    i, j = bad[0]
                    problem = (f"member {i} sends {sends[i][j]} elements to member {j}, which expects "
                               f"{recvs[j][i]}")
    if problem:
        listing = "; ".join(f"GPU {members[i]}: " + (f"{entry[0]}" + (f" counts {entry[1]}" if entry[1] else "")
                                                    if ok else f"{entry!r:.120}")
                            for i, (entry, ok) in enumerate(zip(calls, shaped)))
        raise CollectiveMismatch(f"GPU {gpu_rank}: {name} #{seq} on communicator {comm_name!r}: "
                                 f"{problem}: {listing}")
