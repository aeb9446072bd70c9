"""The registry of algorithms built as plans: name -> function(gpus, collective) -> Plan.

ring: ranks/collectives/ring.py's one-node schedule (one ring 0, 1, ..., n-1; the buffer in n chunks;
reduce-scatter step s: position p sends chunk p-1-s to p+1 and folds chunk p-2-s from p-1 into its
own, a flush after each step; all-gather step s: sends chunk p-s, takes chunk p-1-s, one flush at the
end). Each GPU's link bytes: 2 (n-1)/n S (allreduce), (n-1)/n S (reduce_scatter, allgather).
recursive_doubling: allreduce on a power-of-two GPU count; step k, GPU g exchanges its whole buffer
with g xor 2^k and adds the partner's (received into scratch) to its own: log2(n) S bytes each way;
every GPU folds the same sets, in a different order (floating-point sums may differ from ring's).
"""

import functools

from ..errors import PlanError
from .format import GpuProgram, Op, Plan, Ref
from .validate import validate


def _ring_steps(n, p, buf, reduce):
    nxt, prv = (p + 1) % n, (p - 1) % n
    ops = []
    for s in range(n - 1):
        sent, taken = ((p - 1 - s) % n, (p - 2 - s) % n) if reduce else ((p - s) % n, (p - 1 - s) % n)
        ops.append(Op("send", src=Ref(buf, sent), send_to=nxt))
        ops.append(Op("recv_reduce" if reduce else "recv", dst=Ref(buf, taken), recv_from=prv))
        if reduce:
            ops.append(Op("flush"))
    if not reduce and n > 1:
        ops.append(Op("flush"))
    return ops


def ring(gpus: int, collective: str) -> Plan:
    """ring.py's one-node ring (module docstring) for allreduce, reduce_scatter or allgather."""
    n, programs = gpus, []
    for p in range(n):
        if collective == "allreduce":
            ops, chunks = _ring_steps(n, p, "o", True) + _ring_steps(n, p, "o", False), (n, n)
        elif collective == "reduce_scatter":
            ops, chunks = _ring_steps(n, p, "i", True) + [Op("copy", src=Ref("i", p), dst=Ref("o", 0))], (n, 1)
        elif collective == "allgather":
            ops, chunks = [Op("copy", src=Ref("i", 0), dst=Ref("o", p))] + _ring_steps(n, p, "o", False), (1, n)
        else:
            raise PlanError(f"ring plan: no {collective}; ring builds allreduce, reduce_scatter, allgather")
        programs.append(GpuProgram(p, tuple(ops), *chunks))
    return Plan("ring", collective, n, tuple(programs), inplace=collective == "allreduce")


def recursive_doubling(gpus: int, collective: str) -> Plan:
    """Recursive-doubling allreduce (module docstring) on a power-of-two GPU count."""
    n = gpus
    if collective != "allreduce":
        raise PlanError(f"recursive_doubling plan: no {collective}; it builds allreduce")
    if n < 1 or n & (n - 1):
        raise PlanError(f"recursive_doubling plan: {n} GPUs is not a power of two")
    programs = []
    for g in range(n):
        ops = []
        for k in range(n.bit_length() - 1):
            peer = g ^ (1 << k)
            ops += [Op("send", src=Ref("o", 0), send_to=peer), Op("recv", dst=Ref("s", 0), recv_from=peer),
                    Op("reduce", src=Ref("s", 0), dst=Ref("o", 0), deps=(len(ops) + 1,))]
        programs.append(GpuProgram(g, tuple(ops), 1, 1, 1))
    return Plan("recursive_doubling", "allreduce", n, tuple(programs), inplace=True)


ALGORITHMS = {"ring": ring, "recursive_doubling": recursive_doubling}


@functools.lru_cache(maxsize=256)
def build(algorithm: str, gpus: int, collective: str) -> Plan:
    """The validated plan of `algorithm` for `collective` on `gpus` GPUs (PlanError if it has none);
    built and validated once per (algorithm, gpus, collective): plans are immutable."""
    if algorithm not in ALGORITHMS:
        raise PlanError(f"no plan algorithm {algorithm!r}; known: {', '.join(ALGORITHMS)}")
    return validate(ALGORITHMS[algorithm](gpus, collective))
