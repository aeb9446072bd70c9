"""The GPU rank: its own memory and address, one-sided put/get through the switch, and a progress
engine that serves incoming requests inside every blocking wait (so no legal pattern deadlocks).

A GPU takes fabric packets from the switch it is attached to and from nobody else: whatever another
rank sends it straight is dropped unread (and counted as stray), so only what the switch forwarded,
translated and authorised can reach its memory, its mailbox or its results."""

import itertools
import math
import time

import msgpack
import numpy as np

from nvlink_emu.fabric import errors
from nvlink_emu.fabric.addressing import Handle, physical_address
from nvlink_emu.fabric.compute import amount
from nvlink_emu.fabric.config import FabricConfig
from nvlink_emu.fabric.counters import LinkCounters, LinkStats, downlink, gpu_view, uplink
from nvlink_emu.fabric.errors import AccessViolation, FabricError, FabricTimeout, ProtocolError, UnsupportedOperation
from nvlink_emu.fabric.memory import DeviceMemory
from nvlink_emu.fabric.packets import (MAX_GPU_HEADER_BYTES, MAX_KEY_PARTS, MAX_LIST, WIRE_INT_MAX, CallRecord,
                                      CountersInfo, ExportInfo, GroupInfo, Info, Kind, MsgInfo, Packet, RevokeInfo,
                                      TraceInfo, raw_bytes)
from nvlink_emu.fabric.faults import LinkFaultState, spine_links_scale
from nvlink_emu.fabric.timemodel import LinkEnd

from .comm import Communicator, is_integer
from .control import CONTROL_PER_SWEEP, ControlPlane
from .mailbox import Mailbox
from .raw import RawPort
from .requests import Request, Stream, wait_all, wait_any
from .transport import (MAILBOX_PEER_BYTES, MAILBOX_PEER_MESSAGES, MAX_HEADER_BYTES,
                        ControlChannel, Idle, Transport, native_collective, poked_idle, unframe)


# the program's own one-sided traffic, which beside a channelled call takes a lane of its own (LinkEnd.post)
BESIDE_KINDS = (Kind.PUT, Kind.GET)
STRAY_SWEEP = 256  # every this many progress calls, look for strays from every rank, not just in front
# Call records travel in the COUNTERS header, which the switch takes up to MAX_HEADER_BYTES: a GPU keeps
# its first calls' records up to this many encoded bytes (about 700 calls) and only counts the rest.
CALL_RECORD_BYTES = MAX_HEADER_BYTES * 3 // 4
GIVEN_UP_KEPT = 64  # bound buffers a GPU gave up (serve_load) whose late LOADs it still refuses at once


