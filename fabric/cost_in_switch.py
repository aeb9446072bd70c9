"""Exact payload bytes per link of the algorithms that reduce or copy in the switches across nodes: sharp's and
nvls's (summed from their plans' slots, fabric.plans.in_switch) and hier_nvls's node stages in the leaf (summed
from its leaf plan; hier_leaf_traffic, the bounds', counted slice by slice in closed form). fabric.cost_nodes.link_bytes dispatches to them; the formulas: docs/model/cost-nodes.md.
"""

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from . import hier_plan, plans, replay
from .budget import buffer_share_bytes
from .counters import downlink, uplink
from .errors import FabricError
from .plans.catalog import IMPLEMENTS, call_plan
from .plans.timing_leaf import leaf_plan_link_bytes
from .packets import raw_bytes
from .reduction import blocks, merged_columns
from .topology import Topology

if TYPE_CHECKING:  # for annotations only: nothing more imported at run time
    from .config import FabricConfig


def check_elements(S: int, itemsize: int) -> None:
    """FabricError unless S bytes are whole elements of a positive integer `itemsize` (what a call passes)."""
    if not isinstance(itemsize, int) or isinstance(itemsize, bool) or itemsize < 1:
        raise FabricError(f"cost_nodes: itemsize must be a positive integer, got {itemsize!r}")
    if not isinstance(S, (int, np.integer)) or isinstance(S, bool) or S < 0 or S % itemsize:
        raise FabricError(f"cost_nodes: S must be a non-negative multiple of itemsize {itemsize} bytes, got {S!r}")


