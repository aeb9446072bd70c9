"""The GPU rank: its own memory and address, one-sided put/get through the switch, and a progress
engine that serves incoming requests inside every blocking wait (so no legal pattern deadlocks).

A GPU takes fabric packets from the switch it is attached to and from nobody else: whatever another
rank sends it straight is dropped unread (and counted as stray), so only what the switch forwarded,
translated and authorised can reach its memory, its mailbox or its results.

Gpu is a facade over its parts: allocations (memory.py), one_sided (onesided.py), links (links.py: its clocks
on the links, counters and trace records), mailbox (mailbox.py), loads (loads.py: NVLS bound buffers), control
(control.py), stream (requests.py), calls (calllog.py); it keeps the progress engine and the packets' dispatch."""

import itertools
import math
import time
from collections.abc import Callable
from typing import cast

import numpy as np

from nvlink_emu.fabric.addressing import Handle, physical_address
from nvlink_emu.fabric.compute import amount
from nvlink_emu.fabric.config import FabricConfig
from nvlink_emu.fabric.counters import gpu_view
from nvlink_emu.fabric.errors import FabricError, FabricTimeout, ProtocolError, UnsupportedOperation
from nvlink_emu.fabric.packets import (MAX_KEY_PARTS, WIRE_INT_MAX, CallRecord, ExportInfo, GroupInfo, Info, Kind,
                                      LoadInfo, McastInfo, MsgInfo, Packet, RevokeInfo, TraceInfo)

from .callcheck import is_integer
from .calllog import CallLog
from .comm import Communicator
from .control import CONTROL_PER_SWEEP, ControlPlane
from .links import GpuLinks
from .loads import BoundBuffers
from .mailbox import Mailbox
from .memory import Allocations
from .onesided import OneSided, raise_remote
from .raw import RawPort
from .requests import Request, Stream, wait_all, wait_any
from .transport import ControlChannel, Idle, Transport, native_collective, poked_idle, unframe
from .transport.packets import MAILBOX_PEER_BYTES, MAILBOX_PEER_MESSAGES


STRAY_SWEEP = 256  # every this many progress calls, look for strays from every rank, not just in front


