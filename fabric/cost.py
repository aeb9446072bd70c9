"""Cost model: closed forms of every collective and algorithm on one switch (modeled ns, link bytes).

Notation (one switch, N GPUs, S bytes, b = S // N bytes a block): B link bandwidth (GB/s = bytes/ns),
a link latency (one hop GPU <-> switch), s switch traversal, hop = 2a + s (GPU -> switch -> GPU,
first byte); E in-switch reduction throughput (bytes/ns of result) and p its added latency; h header
bytes; R(x) = x + max(1, ceil(x / mtu)) h, one message's raw bytes, summed over the messages of at
most `chunk` bytes that x travels in (chunk_bytes; for in-switch reductions the size the switch
buffer allows, `in_switch_chunk`; for NVLS its pipeline chunk nvls_chunk_bytes). Times written
R(x)/B below are raw bytes at the link's rate; /E at the reduction engine's. The forms are those of
the emulator's schedules (ranks/collectives/*), for calls every member starts at the same modeled
time; tests/mpi/test_modeled_time.py checks them against emulated runs. They are the oracle of the plans'
replay on one node (fabric.cost_nodes.modeled_ns, which `nvlink-emu model` reports: exact, as the emulated
time), not a second implementation: tests/unit/test_one_node_oracle.py holds the replay to them, exactly
where they are exact, within their documented tolerance elsewhere; `auto` chooses by them on one node
(fabric.tuner).
"""

from typing import TYPE_CHECKING

from .packets import raw_bytes
from .reduction import blocks, bus_factor as bus_factor, chunks  # bus_factor: re-exported (explicitly: "as")
from .budget import in_switch_chunk
from .software import call_latency_ns

if TYPE_CHECKING:  # for annotations only: nothing more imported at run time
    from .config import FabricConfig

COLLECTIVES = ("allreduce", "reduce_scatter", "allgather", "broadcast", "all2all")
ALGORITHMS = ("ring", "direct", "sharp", "nvls")
# which algorithm implements which collective (all2all has one schedule, `direct`'s pairwise exchange)
IMPLEMENTS = {
    "ring": ("allreduce", "reduce_scatter", "allgather", "broadcast"),
    "direct": ("allreduce", "reduce_scatter", "allgather", "broadcast", "all2all"),
    "sharp": ("allreduce", "reduce_scatter", "allgather", "broadcast"),
    "nvls": ("allreduce", "reduce_scatter", "allgather", "broadcast"),
}
IN_SWITCH = ("sharp", "nvls")


def raw_of(nbytes: int, config: "FabricConfig", chunk: int | None = None) -> int:
    """R(nbytes): raw bytes (payload + headers) of nbytes sent as messages of at most `chunk` bytes
    (default config.chunk_bytes)."""
    chunk = chunk or config.chunk_bytes
    return sum(raw_bytes(hi - lo, config.mtu_bytes, config.header_bytes) for lo, hi in chunks(0, nbytes, chunk))


