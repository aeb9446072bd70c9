"""Collective algorithms, one module each, registered by name; `Call` holds the primitives they use.

Primitives: send a message to a peer, post/wait a receive, in-switch reduce (REDUCE), multicast store
(MCAST) and NVLS load-reduce (LOAD_REDUCE). Each algorithm module defines the collectives it supports
as functions `allreduce(call, array)`, `reduce_scatter(call, send, recv)`, `allgather(call, send,
recv)`, `broadcast(call, array, root)`, and documents its per-GPU link bytes and its combine order.
"""

import contextlib

import numpy as np

from nvlink_emu.fabric.packets import Kind, LoadInfo, McastInfo, ReduceInfo
from nvlink_emu.fabric.reduction import blocks, dtype_name
from nvlink_emu.fabric.tuner import ACROSS_NODES, IN_SWITCH, SMALL_BYTES, allowed, choose  # noqa: F401 (re-exported)
from nvlink_emu.fabric.budget import in_switch_window

from . import all2all, direct, hier, hier_nvls, nvls, pxn, ring, sharp, tree

# the modules that run each algorithm; which runs a call is fabric.tuner's choice (choose, allowed: re-exported
# here, with the tuner's tables), and each module defines exactly the collectives fabric.tuner.IMPLEMENTS lists for it
ALGORITHMS = {"ring": ring, "direct": direct, "sharp": sharp, "nvls": nvls, "hier": hier,
              "hier_nvls": hier_nvls, "tree": tree}  # in fabric.tuner.ALGORITHMS' order
# all2all's algorithms (comm.all2all's `algorithm`, fabric.tuner.ALL2ALL), each taking all2allv's arguments;
# all2allv runs direct
ALL2ALL = {"direct": all2all.all2allv, "pxn": pxn.all2all}


def run(algorithm: str, collective: str, call: "Call", *args) -> None:
    getattr(ALGORITHMS[algorithm], collective)(call, *args)


