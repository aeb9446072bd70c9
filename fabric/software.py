"""Software latency of a collective call: what NCCL's kernels and proxies add to the links' time.

The links model hardware only (hops, switches, bytes). A real call also pays a launch and per-step
protocol costs, which dominate small messages (an 8-byte AllReduce). With `software = "nccl"` (every
preset but the -line twins) a call costs, on top of its links, NCCL's own latency estimate for the algorithm
NCCL would run in its place, at the protocol (LL, LL128, Simple) NCCL's tuner would pick:

    L = min over protocols p of  latency(p) + T x (1 / f(p) - 1)

latency(p): NCCL's base latency plus its per-step latencies (NVLink steps inside a node, network steps
across nodes), combined as NCCL's ncclTopoTuneModel does; T = S x bus factor / the GPU's payload
bandwidth (the slowest stage's), the call's bandwidth term; f(p) the fraction of Simple's bandwidth
NCCL's model gives protocol p (LL 1/2, LL128 0.92 on rings): a protocol's bandwidth cost beyond the
links. Every member adds L to its clock when the call starts (ranks/comm.py), and the cost models add
it to their time (fabric.cost, fabric.cost_nodes), so emulated time still equals the replay. L depends
only on the call (collective, algorithm, members, nodes, bytes) and the config: not on the host.

Source of every figure: NVIDIA/nccl at commit 5067397c (2026-06-11), src/graph/tuning.cc (tables lines
149-176, combination lines 384-434, protocol bandwidths lines 327-335, LL128 only on NVLink paths line
531, ncclTopoGetAlgoTime lines 630-655); src/enqueue.cc lines 931-932 (point-to-point: LL or Simple);
docs/model/time.md "Software latency" maps the emulator's algorithms to NCCL's and lists what is left out.
"""

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from .reduction import bus_factor, ring_channel_count

if TYPE_CHECKING:  # for annotations only
    from .config import FabricConfig

PROTOCOLS = ("LL", "LL128", "Simple")
# NCCL's ncclTunerConstantsDefaults.baseLatencies (us; LL, LL128, Simple), tuning.cc lines 149-155
BASE_US = {"tree": (6.8, 14.0, 8.4), "ring": (6.6, 14.0, 8.4), "nvls": (0.0, 0.0, 0.0), "nvls_tree": (0.0, 0.0, 0.0)}
# hwLatencies (us per step) by the link the step crosses, tuning.cc lines 156-176
HW_US = {
    "nvlink": {"tree": (0.6, 1.25, 4.0), "ring": (0.6, 1.9, 3.4), "nvls": (0.0, 0.0, 25.0), "nvls_tree": (0.0, 0.0, 25.0)},
    "pci": {"tree": (1.0, 1.9, 4.0), "ring": (1.0, 2.5, 5.7), "nvls": (0.0, 0.0, 0.0), "nvls_tree": (0.0, 0.0, 0.0)},
    "net": {"tree": (5.0, 8.5, 14.0), "ring": (2.7, 4.0, 14.0), "nvls": (0.0, 0.0, 18.0), "nvls_tree": (0.0, 0.0, 20.9)},
}
# getNetOverhead (tuning.cc lines 228-233): a network post costs 1 us on an Intel host, 2 on an AMD one (x3
# for Simple). DGX A100's hosts are AMD EPYC 7742 (NVIDIA DGX A100 user guide, hardware overview), DGX H100's
# Intel Xeon 8480C (DGX H100 user guide), DGX B200's Intel Xeon 8570 (DGX B200 user guide).
NET_OVERHEAD_US = {"a100-sxm": 2.0, "a100-pcie": 2.0}
DEFAULT_NET_OVERHEAD_US = 1.0
# Bandwidth of each protocol as a fraction of Simple's in NCCL's model (tuning.cc lines 327-335): ring LL x0.5,
# LL128 x0.92; tree LL x1/3.8, LL128 x7/9 on one node and x120/128 across nodes. The per-channel caps
# (llMaxBws, perChMaxRingLL128Bws) are left out. NVLS and NVLS Tree run Simple only.
RING_FRACTION = (0.5, 0.92, 1.0)
# the emulator's algorithm -> NCCL's closest (docs/model/time.md "Software latency"): "p2p" is NCCL's grouped
# send/receive (All2All, gather, scatter, and direct's all-pairs exchange), charged as ring steps, one a batch of
# peers a round
SOFTWARE_CLASS = {"ring": "ring", "tree": "tree", "hier": "tree", "sharp": "nvls", "nvls": "nvls",
                  "hier_nvls": "nvls_tree", "direct": "p2p", "pxn": "p2p", "all2allv": "p2p"}
# NCCL_MAX_DEV_WORK_P2P_PER_BATCH (src/include/device.h line 391): "Each channel runs up to
# NCCL_MAX_DEV_WORK_P2P_PER_BATCH tasks concurrently" (src/enqueue.cc line 1052), a task a peer
P2P_PER_BATCH = 8
# rounds of a direct (all-pairs) schedule: allreduce and reduce exchange twice (reduce-scatter, then gather)
DIRECT_ROUNDS = {"allreduce": 2, "reduce": 2}


def _log2i(n: int) -> int:
    return max(0, int(n).bit_length() - 1)


