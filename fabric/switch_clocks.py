"""The fabric's side of in-switch reductions across nodes, as the replay books it: each leaf's and spine's
reduction engine, a member's part of its node's partial on its share of the uplink to a spine, the result
down the group's shares, the copies down to the members (fabric.switch books the same: Spanning groups);
and on one node (OneSwitch) the leaf's engine of the group and its ports (fabric.switch.in_switch).

Pure (no MPI). Units: ns, bytes, GB/s (= bytes per ns). The schedule (who contributes which chunk when,
who takes which result in what order) is not here: it is a plan's (fabric.plans.timing.switch_plan_ns
walks it and books each step here); this module is what the switches do with it.
"""

from collections.abc import Iterable
from typing import TYPE_CHECKING, cast

from .errors import FabricError
from .programs import GpuClocks
from .timemodel import LinkEnd, ReductionClock
from .topology import Topology

if TYPE_CHECKING:  # for annotations only: nothing more imported at run time
    from .config import FabricConfig

# a slot's contributions so far, as reduce reads them: [count, then running maxima of their stamps] (the clocks'
# `pool`); a slot's contributions one by one held 4.2 million stamps' tuples at nvls 8 x 8 GPUs and 256 MiB (1.5 GB)
Pool = list[float]
_NONE = float("-inf")  # a running maximum of no stamp yet


def sharp_clocks(topo: Topology, config: "FabricConfig", algorithm: str = "sharp") -> tuple[
        list[GpuClocks], list[ReductionClock], dict[tuple[int, int], LinkEnd], dict[tuple[int, int], LinkEnd]]:
    """The clocks a two-level in-switch reduction books on every GPU of `topo` (several nodes, spines):
    (GPUs, engines (leaves 0..N-1, then spines), `mine` {(GPU, spine): its share of its node's uplink to
    that spine, U / (G P)}, `down` {(spine, node): the group's shares of that node's uplink from it,
    U / P}); the uplink's latency u on both."""
    N, G, P, n = topo.nodes, topo.gpus_per_node, topo.spines, topo.gpus
    if N < 2 or not P:
        raise FabricError(f"replay: {algorithm} across nodes needs a topology of several nodes and spines, got {N} nodes")
    t, u = config.timing, cast(float, config.uplink_latency_ns)  # several nodes (checked above): set
    gpus = [GpuClocks(g, topo) for g in range(n)]
    engines = [ReductionClock(t.reduction_gbytes_per_s, t.reduction_latency_ns) for _ in range(N + P)]
    share = cast(float, topo.share_gbytes_per_s)  # several nodes and spines (checked above): set
    group_share = share * G / P  # the node's members' shares of its uplink to one spine
    mine = {(g, i): LinkEnd(share / P, u) for g in range(n) for i in range(P)}
    down = {(i, k): LinkEnd(group_share, u) for k in range(N) for i in range(P)}
    return gpus, engines, mine, down


