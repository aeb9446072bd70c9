"""The fabric's topology as data: nodes, switches and their ports, links, routes and the MPI rank layout.

Pure (numpy at most, never mpi4py). Units: bandwidth in GB/s (1e9 bytes/s = bytes per ns), time in ns.
N nodes x G GPUs, node-major; a leaf switch per node, S spines (switch N + k); D-mod-k routing on the local
index; rank blocks of G + 1 per node, the spines last. Ports, link names, routes and the rank layout:
docs/design/architecture.md ("The topology"); each GPU's share of its node's uplink (Shares), the rule that
keeps flows meeting between switches independent of the host, and why: docs/model/time.md ("Several nodes").
"""

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

import numpy as np
import numpy.typing as npt

from .addressing import MAX_GPUS, NETWORK_ADDRESSES
from .figures import check_figure
from .counters import LinkCounters
from .errors import ConfigError, FabricError


class _LinkTiming(Protocol):  # what Topology.single reads of a fabric.config.Timing
    @property
    def bandwidth_gbytes_per_s(self) -> float: ...
    @property
    def link_latency_ns(self) -> float: ...
    @property
    def switch_latency_ns(self) -> float: ...


class _OneNode(Protocol):  # and of a fabric.config.FabricConfig (config imports this module: no import back)
    @property
    def gpus(self) -> int: ...
    @property
    def name(self) -> str: ...
    @property
    def timing(self) -> _LinkTiming: ...

ROLES = ("gpu", "switch")
SWITCH_LEVELS = ("leaf", "spine")
LEVELS = ("gpu-leaf", "leaf-spine")  # link levels, bottom up
DIRECTIONS = ("up", "down")          # up: towards the spines


def gpu_name(gpu: int) -> str:
    """Endpoint name of GPU `gpu`: "gpu3"."""
    return f"gpu{gpu}"


def switch_name(switch: int) -> str:
    """Endpoint name of switch `switch` (leaves 0..N-1, then spines): "sw0"."""
    return f"sw{switch}"


def link_name(src: str, dst: str) -> str:
    """Name of the link from endpoint `src` to endpoint `dst`: "gpu3->sw0"."""
    return f"{src}->{dst}"


@dataclass(frozen=True)
class Link:
    """One direction of one cable: from port `src_port` of `src` to port `dst_port` of `dst`.

    level: "gpu-leaf" or "leaf-spine"; direction: "up" (towards the spines) or "down";
    bandwidth_gbytes_per_s: GB/s = bytes per ns; latency_ns: ns from a byte leaving to it arriving.
    """

    name: str
    level: str
    direction: str
    src: str
    src_port: int
    dst: str
    dst_port: int
    bandwidth_gbytes_per_s: float
    latency_ns: float


@dataclass(frozen=True)
class Hop:
    """One timed stage of a route (`Topology.timed_route`): a link, or a GPU's share of its node's
    uplink in place of a cable between switches. bandwidth_gbytes_per_s: bytes per ns; latency_ns:
    from a byte leaving to it reaching the next switch or GPU."""

    name: str
    bandwidth_gbytes_per_s: float
    latency_ns: float


def share_name(gpu: int, direction: str) -> str:
    """Name of GPU `gpu`'s share of its node's uplink, direction "out" or "in": "gpu3:out"."""
    return f"{gpu_name(gpu)}:{direction}"


@dataclass(frozen=True)
class Port:
    """Port `number` of a switch: it faces port `peer_port` of endpoint `peer`; `egress` is the
    name of the link leaving by it, `ingress` of the link arriving on it."""

    number: int
    peer: str
    peer_port: int
    egress: str
    ingress: str


@dataclass(frozen=True)
class Switch:
    """Switch `index` ("sw{index}"): a leaf (of node `node`) or a spine; its MPI rank; the ns one
    traversal takes; its ports, numbered from 0."""

    index: int
    level: str
    node: int | None
    rank: int
    latency_ns: float
    ports: tuple[Port, ...]

    @property
    def name(self) -> str:
        return switch_name(self.index)