def raise_remote(error: str, message: str, context: str):
    """Re-raise an error the switch reported (a fabric.errors class name and its message), as that class."""
    cls = getattr(errors, error, FabricError)
    if not (isinstance(cls, type) and issubclass(cls, FabricError)):
        cls = FabricError
    raise cls(f"{context}: {message}")


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
        self._mem = DeviceMemory(self.rank, config.memory_capacity_bytes, config.alignment_bytes)
        self.memory = self._mem.array
        self._counters = LinkCounters(config.mtu_bytes, config.header_bytes)
        self._req = itertools.count(1)
        self._puts: dict[int, str] = {}                 # req -> what, until acknowledged
        self._gets: dict[int, np.ndarray] = {}          # req -> destination bytes, until data arrives
        self._replies: dict[int, Packet] = {}           # req -> REPLY / NACK for a waiting caller
        self._async_errors: list[FabricError] = []      # refusals of puts: raised at put, get, fence, barrier
        self._traffic_errors: list[FabricError] = []    # refusals of collective traffic: raised in any wait
        self.mailbox = Mailbox(transport, switch_rank, self._leaf, config.gpus_per_node)  # messages, credits
        self.control = ControlPlane(control_channel, self._serve_or_nap)  # credits, communicators, "where are you?"
        self._exports: list[tuple[int, int, Handle]] = []  # live windows: (physical offset, bytes, handle)
        self._bound: dict[tuple, np.ndarray] = {}       # buffer key -> bytes the switch may LOAD (NVLS)
        self._loads: dict[tuple, Packet] = {}           # (group, buffer key, slot) -> LOAD until served
        self._given_up: dict[tuple, None] = {}          # (group, buffer key) a refused LOAD gave up, latest last
        self._allocations: dict[int, tuple[np.ndarray, int]] = {}  # id(array) -> (the array alloc returned, offset)
        self._strays = 0                                # dropped by the sweeps: data from ranks other than the
                                                        # switch, control junk, members' MPI strays (control.strays: the rest)
        self._polls = 0                                 # progress calls, to sweep for strays now and then
        self._arrivals: dict[tuple, Packet] = {}        # message key -> its header until consumed (timing)
        timing = config.timing
        # this GPU's two links, each booked here: the uplink as it sends, the downlink as it consumes
        self._uplink = LinkEnd(timing.bandwidth_gbytes_per_s, timing.link_latency_ns)
        self._downlink = LinkEnd(timing.bandwidth_gbytes_per_s, timing.link_latency_ns)
        # its inbound share of its node's uplink (fabric.topology; docs/model/time.md, "Several nodes"), booked as it consumes a transfer
        # from another node; the cable's latency is in the packet's stamp already
        share = config.topology.share_gbytes_per_s
        self._inbound = LinkEnd(share, 0.0) if share else None
        # the fault plan's state of this GPU's faulted links (fabric.faults), booked with them; from the
        # launcher's config only, never from a packet
        self._plan = config.fault_plan
        self._faults = {name: LinkFaultState(self._plan, name, config.mtu_bytes, config.header_bytes)
                        for name in (uplink(self.rank, self._leaf), downlink(self.rank, self._leaf))
                        if self._plan.on(name)}
        self._spine_faults = any(link.startswith("sw") and "->sw" in link for link in self._plan.links())
        self.now_ns = 0.0                               # this GPU's modeled clock (a channel's, in one: lane)
        # the channel (c, C) whose clock now_ns is and whose lanes of the links the program books, while a call
        # runs C > 1 channels (ranks.collectives.Call.channel; docs/model/time.md, "Channels"); None: the GPU's
        self.lane: tuple[int, int] | None = None
        self._beside_end: float | None = None  # a put's last byte out, when it went beside a channelled call
        self._acked_ns = 0.0                            # latest acknowledgement of a put (modeled)
        self._got_ns: dict[int, float] = {}             # GET req -> modeled arrival of its data
        self.trace = trace                              # a TraceWriter, or None
        self._tx_seq = self._rx_seq = -1                # packets sent / received on this GPU's links
        self._program_bytes = [0, 0]                    # payload its program sent / consumed (program_bytes)
        self._shutdown: Packet | None = None
        self._calls: list[CallRecord] = []             # collective calls, for the run's report (record_call)
        self._call_bytes = 0                            # their encoded size
        self._calls_unrecorded = 0                      # calls past CALL_RECORD_BYTES
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
        self._servers: dict[str, object] = {}           # message key[0] -> its server (serve_messages)
        self.world = Communicator.world(self, control_channel.comm)
        # members known from the config, so no GPU outside the partition takes part in making it
        self.partition = Communicator.partition_of(self, control_channel.comm)

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
        sends, and what a switch sends it; ranks/switch/, _traced): another tenant's stay. Every GPU
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
        try:
            dtype = np.dtype(dtype)
        except TypeError:
            raise FabricError(f"GPU {self.rank}: alloc: {dtype!r} is not a numpy dtype") from None
        if dtype.hasobject or dtype.itemsize == 0:  # Python objects cannot live in device memory
            raise FabricError(f"GPU {self.rank}: alloc: dtype {dtype} has no fixed-size binary layout")
        if not is_integer(count) or count < 0:
            raise FabricError(f"GPU {self.rank}: alloc: count must be a non-negative integer, got {count!r}")
        offset = self._mem.allocate(int(count) * dtype.itemsize)
        array = self._mem.view(offset, int(count), dtype)
        self._allocations[id(array)] = (array, offset)
        return array

    def free(self, array: np.ndarray) -> None:
        """Release the array alloc() returned (that object itself, once); an exported array must be
        revoked first."""
        self.stream.drain()  # a pending request may still own the array's memory
        entry = self._allocations.get(id(array))
        if entry is None or entry[0] is not array:
            # by identity: an empty array's address, a view's or a freed array's, would name another block
            raise FabricError(f"GPU {self.rank}: free of an array that is not a live allocation (free takes "
                              f"the very array gpu.alloc returned, once)")
        offset = entry[1]
        block = self._mem.allocation_at(offset)
        end = block[0] + block[1]
        live = [h for start, size, h in self._exports if start < end and offset < start + size]
        if live:
            raise FabricError(f"GPU {self.rank}: free of memory still exported as {', '.join(map(str, live))}; "
                              f"revoke first")
        self._mem.release(offset)
        del self._allocations[id(array)]

    @property
    def free_bytes(self) -> int:
        """Bytes of this GPU's memory not allocated."""
        return self._mem.free_bytes

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
        offset = self._mem.offset_of(array)
        if array.nbytes == 0:
            raise FabricError(f"GPU {self.rank}: export of an empty array")
        block = self._mem.allocation_at(offset)
        if block is None or offset + array.nbytes > block[0] + block[1]:
            raise FabricError(f"GPU {self.rank}: export of memory at {offset:#x}+{array.nbytes} that is not "
                              f"inside one allocation (export what gpu.alloc returned, or a part of it)")
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
        self._exports.append((offset, array.nbytes, handle))
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
        self._exports = [e for e in self._exports if e[2] != handle]

    def physical_address(self, array: np.ndarray) -> int:
        """Global physical address of `array` (classic NVLink: any GPU may put/get it, no isolation)."""
        if self._network:
            raise UnsupportedOperation(f"GPU {self.rank}: NVLink Network ({self.config.name}) has no shared "
                                       f"physical address space; export(array) a window instead")
        return physical_address(self.rank, self._mem.offset_of(array))

    # -- one-sided access -------------------------------------------------------------------------
    def put(self, target, array: np.ndarray, offset: int = 0) -> None:
        """Write `array`'s bytes at byte `offset` of `target` (a Handle, or a physical address in classic mode).

        Returns once `array` may be reused; fence() waits until the bytes are visible at the target and
        raises AccessViolation if the switch refused them.
        """
        self.stream.drain()
        self._raise_async()
        data = self._as_bytes(array, "put")
        dst, address = self._destination(target, offset, data.nbytes, "put")
        sends, self._beside_end = [], None
        for start, stop in self._chunks(data.nbytes):
            req = next(self._req)
            self._puts[req] = f"put to {_describe(target)}"
            sends.append(self._send(Packet(Kind.PUT, self._keys[self.rank], dst, address + start,
                                           stop - start, req), data[start:stop]))
        self.wait_sent(sends, "put")
        # the data has left: `array` may be reused; beside a channelled call, once its own bytes left (not the call's)
        self.now_ns = max(self.now_ns, self.sent_ns if self._beside_end is None else self._beside_end)

    def get(self, target, array: np.ndarray, offset: int = 0) -> None:
        """Read `array.nbytes` bytes at byte `offset` of `target` into `array`; AccessViolation if refused."""
        self.stream.drain()
        self._raise_async()
        data = self._as_bytes(array, "get", written=True)
        dst, address = self._destination(target, offset, data.nbytes, "get")
        reqs = []
        for start, stop in self._chunks(data.nbytes):
            req = next(self._req)
            self._gets[req] = data[start:stop]
            self._send(Packet(Kind.GET, self._keys[self.rank], dst, address + start, stop - start, req))
            reqs.append(req)
        owner = getattr(target, "owner", "the target")
        self._wait(lambda: all(r not in self._gets for r in reqs), "get", f"GPU {owner}")
        self.now_ns = max([self.now_ns] + [self._got_ns.pop(r, 0.0) for r in reqs])
        for req in reqs:
            nack = self._replies.pop(req, None)
            if nack is not None:
                raise_remote(nack.info.error, nack.info.message, f"GPU {self.rank}: get from {_describe(target)}")

    def fence(self) -> None:
        """Return when every put of this GPU is visible at its target; raise any refusal."""
        self._wait(lambda: not self._puts, "fence", "acknowledgements of puts")
        self.now_ns = max(self.now_ns, self._acked_ns)
        self._raise_async()

    def link_counters(self) -> dict:
        """This GPU's link counters: tx_/rx_ bytes (payload), raw_bytes, packets, busy_ns (modeled)."""
        return gpu_view(self.link_snapshot(), self.rank, self._leaf)

    def program_bytes(self) -> tuple[int, int]:
        """(tx, rx) payload bytes this GPU's program has sent and consumed so far: the link counters'
        bytes without the one-sided traffic served as the host delivered it (puts and gets into this
        GPU, the replies to them and to its own), which may come in the middle of any call."""
        return self._program_bytes[0], self._program_bytes[1]

    def record_call(self, call: CallRecord) -> None:
        """Keep a collective call's record for the run's report (the communicators call this); past
        CALL_RECORD_BYTES of records, calls are only counted."""
        size = len(msgpack.packb(call.to_wire()))
        if self._calls_unrecorded or self._call_bytes + size > CALL_RECORD_BYTES or len(self._calls) >= MAX_LIST:
            self._calls_unrecorded += 1
        else:
            self._calls.append(call)
            self._call_bytes += size

    def link_snapshot(self) -> dict:
        """Every link's counters this GPU keeps ({link name: LinkStats.as_dict()}), busy times and fault
        counts included: what it reports at the end of the run."""
        self._counters.links.setdefault(uplink(self.rank, self._leaf), LinkStats()).busy_ns = self._uplink.busy_ns
        self._counters.links.setdefault(downlink(self.rank, self._leaf), LinkStats()).busy_ns = self._downlink.busy_ns
        snapshot = self._counters.snapshot()
        for link, state in self._faults.items():  # only faulted links carry these: honest reports unchanged
            snapshot.setdefault(link, LinkStats().as_dict()).update(crc_errors=state.crc_errors, replays=state.replays)
        return snapshot

    def _fault_fields(self, link: str) -> dict:
        """A trace record's crc_errors and replays so far on `link` (nothing on a link without faults)."""
        state = self._faults.get(link)
        return {} if state is None else {"crc_errors": state.crc_errors, "replays": state.replays}

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
        size = data.nbytes if nbytes is None else nbytes
        return self._send(Packet(kind, self._keys[self.rank], -1, address, size, info=info), data, at_ns, stamp)

    @property
    def sent_ns(self) -> float:
        """When the last byte this GPU's program sent left its uplink (modeled ns): what a call that
        waits for its sends waits for. One-sided replies it served (PUT_ACK, GET_DATA), booked in the
        order the host delivered their requests, are not in it (fabric.timemodel.LinkEnd.serve). In a
        channel (`lane`), the last byte that channel sent."""
        return self._uplink.lane_sent_ns(self.lane)

    def reserve_uplink(self, payload_bytes: int, at_ns: float) -> tuple[float, float]:
        """Book this GPU's uplink now for a transfer sent later (the emulator may hold a send back to
        bound host memory; modeled time treats it as issued at `at_ns`); returns its stamp."""
        raw = raw_bytes(payload_bytes, self.config.mtu_bytes, self.config.header_bytes)
        return self._uplink.send(at_ns, at_ns, self._link_time(uplink(self.rank, self._leaf), payload_bytes, at_ns, raw))

    def _link_time(self, link: str, payload_bytes: int, at_ns: float, raw: float) -> float:
        """Raw bytes' worth of time a transfer keeps `link` busy: `raw`, or with the link's faults its
        replays added and its lanes accounted (fabric.faults.LinkFaultState); LinkDown if it is down."""
        state = self._faults.get(link)
        return raw if state is None else state.book(payload_bytes, at_ns)

    def link_status(self) -> dict:
        """This GPU's two links at its modeled clock: {link name: {"state": "up" | "ber" | "degraded" |
        "down", "crc_errors": n, "replays": n}}, and when down "down_since_ns" and "up_at_ns" (inf: for
        good) (fabric.faults; all "up" and 0 without a fault plan)."""
        status = {}
        for link in (uplink(self.rank, self._leaf), downlink(self.rank, self._leaf)):
            state = self._faults.get(link)
            status[link] = state.counters(self.now_ns) if state is not None else \
                {"crc_errors": 0, "replays": 0, "state": self._plan.state(link, self.now_ns)}
            window = self._plan.down(link, self.now_ns)
            if window is not None:
                status[link].update(down_since_ns=window[0], up_at_ns=window[1])
        return status

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
        self._bound[tuple(key)] = self._as_bytes(data, "bind")

    def unbind_buffer(self, key: tuple) -> None:
        """Stop the switch's LOADs from the buffer bound as `key`; one serve_load gave up (a LOAD past its
        end) is unbound already, and a program's cleanup after that refusal is no second error."""
        key = tuple(key)
        if key not in self._bound and any(given == key for _, given in self._given_up):
            return
        del self._bound[key]

    def serve_load(self, group: int, key: tuple, slot: tuple, requester: str) -> None:
        """Answer the switch's LOAD of `slot` through `group` from the buffer bound as `key` (NVLS),
        waiting for it to arrive. Served in program order, so its place on the links is deterministic;
        the answer leaves when the LOAD arrived, not when the program got to it (memory answers, not
        the SMs). A LOAD past the buffer's end (a requester's range, which the switch cannot check: it
        does not know the buffer) gives the buffer up: AccessViolation naming this GPU, the requester,
        the slot and the bytes; the buffer is unbound, and this LOAD and every other of the buffer,
        come or to come, is answered with the notice "unserved" (header-only, no bytes counted), so
        that each requester's leaf gives the request's budget back (fabric.switch, Load-reduce)."""
        buffer = (group, tuple(key))
        lookup = (*buffer, tuple(slot))
        if buffer in self._given_up:
            raise AccessViolation(f"GPU {self.rank}: {requester}'s load-reduce (slot {list(slot)}): the buffer bound "
                                  f"as {list(key)} was given up after a LOAD past its end; not served")
        self._wait(lambda: lookup in self._loads, "serve load", f"{requester}'s load-reduce (slot {slot})")
        packet, seq = self._loads.pop(lookup)
        bound = self._bound[lookup[1]]
        if packet.address + packet.nbytes > bound.nbytes:
            del self._bound[lookup[1]]
            self._given_up[buffer] = None
            if len(self._given_up) > GIVEN_UP_KEPT:
                del self._given_up[next(iter(self._given_up))]
            for filed in [k for k in self._loads if k[:2] == buffer]:
                self._unserved(self._loads.pop(filed)[0])
            self._unserved(packet)
            raise AccessViolation(f"GPU {self.rank}: {requester}'s load-reduce (slot {list(slot)}) reads bytes "
                                  f"{packet.address}+{packet.nbytes} of a bound buffer of {bound.nbytes}; not served")
        data = bound[packet.address:packet.address + packet.nbytes]
        self._send(Packet(Kind.REDUCE, self._keys[self.rank], -1, 0, packet.nbytes, packet.req,
                          packet.info.contribution()), data, self._consume(packet, seq, program=True))

    def _unserved(self, load: Packet) -> None:
        """Tell the switch this GPU will not serve `load` (a control notice, which nothing answers)."""
        notice = GroupInfo("unserved", load.info.group, load.info.slot, "")
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
        seq = None
        if packet.kind.counted:
            raw = self._counters.record(downlink(self.rank, self._leaf), packet.payload_bytes)
            self._rx_seq += 1
            seq = self._rx_seq
            if self.trace is not None and self.trace.enabled:
                self.trace.write({"ev": "rx", "link": downlink(self.rank, self._leaf), "seq": seq, "kind": packet.kind.name,
                                  "payload": packet.payload_bytes, "raw": raw, "src": packet.src, "dst": packet.dst,
                                  "wall": time.time()})
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
            self._puts.pop(packet.req, None)
            self._acked_ns = max(self._acked_ns, self._consume(packet, seq))
        elif kind is Kind.GET_DATA:
            dest = self._gets.pop(packet.req, None)
            self._receive(packet, dest if dest is not None else np.empty(packet.nbytes, np.uint8), inline)
            if dest is None:  # the bytes are taken first, so the next payload is not mistaken for these
                raise ProtocolError(f"GPU {self.rank}: GET_DATA for request {packet.req}, which it never made")
            self._got_ns[packet.req] = self._consume(packet, seq)
        elif kind is Kind.MSG and self._servers and packet.info.key and packet.info.key[0] in self._servers:
            data = np.empty(packet.nbytes, np.uint8)
            self._receive(packet, data, inline)
            arrived = self._consume(packet, seq)
            sender = self._gpu_of.get(packet.src)
            self.mailbox.took(sender, tuple(packet.info.key), packet.nbytes)  # served is taken: credit the mailbox bound
            for peer, key, reply in self._servers[packet.info.key[0]](sender, tuple(packet.info.key), data):
                self._send(Packet(Kind.MSG, self._keys[self.rank], self._keys[peer], 0, reply.nbytes,
                                  info=MsgInfo(tuple(key))), reply, arrived, served=True)
        elif kind is Kind.MSG or kind is Kind.MCAST:
            sender = self._gpu_of.get(packet.src) if kind is Kind.MSG else _sender(None, packet.info.group)
            slot = (packet.info.key, sender)
            dest = self.mailbox.posted.get(slot)
            fits = dest is None or dest.nbytes == packet.nbytes
            buffer = dest if dest is not None and fits else np.empty(packet.nbytes, np.uint8)
            self._receive(packet, buffer, inline)
            if not fits:  # taken first, so the next payload is not mistaken for this one
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
            if (packet.info.group, packet.info.source) in self._given_up:  # serve_load refused the buffer
                self._unserved(packet)
            else:
                self._loads[(packet.info.group, packet.info.source, packet.info.slot)] = (packet, seq)
        elif kind is Kind.NACK:
            arrived = self._consume(packet, seq)
            if packet.req in self._puts:  # the refusal is what the put's fence waits for
                self._acked_ns = max(self._acked_ns, arrived)
            elif packet.req in self._gets:
                self._got_ns[packet.req] = arrived
            self._nack(packet)
        elif kind is Kind.REPLY:
            self._replies[packet.req] = packet
        elif kind is Kind.CREDIT:  # the switch holds a message of GPU src's for want of mailbox credit
            # req: the mailbox class (transport.mailbox_class)
            self.mailbox.credit_asked(self._gpu_of.get(packet.src), packet.req)
        elif kind is Kind.SHUTDOWN:
            self._shutdown = packet
        else:
            raise ProtocolError(f"GPU {self.rank}: unexpected {kind.name} from rank {source}")

    def _nack(self, packet: Packet) -> None:
        what = self._puts.pop(packet.req, None)
        if packet.req in self._gets:
            del self._gets[packet.req]
            self._replies[packet.req] = packet
            return
        try:
            raise_remote(packet.info.error, packet.info.message, f"GPU {self.rank}: {what or packet.info.kind}")
        except FabricError as exc:
            (self._async_errors if what else self._traffic_errors).append(exc)

    def _raise_async(self) -> None:
        if self._async_errors:
            first, rest = self._async_errors[0], len(self._async_errors) - 1
            self._async_errors = []
            if rest:
                raise type(first)(f"{first} (and {rest} more refused)")
            raise first

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
            link = uplink(self.rank, self._leaf)
            if stamp is None:  # a down link raises here, before anything is counted
                at = self.now_ns if at_ns is None else at_ns
                timed = self._link_time(link, packet.payload_bytes, at, None)
            raw = self._counters.record(link, packet.payload_bytes)
            if stamp is None:
                timed = raw if timed is None else timed
                stamp = self._uplink.serve(at, at, timed) if served else None
                if not served and self.lane is None and packet.kind in BESIDE_KINDS:
                    # the program's own one-sided traffic beside a channelled call that still sends: a lane of
                    # its own (fabric.timemodel.LinkEnd.post; docs/model/time.md, "A put beside a collective")
                    stamp = self._uplink.post(at, at, timed)
                    if stamp is not None:
                        end = stamp[1] - self._uplink.latency_ns
                        self._beside_end = max(end, self._beside_end or end)
                if stamp is None and not served:
                    stamp = self._uplink.send(at, at, timed, self.lane)
            if not served:
                self._program_bytes[0] += packet.payload_bytes
            packet = packet.but(t_start=stamp[0], t_end=stamp[1])
            self._tx_seq += 1
            if self.trace is not None and self.trace.enabled:
                self.trace.write({"ev": "tx", "link": uplink(self.rank, self._leaf), "seq": self._tx_seq, "kind": packet.kind.name,
                                  "payload": packet.payload_bytes, "raw": raw, "src": packet.src, "dst": packet.dst,
                                  "m_start": stamp[0] - self._uplink.latency_ns,
                                  "m_end": stamp[1] - self._uplink.latency_ns,
                                  "wall": time.time(), **self._fault_fields(link)})
        return self._transport.send(self._switch, packet, payload)

    def _consume(self, packet: Packet, seq: int, program: bool = False) -> float:
        """Put transfer `seq` that reached this GPU on its downlink; returns when its last byte arrived (ns).
        `program`: consumed by this GPU's program, in program order; else served as the host delivered
        it (one-sided traffic), on the links' served lane (fabric.timemodel.LinkEnd), so it neither
        waits for nor delays the program's transfers, and the call records count only the program's."""
        raw = raw_bytes(packet.payload_bytes, self.config.mtu_bytes, self.config.header_bytes)
        start, end = packet.t_start, packet.t_end
        lane = self.lane if program else None  # a channel's receive: its lane of the downlink
        if self._inbound is not None:
            sender = self._gpu_of.get(packet.src)  # a GPU's transfer (a switch's own packets take no share)
            if sender is not None and sender // self.config.gpus_per_node != self._leaf:
                timed = raw
                if self._spine_faults:  # the node's uplink lost its down links' part (fabric.faults)
                    topology = self.config.topology
                    timed = raw * spine_links_scale(self._plan, self._leaf, topology.nodes, topology.spines, start,
                                                    up=False)
                start, end = self._inbound.book(start, end, timed, served=not program)
                # its burst on the faster downlink, ending with its last byte (docs/model/time.md)
                start = max(start, end - raw / self._downlink.lane_bandwidth(lane))
        link = downlink(self.rank, self._leaf)
        start, end = self._downlink.book(start, end, self._link_time(link, packet.payload_bytes, start, raw),
                                         served=not program, lane=lane)
        if program:
            self._program_bytes[1] += packet.payload_bytes
        if self.trace is not None and self.trace.enabled:
            self.trace.write({"ev": "busy", "link": link, "seq": seq, "m_start": start, "m_end": end,
                              "wall": time.time(), **self._fault_fields(link)})
        return end + self._downlink.latency_ns

    def ask_fabric_manager(self, kind: Kind, info: Info, what: str) -> dict:
        """Ask the fabric manager (the leaf switch) for `what` (a GROUP, EXPORT or REVOKE request, not counted
        on a link) and wait for its reply's info; an error it answered is raised as its fabric.errors class."""
        req = next(self._req)
        self._transport.send(self._switch, Packet(kind, self._keys[self.rank], -1, req=req, info=info))
        self._wait(lambda: req in self._replies, what, "the fabric manager (switch)")
        reply = self._replies.pop(req).info
        if "error" in reply:
            raise_remote(reply["error"], reply.get("message", ""), f"GPU {self.rank}: {what}")
        return reply

    # -- helpers ------------------------------------------------------------------------------------
    def _destination(self, target, offset: int, nbytes: int, op: str) -> tuple[int, int]:
        """(dst routing key, address) of a put/get of `nbytes` at byte `offset` of `target`; checked
        before anything is sent or left pending."""
        if not is_integer(offset) or offset < 0:
            raise FabricError(f"GPU {self.rank}: {op} offset must be a non-negative integer of bytes, got {offset!r}")
        offset = int(offset)
        if self._network:
            if not isinstance(target, Handle):
                raise UnsupportedOperation(f"GPU {self.rank}: {op} on NVLink Network needs a Handle from "
                                           f"export(), got {target!r}")
            dst, base = target.network_address, target.address
            if not (is_integer(dst) and is_integer(base) and 0 <= dst <= WIRE_INT_MAX):
                raise FabricError(f"GPU {self.rank}: {op} to {target!r}: not a handle export() returned")
        elif isinstance(target, Handle) and self.config.windows:  # a registered window of classic nodes
            dst, base = target.network_address, target.address
            if not (is_integer(dst) and is_integer(base) and 0 <= dst < self.size):
                raise FabricError(f"GPU {self.rank}: {op} to {target!r}: not a handle export() returned")
        else:
            if isinstance(target, Handle) or not is_integer(target):
                raise UnsupportedOperation(f"GPU {self.rank}: {op} on classic NVLink takes a physical address "
                                           f"(gpu.physical_address(array)), got {target!r}")
            dst, base = -1, target
        address = int(base) + offset
        if not 0 <= address <= WIRE_INT_MAX - nbytes:
            raise AccessViolation(f"GPU {self.rank}: {op} of {nbytes} bytes at {address:#x} ({_describe(target)} + "
                                  f"offset {offset}): outside the 64-bit address space")
        return int(dst), address

    def _chunks(self, nbytes: int):
        step = self.config.chunk_bytes
        return [(s, min(s + step, nbytes)) for s in range(0, nbytes, step)] or [(0, 0)]

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
        return self._shutdown.info

    def _counters_packet(self, links: dict, leftovers: list) -> Packet:
        """The COUNTERS answer; its call records cut (the cut ones counted), then its leftover message
        keys (a last entry ["...", n] counts the n cut), until its lists have at most MAX_LIST entries
        and the header fits in the MAX_GPU_HEADER_BYTES the switch takes from a GPU, so many leftover messages or
        calls cannot make it refused."""
        calls, keys = self._calls, leftovers[:MAX_LIST - 1] if len(leftovers) > MAX_LIST else leftovers
        while True:
            shown = keys if len(keys) == len(leftovers) else [*keys, ["...", len(leftovers) - len(keys)]]
            info = CountersInfo(links, shown, float(self.now_ns), tuple(calls),
                                self._calls_unrecorded + len(self._calls) - len(calls))
            packet = Packet(Kind.COUNTERS, self._keys[self.rank], -1, info=info)
            if len(packet.to_wire()) <= MAX_GPU_HEADER_BYTES:
                return packet
            if calls:
                calls = calls[:len(calls) * 3 // 4]
            elif keys:
                keys = keys[:len(keys) * 3 // 4]
            else:
                return packet


# whom wait_sent waits for: the switch holds a message past its receiver's mailbox bound (transport.MAILBOX_PEER_*)
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


def _describe(target) -> str:
    return str(target) if isinstance(target, Handle) else f"physical {int(target):#x}"


def _sender(peer: int | None, group: int | None):
    """Who a mailbox slot's message comes from: GPU `peer`, or the switch through multicast `group`."""
    return peer if peer is not None else f"group {group}"