class TwoLevelSwitches:
    """Every GPU's links and the switches' clocks of in-switch operations across nodes (sharp's and nvls's):
    contributions (a push's, or answers to an NVLS load) on the members' uplinks, each member's part of its
    node's partial on its share of the node's uplink to the slot's spine, each leaf's and spine's engine, the
    results down the group's shares and the members' downlinks; multicast stores up the sender's share to
    one spine and down its part of every other node's shares; NVLS's header-only requests and LOADs."""

    def __init__(self, topo: Topology, config: "FabricConfig", algorithm: str = "sharp"):
        self.topo, self.config = topo, config
        self.gpus, self.engines, self.mine, self.down = sharp_clocks(topo, config, algorithm)
        t = config.timing
        # a leaf's, a spine's (topo.spine_latency_ns) switch latency, the cable's, the engines'
        # several nodes and spines (sharp_clocks checked): the spine's and the uplink's latencies set
        self.s, self.sp, self.u, self.p = (t.switch_latency_ns, cast(float, topo.spine_latency_ns),
                                           cast(float, config.uplink_latency_ns), t.reduction_latency_ns)
        self.store_down: dict[int, dict[tuple[int, int], LinkEnd]] = {}  # sender -> {(spine, node): its part of that node's shares}
        # contribute's per-operation look-ups, made once: GPU g's share to spine i is mine_of[g][i]; its pool offset
        self.P, self.G = topo.spines, topo.gpus_per_node
        self.mine_of = [[self.mine[(g, i)] for i in range(self.P)] for g in range(topo.gpus)]
        self.at_of = [1 + 4 * gpu.node for gpu in self.gpus]

    def request(self, g: int, raw: int) -> tuple[float, float]:
        """GPU g's header-only load-reduce request of `raw` bytes on its uplink, issued at the call's start
        (all of a GPU's are, before anything else it sends: the emulator sends them as credits allow)."""
        return self.gpus[g].uplink.send(0.0, 0.0, raw)

    def load(self, g: int, requested: tuple[float, float], requester: int, raw: int) -> float:
        """When GPU g may answer the switch's LOAD for a request that left `requester`'s uplink at
        `requested`: its leaf (+ s), across nodes the spine and the other leaf (+ s' + s + 2 u), the LOAD
        (`raw` bytes, header-only) on g's downlink in its program order (+ a)."""
        gpu = self.gpus[g]
        ready = requested[1] + self.s + (0.0 if self.gpus[requester].node == gpu.node else
                                         self.sp + self.s + 2 * self.u)
        _, end = gpu.downlink.book(ready, ready, raw)
        return end + gpu.downlink.latency_ns

    def pool(self) -> Pool:
        """An empty slot's pool for contribute and reduce: [count, then per node the latest first and last
        byte of its members' contributions at the leaf and of their parts at the spine (ns)]."""
        return [0.0] + [_NONE] * (4 * self.topo.nodes)

    def contribute(self, pool: Pool, g: int, raw: int, partial_raw: int, spine: int, at: float = 0.0) -> None:
        """GPU g's contribution of `raw` bytes on its uplink from `at` (sharp's push: the call's start, the
        credits not modeled; an NVLS answer: when its LOAD came, load), after its earlier ones; its part of
        its node's partial (partial_raw / G raw bytes) takes its share of the node's uplink to spine `spine`
        mod P (`mine`, + u) once its chunk has been through the engine (+ s + p). Counted into the slot's
        `pool` (its stamps on the uplink and its part's at the spine, what reduce reads of them: maxima)."""
        a, b = self.gpus[g].uplink.send(at, at, raw)
        s, p = self.s, self.p  # (a + s) + p, as the switches add them: the same floats
        c, d = self.mine_of[g][spine % self.P].send(a + s + p, b + s + p, partial_raw / self.G)
        k = self.at_of[g]
        pool[0] += 1
        if a > pool[k]:
            pool[k] = a
        if b > pool[k + 1]:
            pool[k + 1] = b
        if c > pool[k + 2]:
            pool[k + 2] = c
        if d > pool[k + 3]:
            pool[k + 3] = d

    def reduce(self, spine: int, pool: Pool, raw: int, partial_raw: int,
               nodes: Iterable[int]) -> dict[int, tuple[float, float]]:
        """A slot's reduction once every GPU's contribution is in (pool: contribute's; raw: the result's raw
        bytes; partial_raw: a leaf's partial's, the accumulator's width): each leaf's engine reduces its
        node's once the latest is in (+ s); the partial is at spine `spine` mod P once the engine's result
        (+ u) and every member's part are; the spine reduces once every partial is in (+ s'); the result
        goes down the group's shares of each node in `nodes` (+ u): {node: when it is at that leaf}."""
        N, P = self.topo.nodes, self.topo.spines
        i, s, u = spine % P, self.s, self.u
        first = last = _NONE  # the latest partial's first and last byte at the spine
        for k in range(N):
            a, b, c, d = pool[1 + 4 * k:5 + 4 * k]
            start, end = self.engines[k].reduce(a + s, b + s, partial_raw)
            first, last = max(first, max(start + u, c)), max(last, max(end + u, d))
        start, end = self.engines[N + i].reduce(first + self.sp, last + self.sp, raw)
        return {k: self.down[(i, k)].send(start, end, raw) for k in nodes}

    def store(self, p: int, raw: int, spine: int) -> dict[int, tuple[float, float]]:
        """GPU p's multicast store of `raw` bytes, issued at its clock after its earlier sends: its leaf (+ s)
        copies it to the node's members and sends one copy up to spine `spine` mod P on the sender's share of
        the node's uplink to it (`mine`, U / (G P), + u); the spine (+ s') sends one copy to each other leaf k
        on the sender's part of that node's shares from it (U G / (P (n - G)), + u): {node: when the copy is
        at that leaf (its copy down, + s, is take's)}."""
        N, G, P, n = self.topo.nodes, self.topo.gpus_per_node, self.topo.spines, self.topo.gpus
        gpu, i = self.gpus[p], spine % P
        if p not in self.store_down:
            share = cast(float, self.topo.share_gbytes_per_s)  # several nodes: set
            self.store_down[p] = {(x, k): LinkEnd(share * G / (P * (n - G)), self.u)
                                  for x in range(P) for k in range(N) if k != gpu.node}
        a, b = gpu.uplink.send(gpu.now, gpu.now, raw)
        out = {gpu.node: (a, b)}
        a, b = self.mine[(p, i)].send(a + self.s, b + self.s, raw)
        for k in range(N):
            if k != gpu.node:
                out[k] = self.store_down[p][(i, k)].send(a + self.sp, b + self.sp, raw)
        return out

    def take(self, g: int, at: tuple[float, float], raw: int) -> None:
        """GPU g takes a result or a store's copy that is at its leaf at `at`: the leaf copies it down (+ s),
        its downlink books it after its earlier ones, and its clock moves to the last byte (+ a)."""
        gpu = self.gpus[g]
        _, b = gpu.downlink.book(at[0] + self.s, at[1] + self.s, raw)
        gpu.now = max(gpu.now, b + gpu.downlink.latency_ns)

    def end_ns(self) -> float:
        """The latest member's clock once its sends have left its uplink (the call's flush)."""
        for gpu in self.gpus:
            gpu.now = max(gpu.now, gpu.uplink.free_ns)
        return max(gpu.now for gpu in self.gpus)