def block_bytes(S: int, n: int, itemsize: int) -> list[int]:
    """Bytes of each of the N blocks of S bytes (fabric.reduction.blocks of S / itemsize elements)."""
    check_elements(S, itemsize)
    return [(hi - lo) * itemsize for lo, hi in blocks(int(S) // itemsize, n)]


def hier_leaf_link_bytes(collective: str, topo: Topology, S: int, config: "FabricConfig", itemsize: int = 4,
                         root: int = 0) -> tuple[dict[str, int], dict[str, int]]:
    """Exact (payload, raw) bytes on every link of hier_nvls's `collective` of S bytes by every GPU of `topo`
    (its node stages in the leaf; N > 1 nodes of G > 1 GPUs; hier_plan.in_leaf(config)), summed from its plan
    (fabric.plans.catalog.call_plan's, the one the replay times: fabric.plans.timing_leaf.leaf_plan_link_bytes): a rail
    message on the sender's uplink, the cables the Topology routes it over and the receiver's downlink; a
    load-reduce request, header only, on the requester's uplink; each LOAD, header only, on the serving
    member's downlink and its answer (the range) on its uplink; a result on the requester's downlink; a
    multicast store once on the sender's uplink and on every node member's downlink (the sender's too). Raw =
    payload + one header a packet of mtu_bytes (fabric.packets.raw_bytes), header-only packets header_bytes
    each. Payload closed forms (S a multiple of N G itemsize, n = N G; hier_leaf_traffic counts them for the
    bounds): allreduce every GPU link tx = rx = S + S/G (node RS: its answers to every column, S; its reduced
    column, S/G; node AG: its store, S/G, every member's stores, S) + 2(N-1)/n S (the rails); reduce_scatter
    (S = input): tx S, rx S/G, + (N-1)/n S each way; allgather (S = output): tx S/G, rx S, + (N-1)/n S each
    way; broadcast: the node AG's store S/G tx and S rx on every GPU, + the scatter's and the chain's as with
    node rings. The cables carry only the rail messages: as with node rings (link_bytes)."""
    _leaf_checks(collective, topo, S, config, itemsize, root)
    plan, _ = call_plan(collective, "hier_nvls", topo.nodes, topo.gpus_per_node, S, config, itemsize, root)
    tables = [plans.chunks.spans(plan, S, itemsize, g) for g in range(topo.gpus)]
    return leaf_plan_link_bytes(plan, topo, config, itemsize, tables)


def _leaf_checks(collective: str, topo: Topology, S: int, config: "FabricConfig", itemsize: int, root: int) -> int:
    """hier_nvls's arguments checked (FabricError): several nodes of several GPUs whose leaves reduce, S a
    non-negative multiple of itemsize, a broadcast root of the GPUs, one of its collectives; the elements."""
    G, N, n = topo.gpus_per_node, topo.nodes, topo.gpus
    if N < 2 or G < 2 or not hier_plan.in_leaf(config):
        raise FabricError(f"cost_nodes: hier_nvls runs its node stages in the leaf on {N} nodes of {G} GPUs, "
                          f"config {config.name!r}: they need several nodes of several GPUs and leaves that reduce")
    count = block_bytes(S, 1, itemsize)[0] // itemsize
    if collective == "broadcast" and (not isinstance(root, (int, np.integer)) or isinstance(root, bool)
                                      or not 0 <= root < n):
        raise FabricError(f"cost_nodes: broadcast root must be one of GPUs 0..{n - 1}, got {root!r}")
    if collective not in IMPLEMENTS["hier_nvls"]:
        raise FabricError(f"cost_nodes: hier_nvls runs {', '.join(IMPLEMENTS['hier_nvls'])}, not {collective}")
    return count


# (sent, sent_raw, up, up_raw, down, down_raw): hier_leaf_traffic's (exact: object arrays of Python ints)
LeafTraffic = tuple[npt.NDArray[np.object_], npt.NDArray[np.object_], list[int], list[int], list[int], list[int]]


def hier_leaf_traffic(collective: str, topo: Topology, S: int, config: "FabricConfig", itemsize: int,
                      root: int) -> LeafTraffic:
    """hier_nvls's traffic (hier_leaf_link_bytes' sums, counted in closed form for fabric.cost_nodes' bounds) as (sent, sent_raw, up, up_raw, down, down_raw): sent[g][h]
    the payload of GPU g's messages to GPU h (the rails, broadcast's scatter and chain), sent_raw their raw
    bytes (n x n object arrays: exact); up[g], down[g] (and _raw) what the node stages in the leaf put on
    GPU g's uplink and downlink. Counted slice by slice as fabric.hier_plan.program cuts the call
    (ranges, slices, merged node segments, chunks of chunk_bytes), not op by op: every node's node stages
    move the same columns, so the counts are O(slices x GPUs), not O(messages)."""
    G, N, n = topo.gpus_per_node, topo.nodes, topo.gpus
    count = _leaf_checks(collective, topo, S, config, itemsize, root)
    chunk = max(1, config.chunk_bytes // itemsize)
    mtu, head = config.mtu_bytes, config.header_bytes
    raws: dict[int, tuple[int, int]] = {}

    def messages(length: int) -> tuple[int, int]:
        """(messages, raw bytes) of `length` elements sent in chunks of `chunk` (hier_plan's chunks)."""
        got = raws.get(length)
        if got is None:
            whole, rest = divmod(length, chunk)
            got = raws[length] = (whole + (rest > 0), whole * raw_bytes(chunk * itemsize, mtu, head)
                                  + (raw_bytes(rest * itemsize, mtu, head) if rest else 0))
        return got

    h = raw_bytes(0, mtu, head)  # a header-only packet: a request or a LOAD
    spans = hier_plan.ranges(collective, N, G, count)
    P = hier_plan.slice_elements(chunk, itemsize, N, G, buffer_share_bytes(config))
    K = hier_plan.slices(spans, N, G, P)
    sent, sent_raw = np.zeros((n, n), object), np.zeros((n, n), object)
    # per position j (the same on every node): node stages' bytes on its uplink and downlink
    up, up_raw, down, down_raw = [0] * G, [0] * G, [0] * G, [0] * G
    rail, rail_raw = [[0] * G for _ in range(N)], [[0] * G for _ in range(N)]  # range (b, j)'s messages, summed
    a_root, j_root = divmod(root, G)
    for i in range(K):
        pieces = hier_plan.slice_pieces(spans, i, P, K)
        segments = [[p] for p in pieces[0]] if collective == "broadcast" else merged_columns(pieces)
        nbytes, nmsg, nraw = [0] * G, [0] * G, [0] * G  # column k's piece this slice
        for k, segment in enumerate(segments):
            for lo, hi in segment:
                m, w = messages(hi - lo)
                nbytes[k] += (hi - lo) * itemsize
                nmsg[k] += m
                nraw[k] += w
        every, every_raw, loads = sum(nbytes), sum(nraw), sum(nmsg) * h
        for j in range(G):
            if collective in ("allreduce", "reduce_scatter"):  # node RS: requests, loads served, my results
                up[j] += every
                up_raw[j] += nmsg[j] * h + every_raw
                down[j] += nbytes[j]
                down_raw[j] += loads + nraw[j]
            if collective != "reduce_scatter":  # node AG: my stores up, every member's (mine too) down
                up[j] += nbytes[j]
                up_raw[j] += nraw[j]
                down[j] += every
                down_raw[j] += every_raw
        if collective == "broadcast":
            for k in range(G):  # the scatter (root's node), then part k's piece down rail k from node a_root
                lo, hi = pieces[0][k]
                w = messages(hi - lo)[1]
                if k != j_root:
                    sent[root, a_root * G + k] += (hi - lo) * itemsize
                    sent_raw[root, a_root * G + k] += w
                for q in range(N - 1):
                    src, dst = (a_root + q) % N * G + k, (a_root + q + 1) % N * G + k
                    sent[src, dst] += (hi - lo) * itemsize
                    sent_raw[src, dst] += w
            continue
        for b in range(N):
            for j in range(G):
                lo, hi = pieces[b][j]
                rail[b][j] += (hi - lo) * itemsize
                rail_raw[b][j] += messages(hi - lo)[1]
    if collective != "broadcast":  # rail RS: (a, j) sends every range (b, j) but its own to (a+1, j); AG all but a+1's
        for j in range(G):
            column, column_raw = sum(rail[b][j] for b in range(N)), sum(rail_raw[b][j] for b in range(N))
            for a in range(N):
                src, dst, nxt = a * G + j, (a + 1) % N * G + j, (a + 1) % N
                if collective != "allgather":
                    sent[src, dst] += column - rail[a][j]
                    sent_raw[src, dst] += column_raw - rail_raw[a][j]
                if collective != "reduce_scatter":
                    sent[src, dst] += column - rail[nxt][j]
                    sent_raw[src, dst] += column_raw - rail_raw[nxt][j]
    every_gpu: Callable[[list[int]], list[int]] = lambda per: [per[g % G] for g in range(n)]
    return sent, sent_raw, every_gpu(up), every_gpu(up_raw), every_gpu(down), every_gpu(down_raw)


def sharp_link_bytes(topo: Topology, S: int, config: "FabricConfig", itemsize: int = 4,
                     partial_itemsize: int | None = None) -> dict[str, int]:
    """Exact payload bytes of ranks/collectives/sharp.py's allreduce of S bytes by every GPU of `topo` (N
    nodes, P spines), every link: each GPU tx = rx = S (its chunks up, the results down); leaf a ->
    spine i the partials of the chunks c with c mod P = i, at partial_itemsize bytes an element (the
    accumulator's: 4 for float16/bfloat16; default itemsize); spine i -> leaf a the results of the same
    chunks (S_i = their bytes; S / P when P divides the chunks into equal sets). The chunks and their
    slots are its plan's (fabric.plans.in_switch.sharp): a slot's spine is its last entry mod P."""
    n, N, P = topo.gpus, topo.nodes, topo.spines
    if P < 1:  # one node: fabric.cost's sharp
        raise FabricError(f"cost_nodes: sharp across nodes needs spines; this topology has {N} node and none")
    count = block_bytes(S, 1, itemsize)[0] // itemsize
    wide = partial_itemsize or itemsize
    plan = plans.build("sharp", n, "allreduce",
                       shape=plans.in_switch.shape("sharp", n, "allreduce", N, config, count * itemsize, itemsize,
                                                   wide // itemsize))
    table = plans.chunks.spans(plan, count * itemsize, itemsize, 0)
    per_spine = [0] * P
    for op in plan.programs[0].ops:  # every GPU contributes the same chunks to the same slots
        if op.kind == "switch_contribute":
            lo, hi = plans.chunks.span(table, op.src)
            per_spine[op.slot[-1] % P] += hi - lo
    out = dict.fromkeys((link.name for link in topo.links), 0)
    for link in topo.links:
        if link.level == "gpu-leaf":
            out[link.name] = count * itemsize
        else:
            src, dst = int(link.src[2:]), int(link.dst[2:])
            up = src < N  # leaf -> spine
            elements = per_spine[(dst if up else src) - N]
            out[link.name] = elements * (wide if up else itemsize)
    return out


def nvls_link_bytes(collective: str, topo: Topology, S: int, config: "FabricConfig", itemsize: int = 4,
                    partial_itemsize: int | None = None) -> dict[str, int]:
    """Exact payload bytes of ranks/collectives/nvls.py's reduce_scatter (S: the input's bytes) or
    allreduce by every GPU of `topo` (N nodes of G GPUs, P spines), every link; S_g = GPU g's block.
    Load-reduce: GPU g's uplink S (its answers to the LOADs of every block), its downlink S_g (its
    block's results); leaf a -> spine i the partials of chunk c of every block j for (j + c) mod P = i, at
    partial_itemsize bytes an element (4 for float16/bfloat16; default itemsize): S x wide / itemsize
    over the spines (S / P each for equal sets); spine i -> leaf a the results of those chunks of node
    a's G blocks (S / (N P) for equal sets). Allreduce adds the multicast stores of the reduced
    blocks: GPU g's uplink S_g, every downlink S; leaf a -> spine (g + c) mod P chunk c of node a's
    members' blocks, that spine -> every other leaf the same (G S / (n P) and (n - G) S / (n P) per
    cable for equal sets). The header-only packets (payload 0, header_bytes raw each): per chunk of GPU
    j's block, its request on its uplink, a LOAD down every member's downlink, the request on leaf ->
    spine and on spine -> each other leaf (the spine's notices to the other leaves are control packets).
    Chunks as fabric.replay.nvls_chunks sizes them."""
    n, N, G, P = topo.gpus, topo.nodes, topo.gpus_per_node, topo.spines
    if P < 1:
        raise FabricError(f"cost_nodes: nvls across nodes needs spines; this topology has {N} node and none")
    count = block_bytes(S, 1, itemsize)[0] // itemsize
    wide = partial_itemsize or itemsize
    spans = replay.nvls_chunks(topo, count, config, itemsize, partial_itemsize)
    out = dict.fromkeys((link.name for link in topo.links), 0)
    for j, span in enumerate(spans):
        a = j // G
        for c, (lo, hi) in enumerate(span):
            b, i = (hi - lo) * itemsize, N + (j + c) % P  # the slot (j, c, j + c)
            for k in range(N):  # every leaf's partial up; the result down to the requester's leaf
                out[f"sw{k}->sw{i}"] += (hi - lo) * wide
            out[f"sw{i}->sw{a}"] += b
            out[downlink(j, a)] += b
            if collective == "allreduce":  # my store of the reduced chunk, up once, down to every other leaf
                out[uplink(j, a)] += b
                i = N + (j + c) % P
                out[f"sw{a}->sw{i}"] += b
                for k in range(N):
                    if k != a:
                        out[f"sw{i}->sw{k}"] += b
    for g in range(n):
        out[uplink(g, g // G)] += count * itemsize
        if collective == "allreduce":
            out[downlink(g, g // G)] += count * itemsize
    return out


def sharp_scatter_link_bytes(topo: Topology, S: int, config: "FabricConfig", itemsize: int = 4,
                             partial_itemsize: int | None = None) -> dict[str, int]:
    """Exact payload bytes of ranks/collectives/sharp.py's reduce_scatter of S input bytes by every GPU of
    `topo` (N nodes, P spines), every link: each GPU tx S (every block's chunks), rx its block b_j; leaf
    a -> spine i the partials of the chunks c of blocks j with (j + c) mod P = i (partial_itemsize bytes
    an element: the accumulator's; S / P when they split evenly, 2 S / P for a 16-bit float), spine
    i -> leaf k the results of those chunks of the blocks of node k's members only (G S / (n P) for
    even shares); the other leaves get the spine's notice, a control packet of no bytes. Slots and chunks
    are its plan's (fabric.plans.in_switch.sharp): slot (j, c, j + c), its last entry picking the spine."""
    N, P = topo.nodes, topo.spines
    if P < 1:
        raise FabricError(f"cost_nodes: sharp across nodes needs spines; this topology has {N} node and none")
    count = block_bytes(S, 1, itemsize)[0] // itemsize
    wide = partial_itemsize or itemsize
    out = dict.fromkeys((link.name for link in topo.links), 0)
    for g in range(topo.gpus):
        out[uplink(g, topo.locate(g)[0])] = count * itemsize
    plan = plans.build("sharp", topo.gpus, "reduce_scatter",
                       shape=plans.in_switch.shape("sharp", topo.gpus, "reduce_scatter", N, config, count * itemsize,
                                                   itemsize, wide // itemsize))
    program = plan.programs[0]  # every GPU contributes the same chunks to the same slots
    for op in program.ops:
        if op.kind != "switch_contribute":
            continue
        assert op.send_to is not None and op.src is not None and program.elements is not None  # a sized plan's slot
        j, elements = op.send_to, program.elements[0][op.src.off]
        spine, node = N + op.slot[-1] % P, topo.locate(j)[0]
        out[downlink(j, node)] += elements * itemsize
        for k in range(N):
            out[f"sw{k}->sw{spine}"] += elements * wide
        out[f"sw{spine}->sw{node}"] += elements * itemsize
    return out


def sharp_mcast_link_bytes(collective: str, topo: Topology, S: int, config: "FabricConfig", itemsize: int = 4,
                           root: int = 0) -> dict[str, int]:
    """Exact payload bytes of ranks/collectives/sharp.py's allgather (S: the output's bytes) or broadcast
    (S: the array's, from GPU `root`) by every GPU of `topo` (N nodes, P spines), every link, from its
    multicast stores (its plan, fabric.plans.catalog.call_plan's): GPU p's uplink its own stores (allgather: its block
    b_p; broadcast: S at the root, 0 elsewhere), every downlink S (every store comes back to every member,
    the sender's own included, as on one node); leaf a -> spine i the stores of node a's members whose
    chunk goes to spine i ((p + c) mod P), once whatever the node's members; spine i -> leaf k the
    stores of the other nodes' members sent to spine i. With P | chunks of every block: leaf a -> each
    spine the node's blocks / P, spine -> leaf k the other nodes' blocks / P (allgather: G S / (n P) up
    and (n - G) S / (n P) down per cable; broadcast: S / P up from the root's leaf, S / P down to each
    other leaf)."""
    N, P = topo.nodes, topo.spines
    if P < 1:
        raise FabricError(f"cost_nodes: sharp across nodes needs spines; this topology has {N} node and none")
    count = block_bytes(S, 1, itemsize)[0] // itemsize
    out = dict.fromkeys((link.name for link in topo.links), 0)
    plan, _ = call_plan(collective, "sharp", N, topo.gpus_per_node, count * itemsize, config, itemsize, root)
    for p, sent in plans.in_switch.stores(plan, count * itemsize, itemsize).items():
        node = topo.locate(p)[0]
        for nbytes, i in sent:
            i %= P
            out[uplink(p, node)] += nbytes
            out[f"sw{node}->sw{N + i}"] += nbytes
            for k in range(N):
                if k != node:
                    out[f"sw{N + i}->sw{k}"] += nbytes
    for g in range(topo.gpus):
        out[downlink(g, topo.locate(g)[0])] = count * itemsize
    return out
