"""`sharp`: NVLink SHARP as a push. Every GPU sends its buffer to the switch once; the switch reduces
the contributions and multicasts the result (one packet in, a copy out of every member port); across
nodes the leaves reduce their node's members and the spines the leaves' partials. Bytes per link,
combine order and the windows that bound the switches' memory: docs/model/algorithms-in-switch.md.
"""

import numpy as np

from nvlink_emu.fabric import plans
from nvlink_emu.fabric.plans import in_switch
from nvlink_emu.fabric.reduction import blocks, chunks, switch_accumulator

from . import plan

AG, BC, RD = 2, 3, 4  # message phases (0, 1 were allreduce's and reduce_scatter's, now their plans')


def allreduce(call, array: np.ndarray) -> None:
    """Its plan (fabric.plans.in_switch.sharp, for the call's size and the fabric's switch buffer), run by the
    one executor (ranks/collectives/plan.py)."""
    item = array.dtype.itemsize
    shape = in_switch.shape("sharp", call.n, "allreduce", call.nodes(), call.gpu.config, array.size * item, item,
                            _wide(array.dtype))
    plan.execute(call, plans.build("sharp", call.n, "allreduce", shape=shape), array, array)


def _wide(dtype) -> int:
    """How many times as wide as an element of `dtype` the switch's accumulator is."""
    return switch_accumulator(np.dtype(dtype)).itemsize // np.dtype(dtype).itemsize


def reduce_scatter(call, send: np.ndarray, recv: np.ndarray) -> None:
    """Its plan (fabric.plans.in_switch.sharp), as allreduce's."""
    item = send.dtype.itemsize
    shape = in_switch.shape("sharp", call.n, "reduce_scatter", call.nodes(), call.gpu.config, send.size * item, item,
                            _wide(send.dtype))
    plan.execute(call, plans.build("sharp", call.n, "reduce_scatter", shape=shape), send, recv)


def allgather(call, send: np.ndarray, recv: np.ndarray) -> None:
    parts = blocks(recv.size, call.n)
    for p, (a, b) in enumerate(parts):
        for c, (lo, hi) in enumerate(chunks(a, b, call.chunk)):
            call.post((AG, p, c), recv[lo:hi])
    a, _ = parts[call.r]
    for c, (lo, hi) in enumerate(chunks(0, send.size, call.chunk)):
        call.multicast((AG, call.r, c), send[lo:hi])
    # this node's blocks first (their copies come straight from the leaf), then the others' in rank order:
    # a GPU takes its deliveries on its downlink in the order it waits, and the other nodes' come later
    per_node = call.gpu.config.gpus_per_node
    here = call.gpu.rank // per_node
    for p in sorted(range(call.n), key=lambda p: call.peer(p) // per_node != here):
        a, b = parts[p]
        for c, (lo, hi) in enumerate(chunks(a, b, call.chunk)):
            call.wait((AG, p, c), f"GPU {call.peer(p)}'s multicast", recv[lo:hi])
    call.flush()


def broadcast(call, array: np.ndarray, root: int) -> None:
    spans = chunks(0, array.size, call.chunk)
    if call.r == root:
        scratch = np.empty(min(call.chunk, array.size), array.dtype)
        for c, (lo, hi) in enumerate(spans):
            call.multicast((BC, c), array[lo:hi])
        for c, (lo, hi) in enumerate(spans):
            call.recv_switch((BC, c), scratch[:hi - lo], "the root's own multicast copy")
    else:
        for c, (lo, hi) in enumerate(spans):
            call.recv_switch((BC, c), array[lo:hi], f"GPU {call.peer(root)}'s multicast")
    call.flush()


def reduce(call, send: np.ndarray, recv: np.ndarray | None, root: int) -> None:
    window = call.in_switch_window(1)
    spans = chunks(0, send.size, call.chunk)
    start = call.gpu.now_ns  # modeled: every contribution is issued at once
    last = len(spans) - window  # results the last contribution must wait for (none: no credits)
    step = max(1, window // 2)  # the root gives credit every `step` results, not for each one

    def contribute(c):
        lo, hi = spans[c]
        call.reduce((c,), send[lo:hi], [root], (RD, c), start)

    if call.r == root:
        for c, (lo, hi) in enumerate(spans):
            call.post((RD, c), recv[lo:hi])
        for c in range(min(window, len(spans))):
            contribute(c)
        for c, (lo, hi) in enumerate(spans):
            call.wait((RD, c), "the switch's reduction", recv[lo:hi])
            done = c + 1
            if done <= last and (done % step == 0 or done == last):
                call.comm.send_credit(done)
            if c + window < len(spans):
                contribute(c + window)
    else:
        seen = 0
        for c in range(len(spans)):
            # chunk c goes once results 0..c-window are back at the root: at most `window` in the switch
            while seen < c - window + 1:
                seen = call.comm.next_credit(root)
            contribute(c)
    call.flush()
