"""`sharp`: NVLink SHARP as a push. Every GPU sends its buffer to the switch once; the switch reduces
the contributions and multicasts the result (one packet in, a copy out of every member port); across
nodes the leaves reduce their node's members and the spines the leaves' partials. Bytes per link,
combine order and the windows that bound the switches' memory: docs/model/algorithms-in-switch.md.
"""

import numpy as np

from nvlink_emu.fabric import plans
from nvlink_emu.fabric.plans import in_switch
from nvlink_emu.fabric.reduction import chunks, switch_accumulator

from . import plan

RD = 4  # reduce's message phase (0 to 3 were allreduce's, reduce_scatter's, allgather's and broadcast's, now their plans')


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
    """Its plan of multicast stores (fabric.plans.in_switch.sharp), run by the one executor."""
    per_node, item = call.gpu.config.gpus_per_node, recv.dtype.itemsize
    shape = in_switch.shape("sharp", call.n, "allgather", call.nodes(), call.gpu.config, recv.size * item, item,
                            member_nodes=tuple(call.peer(p) // per_node for p in range(call.n)))
    plan.execute(call, plans.build("sharp", call.n, "allgather", shape=shape), send, recv)


def broadcast(call, array: np.ndarray, root: int) -> None:
    """Its plan of multicast stores (fabric.plans.in_switch.sharp) from `root`, run by the one executor."""
    item = array.dtype.itemsize
    shape = in_switch.shape("sharp", call.n, "broadcast", call.nodes(), call.gpu.config, array.size * item, item)
    plan.execute(call, plans.build("sharp", call.n, "broadcast", root, shape=shape), array, array)


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
        assert recv is not None  # the root's output, checked by the communicator
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
