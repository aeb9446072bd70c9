"""Fabric description: named presets, strict TOML loading and validation (units in every key)."""

import dataclasses
import hashlib
import json
import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from .addressing import MAX_GPUS, NETWORK_ADDRESSES, PHYSICAL_GPU_SHIFT
from .errors import ConfigError
from .figures import check_figure, check_range
from .profiles import CALIBRATED_LINK, LINKS_PER_GPU, NVL72_GPUS, gpu_profile, link_profile, system_profile

if TYPE_CHECKING:  # for annotations only: these import this module
    from .faults import Fault, FaultPlan
    from .topology import Topology

MODES = ("network", "classic")
SOFTWARE = ("none", "nccl")  # FabricConfig.software: fabric.software
KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30

# -- bounds of every numeric key -----------------------------------------------------------------------
# A value outside them has no physical reading and breaks honest runs: modeled times of inf (packets
# refused, waits that run to the deadline), host allocations numpy refuses, millions of messages per call.
# ConfigError names the key, the value and the range (check_range).
MIN_EFFICIENCY = 1e-3    # 0.1% of a datasheet peak (an assumption: what a kernel worth modeling reaches);
#                          5e-324 sent an ordinary kernel's modeled time past any clock
MIN_MEMORY_CAPACITY_BYTES = 4 * KiB  # one host page: less holds no buffer of any workload
MAX_MEMORY_CAPACITY_BYTES = 1 << PHYSICAL_GPU_SHIFT  # 1 TiB: classic NVLink's per-GPU physical aperture
#                          (fabric.addressing); above any GPU's HBM (B300: 288 GB). What this host can map is
#                          checked where the memory is made (fabric.memory.DeviceMemory: ConfigError naming
#                          the key and the GPU)
MIN_PAGE_SIZE_BYTES = 4 * KiB  # a GPU MMU's smallest page; smaller ones make an export map millions of pages
MAX_PAGE_SIZE_BYTES = GiB      # the hosts' largest huge page (x86-64's 1 GiB)
MIN_MTU_BYTES = 16             # one 16-byte NVLink flit of payload
MAX_MTU_BYTES = 64 * KiB       # above every link's largest packet (InfiniBand and PCIe 4 KiB, Ethernet 9 KiB)
MAX_HEADER_BYTES = KiB         # 10x an InfiniBand packet's headers (about 100 B with a GRH)
MAX_TLB_ENTRIES = 1 << 20      # far above a hardware TLB's thousands; each is a dict entry on the switch rank
MIN_CHUNK_BYTES = 256          # one packet of NVLink's largest request: each chunk is one message of the
#                                emulator (host work each); nvls_chunk_bytes = 1 made a 256 KiB allreduce > 90 s
MAX_SWITCH_BUFFER_BYTES = GiB  # host memory a switch rank may hold in flight: 16x the default, far above a
#                                switch chip's buffers, and a chunk (at most this) stays one MPI message
MAX_ALIGNMENT_BYTES = 2 * MiB  # a large page (cudaMalloc aligns to 256 B); more only wastes the GPU's memory
MAX_NAME_CHARS = 128           # the fabric's name is printed in headers and reports, never used as a path

# key: (least, most, why) of each integer key; spines (None or 1..gpus_per_node) is checked on its own
INTEGER_RANGES = {
    "gpus": (1, MAX_GPUS, "one network address each"),
    "nodes": (1, MAX_GPUS, "at least one GPU each"),
    "memory_capacity_bytes": (MIN_MEMORY_CAPACITY_BYTES, MAX_MEMORY_CAPACITY_BYTES,
                              "4 KiB, a host page .. 1 TiB, classic NVLink's per-GPU aperture"),
    "page_size_bytes": (MIN_PAGE_SIZE_BYTES, MAX_PAGE_SIZE_BYTES, "4 KiB .. 1 GiB pages"),
    "mtu_bytes": (MIN_MTU_BYTES, MAX_MTU_BYTES, "one 16-byte flit .. 64 KiB packets"),
    "header_bytes": (0, MAX_HEADER_BYTES, "at most 1 KiB of header per packet"),
    "tlb_entries": (1, MAX_TLB_ENTRIES, "at most 2^20 cached pages"),
    "switch_buffer_bytes": (MIN_CHUNK_BYTES, MAX_SWITCH_BUFFER_BYTES, "one 256-byte chunk .. 1 GiB"),
    "chunk_bytes": (MIN_CHUNK_BYTES, MAX_SWITCH_BUFFER_BYTES, "256 bytes, one NVLink request .. 1 GiB"),
    "nvls_chunk_bytes": (MIN_CHUNK_BYTES, MAX_SWITCH_BUFFER_BYTES, "256 bytes, one NVLink request .. 1 GiB"),
    "alignment_bytes": (1, MAX_ALIGNMENT_BYTES, "at most a 2 MiB page"),
}


