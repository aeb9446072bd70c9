"""The in-switch algorithms as plans (NVLink SHARP; docs/model/algorithms-in-switch.md): sharp's push.

sharp allreduce: every GPU contributes chunk c of its buffer to in-switch reduction slot (c,) (the switch
reduces the contributions; across nodes each leaf its node's members into a partial for spine c mod P,
the spine the partials) and takes the result, multicast to every member, into chunk c of the same buffer
(in place). The chunks are the in-switch chunk of the call (fabric.budget.in_switch_window: chunk_bytes
shrunk so the switch's buffer share holds them), and the window is its credit order: `window` chunks
contributed before the first result is taken, then one more after each result (a result back means
every member contributed that chunk, so at most `window` chunks of each member are in the switch). The
contributions are issued at the call's start (the credits are not modeled: both interpreters book them
at once; docs/model/time.md). The switch finishes the reduction (an average divides once there).

What the plan is built from depends on the fabric's config (its switch buffer and chunk), so `shape`
computes it and registry.build takes it (`shape=`): (elements, elements a chunk, window).
"""

from ..budget import in_switch_window, sharp_streams
from ..errors import PlanError
from ..reduction import chunks
from .format import GpuProgram, Op, Plan, Ref


def shape(algorithm: str, gpus: int, collective: str, nodes: int, config, nbytes: int, itemsize: int,
          wide: int = 1) -> tuple[int, int, int]:
    """What the in-switch plan of `algorithm` for a call of `nbytes` (the buffer's bytes as fabric.replay
    takes them) in `itemsize`-byte elements by `gpus` members in `nodes` nodes of the fabric `config` is
    built from: (elements, elements a chunk, window). wide: how many times as wide as an element the
    switch's accumulator is (a leaf's partial: 2 for float16/bfloat16, fabric.reduction.switch_accumulator).
    The window and chunk are Call.in_switch_window's with sharp.py's credit streams
    (fabric.budget.sharp_streams)."""
    if (algorithm, collective) != ("sharp", "allreduce"):
        raise PlanError(f"no in-switch plan for {collective} with {algorithm!r}")
    streams = sharp_streams(gpus, nodes, config.nodes, wide)
    window, chunk = in_switch_window(config, gpus, streams, 1, None, itemsize)
    return int(nbytes) // itemsize, chunk // itemsize, window


def sharp(gpus: int, collective: str, root: int = 0, layout=None, shape: tuple[int, int, int] | None = None) -> Plan:
    """sharp's allreduce (module docstring) for shape = (elements, elements a chunk, window). Every GPU runs
    the same operations (one tuple, shared)."""
    if collective != "allreduce":
        raise PlanError(f"sharp plan: no {collective}; sharp builds allreduce")
    if shape is None:
        raise PlanError("sharp plan: it is built for a call's size and the fabric's switch buffer "
                        "(fabric.plans.in_switch.shape)")
    count, piece, window = shape
    k = len(chunks(0, count, piece))
    if k == 0:  # no element: one empty chunk, contributed and taken (the interpreters skip empty ones)
        k, piece = 1, 0
    contribute = [Op("switch_contribute", src=Ref("i", c), slot=(c,)) for c in range(k)]
    ops = contribute[:window]
    for c in range(k):
        ops.append(Op("switch_recv", dst=Ref("o", c), slot=(c,)))
        if c + window < k:
            ops.append(contribute[c + window])
    ops = tuple(ops)
    programs = tuple(GpuProgram(g, ops, k, k) for g in range(gpus))
    return Plan("sharp", "allreduce", gpus, programs, inplace=True, fabrics=("network",), piece=piece)