def _chunk(config: "FabricConfig", itemsize: int) -> int:
    """A point-to-point message: chunk_bytes in whole elements."""
    return max(1, config.chunk_bytes // itemsize) * itemsize


def modeled_ns(collective: str, algorithm: str, S: int, n: int, config: "FabricConfig", itemsize: int = 4) -> float:
    """Modeled time (ns) of one call on S bytes (allgather: the output; reduce_scatter: the input;
    all2all: each member's send buffer) by N members started together: the slowest member's, its
    links' time (links_ns) plus the config's software latency (fabric.software). ValueError for a pair
    this model has no form for."""
    return links_ns(collective, algorithm, S, n, config, itemsize) + call_latency_ns(collective, algorithm, n, 1, S,
                                                                                     config)


def links_ns(collective: str, algorithm: str, S: int, n: int, config: "FabricConfig", itemsize: int = 4) -> float:
    """modeled_ns without software latency: the closed forms of the links' time (the table of
    docs/model/time.md). ValueError for a pair this model has no form for."""
    if collective not in COLLECTIVES or algorithm not in IMPLEMENTS or collective not in IMPLEMENTS[algorithm]:
        raise ValueError(f"no cost model for {collective} with {algorithm!r}")
    t = config.timing
    B, a, s = t.bandwidth_gbytes_per_s, t.link_latency_ns, t.switch_latency_ns
    E, p = t.reduction_gbytes_per_s, t.reduction_latency_ns
    hop = 2 * a + s
    b = S // n
    msg = _chunk(config, itemsize)
    Rb, RS = raw_of(b, config, msg) / B, raw_of(S, config, msg) / B
    h = config.header_bytes / B
    if collective == "all2all" or algorithm == "direct":
        if collective == "allreduce":  # reduce my block from every peer, then send it to every peer
            return 2 * ((n - 1) * Rb + hop)
        if collective == "broadcast":  # the root sends S to each of the N-1 others
            return (n - 1) * RS + hop
        return (n - 1) * Rb + hop
    if algorithm == "ring":
        if collective == "allreduce":  # 2(N-1) steps of one block each
            return 2 * (n - 1) * (Rb + hop)
        if collective in ("reduce_scatter", "allgather"):
            return (n - 1) * (Rb + hop)
        u = raw_of(min(S, msg), config, msg) / B  # broadcast: a chain, store-and-forward per message
        return RS + (n - 1) * hop + (n - 2) * u
    if collective == "allgather":  # sharp and nvls: a multicast store of each block
        return n * Rb + hop
    if collective == "broadcast":  # sharp and nvls: the root's multicast store
        return RS + hop
    if algorithm == "sharp":  # push, reduce in the switch (at min(B, E)), multicast the result
        streams, least = (1, 1) if collective == "allreduce" else (n, 2)
        c = in_switch_chunk(config, n, streams, least, None, itemsize)
        raw = raw_of(S, config, c)
        return raw / min(B, E) + hop + p
    # nvls: requests up and loads down (2h + 2 hop), then the loads of every block in pipeline chunks
    c = in_switch_chunk(config, n, n, 2, config.nvls_chunk_bytes, itemsize)
    Rb = raw_of(b, config, c) / B
    engine = raw_of(S, config, c) / E  # the group's engine reduces all N blocks, one chunk after another
    if collective == "reduce_scatter":
        return 2 * h + 2 * hop + p + max(n * Rb, engine)
    if b <= c:  # one message a block: loads, my reduced block back, my multicast, everyone's multicasts
        # (engine-bound, E < B: a lower bound, as below)
        return 2 * h + 2 * hop + max((n + 1) * Rb + hop + p, 2 * n * Rb + p, engine + Rb + hop + p)
    u = raw_of(c, config, c) / B
    # pipelined, link-bound (E >= B): two rounds of loads fill it (needs N u >= hop + p, nvls_pipelined);
    # exact. Engine-bound (E < B): the last reduced chunk's multicast follows the engine; a lower bound,
    # as the engine's pace, the loads and the multicasts couple on the downlinks: emulated runs took up
    # to 8.2% longer with blocks of 64 KiB to 1 MiB on 3-8 GPUs (dgx-h100), 2.5% with 4 MiB blocks on 4,
    # 0.1% at 32 MiB and 0.06% at 64 MiB on 8.
    return 2 * h + 2 * hop + p + max((n + 1) * Rb + 2 * (n - 1) * u, engine + hop + u)


def nvls_pipelined(S: int, n: int, config: "FabricConfig", itemsize: int = 4) -> bool:
    """Whether the pipelined NVLS form applies: blocks of several chunks, and N chunk times cover a
    round's latency (N u >= hop + p), so the uplinks never wait for a round to come back."""
    t = config.timing
    c = in_switch_chunk(config, n, n, 2, config.nvls_chunk_bytes, itemsize)
    u = raw_of(c, config, c) / t.bandwidth_gbytes_per_s
    return S // n > c and n * u >= 2 * t.link_latency_ns + t.switch_latency_ns + t.reduction_latency_ns


def payload_bytes(collective: str, algorithm: str, S: int, n: int, rank: int = 0, root: int = 0) -> tuple[int, int]:
    """(tx, rx) payload bytes member `rank` moves on its links in one call on S bytes (S a multiple
    of N; broadcast from `root`). Request packets (NVLS LOAD_REDUCE, LOAD) carry no payload."""
    if collective not in COLLECTIVES or algorithm not in IMPLEMENTS or collective not in IMPLEMENTS[algorithm]:
        raise ValueError(f"no cost model for {collective} with {algorithm!r}")
    b = S // n
    if collective == "broadcast":
        position = (rank - root) % n
        if algorithm == "ring":  # a chain from the root: every uplink but the last's, every downlink but the root's
            return (S if position < n - 1 else 0, S if position else 0)
        if algorithm == "direct":
            return ((n - 1) * S, 0) if position == 0 else (0, S)
        return (S if position == 0 else 0, S)  # multicast: the root's own copy comes back too
    if collective == "all2all" or algorithm in ("ring", "direct"):
        each = (n - 1) * b * (2 if collective == "allreduce" else 1)
        return each, each
    if collective == "allgather":
        return b, S
    if collective == "reduce_scatter":
        return S, b
    return (S, S) if algorithm == "sharp" else (S + b, S + b)  # nvls: loads + my multicast; my block + multicasts


def nvls_request_packets(S: int, n: int, config: "FabricConfig", rank: int = 0, itemsize: int = 4) -> tuple[int, int]:
    """(sent, received) header-only request packets of member `rank` in one NVLS allreduce or
    reduce_scatter on S bytes: a LOAD_REDUCE per chunk of its own block up; a LOAD per chunk of
    every block down. Each adds header_bytes of raw bytes and one packet, no payload."""
    c = in_switch_chunk(config, n, n, 2, config.nvls_chunk_bytes, itemsize) // itemsize
    count = S // itemsize
    spans = [len(chunks(lo, hi, c)) for lo, hi in blocks(count, n)]
    return spans[rank], sum(spans)


def nvls_raw_bytes(collective: str, S: int, n: int, config: "FabricConfig", rank: int = 0,
                   itemsize: int = 4) -> tuple[int, int]:
    """(tx, rx) raw bytes (payload + headers) of member `rank` in one NVLS allreduce or reduce_scatter
    on S bytes: R() of every load answer (each chunk of every block), my multicast and my reduced
    block, in pipeline chunks, plus header_bytes for each request packet (nvls_request_packets)."""
    c = in_switch_chunk(config, n, n, 2, config.nvls_chunk_bytes, itemsize)
    sizes = [(hi - lo) * itemsize for lo, hi in blocks(S // itemsize, n)]
    answers = sum(raw_of(size, config, c) for size in sizes)
    mine = raw_of(sizes[rank], config, c)
    up, down = nvls_request_packets(S, n, config, rank, itemsize)
    h = config.header_bytes
    if collective == "reduce_scatter":
        return answers + up * h, mine + down * h
    return answers + mine + up * h, mine + answers + down * h


def busbw_gbps(collective: str, algorithm: str, S: int, n: int, config: "FabricConfig", itemsize: int = 4) -> float:
    """Modeled bus bandwidth (GB/s) as nccl-tests reports it: S / time x bus_factor."""
    return S / modeled_ns(collective, algorithm, S, n, config, itemsize) * bus_factor(collective, n)