@dataclass(frozen=True)
class Topology:
    """Nodes of GPUs behind leaf switches, spines above them, their links, routes and MPI ranks.

    Build with `Topology.single(config)` (today's one-switch fabric) or `Topology.multi_node(...)`;
    the constructor takes the same numbers (gpu_link as two fields; the uplink ones None when
    spines = 0). Invalid sizes or figures raise ConfigError.
    """

    nodes: int
    gpus_per_node: int
    spines: int
    gpu_gbytes_per_s: float
    gpu_latency_ns: float
    switch_latency_ns: float
    uplink_gbytes_per_s_per_node: float | None = None
    uplink_latency_ns: float | None = None
    name: str = "custom"
    spine_latency_ns: float | None = None  # one traversal of a spine (ns); None: switch_latency_ns
    switches: tuple[Switch, ...] = field(init=False, repr=False, compare=False)
    links: tuple[Link, ...] = field(init=False, repr=False, compare=False)
    _by_name: dict[str, Link] = field(init=False, repr=False, compare=False)
    _switch_named: dict[str, Switch] = field(init=False, repr=False, compare=False)
    _gpu_named: dict[str, int] = field(init=False, repr=False, compare=False)
    _cache: dict[str, dict[tuple[int, int], Any]] = field(init=False, repr=False, compare=False)

    # -- builders ---------------------------------------------------------------------------------
    @classmethod
    def single(cls, config: _OneNode) -> "Topology":
        """Today's fabric of `config`: one node, one switch (rank config.gpus), its links with the
        config's bandwidth and latencies (the link profile's, with the config's overrides)."""
        if not all(hasattr(config, key) for key in ("timing", "gpus", "name")):  # a fabric.config.FabricConfig
            raise ConfigError(f"topology: Topology.single takes a FabricConfig, got {type(config).__name__}")
        timing = config.timing
        return cls(nodes=1, gpus_per_node=config.gpus, spines=0, gpu_gbytes_per_s=timing.bandwidth_gbytes_per_s,
                   gpu_latency_ns=timing.link_latency_ns, switch_latency_ns=timing.switch_latency_ns,
                   name=config.name)

    @classmethod
    def multi_node(cls, nodes: int, gpus_per_node: int, spines: int, gpu_link: tuple[float, float],
                   uplink_gbytes_per_s_per_node: float, uplink_latency_ns: float, switch_latency_ns: float,
                   name: str = "custom", spine_latency_ns: float | None = None) -> "Topology":
        """`nodes` x `gpus_per_node` GPUs, a leaf per node, `spines` spines (1..gpus_per_node; 0 for one
        node). gpu_link: (GB/s, ns) of each GPU <-> leaf link per direction; a node's uplink of
        `uplink_gbytes_per_s_per_node` GB/s per direction is split evenly, one leaf <-> spine link per
        spine of uplink / spines GB/s each way, `uplink_latency_ns` ns; a leaf adds `switch_latency_ns` ns,
        a spine `spine_latency_ns` (None: switch_latency_ns)."""
        if not isinstance(gpu_link, (tuple, list)) or len(gpu_link) != 2:
            raise ConfigError(f"topology: gpu_link: must be a (GB/s, ns) pair, got {gpu_link!r}")
        return cls(nodes=nodes, gpus_per_node=gpus_per_node, spines=spines, gpu_gbytes_per_s=gpu_link[0],
                   gpu_latency_ns=gpu_link[1], switch_latency_ns=switch_latency_ns,
                   uplink_gbytes_per_s_per_node=uplink_gbytes_per_s_per_node, uplink_latency_ns=uplink_latency_ns,
                   name=name, spine_latency_ns=spine_latency_ns)

    def __post_init__(self) -> None:
        if self.spine_latency_ns is None:  # the spines traversed as the leaves (one figure for every switch)
            object.__setattr__(self, "spine_latency_ns", self.switch_latency_ns)
        self._validate()
        n, g, s = self.nodes, self.gpus_per_node, self.spines
        links: list[Link] = []
        leaf_ports: list[list[Port]] = [[] for _ in range(n)]
        spine_ports: list[list[Port]] = [[] for _ in range(s)]
        for node in range(n):
            leaf = switch_name(node)
            for local in range(g):
                gpu = gpu_name(node * g + local)
                up, down = link_name(gpu, leaf), link_name(leaf, gpu)
                links.append(Link(up, "gpu-leaf", "up", gpu, 0, leaf, local, self.gpu_gbytes_per_s,
                                  self.gpu_latency_ns))
                links.append(Link(down, "gpu-leaf", "down", leaf, local, gpu, 0, self.gpu_gbytes_per_s,
                                  self.gpu_latency_ns))
                leaf_ports[node].append(Port(local, gpu, 0, egress=down, ingress=up))
        if s:
            # several nodes (spines): _validate checked their uplink figures
            share = cast(float, self.uplink_gbytes_per_s_per_node) / s  # each leaf <-> spine link: uplink / spines
            for node in range(n):
                leaf = switch_name(node)
                for k in range(s):
                    spine = switch_name(n + k)
                    up, down = link_name(leaf, spine), link_name(spine, leaf)
                    links.append(Link(up, "leaf-spine", "up", leaf, g + k, spine, node, share,
                                      cast(float, self.uplink_latency_ns)))
                    links.append(Link(down, "leaf-spine", "down", spine, node, leaf, g + k, share,
                                      cast(float, self.uplink_latency_ns)))
                    leaf_ports[node].append(Port(g + k, spine, node, egress=up, ingress=down))
                    spine_ports[k].append(Port(node, leaf, g + k, egress=down, ingress=up))
        switches = [Switch(node, "leaf", node, node * (g + 1) + g, self.switch_latency_ns, tuple(leaf_ports[node]))
                    for node in range(n)]
        switches += [Switch(n + k, "spine", None, n * (g + 1) + k, cast(float, self.spine_latency_ns),  # set above
                            tuple(spine_ports[k]))
                     for k in range(s)]
        object.__setattr__(self, "switches", tuple(switches))
        object.__setattr__(self, "links", tuple(links))
        object.__setattr__(self, "_by_name", {link.name: link for link in links})
        object.__setattr__(self, "_switch_named", {sw.name: sw for sw in switches})
        object.__setattr__(self, "_gpu_named", {gpu_name(x): x for x in range(n * g)})
        object.__setattr__(self, "_cache", {})

    def _validate(self) -> None:
        if not isinstance(self.name, str):
            raise ConfigError(f"topology: name: must be a string, got {self.name!r}")
        what = f"topology {self.name!r}"
        for key, minimum in (("nodes", 1), ("gpus_per_node", 1), ("spines", 0)):
            value = getattr(self, key)
            # bool is an int in Python, but nodes=True is a mistake, not 1
            if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
                kind = "a positive" if minimum else "a non-negative"
                raise ConfigError(f"{what}: {key}: must be {kind} integer, got {value!r}")
        gpus = self.nodes * self.gpus_per_node
        if gpus > MAX_GPUS:
            raise ConfigError(f"{what}: {self.nodes} nodes x {self.gpus_per_node} GPUs = {gpus} GPUs; at most "
                              f"{MAX_GPUS} (one network address each, {NETWORK_ADDRESSES.start:#x}.."
                              f"{NETWORK_ADDRESSES.stop - 1:#x})")
        if self.nodes == 1 and self.spines:
            raise ConfigError(f"{what}: spines: one node sends nothing between nodes; spines must be 0, got "
                              f"{self.spines}")
        if self.nodes > 1 and not 1 <= self.spines <= self.gpus_per_node:
            raise ConfigError(f"{what}: spines: {self.nodes} nodes need 1..{self.gpus_per_node} spines (the spine "
                              f"is chosen as the destination's local index mod spines, so a spine beyond the "
                              f"{self.gpus_per_node} local indices would carry nothing), got {self.spines}")
        figures = ["gpu_gbytes_per_s", "gpu_latency_ns", "switch_latency_ns", "spine_latency_ns"]
        if self.spines or self.uplink_gbytes_per_s_per_node is not None or self.uplink_latency_ns is not None:
            figures += ["uplink_gbytes_per_s_per_node", "uplink_latency_ns"]
        for key in figures:
            # FabricConfig's bounds (fabric.figures.check_figure); a node's uplink is its G GPUs' shares
            check_figure(key, getattr(self, key), f"{what}: ", self.gpus_per_node if key.endswith("per_node") else 1)

    # -- sizes and the rank layout ----------------------------------------------------------------
    @property
    def gpus(self) -> int:
        """GPUs in the whole fabric."""
        return self.nodes * self.gpus_per_node

    @property
    def world_size(self) -> int:
        """MPI processes the fabric needs: one per GPU, one per leaf, one per spine."""
        return self.nodes * (self.gpus_per_node + 1) + self.spines

    @property
    def ranks_per_node(self) -> int:
        """Consecutive ranks of one node (its GPUs, then its leaf): the block size to place per host."""
        return self.gpus_per_node + 1

    def rank_of(self, role: str, index: int) -> int:
        """MPI rank of ("gpu", GPU index) or ("switch", switch index)."""
        if role == "gpu":
            node, local = self.locate(index)
            return node * (self.gpus_per_node + 1) + local
        if role == "switch":
            return self.switch(index).rank
        raise FabricError(f"{self._what}: rank_of: role must be one of {ROLES}, got {role!r}")

    def role_of(self, rank: int) -> tuple[str, int]:
        """("gpu", GPU index) or ("switch", switch index) of MPI rank `rank`."""
        if not _is_index(rank, self.world_size):
            raise FabricError(f"{self._what}: rank {rank!r} is not one of 0..{self.world_size - 1}")
        block = self.gpus_per_node + 1
        if rank >= self.nodes * block:
            return "switch", self.nodes + rank - self.nodes * block
        node, offset = divmod(rank, block)
        if offset == self.gpus_per_node:
            return "switch", node
        return "gpu", node * self.gpus_per_node + offset

    @property
    def gpu_ranks(self) -> tuple[int, ...]:
        """MPI ranks of GPUs 0..gpus-1, in GPU order."""
        return tuple(self.rank_of("gpu", g) for g in range(self.gpus))

    @property
    def switch_ranks(self) -> tuple[int, ...]:
        """MPI ranks of switches 0.. (leaves, then spines), in switch order."""
        return tuple(sw.rank for sw in self.switches)

    # -- lookups ----------------------------------------------------------------------------------
    def locate(self, gpu: int) -> tuple[int, int]:
        """(node, local index) of GPU `gpu`."""
        self._check_gpu(gpu)
        return divmod(gpu, self.gpus_per_node)

    def gpu_at(self, node: int, local: int) -> int:
        """GPU index of local index `local` in node `node`."""
        if not _is_index(node, self.nodes) or not _is_index(local, self.gpus_per_node):
            raise FabricError(f"{self._what}: no GPU at node {node!r}, local index {local!r} (nodes 0.."
                              f"{self.nodes - 1}, local 0..{self.gpus_per_node - 1})")
        return node * self.gpus_per_node + local

    def leaf_of(self, gpu: int) -> Switch:
        """The leaf switch GPU `gpu` is attached to."""
        return self.switches[self.locate(gpu)[0]]

    def spine_for(self, dst: int) -> int | None:
        """Spine index (0..spines-1) that transfers to GPU `dst` from other nodes cross: its local
        index mod spines; None without spines."""
        local = self.locate(dst)[1]
        return local % self.spines if self.spines else None

    def switch(self, index: int) -> Switch:
        """Switch `index` (leaf n is n, spine k is nodes + k)."""
        if not _is_index(index, len(self.switches)):
            raise FabricError(f"{self._what}: no switch {index!r}; switches are 0..{len(self.switches) - 1}")
        return self.switches[index]

    def link(self, name: str) -> Link:
        """The link called `name` ("gpu3->sw0")."""
        try:
            return self._by_name[name]
        except (KeyError, TypeError):
            raise FabricError(f"{self._what}: no link {name!r}") from None

    def by_level(self) -> dict[str, tuple[Link, ...]]:
        """The links of each level present ("gpu-leaf", then "leaf-spine"), each in link order."""
        groups = {level: tuple(link for link in self.links if link.level == level) for level in LEVELS}
        return {level: links for level, links in groups.items() if links}

    def totals_by_level(self, per_link: dict[str, int]) -> dict[str, dict[str, int]]:
        """Sums of a per-link figure (e.g. link_payload_bytes' bytes) by level and direction:
        {"gpu-leaf": {"up": .., "down": ..}, ...}; a link missing from `per_link` counts 0."""
        unknown = sorted(set(per_link) - set(self._by_name))
        if unknown:
            raise FabricError(f"{self._what}: totals_by_level: no link(s) {', '.join(unknown)}")
        return {level: {d: sum(per_link.get(link.name, 0) for link in links if link.direction == d)
                        for d in DIRECTIONS}
                for level, links in self.by_level().items()}

    # -- routing ----------------------------------------------------------------------------------
    def next_port(self, switch: int, dst: int) -> int:
        """The port switch `switch` sends a transfer for GPU `dst` out of (the routing rule above)."""
        sw = self.switch(switch)
        node, local = self.locate(dst)
        if sw.level == "spine":
            return node
        if node == sw.node:
            return local
        return self.gpus_per_node + local % self.spines

    def route(self, src: int, dst: int) -> tuple[Link, ...]:
        """The links a transfer from GPU `src` to GPU `dst` crosses, in order (the switches' next_port
        decisions from src's uplink on)."""
        self._check_gpu(src)
        self._check_gpu(dst)
        routes: dict[tuple[int, int], tuple[Link, ...]] = self._cache.setdefault("routes", {})
        route = routes.get((src, dst))
        if route is None:
            hops = [self._by_name[link_name(gpu_name(src), self.leaf_of(src).name)]]
            while (sw := self._switch_named.get(hops[-1].dst)) is not None:
                hops.append(self._by_name[sw.ports[self.next_port(sw.index, dst)].egress])
            route = routes[(src, dst)] = tuple(hops)
        return route

    @property
    def share_gbytes_per_s(self) -> float | None:
        """Each GPU's share of its node's uplink, GB/s per direction (U / G); None on one node."""
        # several nodes (spines) have an uplink figure (multi_node)
        return cast(float, self.uplink_gbytes_per_s_per_node) / self.gpus_per_node if self.spines else None

    def timed_route(self, src: int, dst: int) -> tuple[Hop, ...]:
        """The stages that time a transfer src -> dst, in order, each followed by one switch traversal
        but the last: the route's links, except that a cable between switches is timed on the
        sender's outbound share and the receiver's inbound share (docs/model/time.md, "Several nodes")."""
        hops: dict[tuple[int, int], tuple[Hop, ...]] = self._cache.setdefault("timed_routes", {})
        timed = hops.get((src, dst))
        if timed is None:
            ends = {"up": share_name(src, "out"), "down": share_name(dst, "in")}
            timed = hops[(src, dst)] = tuple(
                # a leaf-spine link: several nodes, share_gbytes_per_s set
                Hop(ends[link.direction], cast(float, self.share_gbytes_per_s), link.latency_ns)
                if link.level == "leaf-spine"
                else Hop(link.name, link.bandwidth_gbytes_per_s, link.latency_ns) for link in self.route(src, dst))
        return timed

    def traversal_ns(self, link: Link) -> float:
        """ns of one traversal of the switch `link` ends at (a leaf's switch_latency_ns, a spine's
        spine_latency_ns); FabricError if it ends at a GPU."""
        switch = self._switch_named.get(link.dst)
        if switch is None:
            raise FabricError(f"{self._what}: link {link.name!r} ends at a GPU, not at a switch")
        return switch.latency_ns

    def path_latency_ns(self, src: int, dst: int) -> float:
        """Latency of the route src -> dst, ns: its links' latencies plus one traversal per switch
        (2a + s within a node, today's `hop`; 2a + 2u + 2s + the spine's across nodes)."""
        route = self.route(src, dst)
        return sum(link.latency_ns for link in route) + sum(self._switch_named[link.dst].latency_ns
                                                            for link in route[:-1])

    def bottleneck_gbytes_per_s(self, src: int, dst: int) -> float:
        """Least bandwidth a transfer src -> dst is timed at (`timed_route`), GB/s."""
        return min(hop.bandwidth_gbytes_per_s for hop in self.timed_route(src, dst))

    def unloaded_ns(self, src: int, dst: int, raw_bytes: int) -> float:
        """ns from the first byte of a transfer of `raw_bytes` leaving `src` to its last byte reaching
        `dst` over idle links and shares: cut-through, so raw / bottleneck + path latency."""
        return raw_bytes / self.bottleneck_gbytes_per_s(src, dst) + self.path_latency_ns(src, dst)

    # -- what flows where -------------------------------------------------------------------------
    def link_payload_bytes(self, traffic: npt.ArrayLike) -> dict[str, int]:
        """Payload bytes each link carries when GPU i sends traffic[i][j] bytes to GPU j, routed as
        `route` does: {link name: bytes} for every link, in link order. traffic is a gpus x gpus
        matrix of non-negative integers; its diagonal is fabric loopback (up and down again), so a
        collective's own block, which it copies locally, must be 0 there. Exact (Python ints past
        int64); O(gpus^2) in numpy, so a 256-GPU matrix takes milliseconds."""
        matrix = self._traffic(traffic)
        if matrix.dtype != object and int(matrix.sum(dtype=object)) >= 2 ** 63:
            matrix = matrix.astype(object)  # int64 sums would wrap
        n, g, s = self.nodes, self.gpus_per_node, self.spines
        totals = {}
        for gpu, (up, down) in enumerate(zip(matrix.sum(axis=1), matrix.sum(axis=0))):
            leaf = switch_name(gpu // g)
            totals[link_name(gpu_name(gpu), leaf)] = int(up)
            totals[link_name(leaf, gpu_name(gpu))] = int(down)
        if s:
            # by[a, b, k]: bytes from node a's GPUs to node b's GPUs of local index = k mod S, i.e. what
            # crosses spine k from leaf a to leaf b (nothing for a = b: it stays in the leaf)
            to_local = matrix.reshape(n, g, n, g).sum(axis=1)
            by = np.stack([to_local[:, :, k::s].sum(axis=2) for k in range(s)], axis=2)
            for a in range(n):
                by[a, a, :] = 0
            for a in range(n):
                for k in range(s):
                    totals[link_name(switch_name(a), switch_name(n + k))] = int(by[a, :, k].sum())
                    totals[link_name(switch_name(n + k), switch_name(a))] = int(by[:, a, k].sum())
        return {link.name: totals[link.name] for link in self.links}

    def expected_counters(self, transfers: Iterable[tuple[int, int, int]], mtu_bytes: int,
                          header_bytes: int) -> LinkCounters:
        """The per-link counters (payload, raw bytes and packets, fabric.counters) a fabric shows after
        `transfers`, an iterable of (src GPU, dst GPU, payload bytes), each one transfer segmented
        at the MTU on every link of its route (cut-through switches forward it whole)."""
        counters = LinkCounters(mtu_bytes, header_bytes)
        for transfer in transfers:
            try:
                src, dst, nbytes = transfer
            except (TypeError, ValueError):
                raise FabricError(f"{self._what}: a transfer is (src GPU, dst GPU, bytes), got {transfer!r}") from None
            if not isinstance(nbytes, (int, np.integer)) or isinstance(nbytes, bool) or nbytes < 0:
                raise FabricError(f"{self._what}: transfer GPU {src} -> GPU {dst}: bytes must be a non-negative "
                                  f"integer, got {nbytes!r}")
            for link in self.route(src, dst):
                counters.record(link.name, int(nbytes))
        return counters

    # -- helpers ----------------------------------------------------------------------------------
    @property
    def _what(self) -> str:
        return f"topology {self.name!r}"

    def _check_gpu(self, gpu: object) -> None:
        if not _is_index(gpu, self.gpus):
            raise FabricError(f"{self._what}: GPU {gpu!r} is not one of GPUs 0..{self.gpus - 1}")

    def _traffic(self, traffic: npt.ArrayLike) -> np.ndarray:
        matrix = np.asarray(traffic)
        if matrix.shape != (self.gpus, self.gpus):
            raise FabricError(f"{self._what}: traffic matrix must be {self.gpus} x {self.gpus} (bytes from GPU i "
                              f"to GPU j), got shape {matrix.shape}")
        # a float matrix would round byte counts past 2**53; bool is a mistake, not 0/1 bytes
        if matrix.dtype == np.bool_ or not (np.issubdtype(matrix.dtype, np.integer) or matrix.dtype == object):
            raise FabricError(f"{self._what}: traffic matrix must hold integer byte counts, got dtype {matrix.dtype}")
        if matrix.dtype == object:  # Python ints too large for int64, or anything else
            bad = [(i, j) for i, j in zip(*np.nonzero(matrix)) if not isinstance(matrix[i, j], (int, np.integer))
                   or isinstance(matrix[i, j], bool) or matrix[i, j] < 0]
        else:
            bad = list(zip(*np.nonzero(matrix < 0)))
        if bad:
            i, j = bad[0]
            value = matrix[i, j]
            shown = int(value) if isinstance(value, np.integer) else value
            raise FabricError(f"{self._what}: traffic from GPU {i} to GPU {j} must be a non-negative integer "
                              f"number of bytes, got {shown!r}")
        return matrix


def _is_index(value: object, size: int) -> bool | np.bool_:
    """Whether `value` is an integer (not a bool) in 0..size-1 (a numpy bool for a numpy integer)."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool) and 0 <= value < size