class Gpu:
    """One emulated GPU, handed to a workload's main(gpu).

    rank: GPU index 0..size-1; memory: this GPU's whole uint8 memory; network_address: the address the
    fabric manager gave this GPU (NVLink Network mode; None in classic mode); world: communicator of
    all GPUs; timeout_s: deadline of every blocking wait, in seconds.
    """

    def __init__(self, config: FabricConfig, transport: Transport, control_channel: ControlChannel,
                 switch_rank: int, network_addresses: tuple[int, ...], timeout_s: float, trace=None):
        self.config = config
        self.rank = transport.rank
        self.size = config.gpus
        self.timeout_s = timeout_s
        self._transport = transport
        self._switch = switch_rank  # the rank of this GPU's leaf switch
        self._leaf = self.rank // config.gpus_per_node  # its switch index (the node's)
        self._network = config.mode == "network"
        self._keys = network_addresses if self._network else tuple(range(config.gpus))
        self.network_address = network_addresses[self.rank] if self._network else None
        self._gpu_of = {key: gpu for gpu, key in enumerate(self._keys)}  # routing key -> GPU index
        self.allocations = Allocations(self.rank, config)  # its memory's allocations and exported windows
        self.memory = self.allocations.array
        self._req = itertools.count(1)
        self._replies: dict[int, Packet] = {}           # req -> REPLY / NACK for a waiting caller
        self._traffic_errors: list[FabricError] = []    # refusals of collective traffic: raised in any wait
        # its puts and gets (ranks/onesided.py), over its packet sends, request numbers and replies
        self.one_sided = OneSided(self, self._keys[self.rank], self._send, self._as_bytes, lambda: next(self._req),
                                  self._replies)
        self.mailbox = Mailbox(transport, switch_rank, self._leaf, config.gpus_per_node)  # messages, credits
        self.control = ControlPlane(control_channel, self._serve_or_nap)  # credits, communicators, "where are you?"
        self.loads = BoundBuffers(self.rank, self._unserved)  # buffers bound for the switch's LOADs (NVLS)
        self._strays = 0                                # dropped by the sweeps: data from ranks other than the
                                                        # switch, control junk, members' MPI strays (control.strays: the rest)
        self._polls = 0                                 # progress calls, to sweep for strays now and then
        self._arrivals: dict[tuple, tuple[Packet, int | None]] = {}  # message key -> (its header, downlink seq) until consumed (timing)
        # its two links, booked and counted as it sends and consumes (ranks/links.py)
        self.links = GpuLinks(config, self.rank, self._leaf, trace)
        self.now_ns = 0.0                               # this GPU's modeled clock (a channel's, in one: lane)
        # the channel (c, C) whose clock now_ns is and whose lanes of the links the program books, while a call
        # runs C > 1 channels (ranks.collectives.Call.channel; docs/model/time.md, "Channels"); None: the GPU's
        self.lane: tuple[int, int] | None = None
        self._shutdown: Packet | None = None
        self.calls = CallLog()                          # collective calls, for the run's report (record_call)
        # a wait for the fabric sleeps at once, 1 to 5 ms (transport.poked_idle), where its leaf can wake
        # it: whoever sends this GPU anything pokes it (transport.Waker), so a nap only bounds a lost poke,
        # and a polling GPU would take the cores from the switch, which every packet passes (measured: 1 KiB
        # ring AllReduce on 8 GPUs, the job's CPU per call 176-182 ms polling from 10 us naps, 104-112 ms
        # napping from 2 ms). A leaf on another host, or no socket, pokes nobody: there the waits poll from 10 us
        waker = transport.waker
        self._idle = poked_idle() if waker.reaches((self._switch,)) else Idle()
        # MPI's own collectives (the native reference, an exchange's Iallgather(v)) move only as their ranks
        # poll, and poke nobody: their waits back off from 10 us
        self._mpi_idle = Idle()
        # not the members' exchanges either: sleeping through an exchange's poked round (tried) let members
        # leave a barrier up to a nap apart, which bench's timing after its barrier then counted (MPI's own
        # 1 KiB AllReduce on 4 GPUs measured 2.4-3.5 ms with it, 0.7-1.5 ms without)
        self.stream = Stream(self)                      # its non-blocking operations (ranks/requests.py)
        self._servers: dict[str, Callable] = {}         # message key[0] -> its server (serve_messages)
        self.world = Communicator.world(self, control_channel.comm)
        # members known from the config, so no GPU outside the partition takes part in making it
        self.partition = Communicator.partition_of(self, control_channel.comm)

    @property
    def trace(self):
        """This GPU's TraceWriter, or None (no trace directory): the one its links record with."""
        return self.links.trace

    # -- modeled time -------------------------------------------------------------------------------
    def compute(self, ns: float | None = None, *, flops: float | None = None, bytes: float | None = None,
                dtype=None) -> float:
        """Advance this GPU's modeled clock by a kernel's time; returns the ns added.

        compute(ns): `ns` of compute, as the script says. compute(flops=F, bytes=B, dtype=d): F
        operations in d (float64, float32, tf32, bfloat16, float16, fp8, int8, or the numpy dtype;
        default float32; work with no flops takes any numpy dtype) moving B bytes to and from HBM, timed by the roofline of this fabric's GPU
        profile (fabric/compute.py). Non-blocking collectives issued before run meanwhile: they overlap."""
        if ns is not None:
            if flops is not None or bytes is not None or dtype is not None:
                raise FabricError(f"GPU {self.rank}: compute({ns!r}, flops={flops!r}, bytes={bytes!r}, "
                                  f"dtype={dtype!r}): give ns, or flops/bytes/dtype, not both")
            added = amount(ns)
            if added is None:
                raise FabricError(f"GPU {self.rank}: compute({ns!r}): needs a finite, non-negative number of ns")
        else:
            if flops is None and bytes is None:
                raise FabricError(f"GPU {self.rank}: compute(): give ns, or the kernel's flops and/or bytes")
            try:
                added = self.config.compute_ns(flops or 0, bytes or 0, "float32" if dtype is None else dtype)
            except FabricError as exc:
                raise FabricError(f"GPU {self.rank}: {exc}") from None
        if not math.isfinite(self.now_ns + added):
            raise FabricError(f"GPU {self.rank}: compute of {added!r} ns: past any modeled clock")
        self.now_ns += added
        return added

    def set_tracing(self, on: bool) -> None:
        """Turn this GPU's trace records on or off, and the switches' records of its own traffic (what it
        sends, and what a switch sends it; ranks/switch/tracing.py, Records.traced): another tenant's stay. Every GPU
        off turns the switches' records off; the bench measures tracing's cost this way. No effect
        without --trace-dir."""
        if self.trace is not None:
            self.trace.enabled = on
            self._transport.send(self._switch, Packet(Kind.TRACE, self._keys[self.rank], -1, info=TraceInfo(bool(on))))

    def event(self, record: dict) -> None:
        """Append a record to this GPU's trace (with wall and modeled time), if tracing."""
        if self.trace is not None and self.trace.enabled:
            self.trace.write({**record, "wall": time.time(), "m": self.now_ns})

    # -- memory -----------------------------------------------------------------------------------
    def alloc(self, count: int, dtype="float32") -> np.ndarray:
        """A new array of `count` elements of `dtype`, a view into this GPU's memory."""
        return self.allocations.alloc(count, dtype)

    def free(self, array: np.ndarray) -> None:
        """Release the array alloc() returned (that object itself, once); an exported array must be
        revoked first."""
        self.stream.drain()  # a pending request may still own the array's memory
        self.allocations.free(array)

    @property
    def free_bytes(self) -> int:
        """Bytes of this GPU's memory not allocated."""
        return self.allocations.free_bytes

    # -- windows (NVLink Network) and physical addresses (classic) ---------------------------------
    def export(self, array: np.ndarray, to=None, writable: bool = True, readable: bool = True) -> Handle:
        """Export `array` as a window that GPUs `to` (default: this GPU's partition) may read/write.

        The fabric manager maps it in the Link TLB at run time and returns its network address. On
        classic nodes joined by InfiniBand (several nodes) it registers the memory, as RDMA does: the
        handle names the owner's GPU index, and it is how GPUs of other nodes reach it.
        """
        if not self.config.windows:
            raise UnsupportedOperation(f"GPU {self.rank}: export on classic NVLink ({self.config.name}): "
                                       f"connections are fixed at boot; use gpu.physical_address(array)")
        offset = self.allocations.exportable(array)
        if to is not None:
            given = to
            try:
                to = [to] if is_integer(to) else list(to)
            except TypeError:
                to = None
            if to is None or not all(is_integer(g) for g in to):
                raise FabricError(f"GPU {self.rank}: export to={given!r}: GPU indices must be integers")
            if not to:
                raise FabricError(f"GPU {self.rank}: export to=[]: a window nobody may use; name at least one GPU")
            to = tuple(int(g) for g in to)
            self._check_peer_list(to, "export to=")
        for name, flag in (("writable", writable), ("readable", readable)):
            if not isinstance(flag, (bool, np.bool_)):
                raise FabricError(f"GPU {self.rank}: export {name}={flag!r}: must be True or False")
        info = ExportInfo(offset, array.nbytes, to, bool(writable), bool(readable))
        reply = self.ask_fabric_manager(Kind.EXPORT, info, "export")
        handle = Handle(*reply["handle"])
        self.allocations.exported(offset, array.nbytes, handle)
        return handle

    def revoke(self, handle: Handle) -> None:
        """Tear down an exported window: later accesses to it are refused."""
        if not self.config.windows:
            raise UnsupportedOperation(f"GPU {self.rank}: revoke on classic NVLink ({self.config.name}): "
                                       f"connections are fixed at boot")
        if not isinstance(handle, Handle):
            raise FabricError(f"GPU {self.rank}: revoke needs a Handle from export(), got {handle!r}")
        if not (is_integer(handle.network_address) and is_integer(handle.address)
                and 0 <= handle.network_address <= WIRE_INT_MAX and 0 <= handle.address <= WIRE_INT_MAX):
            raise FabricError(f"GPU {self.rank}: revoke of {handle!r}: not a handle export() returned")
        self.ask_fabric_manager(Kind.REVOKE, RevokeInfo(int(handle.network_address), int(handle.address)),
                           f"revoke of {handle}")
        self.allocations.revoked(handle)

    def physical_address(self, array: np.ndarray) -> int:
        """Global physical address of `array` (classic NVLink: any GPU may put/get it, no isolation)."""
        if self._network:
            raise UnsupportedOperation(f"GPU {self.rank}: NVLink Network ({self.config.name}) has no shared "
                                       f"physical address space; export(array) a window instead")
        return physical_address(self.rank, self.allocations.offset_of(array))

    # -- one-sided access -------------------------------------------------------------------------
    def put(self, target, array: np.ndarray, offset: int = 0) -> None:
        """Write `array`'s bytes at byte `offset` of `target` (a Handle, or a physical address in classic mode).

        Returns once `array` may be reused; fence() waits until the bytes are visible at the target and
        raises AccessViolation if the switch refused them.
        """
        self.one_sided.put(target, array, offset)

    def get(self, target, array: np.ndarray, offset: int = 0) -> None:
        """Read `array.nbytes` bytes at byte `offset` of `target` into `array`; AccessViolation if refused."""
        self.one_sided.get(target, array, offset)

    def fence(self) -> None:
        """Return when every put of this GPU is visible at its target; raise any refusal."""
        self.one_sided.fence()

    def link_counters(self) -> dict:
        """This GPU's link counters: tx_/rx_ bytes (payload), raw_bytes, packets, busy_ns (modeled)."""
        return gpu_view(self.link_snapshot(), self.rank, self._leaf)

    def program_bytes(self) -> tuple[int, int]:
        """(tx, rx) payload bytes this GPU's program has sent and consumed so far: the link counters'
        bytes without the one-sided traffic served as the host delivered it (puts and gets into this
        GPU, the replies to them and to its own), which may come in the middle of any call."""
        return self.links.program_bytes[0], self.links.program_bytes[1]

    def record_call(self, call: CallRecord) -> None:
        """Keep a collective call's record for the run's report (the communicators call this; CallLog.record)."""
        self.calls.record(call)

    def link_snapshot(self) -> dict:
        """Every link's counters this GPU keeps ({link name: LinkStats.as_dict()}), busy times and fault
        counts included: what it reports at the end of the run."""
        return self.links.snapshot()

    # -- non-blocking operations (ranks/requests.py) -------------------------------------------------
    def wait_all(self, requests) -> None:
        """Wait for every request (comm.iallreduce and the other i-forms); the clock moves to the latest end."""
        wait_all(self._requests(requests, "wait_all"))

    def wait_any(self, requests) -> int:
        """Wait for the request that completes first in modeled time; returns its index in `requests`."""
        requests = self._requests(requests, "wait_any")
        if not requests:
            raise FabricError(f"GPU {self.rank}: wait_any of no requests")
        return wait_any(requests)

    def _requests(self, requests, op: str) -> list[Request]:
        try:
            requests = list(requests)
        except TypeError:
            raise FabricError(f"GPU {self.rank}: {op} takes a list of Requests, got {requests!r}") from None
        for request in requests:
            if not isinstance(request, Request) or request.gpu is not self:
                raise FabricError(f"GPU {self.rank}: {op}: {request!r} is not a Request of this GPU (the i-forms "
                                  f"of the collectives return them)")
        return requests

    # -- messages (collective traffic) ------------------------------------------------------------
    def send_message(self, peer: int, key: tuple, data: np.ndarray, at_ns: float | None = None) -> list:
        """Post `data` to GPU `peer`'s mailbox slot `key` (a flat tuple of ints and strings) through the
        switch; returns the send requests. Asynchronous: `data` must not be written until
        gpu.wait_sent([requests]) returned (the emulator may still be sending from it). at_ns: modeled
        time the send is issued (default: now)."""
        self.stream.drain()
        self._check_peer(peer, f"send_message to {peer!r}")
        if not isinstance(key, tuple) or not all(isinstance(k, (int, str)) for k in key):
            raise FabricError(f"GPU {self.rank}: message key {key!r} must be a flat tuple of ints and strings")
        data = self._as_bytes(data, "send")
        return self._send(Packet(Kind.MSG, self._keys[self.rank], self._keys[peer], 0, data.nbytes,
                                 info=MsgInfo(key)), data, at_ns)

    def switch_request(self, kind: Kind, info: Info, payload: np.ndarray | None = None, address: int = 0,
                       nbytes: int | None = None, at_ns: float | None = None,
                       stamp: tuple[float, float] | None = None) -> list:
        """Post an in-switch operation (REDUCE, MCAST, LOAD_REDUCE) to the switch; returns the send requests.
        at_ns: modeled issue time (default now); stamp: uplink times reserved earlier (reserve_uplink)."""
        self.stream.drain()
        data = None if payload is None else self._as_bytes(payload, kind.name)
        size = cast(np.ndarray, data).nbytes if nbytes is None else nbytes  # LOAD_REDUCE names nbytes, the others carry a payload
        return self._send(Packet(kind, self._keys[self.rank], -1, address, size, info=info), data, at_ns, stamp)

    @property
    def sent_ns(self) -> float:
        """When the last byte this GPU's program sent left its uplink (modeled ns): what a call that
        waits for its sends waits for. One-sided replies it served (PUT_ACK, GET_DATA), booked in the
        order the host delivered their requests, are not in it (fabric.timemodel.LinkEnd.serve). In a
        channel (`lane`), the last byte that channel sent."""
        return self.links.uplink.lane_sent_ns(self.lane)

    def reserve_uplink(self, payload_bytes: int, at_ns: float) -> tuple[float, float]:
        """Book this GPU's uplink now for a transfer sent later (the emulator may hold a send back to
        bound host memory; modeled time treats it as issued at `at_ns`); returns its stamp."""
        return self.links.reserve_uplink(payload_bytes, at_ns)

    def link_status(self) -> dict:
        """This GPU's two links at its modeled clock: {link name: {"state": "up" | "ber" | "degraded" |
        "down", "crc_errors": n, "replays": n}}, and when down "down_since_ns" and "up_at_ns" (inf: for
        good) (fabric.faults; all "up" and 0 without a fault plan)."""
        return self.links.status(self.now_ns)

    def post_receive(self, key: tuple, out: np.ndarray, peer: int | None = None, group: int | None = None) -> None:
        """Receive the message in slot `key` from GPU `peer`, or (peer None) the switch's delivery through
        multicast group `group` (an in-switch result or a multicast copy), straight into `out` when it
        arrives (see wait_receive)."""
        self.stream.drain()
        key = (tuple(key), _sender(peer, group))
        dest = self._as_bytes(out, "receive", written=True)
        got = self.mailbox.post(key, dest)
        if got is None:
            return
        self.mailbox.took(key[1], key[0], got.nbytes)
        if got.nbytes != dest.nbytes:
            raise ProtocolError(f"GPU {self.rank}: message {key} has {got.nbytes} bytes, expected {dest.nbytes}")
        dest[:] = got

    def wait_receive(self, key: tuple, peer: int | None = None, what: str = "", group: int | None = None) -> None:
        """Wait until the posted receive of slot `key` from `peer` (or group `group`) completed; the
        transfer takes its turn on this GPU's downlink now, in program order (modeled time)."""
        self.stream.drain()
        slot = (tuple(key), _sender(peer, group))
        source = what or ("the switch" if peer is None else f"GPU {peer}")
        want = self.mailbox.wanting(slot)
        self._wait(lambda: slot not in self.mailbox.posted or want(), "receive", f"{source} (slot {slot[0]})")
        self.now_ns = max(self.now_ns, self._consume(*self._arrivals.pop(slot), program=True))

    def take_message(self, key: tuple, peer: int, op: str, waiting_for: str) -> np.ndarray:
        """Wait for the message in slot `key` from GPU `peer` (never posted: it lands in the mailbox) and
        return its bytes, whatever their size; its downlink turn comes now, in program order."""
        self.stream.drain()
        slot = (tuple(key), peer)
        want = self.mailbox.wanting(slot)
        self._wait(lambda: slot in self.mailbox.arrived or want(), op, waiting_for)
        self.now_ns = max(self.now_ns, self._consume(*self._arrivals.pop(slot), program=True))
        got = self.mailbox.arrived.pop(slot)
        self.mailbox.took(peer, slot[0], got.nbytes)
        return got

    def has_message(self, key: tuple, peer: int) -> bool:
        """Whether the message in slot `key` from GPU `peer` has arrived, not posted for and not yet taken
        (an MPI-style probe; read-only)."""
        return (tuple(key), peer) in self.mailbox.arrived

    def peek_message(self, key: tuple, peer: int) -> np.ndarray | None:
        """The bytes of GPU `peer`'s message in slot `key` if it arrived and was not taken, else None; it stays
        in the mailbox, not taken (read-only: not credited to the switch, no downlink turn)."""
        return self.mailbox.arrived.get((tuple(key), peer))

    def serve_messages(self, tag: str, server) -> None:
        """Serve messages whose key starts with `tag` in the progress loop, as they arrive, instead of
        filing them: `server(sender GPU, key, bytes)` returns replies [(GPU, key, uint8 array)], sent at
        once, booked when the request arrived (a served reply, as a PUT_ACK). A layer's remote operation
        that the target's memory answers without its program (the mpi4py layer's MPI.Win: accumulates,
        locks) is this; the server runs in whatever wait the target is in, one request at a time (no
        concurrency: a read-modify-write in it is atomic). server None: file them again."""
        if server is None:
            self._servers.pop(tag, None)
        else:
            self._servers[tag] = server

    def raw_port(self):
        """This GPU's raw port (ranks.raw.RawPort): forged headers and bare channels, for the attack tests and
        the hostile example; never needed by a workload."""
        return RawPort(self)

    @property
    def strays(self) -> int:
        """Messages dropped unread: data from ranks other than the switch, and control messages that are
        not this emulator's or not for this GPU."""
        return self._strays + self.control.strays

    def poll(self) -> bool:
        """Serve this GPU's traffic once, without waiting (what arrived is filed); True if anything moved."""
        return self._progress()

    def wait(self, done, what: str, whom: str) -> None:
        """Serve this GPU's traffic until done() holds; FabricTimeout naming `what` and `whom` at the
        run's deadline (every blocking wait of the emulator is this one)."""
        self._wait(done, what, whom)

    def receive_message(self, key: tuple, out: np.ndarray, peer: int) -> None:
        """Wait for the message in slot `key` from GPU `peer` and place its bytes in `out`."""
        self._check_peer(peer, f"receive_message from {peer!r}")
        self.post_receive(key, out, int(peer))
        self.wait_receive(key, peer)

    def wait_sent(self, sends: list[list], what: str) -> None:
        """Wait until sends (a list of what send_message returned) completed locally, so their buffers
        may be written again; `what` names them in a timeout. Modeled time does not move."""
        self._wait(lambda: all(self._transport.sent(r) for r in sends), what, _TAKE_DATA)

    def bind_buffer(self, key: tuple, data: np.ndarray) -> None:
        """Let the switch LOAD from `data` under `key` (NVLS: a buffer bound to a multicast group)."""
        self.loads.bind(key, self._as_bytes(data, "bind"))

    def unbind_buffer(self, key: tuple) -> None:
        """Stop the switch's LOADs from the buffer bound as `key` (BoundBuffers.unbind)."""
        self.loads.unbind(key)

    def serve_load(self, group: int, key: tuple, slot: tuple, requester: str) -> None:
        """Answer the switch's LOAD of `slot` through `group` from the buffer bound as `key` (NVLS),
        waiting for it to arrive. Served in program order, so its place on the links is deterministic;
        the answer leaves when the LOAD arrived, not when the program got to it (memory answers, not
        the SMs). A LOAD past the buffer's end gives the buffer up (BoundBuffers.take: AccessViolation)."""
        lookup = (group, tuple(key), tuple(slot))
        self.loads.check(group, key, slot, requester)
        self._wait(lambda: self.loads.came(lookup), "serve load", f"{requester}'s load-reduce (slot {slot})")
        packet, seq, data = self.loads.take(lookup, requester)
        self._send(Packet(Kind.REDUCE, self._keys[self.rank], -1, 0, packet.nbytes, packet.req,
                          cast(LoadInfo, packet.info).contribution()), data, self._consume(packet, seq, program=True))

    def _unserved(self, load: Packet) -> None:
        """Tell the switch this GPU will not serve `load` (a control notice, which nothing answers)."""
        info = cast(LoadInfo, load.info)  # a LOAD carries a LoadInfo (Packet checks the record of its kind)
        notice = GroupInfo("unserved", info.group, info.slot, "")
        self._transport.send(self._switch, Packet(Kind.GROUP, self._keys[self.rank], -1, info=notice))

    def native(self, collective: str, send: np.ndarray, recv: np.ndarray, op: str = "sum", root: int = 0) -> None:
        """The same collective by MPI's own implementation over the GPU ranks (not through the fabric,
        not counted): the reference the bench times and the tests compare with."""
        request = native_collective(self.control.channel, collective, send, recv, op, root)
        self._wait(request.Test, f"native MPI {collective}", "the other GPU ranks", idle=self._mpi_idle)

    # -- the progress engine ------------------------------------------------------------------------
    def _wait(self, done, op: str, waiting_for: str, timeout_s: float | None = None, idle: Idle | None = None) -> None:
        """Serve traffic until done() holds; FabricTimeout naming op and peer at the deadline."""
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout_s
        idle = self._idle if idle is None else idle
        while not done():
            if self._traffic_errors:
                # a refused message or in-switch operation: its answer will never come
                error, self._traffic_errors = self._traffic_errors[0], []
                raise error
            if self._progress():
                idle.reset()
                continue
            if time.monotonic() > deadline:
                raise FabricTimeout(f"GPU {self.rank}: {op} timed out after {timeout_s:g} s waiting for "
                                    f"{waiting_for}")
            idle(sending=not self._transport.idle)

    def _progress(self) -> bool:
        moved = self._transport.progress() | self.control.channel.progress() | self.control.take_in()
        self._polls += 1
        sweep = not self._polls % STRAY_SWEEP
        # most wakes find nothing: one probe for any message on the fabric's communicator, instead of
        # the two below (a header from the switch, strays in front), which find nothing if it does not
        if not sweep and not self._transport.anything_waiting():
            return moved
        incoming = self._transport.poll(self._switch)
        if incoming is not None:
            header, inline = unframe(incoming[1])  # the switch is trusted: a bad frame or header is a bug
            self._handle(incoming[0], Packet.from_wire(header), inline)
            if not sweep:
                return True
            moved = True
        dropped = self._transport.drop_strays(self._switch, sweep=sweep) + (self._sweep_mpi() if sweep else 0)
        self._strays += dropped
        return moved or bool(dropped)

    def wake_for_mpi(self, members) -> None:
        """MPI's own traffic moved (a step of an exchange): start this GPU's MPI back-off afresh and poke
        `members` (GPU indices = their fabric ranks), whose naps neither the fabric's progress nor MPI see;
        otherwise a collective whose every round needs each member's next poll would crawl."""
        self._mpi_idle.reset()
        for member in members:
            self._transport.waker.poke(member)

    def wait_for_mpi(self, done, what: str, whom) -> None:
        """wait() for MPI's own collectives (an exchange, MPI's native ones): they move only as their ranks
        poll and poke nobody, so the wait backs off from 10 us instead of sleeping until poked."""
        self._wait(done, what, whom, idle=self._mpi_idle)

    def _serve_or_nap(self) -> None:
        """Serve this GPU's traffic once; nap if nothing moved."""
        if not self._progress():
            self._idle()

    def _sweep_mpi(self) -> int:
        """Drop what waits on this GPU's other MPI communicators and no protocol expects (a flood sent
        around the fabric would hold its bytes here and slow every match of this rank's, whatever the
        communicator); returns how many. The run's own communicator (MPI_COMM_WORLD under `nvlink-emu run`:
        nobody's point to point while the run lasts), the GPU ranks' control channel (control messages
        only: those waiting are taken and filed now, up to CONTROL_PER_SWEEP), each communicator's
        members' MPI communicators (exchange slots only, one a member: MemberComms.sweep)."""
        dropped = self._transport.sweep_outer() + self.control.channel.drop_strays()
        self.control.take_in(CONTROL_PER_SWEEP)
        status = self._transport._status
        for comm in list(self.control.communicators.values()):
            dropped += comm.sweep_strays(status)
        return dropped

    def _handle(self, source: int, packet: Packet, inline: np.ndarray | None = None) -> None:
        """Serve `packet` from the switch; `inline`: its payload, if it came in the header's message."""
        seq = self.links.count_receive(packet) if packet.kind.counted else None
        kind = packet.kind
        # one-sided traffic is served as it comes: it takes its turn on the links in serving order
        if kind is Kind.PUT:
            phys = packet.address
            self._receive(packet, self.memory[phys:phys + packet.nbytes], inline)
            self._send(Packet(Kind.PUT_ACK, self._keys[self.rank], packet.src, req=packet.req),
                       at_ns=self._consume(packet, seq), served=True)
        elif kind is Kind.GET:
            data = self.memory[packet.address:packet.address + packet.nbytes].copy()
            self._send(Packet(Kind.GET_DATA, self._keys[self.rank], packet.src, 0, packet.nbytes, packet.req),
                       data, self._consume(packet, seq), served=True)
        elif kind is Kind.PUT_ACK:
            self.one_sided.acked(packet.req, self._consume(packet, seq))
        elif kind is Kind.GET_DATA:
            dest = self.one_sided.take_get(packet.req)
            self._receive(packet, dest if dest is not None else np.empty(packet.nbytes, np.uint8), inline)
            if dest is None:  # the bytes are taken first, so the next payload is not mistaken for these
                raise ProtocolError(f"GPU {self.rank}: GET_DATA for request {packet.req}, which it never made")
            self.one_sided.got(packet.req, self._consume(packet, seq))
        elif kind is Kind.MSG and self._servers and (served := cast(MsgInfo, packet.info).key) and \
                served[0] in self._servers:
            data = np.empty(packet.nbytes, np.uint8)
            self._receive(packet, data, inline)
            arrived = self._consume(packet, seq)
            sender = self._gpu_of.get(packet.src)
            self.mailbox.took(sender, tuple(served), packet.nbytes)  # served is taken: credit the mailbox bound
            for peer, key, reply in self._servers[served[0]](sender, tuple(served), data):
                self._send(Packet(Kind.MSG, self._keys[self.rank], self._keys[peer], 0, reply.nbytes,
                                  info=MsgInfo(tuple(key))), reply, arrived, served=True)
        elif kind is Kind.MSG or kind is Kind.MCAST:
            info = cast(MsgInfo | McastInfo, packet.info)  # the record of its kind (Packet checks it)
            sender = self._gpu_of.get(packet.src) if kind is Kind.MSG else _sender(None, cast(McastInfo, info).group)
            slot = (info.key, sender)
            dest = self.mailbox.posted.get(slot)
            fits = dest is None or dest.nbytes == packet.nbytes
            buffer = dest if dest is not None and fits else np.empty(packet.nbytes, np.uint8)
            self._receive(packet, buffer, inline)
            if dest is not None and not fits:  # taken first, so the next payload is not mistaken for this one
                raise ProtocolError(f"GPU {self.rank}: message {slot[0]} from "
                                    f"{sender if isinstance(sender, str) else f'GPU {sender}'} has {packet.nbytes} "
                                    f"bytes, the receive expects {dest.nbytes}")
            if dest is not None:
                del self.mailbox.posted[slot]
                self.mailbox.took(sender, slot[0], packet.nbytes)
            else:
                self.mailbox.arrived[slot] = buffer
            self._arrivals[slot] = (packet, seq)  # its downlink turn comes when the program consumes it
        elif kind is Kind.LOAD:
            self.loads.file(packet, seq)
        elif kind is Kind.NACK:
            refusal = self.one_sided.refused(packet, self._consume(packet, seq))
            if refusal is not None:  # of collective traffic: raised in any wait
                self._traffic_errors.append(refusal)
        elif kind is Kind.REPLY:
            self._replies[packet.req] = packet
        elif kind is Kind.CREDIT:  # the switch holds a message of GPU src's for want of mailbox credit
            # req: the mailbox class (transport.mailbox_class)
            self.mailbox.credit_asked(self._gpu_of.get(packet.src), packet.req)
        elif kind is Kind.SHUTDOWN:
            self._shutdown = packet
        else:
            raise ProtocolError(f"GPU {self.rank}: unexpected {kind.name} from rank {source}")

    def _receive(self, packet: Packet, out: np.ndarray, inline: np.ndarray | None) -> None:
        """Take `packet`'s payload into `out` (uint8, its size): from `inline` if it came in the header's
        message, else the next payload message from the switch."""
        if inline is not None:
            if inline.nbytes != packet.payload_bytes:  # the switch is trusted: a bug
                raise ProtocolError(f"GPU {self.rank}: {packet.kind.name} req {packet.req} from the switch says "
                                    f"{packet.payload_bytes} bytes, {inline.nbytes} came inline")
            out[:] = inline
        elif packet.payload_bytes:
            self._transport.recv_payload(self._switch, out, time.monotonic() + self.timeout_s,
                                         f"{packet.kind.name} req {packet.req}")
            self._transport.waker.poke(self._switch)  # its send completed: the switch retires it at once

    def _send(self, packet: Packet, payload: np.ndarray | None = None, at_ns: float | None = None,
              stamp: tuple[float, float] | None = None, served: bool = False) -> list:
        """Post `packet` to the switch, booked on the uplink at `at_ns` (default now) unless `stamp` was
        reserved; `served`: a one-sided reply, booked on the uplink's served lane: it neither moves sent_ns
        nor delays the program's sends (its request's host arrival order would then move the program's time)."""
        if packet.kind.counted:
            at = self.now_ns if at_ns is None else at_ns
            packet, beside = self.links.book_send(packet, at, stamp, served, self.lane)
            if beside is not None:
                self.one_sided.sent_beside(beside)
        return self._transport.send(self._switch, packet, payload)

    def _consume(self, packet: Packet, seq: int | None, program: bool = False) -> float:
        """Put transfer `seq` that reached this GPU on its downlink; returns when its last byte arrived (ns).
        `program`: consumed by this GPU's program, in program order; else served as the host delivered
        it (one-sided traffic), on the links' served lane (fabric.timemodel.LinkEnd), so it neither
        waits for nor delays the program's transfers, and the call records count only the program's."""
        return self.links.consume(packet, seq, self._gpu_of.get(packet.src), program, self.lane)

    def ask_fabric_manager(self, kind: Kind, info: Info, what: str) -> dict:
        """Ask the fabric manager (the leaf switch) for `what` (a GROUP, EXPORT or REVOKE request, not counted
        on a link) and wait for its reply's info; an error it answered is raised as its fabric.errors class."""
        req = next(self._req)
        self._transport.send(self._switch, Packet(kind, self._keys[self.rank], -1, req=req, info=info))
        self._wait(lambda: req in self._replies, what, "the fabric manager (switch)")
        reply = cast(dict, self._replies.pop(req).info)  # a REPLY's info is a map
        if "error" in reply:
            raise_remote(reply["error"], reply.get("message", ""), f"GPU {self.rank}: {what}")
        return reply

    # -- helpers ------------------------------------------------------------------------------------
    def _check_peer(self, peer, op: str) -> None:
        if not is_integer(peer) or not 0 <= peer < self.size:
            raise FabricError(f"GPU {self.rank}: {op}: not a GPU 0..{self.size - 1}")

    def _check_peer_list(self, peers, op: str) -> None:
        for peer in peers:
            self._check_peer(peer, f"{op}{list(peers)} names {peer}")

    def _as_bytes(self, array: np.ndarray, op: str, written: bool = False) -> np.ndarray:
        """`array`'s bytes; `written`: the operation writes into them."""
        if not isinstance(array, np.ndarray) or not array.flags.c_contiguous:
            raise FabricError(f"GPU {self.rank}: {op} needs a contiguous numpy array")
        if written and not array.flags.writeable:
            raise FabricError(f"GPU {self.rank}: {op} into a read-only array")
        return array.reshape(-1).view(np.uint8)

    # -- end of run ---------------------------------------------------------------------------------
    def finish(self) -> dict:
        """After main(gpu): complete this GPU's traffic (requests never waited for included, their
        errors raised), report DONE, serve until the switch's report."""
        self.now_ns = max(self.now_ns, self.stream.finish())  # the end of main waits for every request
        self.fence()
        self._wait(lambda: self._transport.idle and self.control.channel.idle, "end of run", "sends to complete")
        self._transport.send(self._switch, Packet(Kind.DONE, self._keys[self.rank], -1))
        # The switch bounds this wait: it times out on GPUs that never finish and ends the job.
        self._wait(lambda: self._shutdown is not None, "end of run", "the other GPUs to finish",
                   timeout_s=2 * self.timeout_s + 30)  # switch's is 2 t + 5
        leftovers = sorted(self.mailbox.arrived, key=repr)
        links = self.link_snapshot()
        self._transport.send(self._switch, self._counters_packet(links, [leftover_entry(key, sender)
                                                                         for key, sender in leftovers]))
        self._shutdown = None
        self._wait(lambda: self._shutdown is not None, "end of run", "the switch's report")
        return cast(dict, cast(Packet, self._shutdown).info)  # set by _handle meanwhile: the SHUTDOWN's map

    def _counters_packet(self, links: dict, leftovers: list) -> Packet:
        """The COUNTERS answer (CallLog.counters_packet; raw_port().counters_packet replaces it in tests)."""
        return self.calls.counters_packet(self._keys[self.rank], links, leftovers, self.now_ns)


# whom wait_sent waits for: the switch holds a message past its receiver's mailbox bound (transport.packets.MAILBOX_PEER_*)
_TAKE_DATA = (f"the switch to take the data (a message waits there while its receiver, a GPU of this node, has "
              f"{MAILBOX_PEER_MESSAGES} of this GPU's messages or {MAILBOX_PEER_BYTES >> 20} MiB of them not taken "
              f"by its program)")


def leftover_entry(key: tuple, sender: int) -> list:
    """A message never received as the COUNTERS record lists it: its key, then its sender. A key of
    MAX_KEY_PARTS parts (a message may have one) and its sender would be one part too many: its last
    parts are shown as "..."; a key's own first part "..." is shown as "'...'", so that only the last
    entry ["...", n] (n more, not listed) starts with "..." (launch.report)."""
    key = tuple(key)
    if key[:1] == ("...",):
        key = ("'...'", *key[1:])
    return [*(key if len(key) < MAX_KEY_PARTS else (*key[:MAX_KEY_PARTS - 2], "...")), sender]


def _sender(peer: int | None, group: int | None):
    """Who a mailbox slot's message comes from: GPU `peer`, or the switch through multicast `group`."""
    return peer if peer is not None else f"group {group}"