class OneSwitch:
    """Every GPU's links and the switch's clocks of in-switch operations on one node (sharp's and nvls's), as
    the leaf books them for a group of one node (fabric.switch.in_switch): a contribution (a push's, or an
    answer to an NVLS LOAD) on the member's uplink; the group's one reduction engine (GroupTable.engine)
    reduces a slot once its latest contribution is in (+ s, then the engine's latency and rate, in the order
    the slots complete), and the result leaves on the destinations' downlinks as the engine makes it (no
    second traversal); a multicast store goes through the leaf (+ s, cut-through) and down every member's
    downlink; an NVLS request's LOAD is ready a traversal after its last byte (+ s), header-only. The same
    interface as TwoLevelSwitches, so fabric.plans.timing.switch_plan_ns walks a plan on either; a node is
    node 0, and the spine arguments are unused (there is none)."""

    def __init__(self, topo: Topology, config: "FabricConfig", algorithm: str = "sharp"):
        if topo.nodes != 1:
            raise FabricError(f"replay: {algorithm} on one switch needs a topology of one node, got {topo.nodes} "
                              f"nodes (TwoLevelSwitches books several)")
        t = config.timing
        self.topo, self.config = topo, config
        self.gpus = [GpuClocks(g, topo) for g in range(topo.gpus)]
        self.engine = ReductionClock(t.reduction_gbytes_per_s, t.reduction_latency_ns)  # the group's one engine
        self.s = t.switch_latency_ns

    def request(self, g: int, raw: int) -> tuple[float, float]:
        """GPU g's header-only load-reduce request of `raw` bytes on its uplink, issued at the call's start
        (Call.load_reduce's reserved stamp, gpu.reserve_uplink)."""
        return self.gpus[g].uplink.send(0.0, 0.0, raw)

    def load(self, g: int, requested: tuple[float, float], requester: int, raw: int) -> float:
        """When GPU g may answer the switch's LOAD for a request whose last byte was at the leaf at
        `requested[1]`: the LOAD is ready a traversal later (+ s, header-only, `raw` bytes) and is booked
        on g's downlink in its program order (+ a)."""
        gpu = self.gpus[g]
        ready = requested[1] + self.s
        _, end = gpu.downlink.book(ready, ready, raw)
        return end + gpu.downlink.latency_ns

    def pool(self) -> Pool:
        """An empty slot's pool for contribute and reduce: [count, the latest first and last byte of its
        contributions at the leaf (ns)]."""
        return [0.0, _NONE, _NONE]

    def contribute(self, pool: Pool, g: int, raw: int, partial_raw: int, spine: int, at: float = 0.0) -> None:
        """GPU g's contribution of `raw` bytes on its uplink from `at` (sharp's push: the call's start; an
        NVLS answer: when its LOAD came), after its earlier ones, counted into the slot's `pool` (its first
        and last byte at the leaf: the latest of them). (partial_raw and spine: TwoLevelSwitches'; one
        switch finishes the reduction in the element's dtype.)"""
        a, b = self.gpus[g].uplink.send(at, at, raw)
        pool[0] += 1
        if a > pool[1]:
            pool[1] = a
        if b > pool[2]:
            pool[2] = b

    def reduce(self, spine: int, pool: Pool, raw: int, partial_raw: int,
               nodes: Iterable[int]) -> dict[int, tuple[float, float]]:
        """A slot's reduction once every contribution is in (pool: contribute's): the group's engine starts
        once the latest first byte is in and a traversal has passed (+ s, + its latency p, at its rate, after
        the slots it reduced before): {0: (start, end) of the result at the leaf's ports}."""
        start, end = self.engine.reduce(pool[1] + self.s, pool[2] + self.s, raw)
        return {0: (start, end)}

    def store(self, p: int, raw: int, spine: int) -> dict[int, tuple[float, float]]:
        """GPU p's multicast store of `raw` bytes, issued at its clock after its earlier sends: up its uplink
        (+ a), through the leaf (+ s): {0: when its copies are at every member's port}."""
        gpu = self.gpus[p]
        a, b = gpu.uplink.send(gpu.now, gpu.now, raw)
        return {0: (a + self.s, b + self.s)}

    def take(self, g: int, at: tuple[float, float], raw: int) -> None:
        """GPU g takes a result or a store's copy that is at its port at `at`: its downlink books it after
        its earlier ones, and its clock moves to the last byte (+ a)."""
        gpu = self.gpus[g]
        _, b = gpu.downlink.book(at[0], at[1], raw)
        gpu.now = max(gpu.now, b + gpu.downlink.latency_ns)

    def end_ns(self) -> float:
        """The latest member's clock once its sends have left its uplink (the call's flush)."""
        for gpu in self.gpus:
            gpu.now = max(gpu.now, gpu.uplink.free_ns)
        return max(gpu.now for gpu in self.gpus)