@dataclass(frozen=True)
class FabricConfig:
    """One fabric: `gpus` GPUs in `nodes` nodes, each node's GPUs behind its leaf switch rank, and
    `spines` spine switch ranks above the leaves (fabric.topology; one node: one switch, no spines).

    mode: "network" (Hopper NVLink Network: per-GPU address spaces, Link TLB, partitions, run-time
    connections) or "classic" (A100 NVLink: one shared physical address space, no isolation,
    connections fixed at boot, forwarding-only switch).
    """

    name: str = "custom"
    mode: str = "network"
    gpus: int = 8  # in the whole fabric: nodes x gpus_per_node
    nodes: int = 1
    # spine switches above the leaves: None takes gpus_per_node on several nodes (one spine per local
    # index, as rail-optimised fabrics have one per NIC rail) and 0 on one node
    spines: int | None = None
    sharp: bool = True
    # the spines reduce and multicast too (the NVLink Switch System's NVSwitches), so `sharp` spans nodes
    spine_sharp: bool = False
    link: str = "nvlink4"
    memory_capacity_bytes: int = 256 * MiB
    page_size_bytes: int = 64 * 1024
    mtu_bytes: int = 256
    header_bytes: int = 16
    tlb_entries: int = 4096
    switch_buffer_bytes: int = 64 * MiB
    chunk_bytes: int = 4 * MiB
    # NVLS pipelines each block in pieces of this size (at most chunk_bytes); NCCL's default NVLS chunk,
    # NCCL_PARAM(NvlsChunkSize, "NVLS_CHUNKSIZE", 128*1024) in NVIDIA/nccl src/transport/nvls.cc
    nvls_chunk_bytes: int = 128 * 1024
    alignment_bytes: int = 256
    partitions: tuple[tuple[int, ...], ...] = field(default=())
    # modeled time: None takes the link profile's figure; a number overrides it
    bandwidth_gbytes_per_s: float | None = None
    link_latency_ns: float | None = None
    switch_latency_ns: float | None = None
    # a node's links to the spines, per direction and per GPU of the node (the node's uplink is
    # gpus_per_node times this, split evenly over the spines; several nodes only), and their latency
    uplink_gbytes_per_s_per_gpu: float | None = None
    uplink_latency_ns: float | None = None
    # one traversal of a spine switch (several nodes only): None takes switch_latency_ns (the node link's, as
    # every spine took before spines had their own); the superpod presets take their spine link profile's
    spine_switch_latency_ns: float | None = None
    reduction_gbytes_per_s: float | None = None
    reduction_latency_ns: float | None = None
    # compute model (fabric/compute.py): the GPU profile, and the fractions of its datasheet peaks that
    # kernels reach (assumptions of this emulator, not measurements; set them from your own profiles)
    gpu: str = "h100-sxm"
    compute_efficiency: float = 0.7
    memory_efficiency: float = 0.9
    # the fault plan (fabric.faults): `[[faults]]` tables in a config TOML or `--faults FILE.toml`;
    # validated against this fabric's link names, held as fabric.faults.Fault records
    faults: tuple["Fault", ...] = ()
    # software latency (fabric.software): "nccl" adds NCCL's launch and protocol latency to every collective
    # call (every preset but the -line twins); "none": the links' time only (the -line twins, what-if studies)
    software: str = "none"

    def __post_init__(self) -> None:
        if self.spines is None and isinstance(self.nodes, int) and isinstance(self.gpus, int) and self.nodes >= 1:
            object.__setattr__(self, "spines", 0 if self.nodes == 1 else max(1, self.gpus // self.nodes))
        self._validate()
        if not self.partitions:
            object.__setattr__(self, "partitions", (tuple(range(self.gpus)),))
        if self.faults:
            self._parse_faults()
        else:  # an empty [[faults]] list is no faults: () as the default, so configs compare equal
            object.__setattr__(self, "faults", ())

    @property
    def timing(self) -> "Timing":
        """The numbers of the time model: the link profile's, with this config's overrides."""
        profile = link_profile(self.link)
        return Timing(*(getattr(self, name) if getattr(self, name) is not None else getattr(profile, name)
                        for name in TIMING_FIELDS))

    def compute_ns(self, flops: float = 0, nbytes: float = 0, dtype: str = "float32") -> float:
        """Modeled ns of a kernel of `flops` operations in `dtype` moving `nbytes` HBM bytes (roofline)."""
        from .compute import roofline_ns
        return roofline_ns(gpu_profile(self.gpu), flops, nbytes, dtype, self.compute_efficiency,
                           self.memory_efficiency)

    @property
    def gpus_per_node(self) -> int:
        return self.gpus // self.nodes

    @property
    def windows(self) -> bool:
        """Whether GPUs export windows that others reach by handle: NVLink Network mode, and classic
        nodes joined by a scale-out network (registered memory, as RDMA uses between nodes)."""
        return self.mode == "network" or self.nodes > 1

    @property
    def switches(self) -> int:
        """Switch ranks: one leaf per node, then the spines."""
        return self.nodes + cast(int, self.spines)  # None only as an argument: __post_init__ sets the count

    @property
    def world_size(self) -> int:
        """MPI processes the fabric needs: one per GPU plus one per switch."""
        return self.gpus + self.switches

    @property
    def topology(self) -> "Topology":
        """The fabric.topology.Topology of this config (links with this config's bandwidths and latencies)."""
        from .topology import Topology
        cached = self.__dict__.get("_topology")
        if cached is None:
            if self.nodes == 1:
                cached = Topology.single(self)
            else:
                timing = self.timing
                # several nodes: __post_init__ set the spines, _validate checked the uplink's figures
                cached = Topology.multi_node(self.nodes, self.gpus_per_node, cast(int, self.spines),
                                             (timing.bandwidth_gbytes_per_s, timing.link_latency_ns),
                                             cast(float, self.uplink_gbytes_per_s_per_gpu) * self.gpus_per_node,
                                             cast(float, self.uplink_latency_ns),
                                             timing.switch_latency_ns, name=self.name,
                                             spine_latency_ns=self.spine_switch_latency_ns)
            object.__setattr__(self, "_topology", cached)
        return cached

    def partition_of(self, gpu: int) -> int:
        """Index of the partition that holds `gpu`."""
        for index, members in enumerate(self.partitions):
            if gpu in members:
                return index
        raise ConfigError(f"partitions: GPU {gpu} is in no partition")

    @property
    def fault_plan(self) -> "FaultPlan":
        """The fabric.faults.FaultPlan of this config (empty, and false, without faults)."""
        from .faults import FULL_LANES, FaultPlan
        return FaultPlan(self.faults, FULL_LANES.get(self.link, 0))

    def _parse_faults(self) -> None:
        from .faults import FULL_LANES, Fault, parse_plan
        if not isinstance(self.faults, (list, tuple)):
            raise ConfigError(f"faults: must be a list of tables ([[faults]]), got {self.faults!r}")
        if all(isinstance(f, Fault) for f in self.faults):
            entries = [f.entry() for f in self.faults]
        else:
            entries = list(cast("list[dict[str, Any]]", self.faults))  # the tables given, not parsed yet
        known = {link.name for link in self.topology.links}
        plan = parse_plan(entries, "faults", known, FULL_LANES.get(self.link, 0))
        for fault in plan.faults:  # between switches: rerouted around when down; ber and lanes not modeled there
            if fault.kind in ("ber", "degraded") and any(self.topology.link(name).level != "gpu-leaf"
                                                         for name in fault.links):
                raise ConfigError(f"faults: kind: {fault.kind!r} on {fault.link!r}, a link between switches; "
                                  f"this version models ber and degraded on a GPU's links only (gpuN<->swL), and "
                                  f"down or flap on any link")
        object.__setattr__(self, "faults", plan.faults)

    def digest(self) -> str:
        """Short stable hash of every field, for trace headers and reports (a config without faults or
        software latency or a spine latency of its own hashes as it did before they existed)."""
        fields = dataclasses.asdict(self)
        if not self.faults:
            del fields["faults"]
        if self.software == "none":
            del fields["software"]
        if self.spine_switch_latency_ns is None:
            del fields["spine_switch_latency_ns"]
        text = json.dumps(fields, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def _validate(self) -> None:
        # printed in headers, reports and errors: one short line of text (never a path: see launch.cli)
        if not isinstance(self.name, str) or not 1 <= len(self.name) <= MAX_NAME_CHARS \
                or not self.name.isprintable() or any(c in self.name for c in "/\\"):
            raise ConfigError(f"name: must be 1..{MAX_NAME_CHARS} printable characters without / or \\, "
                              f"got {self.name!r:.{MAX_NAME_CHARS + 20}}")
        if self.mode not in MODES:
            raise ConfigError(f"mode: must be one of {MODES}, got {self.mode!r}")
        link_profile(self.link)
        if self.software not in SOFTWARE:
            raise ConfigError(f"software: must be one of {SOFTWARE}, got {self.software!r}")
        if not isinstance(self.gpu, str):
            raise ConfigError(f"gpu: must be the name of a GPU profile, got {self.gpu!r}")
        gpu_profile(self.gpu)
        for key in ("compute_efficiency", "memory_efficiency"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or not MIN_EFFICIENCY <= value <= 1:
                raise ConfigError(f"{key}: must be a number in {MIN_EFFICIENCY:g}..1 (a fraction of the "
                                  f"datasheet peak), got {value!r}")
        for key, (least, most, why) in INTEGER_RANGES.items():
            value = getattr(self, key)
            # bool is an int in Python, but `gpus = true` is a mistake, not 1
            if not isinstance(value, int) or isinstance(value, bool):
                raise ConfigError(f"{key}: must be an integer in {least}..{most}, got {value!r}")
            if key == "gpus" and value > MAX_GPUS:
                raise ConfigError(f"gpus: at most {MAX_GPUS} (one network address each, "
                                  f"{NETWORK_ADDRESSES.start:#x}..{NETWORK_ADDRESSES.stop - 1:#x}), got {value}")
            check_range(key, value, least, most, why=why)
        if not isinstance(self.sharp, bool):
            raise ConfigError(f"sharp: must be true or false, got {self.sharp!r}")
        for key in ("page_size_bytes", "alignment_bytes"):
            value = getattr(self, key)
            if value & (value - 1):
                raise ConfigError(f"{key}: must be a power of two, got {value}")
        if not isinstance(self.spine_sharp, bool):
            raise ConfigError(f"spine_sharp: must be true or false, got {self.spine_sharp!r}")
        if self.spine_sharp and not self.sharp:
            raise ConfigError("spine_sharp: spines that reduce need leaves that do; set sharp = true")
        if self.sharp and self.mode == "classic":
            raise ConfigError("sharp: a classic NVLink switch (NVSwitch gen 2) only forwards; set sharp = false")
        if self.mode == "classic" and len(self.partitions) > 1:
            raise ConfigError("partitions: classic NVLink has no isolation; partitions need mode = \"network\"")
        if self.chunk_bytes > self.switch_buffer_bytes:
            raise ConfigError(f"chunk_bytes: {self.chunk_bytes} exceeds switch_buffer_bytes "
                              f"{self.switch_buffer_bytes}")
        for key in TIMING_FIELDS + ("uplink_gbytes_per_s_per_gpu", "uplink_latency_ns", "spine_switch_latency_ns"):
            value = getattr(self, key)
            if value is not None:
                check_figure(key, value)
        if self.gpus % self.nodes:
            raise ConfigError(f"gpus: {self.gpus} GPUs do not split evenly over {self.nodes} nodes")
        if self.nodes == 1:
            if self.spines:
                raise ConfigError(f"spines: one node sends nothing between nodes; spines must be 0, got {self.spines!r}")
            extra = [k for k in ("uplink_gbytes_per_s_per_gpu", "uplink_latency_ns", "spine_switch_latency_ns")
                     if getattr(self, k) is not None]
            if extra:
                raise ConfigError(f"{extra[0]}: only a fabric of several nodes has uplinks and spines (nodes = 1)")
        else:
            if not isinstance(self.spines, int) or isinstance(self.spines, bool) \
                    or not 1 <= self.spines <= self.gpus_per_node:
                raise ConfigError(f"spines: {self.nodes} nodes of {self.gpus_per_node} GPUs need 1.."
                                  f"{self.gpus_per_node} spines, got {self.spines!r}")
            missing = [k for k in ("uplink_gbytes_per_s_per_gpu", "uplink_latency_ns") if getattr(self, k) is None]
            if missing:
                raise ConfigError(f"{missing[0]}: a fabric of {self.nodes} nodes needs it (its links to the spines)")
        if self.partitions:
            seen: list[int] = []
            for members in self.partitions:
                if not isinstance(members, tuple) or not members:
                    raise ConfigError(f"partitions: a partition must be a list of at least one GPU index, "
                                      f"got {members!r}")
                for gpu in members:
                    # 1.0 == 1 and True == 1 would pass the coverage check below
                    if not isinstance(gpu, int) or isinstance(gpu, bool):
                        raise ConfigError(f"partitions: GPU indices must be integers, got {gpu!r} in "
                                          f"{list(members)}")
                seen.extend(members)
            if sorted(seen) != list(range(self.gpus)):
                raise ConfigError(f"partitions: must cover GPUs 0..{self.gpus - 1} exactly once, got "
                                  f"{[list(p) for p in self.partitions]}")


TIMING_FIELDS = ("bandwidth_gbytes_per_s", "link_latency_ns", "switch_latency_ns", "reduction_gbytes_per_s",
                 "reduction_latency_ns")


@dataclass(frozen=True)
class Timing:
    """The time model's numbers: GB/s (= bytes per ns) and ns."""

    bandwidth_gbytes_per_s: float
    link_latency_ns: float
    switch_latency_ns: float
    reduction_gbytes_per_s: float
    reduction_latency_ns: float


# Every preset names its sources in fabric/profiles.py (link) and docs/model/presets.md (topology).
PRESETS: dict[str, dict[str, Any]] = {
    # DGX H100: 8 H100 GPUs on NVLink4 through NVSwitch gen 3 (SHARP); NVLink Network addressing.
    # Calibrated: effective bandwidth and in-switch reduction as NCCL measures them (profiles.PUBLISHED).
    "dgx-h100": dict(mode="network", gpus=8, sharp=True, link="nvlink4-nccl", software="nccl", gpu="h100-sxm"),
    # DGX A100: 8 A100 GPUs on NVLink3 through NVSwitch gen 2 (forwarding only); shared physical addresses.
    # Calibrated: effective bandwidth as NCCL measures it (profiles.PUBLISHED).
    "dgx-a100": dict(mode="classic", gpus=8, sharp=False, link="nvlink3-nccl", software="nccl", gpu="a100-sxm"),
    # The same systems at line rate (450 / 300 GB/s, reduction at line rate), for what-if studies.
    "dgx-h100-line": dict(mode="network", gpus=8, sharp=True, link="nvlink4", gpu="h100-sxm"),
    "dgx-a100-line": dict(mode="classic", gpus=8, sharp=False, link="nvlink3", gpu="a100-sxm"),
    # 8 A100 / H100 GPUs, each behind its own InfiniBand HDR / NDR port on one IB switch (no SHARP):
    # separate address spaces reached through registered windows, like NVLink Network mode.
    "a100-ib": dict(mode="network", gpus=8, sharp=False, link="ib-hdr", software="nccl", gpu="a100-sxm"),
    "h100-ib": dict(mode="network", gpus=8, sharp=False, link="ib-ndr", software="nccl", gpu="h100-sxm"),
    # 8 A100 / H100 PCIe cards behind a PCIe switch: peer-to-peer by physical (BAR) address, no isolation,
    # no SHARP.
    "pcie-gen4": dict(mode="classic", gpus=8, sharp=False, link="pcie-gen4", software="nccl", gpu="a100-pcie"),
    "pcie-gen5": dict(mode="classic", gpus=8, sharp=False, link="pcie-gen5", software="nccl", gpu="h100-pcie"),
    # DGX B200: 8 B200 GPUs on NVLink5 through NVSwitch gen 4 (SHARP); NVLink Network addressing.
    # Calibrated: effective bandwidth and in-switch reduction as NCCL measures them on 8 Blackwell GPUs
    # (profiles.PUBLISHED: NVIDIA/nccl issue #2140's 8 x B300, same NVLink5 and switch generation).
    "dgx-b200": dict(mode="network", gpus=8, sharp=True, link="nvlink5-nccl", software="nccl", gpu="b200"),
    # GB200 NVL72: one NVLink domain of 72 B200 GPUs, 18 NVLink5 links a GPU (900 GB/s per direction), one to each
    # of the 18 NVLink switch chips of 9 switch trays (profiles.NVL72_SOURCES), shown as one switch (SHARP); the
    # GPU's compute is the HGX B200 profile's. Calibrated as dgx-b200 (the 8-GPU figures: no NVL72 figure that
    # names its algorithm was found; docs/model/calibration-nodes.md compares the 72-GPU default).
    "gb200-nvl72": dict(mode="network", gpus=NVL72_GPUS, sharp=True, link="nvlink5-nccl", software="nccl", gpu="b200"),
    # The same two at line rate (900 GB/s, reduction at line rate), for what-if studies.
    "dgx-b200-line": dict(mode="network", gpus=8, sharp=True, link="nvlink5", gpu="b200"),
    "gb200-nvl72-line": dict(mode="network", gpus=NVL72_GPUS, sharp=True, link="nvlink5", gpu="b200"),
}


def _system(name: str, nodes: int = 2, line: bool = False) -> dict[str, Any]:
    """A multi-node preset from profiles.SYSTEMS[name], `nodes` nodes by default (--nodes changes it).
    Calibrated (line=False): a node's NVLink is the generation's calibrated profile (profiles.CALIBRATED_LINK:
    nvlink4 -> nvlink4-nccl, 393 GB/s raw, reduction 292), and NVLink uplinks to NVLink spines carry the
    same per-link rate (72 NVLink4 links: 72 x 393/18 = 1,572 GB/s a node, not 72 x 25 = 1,800); an
    InfiniBand uplink stays at its line rate (one NIC per GPU: 50 GB/s NDR carries 47.1 GB/s of payload here,
    NVIDIA's 46-48 per NIC, docs/model/calibration-nodes.md [P1]). line=True: the line-rate profiles and
    uplinks, for what-if studies. The node's uplink is kept per GPU (a node of fewer GPUs, --gpus-per-node,
    has that share of it). The uplink latency and a spine's switch latency are the spine link profile's
    (profiles: InfiniBand's from the adapter's and the switch's datasheets, 600 and 130 ns; NVLink's
    assumptions, 150 and 250 ns, see SystemProfile.notes); a leaf takes the node link profile's switch latency. A node's switch reduces where its NVSwitch does (network mode),
    whatever the spine. Calibrated presets add NCCL's software latency to every call (fabric.software);
    the line-rate twins model the links alone."""
    system = system_profile(name)
    link = system.gpu_link if line else CALIBRATED_LINK[system.gpu_link]
    # a spine of another profile than the node's (InfiniBand) its own switch latency; the same (NVLink): unset,
    # so those presets' configs hash as before spines had their own
    spine = link_profile(system.spine_link).switch_latency_ns
    uplink = system.uplink_gbytes_per_s_per_node / system.gpus_per_node
    if system.spine_link in LINKS_PER_GPU and not line:  # NVLink uplinks: each link at the calibrated per-link rate
        uplink *= link_profile(link).bandwidth_gbytes_per_s / link_profile(system.spine_link).bandwidth_gbytes_per_s
    return dict(mode=system.mode, sharp=system.mode == "network",
                spine_sharp=system.mode == "network" and system.in_network_reduction, link=link, gpu=system.gpu,
                nodes=nodes, gpus=nodes * system.gpus_per_node, uplink_gbytes_per_s_per_gpu=uplink,
                uplink_latency_ns=link_profile(system.spine_link).link_latency_ns,
                spine_switch_latency_ns=spine if spine != link_profile(link).switch_latency_ns else None,
                software="none" if line else "nccl")


# Multi-node systems (fabric.topology): DGX H100 nodes on the NVLink Switch System, DGX H100 nodes on NDR
# InfiniBand, DGX A100 nodes on HDR InfiniBand, DGX GH200 (32 nodes of 8 GH200 superchips on the two-level
# NVLink Switch System without a taper); their figures and sources are profiles.SYSTEMS'. Each calibrated,
# and its line-rate twin NAME-line (as dgx-h100 / dgx-h100-line).
for _name in ("superpod-h100-nvlink", "superpod-h100-ib", "superpod-a100-ib", "dgx-gh200"):
    PRESETS[_name] = _system(_name)
    PRESETS[_name + "-line"] = _system(_name, line=True)
del _name
DEFAULT_PRESET = "dgx-h100"
_KEYS = {f.name for f in dataclasses.fields(FabricConfig)}


def build_config(settings: dict[str, Any], source: str) -> FabricConfig:
    """A validated FabricConfig from plain settings; `source` names where they came from in errors."""
    unknown = sorted(set(settings) - _KEYS)
    if unknown:
        raise ConfigError(f"{source}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(_KEYS))}")
    settings = dict(settings)
    if "partitions" in settings:
        parts = settings["partitions"]
        if not isinstance(parts, (list, tuple)) or not all(isinstance(p, (list, tuple)) for p in parts):
            raise ConfigError(f"{source}: partitions: must be a list of lists of GPU indices, got {parts!r}")
        settings["partitions"] = tuple(tuple(p) for p in parts)
    try:
        return FabricConfig(**settings)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    except TypeError as exc:
        raise ConfigError(f"{source}: {exc}") from None


def preset(name: str, **overrides: Any) -> FabricConfig:
    """The named preset, with optional overrides (e.g. gpus=4)."""
    if name not in PRESETS:
        raise ConfigError(f"preset: unknown preset {name!r}; known: {', '.join(PRESETS)}")
    return build_config({**PRESETS[name], "name": name, **overrides}, f"preset {name}")


def load_toml(path: str | Path, **overrides: Any) -> FabricConfig:
    """A FabricConfig from a TOML file; `base = "PRESET"` in the file starts from that preset."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such config file") from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: is a directory, not a config file") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the config file: {exc.strerror}") from None
    except UnicodeDecodeError as exc:  # TOML is UTF-8 text; this is most likely a binary file
        raise ConfigError(f"{path}: not a TOML file: byte {exc.start} is not UTF-8 text") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    base = data.pop("base", None)
    if base is not None and (not isinstance(base, str) or base not in PRESETS):
        raise ConfigError(f"{path}: base: unknown preset {base!r}; known: {', '.join(PRESETS)}")
    settings = dict(PRESETS[base]) if base else {}
    settings.update(data)
    settings.setdefault("name", path.stem)
    settings.update(overrides)
    return build_config(settings, str(path))


# --software's help (launch: run, bench, model)
SOFTWARE_HELP = ("software latency of every collective call: nccl (NCCL's launch and protocol latency, every preset's "
                 "but the -line twins') or none (the links alone, the -line presets' own); default: the fabric's")


def resolve(preset_name: str | None = None, config_path: str | None = None, gpus: int | None = None,
            nodes: int | None = None, gpus_per_node: int | None = None, software: str | None = None) -> FabricConfig:
    """The fabric a command line asks for: --preset or --config (not both), sized by --gpus (in the
    whole fabric), --nodes and --gpus-per-node (the config's own for what is not given), with --software's
    choice if given."""
    if software is not None:
        return dataclasses.replace(resolve(preset_name, config_path, gpus, nodes, gpus_per_node), software=software)
    if preset_name and config_path:
        raise ConfigError("give --preset or --config, not both")
    for flag, value in (("--gpus", gpus), ("--nodes", nodes), ("--gpus-per-node", gpus_per_node)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise ConfigError(f"{flag}: must be a positive integer, got {value!r}")
    if gpus is not None and gpus_per_node is not None:
        raise ConfigError("give --gpus (the whole fabric) or --gpus-per-node, not both")

    def build(**overrides: Any) -> FabricConfig:
        if config_path:
            return load_toml(config_path, **overrides)
        return preset(preset_name or DEFAULT_PRESET, **overrides)

    if nodes is None and gpus_per_node is None:
        return build(**({} if gpus is None else {"gpus": gpus}))
    base = build()
    nodes = base.nodes if nodes is None else nodes
    if gpus is not None:
        return build(nodes=nodes, gpus=gpus)
    return build(nodes=nodes, gpus=nodes * (base.gpus_per_node if gpus_per_node is None else gpus_per_node))