def nccl_latency_us(cls: str, collective: str, n: int, nodes: int, proto: int, intra: str = "nvlink",
                    net_overhead: float = DEFAULT_NET_OVERHEAD_US) -> float | None:
    """NCCL's latency (us) of one call of `collective` by algorithm class `cls` on n GPUs in `nodes` nodes at
    protocol index `proto` (0 LL, 1 LL128, 2 Simple), as ncclTopoTuneModel combines it; None where NCCL does
    not run that protocol: NVLS and NVLS Tree run Simple only, point-to-point LL or Simple (enqueue.cc), and
    LL128 needs NVLink inside a node (tuning.cc line 531). nodes as NCCL counts them (software_nodes);
    intra: the link inside a node ("nvlink" or "pci")."""
    if cls in ("nvls", "nvls_tree") and proto != 2 or proto == 1 and (cls == "p2p" or intra == "pci"):
        return None
    table = "ring" if cls == "p2p" else cls
    base = BASE_US[table][proto]
    intra_lat = HW_US[intra][table][proto]
    ppn = n / nodes
    # with one GPU a node NCCL takes the tree's network latency; latencyInter (the net plugin's) is 0 for IB
    inter_lat = HW_US["net"]["tree" if ppn == 1 else table][proto]
    if cls == "ring":
        nsteps = 2 * (n - 1) if collective == "allreduce" else n - 1 if collective in ("reduce_scatter", "allgather") else n
        if collective in ("broadcast", "reduce"):  # one chain's step (sameChannels, the search's first try)
            return base + HW_US["net" if nodes > 1 else intra]["ring"][proto]
        if nodes > 1:
            intra_lat = max(intra_lat, net_overhead * (3 if proto == 2 else 1))
        inter_steps = 0 if nodes == 1 else 2 * (nodes - 1) if collective == "allreduce" else nodes - 1
        return base + (nsteps - inter_steps) * intra_lat + inter_steps * inter_lat
    if cls == "tree":  # NCCL's tree runs AllReduce; the emulator's tree and hier reduce and broadcast along one
        return base + 2 * ((n // nodes - 1) * intra_lat + _log2i(nodes) * inter_lat)
    if cls == "nvls":
        return intra_lat + (inter_lat if nodes > 1 else 0.0)
    if cls == "nvls_tree":
        return base + intra_lat + 2 * _log2i(nodes) * inter_lat
    # p2p: NCCL runs up to P2P_PER_BATCH peers' sends and receives at once, so a round of the schedule costs a
    # step per batch of peers: NVLink steps for the node's peers, network steps for the others
    rounds = DIRECT_ROUNDS.get(collective, 1)
    local = n // nodes
    return base + rounds * (-(-(local - 1) // P2P_PER_BATCH) * intra_lat + -(-(n - local) // P2P_PER_BATCH) * inter_lat)


def call_latency_ns(collective: str, algorithm: str, n: int, nodes: int, S: int, config: "FabricConfig") -> float:
    """Software latency (ns) a call of `collective` by `algorithm` on S bytes by n members in `nodes` nodes
    adds to its links' time under `config` (0 unless config.software is "nccl"; 0 for one GPU, for a call
    of no bytes, and for an algorithm NCCL has no counterpart of, e.g. a plan). S as the cost models take
    it (call_bytes)."""
    cls = SOFTWARE_CLASS.get(algorithm)
    if config.software != "nccl" or n <= 1 or cls is None or S <= 0:  # NCCL returns at once on a count of 0
        return 0.0
    timing = config.timing
    payload = config.mtu_bytes / (config.mtu_bytes + config.header_bytes)
    bandwidth = timing.bandwidth_gbytes_per_s
    if nodes > 1 and config.uplink_gbytes_per_s_per_gpu:
        bandwidth = min(bandwidth, config.uplink_gbytes_per_s_per_gpu)
    T_ns = S * bus_factor(collective, n) / (bandwidth * payload)
    intra = "pci" if config.link.startswith("pcie") else "nvlink"  # the link a step inside a node crosses
    nodes = software_nodes(n, nodes, config)
    net_overhead = NET_OVERHEAD_US.get(config.gpu, DEFAULT_NET_OVERHEAD_US)
    best = math.inf
    for proto in range(len(PROTOCOLS)):
        lat = nccl_latency_us(cls, collective, n, nodes, proto, intra, net_overhead)
        if lat is None:
            continue
        # ncclTopoGetAlgoTime: "Plateau effect of ring" (compute capability >= 8.0); its channel count taken as
        # the model's ring channels (ring_channel_count)
        if cls == "ring" and proto == 2 and nodes > 1 and collective == "allreduce" \
                and S // (ring_channel_count(S, n // nodes) * n) >= 64:
            lat *= 1.4
        fraction = _fraction(cls, proto, nodes)
        best = min(best, lat * 1e3 + T_ns * (1 / fraction - 1))
    return best


def software_nodes(n: int, nodes: int, config: "FabricConfig") -> int:
    """The nodes NCCL would count for n GPUs in `nodes` nodes of `config`: GPUs that reach each other only
    through an InfiniBand switch (the one-switch ib presets) are one GPU a node, so every step is a network
    step; nodes whose spines are NVLink (spine_sharp: the NVLink Switch System's, which reduce) are one
    NVLink domain, one node, so none is."""
    if config.link.startswith("ib"):
        return n
    return 1 if config.spine_sharp else nodes


def _fraction(cls: str, proto: int, nodes: int) -> float:
    """Protocol `proto`'s bandwidth as a fraction of Simple's (tuning.cc lines 327-335)."""
    if cls == "tree":
        return (1 / 3.8, 7 / 9 if nodes == 1 else 120 / 128, 1.0)[proto]
    return RING_FRACTION[proto]


def call_bytes(S: int, counts: Sequence[Sequence[int]] | None = None) -> int:
    """The S of call_latency_ns: S itself, or for all2allv (counts[i][j]: bytes GPU i sends GPU j, as
    fabric.cost_nodes takes them) the most bytes one GPU sends (its own block included)."""
    return int(S) if counts is None else max((int(sum(row)) for row in counts), default=0)