class Call:
    """One member's side of one collective call: message keys, peers, primitives, pending sends.

    n: members; r: this member's rank; chunk: elements per message (chunk_bytes / itemsize).
    """

    def __init__(self, comm, seq: int, op: str, dtype: np.dtype):
        self.comm = comm
        self.gpu = comm.gpu
        self.n, self.r = comm.size, comm.rank
        self.seq = seq
        self.op = op
        self.dtype = dtype
        config = self.gpu.config
        self.chunk = max(1, config.chunk_bytes // dtype.itemsize)
        self._sends: list = []
        self.counts: tuple[tuple[int, ...], ...] | None = None  # all2allv: counts[i][j], elements i sends j
        self._channel_ns: dict[int, float] = {}  # channel c's clock while the call runs channels (channel)

    def in_switch_window(self, streams: int, least: int = 1, chunk_bytes: int | None = None) -> int:
        """Chunks each member may have in the switch at once, so that the contributions the switch
        holds - window x streams x (n - 1), each counted at least fabric.budget.held_slot_bytes - stay
        within the partition's share of switch_buffer_bytes (fabric.budget.buffer_share_bytes) and its
        count of held contributions (held_parts_share); shrinks the message size if even `least` chunks
        would not fit. `streams`: reductions one credit step covers (1 for allreduce; n when all n blocks
        are in flight at once); chunk_bytes: the message size wanted (default and at most
        config.chunk_bytes). fabric.budget.in_switch_window is the rule (fabric.budget.in_switch_chunk, the
        chunk alone, for the cost model)."""
        config, item = self.gpu.config, self.dtype.itemsize
        window, chunk = in_switch_window(config, self.n, streams, least, chunk_bytes, item)
        self.chunk = chunk // item
        return window

    def key(self, *parts) -> tuple:
        return (self.comm.name, self.seq, *parts)

    def nodes(self) -> int:
        """How many nodes the members are in."""
        per_node = self.gpu.config.gpus_per_node
        return len({self.peer(m) // per_node for m in range(self.n)})

    def peer(self, index: int) -> int:
        """GPU index of member `index` (taken mod n)."""
        return self.comm.members[index % self.n]

    # -- point to point ---------------------------------------------------------------------------
    def send(self, to: int, parts: tuple, data: np.ndarray) -> None:
        if data.size:
            self._sends.append(self.gpu.send_message(self.peer(to), self.key(*parts), data))

    def post(self, parts: tuple, out: np.ndarray, frm: int | None = None, group: int | None = None) -> None:
        """Receive `parts` into `out` when it comes, from member `frm` (None: from the switch, through
        this communicator's group, or `group`)."""
        if out.size:
            self.gpu.post_receive(self.key(*parts), out, *self._sender(frm, group))

    def wait(self, parts: tuple, source: str, out: np.ndarray, frm: int | None = None,
             group: int | None = None) -> None:
        if out.size:
            peer, group = self._sender(frm, group)
            self.gpu.wait_receive(self.key(*parts), peer, source, group)

    def _sender(self, frm: int | None, group: int | None = None) -> tuple[int | None, int | None]:
        """(peer GPU, multicast group) a message of member `frm` (None: of the switch, through `group`,
        default this communicator's) comes from."""
        if frm is not None:
            return self.peer(frm), None
        return None, self.comm.group_id() if group is None else group

    def recv(self, frm: int, parts: tuple, out: np.ndarray) -> None:
        """Receive `parts` from member `frm` into `out`."""
        self.post(parts, out, frm)
        self.wait(parts, f"GPU {self.peer(frm)}", out, frm)

    def recv_switch(self, parts: tuple, out: np.ndarray, source: str, group: int | None = None) -> None:
        """Receive a delivery of the switch (an in-switch result or a multicast copy; through `group`,
        default this communicator's) into `out`."""
        self.post(parts, out, group=group)
        self.wait(parts, source, out, group=group)

    def own_block_in_place(self, send: np.ndarray, recv: np.ndarray) -> list[tuple[int, int]]:
        """Allgather's first step: this member's block of `recv` <- `send`; returns every block's range."""
        parts = blocks(recv.size, self.n)
        a, b = parts[self.r]
        recv[a:b] = send
        return parts

    def flush(self) -> None:
        """Wait until every send of this call left (its buffer may be written again); modeled time
        moves to when the last byte this GPU's program sent left it (gpu.sent_ns: not a one-sided
        reply it served meanwhile, whose request the host may deliver at any point of the call)."""
        self.gpu.wait_sent(self._sends, "collective send")
        self._sends = []
        self.gpu.now_ns = max(self.gpu.now_ns, self.gpu.sent_ns)

    @contextlib.contextmanager
    def channel(self, c: int, count: int):
        """Run the body as channel c of `count` independent channels (docs/model/time.md, "Channels"): the
        GPU's clock is channel c's own, which starts at the GPU's clock when the call's first channel
        does, and its sends and receives book channel c's lane of the GPU's uplink and downlink (a 1 /
        count share), so its steps wait for its own receives and sends only. One channel (count 1) is
        the GPU's clock and whole links. join_channels ends them."""
        gpu = self.gpu
        if count == 1:
            yield
            return
        outer, gpu.now_ns = gpu.now_ns, self._channel_ns.get(c, gpu.now_ns)
        gpu.lane = (c, count)
        try:
            yield
        finally:
            self._channel_ns[c] = gpu.now_ns
            gpu.now_ns, gpu.lane = outer, None

    def join_channels(self) -> None:
        """The call's channels are done: the GPU's clock moves to the latest channel's."""
        self.gpu.now_ns = max([self.gpu.now_ns] + list(self._channel_ns.values()))
        self._channel_ns = {}

    # -- in the switch ----------------------------------------------------------------------------
    def reduce(self, slot: tuple, data: np.ndarray, dest: list[int], parts: tuple, at_ns: float | None = None) -> None:
        """Contribute `data` to in-switch reduction `slot`; the result goes to members `dest` as `parts`.
        at_ns: modeled issue time (the credits that bound the switch's memory are not modeled)."""
        info = ReduceInfo(self.comm.group_id(), (self.seq, *slot), self.op, dtype_name(self.dtype),
                          tuple(self.peer(d) for d in dest), self.key(*parts))
        self._sends.append(self.gpu.switch_request(Kind.REDUCE, info, data, at_ns=at_ns))

    def multicast(self, parts: tuple, data: np.ndarray, group: int | None = None) -> None:
        """Multicast-store `data` to every member (this one included) of `group` (default this
        communicator's) as `parts`."""
        info = McastInfo(self.comm.group_id() if group is None else group, self.key(*parts))
        self._sends.append(self.gpu.switch_request(Kind.MCAST, info, data))

    def load_reduce(self, slot: tuple, source: tuple, offset_bytes: int, nbytes: int, parts: tuple,
                    stamp: tuple[float, float], group: int | None = None, op: str | None = None) -> None:
        """Ask the switch to read [offset, offset + nbytes) of every member's buffer bound as `source`,
        reduce, and return the result to this member as `parts` (NVLS load-reduce). stamp: the uplink
        times booked for this request (gpu.reserve_uplink); group: default this communicator's; op:
        default the call's."""
        info = LoadInfo(self.comm.group_id() if group is None else group, (self.seq, *slot), op or self.op,
                        dtype_name(self.dtype),
                        (self.gpu.rank,), self.key(*parts), self.key(*source))
        self._sends.append(self.gpu.switch_request(Kind.LOAD_REDUCE, info, None, offset_bytes, nbytes,
                                                   stamp=stamp))

    def serve_load(self, source: tuple, slot: tuple, requester: int, group: int | None = None) -> None:
        """Answer the switch's read of `slot` (requested by member `requester`) through `group` (default
        this communicator's) from our `source` buffer."""
        self.gpu.serve_load(self.comm.group_id() if group is None else group, self.key(*source), (self.seq, *slot),
                            f"GPU {self.peer(requester)}")
