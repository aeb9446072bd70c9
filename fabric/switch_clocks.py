"""The fabric's side of in-switch reductions across nodes, as the replay books it: each leaf's and spine's
reduction engine, a member's part of its node's partial on its share of the uplink to a spine, the result
down the group's shares, the copies down to the members (fabric.switch books the same: Spanning groups).

Pure (no MPI). Units: ns, bytes, GB/s (= bytes per ns). The schedule (who contributes which chunk when,
who takes which result in what order) is not here: it is a plan's (fabric.plans.timing.switch_plan_ns
walks it and books each step here); this module is what the switches do with it.
"""

from .errors import FabricError
from .programs import GpuClocks
from .timemodel import LinkEnd, ReductionClock
from .topology import Topology


def sharp_clocks(topo: Topology, config, algorithm: str = "sharp"):
    """The clocks a two-level in-switch reduction books on every GPU of `topo` (several nodes, spines):
    (GPUs, engines (leaves 0..N-1, then spines), `mine` {(GPU, spine): its share of its node's uplink to
    that spine, U / (G P)}, `down` {(spine, node): the group's shares of that node's uplink from it,
    U / P}); the uplink's latency u on both."""
    N, G, P, n = topo.nodes, topo.gpus_per_node, topo.spines, topo.gpus
    if N < 2 or not P:
        raise FabricError(f"replay: {algorithm} across nodes needs a topology of several nodes and spines, got {N} nodes")
    t, u = config.timing, config.uplink_latency_ns
    gpus = [GpuClocks(g, topo) for g in range(n)]
    engines = [ReductionClock(t.reduction_gbytes_per_s, t.reduction_latency_ns) for _ in range(N + P)]
    group_share = topo.share_gbytes_per_s * G / P  # the node's members' shares of its uplink to one spine
    mine = {(g, i): LinkEnd(topo.share_gbytes_per_s / P, u) for g in range(n) for i in range(P)}
    down = {(i, k): LinkEnd(group_share, u) for k in range(N) for i in range(P)}
    return gpus, engines, mine, down


def leaf_partial(k: int, G: int, i: int, stamps: list, engine: ReductionClock, mine: dict, w: int, s: float,
                 p: float, u: float) -> tuple[float, float]:
    """When node k's partial (w raw bytes) for spine i reaches it, as fabric.switch books it: the leaf's
    engine reduces once the node's latest chunk is in (+ s), and each member's part (w / G raw bytes) of
    it takes that member's share of the uplink to spine i (`mine`, U / (G P), + u) once its own chunk
    has been through the engine (+ s + p); the partial is there once the engine's result (+ u) and
    every part are."""
    node = stamps[k * G:(k + 1) * G]
    start, end = engine.reduce(max(a for a, _ in node) + s, max(b for _, b in node) + s, w)
    parts = [mine[(k * G + x, i)].send(a + s + p, b + s + p, w / G) for x, (a, b) in enumerate(node)]
    return max(start + u, max(a for a, _ in parts)), max(end + u, max(b for _, b in parts))


class TwoLevelSwitches:
    """Every GPU's links and the switches' clocks of in-switch operations across nodes (sharp's): a push
    reduction's contributions on the members' uplinks, each leaf's engine and its members' shares to the
    spines, the spines' engines, the results down the group's shares and the members' downlinks; multicast
    stores up a sender's share to one spine and down its part of every other node's shares."""

    def __init__(self, topo: Topology, config, algorithm: str = "sharp"):
        self.topo, self.config = topo, config
        self.gpus, self.engines, self.mine, self.down = sharp_clocks(topo, config, algorithm)
        t = config.timing
        # a leaf's, a spine's (topo.spine_latency_ns) switch latency, the cable's, the engines'
        self.s, self.sp, self.u, self.p = (t.switch_latency_ns, topo.spine_latency_ns, config.uplink_latency_ns,
                                           t.reduction_latency_ns)
        self.store_up: dict[int, list[LinkEnd]] = {}  # sender -> its share of its node's uplink to each spine
        self.store_down: dict[int, dict] = {}  # sender -> {(spine, node): its part of that node's shares}

    def contribute(self, g: int, raw: int) -> tuple[float, float]:
        """GPU g's contribution of `raw` bytes on its uplink, issued at the call's start (sharp's push: the
        credits that bound the switch's memory are not modeled), after its earlier ones."""
        return self.gpus[g].uplink.send(0.0, 0.0, raw)

    def reduce(self, spine: int, stamps: list, raw: int, partial_raw: int, nodes) -> dict:
        """A slot's reduction once every GPU's contribution is in (stamps: each GPU's, in GPU order; raw: the
        result's raw bytes; partial_raw: a leaf's partial's, the accumulator's width): every leaf's partial
        to spine `spine` mod P (leaf_partial), the spine reduces once every partial is in (+ s'), the result
        goes down the group's shares of each node in `nodes` (+ u): {node: when it is at that leaf}."""
        N, G, P = self.topo.nodes, self.topo.gpus_per_node, self.topo.spines
        i = spine % P
        partials = [leaf_partial(k, G, i, stamps, self.engines[k], self.mine, partial_raw, self.s, self.p, self.u)
                    for k in range(N)]
        start, end = self.engines[N + i].reduce(max(a for a, _ in partials) + self.sp,
                                                max(b for _, b in partials) + self.sp, raw)
        return {k: self.down[(i, k)].send(start, end, raw) for k in nodes}

    def store(self, p: int, raw: int, spine: int) -> dict:
        """GPU p's multicast store of `raw` bytes, issued at the call's start after its earlier ones: its
        leaf (+ s) copies it to the node's members and sends one copy up to spine `spine` mod P on the
        sender's share of the node's uplink to it (U / (G P), + u); the spine (+ s') sends one copy to each
        other leaf k on the sender's part of that node's shares from it (U G / (P (n - G)), + u):
        {node: when the copy is at that leaf (its copy down, + s, is take's)}."""
        N, G, P, n = self.topo.nodes, self.topo.gpus_per_node, self.topo.spines, self.topo.gpus
        share, u, node, i = self.topo.share_gbytes_per_s, self.u, self.gpus[p].node, spine % P
        if p not in self.store_up:
            self.store_up[p] = [LinkEnd(share / P, u) for _ in range(P)]
            self.store_down[p] = {(x, k): LinkEnd(share * G / (P * (n - G)), u)
                                  for x in range(P) for k in range(N) if k != node}
        a, b = self.gpus[p].uplink.send(0.0, 0.0, raw)
        out = {node: (a, b)}
        a, b = self.store_up[p][i].send(a + self.s, b + self.s, raw)
        for k in range(N):
            if k != node:
                out[k] = self.store_down[p][(i, k)].send(a + self.sp, b + self.sp, raw)
        return out

    def take(self, g: int, at: tuple[float, float], raw: int) -> None:
        """GPU g takes a result that is at its leaf at `at`: the leaf copies it down (+ s), its downlink
        books it after its earlier ones, and its clock moves to the last byte (+ a)."""
        gpu = self.gpus[g]
        _, b = gpu.downlink.book(at[0] + self.s, at[1] + self.s, raw)
        gpu.now = max(gpu.now, b + gpu.downlink.latency_ns)

    def end_ns(self) -> float:
        """The latest member's clock once its sends have left its uplink (the call's flush)."""
        for gpu in self.gpus:
            gpu.now = max(gpu.now, gpu.uplink.free_ns)
        return max(gpu.now for gpu in self.gpus)
