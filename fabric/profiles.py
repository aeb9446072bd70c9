"""Link profiles: per-GPU, per-direction bandwidth and latencies of each interconnect, with sources.

Line-rate profiles (nvlink3, nvlink4, ...): bandwidths are the public line rates (sources below).
Calibrated profiles (nvlink3-nccl, nvlink4-nccl): effective figures chosen so that the cost model
(fabric.cost) gives the bus bandwidths NCCL measures on 8-GPU DGX A100 / DGX H100 (PUBLISHED, below).
Calibrated nvlink5-nccl: the same for 8 Blackwell GPUs (NVIDIA/nccl issue #2140's 8 x B300 figures).
The NVLink latencies and the line-rate profiles' in-switch reduction figures are documented
assumptions of this emulator, of the order vendors and measurements report; the InfiniBand ones are
the vendor's adapter and switch figures (sources below). A TOML config may override every number
(see FabricConfig).
"""

from dataclasses import dataclass
from typing import TypeVar

from .errors import ConfigError

P = TypeVar("P")  # a profile table's profiles (_named)


@dataclass(frozen=True)
class LinkProfile:
    """One interconnect as seen from one GPU.

    bandwidth_gbytes_per_s: GB/s (1e9 bytes/s) per GPU per direction; link_latency_ns: one hop
    GPU <-> switch; switch_latency_ns: one traversal of the switch; reduction_gbytes_per_s and
    reduction_latency_ns: an in-switch reduction's throughput (result bytes) and added latency.
    """

    name: str
    bandwidth_gbytes_per_s: float
    link_latency_ns: float
    switch_latency_ns: float
    reduction_gbytes_per_s: float
    reduction_latency_ns: float
    description: str
    source: str


# Latency assumptions (not measured here): NVLink hop ~150 ns and NVSwitch traversal ~250 ns (no
# published figure found); PCIe: ~250 ns per hop (root/endpoint logic), PCIe switch ~150 ns. In-switch
# reduction: at line rate, +100 ns.
# InfiniBand, from the vendor: a hop (adapter + cable) 600 ns = the "sub-600ns latency" of NVIDIA's
# ConnectX-6 VPI adapter (NVIDIA ConnectX-6 adapter cards user manual, Introduction; the ConnectX-7
# manual states no figure, so NDR keeps it); a switch traversal 130 ns = the "sub-130ns" port-to-port
# latency of NVIDIA's Quantum HDR switch (NVIDIA Quantum QM8790 product brief, read as quoted in a
# public GitHub repository's latency map; the brief itself was not in the searchable sources). No NVIDIA
# figure for the NDR Quantum-2 (QM9700) was found; third-party pages disagree (under 150 ns, a reseller's
# QM9700 comparison; ~330 ns, a knowledge-base table; under 400 ns, a spec-sheet site), so ib-ndr keeps
# the Quantum figure. Multi-node fabrics: a leaf takes the node link's switch latency, a spine its own link
# profile's (fabric.config._system sets spine_switch_latency_ns: 130 ns on an InfiniBand spine, the NVLink
# 250 ns on an NVLink one; fabric.topology's spine_latency_ns, which the ranks and the replays both read).
IB_SWITCH_SOURCE = ("switch 130 ns: NVIDIA Quantum QM8790 product brief, 'sub-130ns' port-to-port (HDR); no NVIDIA "
                    "Quantum-2 QM9700 figure found")
IB_HOP_SOURCE = ("hop 600 ns: NVIDIA ConnectX-6 adapter cards user manual, Introduction, 'sub-600ns latency' (an "
                 "adapter plus its cable)")
PROFILES: dict[str, LinkProfile] = {
    p.name: p
    for p in (
        LinkProfile(
            "nvlink3", 300.0, 150.0, 250.0, 300.0, 100.0, "NVLink 3 (A100): 12 links x 25 GB/s",
            "NVIDIA A100 Tensor Core GPU Architecture whitepaper (2020): 12 NVLinks, 600 GB/s bidirectional",
        ),
        LinkProfile(
            "nvlink4", 450.0, 150.0, 250.0, 450.0, 100.0, "NVLink 4 (H100): 18 links x 25 GB/s",
            "NVIDIA H100 Tensor Core GPU Architecture whitepaper (2022): 18 NVLinks, 900 GB/s bidirectional",
        ),
        LinkProfile(
            "nvlink5", 900.0, 150.0, 250.0, 900.0, 100.0, "NVLink 5 (B200): 18 links x 50 GB/s",
            "NVIDIA Blackwell architecture technical brief (2024): 1.8 TB/s bidirectional per GPU",
        ),
        LinkProfile(
            "ib-hdr", 25.0, 600.0, 130.0, 25.0, 100.0, "InfiniBand HDR, 200 Gb/s per GPU",
            "InfiniBand Trade Association roadmap: HDR = 200 Gb/s per 4x port; " + IB_HOP_SOURCE + "; " + IB_SWITCH_SOURCE,
        ),
        LinkProfile(
            "ib-ndr", 50.0, 600.0, 130.0, 50.0, 100.0, "InfiniBand NDR, 400 Gb/s per GPU",
            "InfiniBand Trade Association roadmap: NDR = 400 Gb/s per 4x port; " + IB_HOP_SOURCE + " (no ConnectX-7 "
            "figure found); " + IB_SWITCH_SOURCE,
        ),
        LinkProfile(
            "pcie-gen4", 32.0, 250.0, 150.0, 32.0, 100.0, "PCIe Gen4 x16, ~32 GB/s",
            "PCI-SIG PCIe 4.0 base specification: 16 GT/s per lane, 128b/130b, x16 ~31.5 GB/s",
        ),
        LinkProfile(
            "pcie-gen5", 64.0, 250.0, 150.0, 64.0, 100.0, "PCIe Gen5 x16, ~64 GB/s",
            "PCI-SIG PCIe 5.0 base specification: 32 GT/s per lane, 128b/130b, x16 ~63 GB/s",
        ),
        # Calibrated to published nccl-tests figures (PUBLISHED below), 8 GPUs, 64 MiB .. 1 GiB. The
        # emulator's packets carry header_bytes = 16 per mtu_bytes = 256 of payload, so a link of raw
        # bandwidth B moves payload at B x 256/272; large ring AllReduce and All2All busbw tend to that.
        LinkProfile(
            "nvlink3-nccl", 244.0, 150.0, 250.0, 244.0, 100.0,
            "NVLink 3 (A100) as NCCL measures it: 244 GB/s raw = 229.6 GB/s of payload (ring busbw ~230)",
            "effective bandwidth: S. Jeaugey (NVIDIA), NVIDIA/nccl-tests issue #149, 2023-07-05: ~230 GB/s "
            "on A100; latencies: the nvlink3 assumptions (no published figure found); reduction: unused "
            "(NVSwitch gen 2 does not reduce), kept at the link rate",
        ),
        LinkProfile(
            "nvlink4-nccl", 393.0, 150.0, 250.0, 292.0, 100.0,
            "NVLink 4 (H100) as NCCL measures it: 393 GB/s raw = 369.9 GB/s of payload (ring busbw ~370); "
            "in-switch reduction 292 GB/s raw = 274.8 GB/s of result (NVLS algbw ~275, busbw ~480)",
            "S. Jeaugey (NVIDIA), NVIDIA/nccl-tests issue #212, 2024-05-06: effective NVLink bandwidth "
            "370 GB/s (ring, non-allreduce); NVLink SHARP AllReduce busBw ~480 GB/s, algbw ~275 GB/s on 8 "
            "GPUs; latencies: the nvlink4 assumptions (no published figure found)",
        ),
        LinkProfile(
            "nvlink5-nccl", 739.0, 150.0, 250.0, 513.0, 100.0,
            "NVLink 5 (Blackwell) as NCCL measures it: 739 GB/s raw = 695.5 GB/s of payload (ring busbw ~695); "
            "in-switch reduction 513 GB/s raw = 482.8 GB/s of result (NVLS algbw ~483, busbw ~845)",
            "NVIDIA/nccl issue #2140, 2026-04-28, NCCL 2.30.4, 8 x B300 (NVLink5, 18 links, the B200's NVLink and "
            "switch generation): busbw 695 GB/s with NVLS off, 845 with NVLS on (algbw 397 / 483); agrees within "
            "2% with an 8 x B200 user's 830+ (NVIDIA/nccl issue #1807, NCCL 2.27.1); latencies: the nvlink5 "
            "assumptions (no published figure found)",
        ),
    )
}

# The calibrated twin of each line-rate NVLink profile (fabric.config builds the calibrated presets with it).
CALIBRATED_LINK = {"nvlink3": "nvlink3-nccl", "nvlink4": "nvlink4-nccl", "nvlink5": "nvlink5-nccl"}
# NVLink links a GPU of each generation has (the line-rate profiles' sources): an NVLink uplink of k links
# carries k / LINKS_PER_GPU of the GPU's profile bandwidth.
LINKS_PER_GPU = {"nvlink3": 12, "nvlink4": 18, "nvlink5": 18}


@dataclass(frozen=True)
class Published:
    """One published nccl-tests figure on 8 GPUs: bus bandwidth (GB/s, nccl-tests' busbw) of
    `collective` by `algorithm` (the emulator's closest) on `preset`, at large sizes, with its source."""

    preset: str
    collective: str
    algorithm: str
    busbw_gbps: float
    source: str  # title, publisher, date, URL
    says: str    # what the source says, in short


# Published figures the calibrated presets are fitted to (tests/unit/test_cost.py checks the cost model
# against each within 10% at every size from 64 MiB to 1 GiB; the dgx-b200 rows are a user's 8 x B300, whose
# size is not stated, taken as peak figures). All are peak figures at large sizes (the
# sources measured 256 MiB .. 8 GiB and say bandwidth still grows up to about 1 GiB and beyond); no
# published per-size table for 64 MiB was found, nor an 8-GPU DGX A100 All2All figure, nor a small-size
# latency figure for either system, so the latencies stay the documented assumptions above.
NCCL_TESTS_212 = ("\"H100 all reduce performance is poor\", NVIDIA/nccl-tests issue #212, GitHub, comment by "
                  "S. Jeaugey (NVIDIA), 2024-05-06, https://github.com/NVIDIA/nccl-tests/issues/212")
NCCL_1455 = ("\"[SHArP] about the intranode allreduce performance with SHArP\", NVIDIA/nccl issue #1455, "
             "GitHub, 2024-09-19, https://github.com/NVIDIA/nccl/issues/1455")
NCCL_2140 = ("\"[Issue]: NVLS: Bandwidth utilization appears to drop vs theoretical NVLink bandwidth.\", NVIDIA/nccl "
             "issue #2140, GitHub, 2026-04-28, https://github.com/NVIDIA/nccl/issues/2140")
NCCL_TESTS_149 = ("\"Expected bandwidth results? A100 GPUs over NVLink\", NVIDIA/nccl-tests issue #149, GitHub, "
                  "comment by S. Jeaugey (NVIDIA), 2023-07-05, https://github.com/NVIDIA/nccl-tests/issues/149")
PUBLISHED: tuple[Published, ...] = (
    Published("dgx-h100", "allreduce", "ring", 370.0, NCCL_TESTS_212,
              "with the protocol overhead (~20%) NCCL gets an effective NVLink bandwidth of 370 GB/s, seen as "
              "busBw of non-allreduce operations or of allreduce with NCCL_ALGO=RING"),
    Published("dgx-h100", "allreduce", "ring", 370.0, NCCL_1455,
              "8 x H100 SXM, NCCL_ALGO=RING, 2 GiB .. 4 GiB: busbw about 365-370 GB/s on 2 to 8 GPUs"),
    Published("dgx-h100", "allreduce", "nvls", 480.0, NCCL_TESTS_212,
              "allreduce uses NVLink SHARP by default; on 8 GPUs a peak busBw of ~480 GB/s (algbw ~275 GB/s), "
              "at sizes above 256 MiB"),
    Published("dgx-h100", "allreduce", "nvls", 480.0, NCCL_1455,
              "8 x H100 SXM, NCCL_ALGO=NVLS, 2 GiB .. 4 GiB: busbw 480 GB/s on 8 GPUs (algbw about 273)"),
    Published("dgx-h100", "all2all", "direct", 370.0, NCCL_TESTS_212,
              "the 370 GB/s effective NVLink bandwidth is what non-allreduce operations show as busBw"),
    Published("dgx-a100", "allreduce", "ring", 230.0, NCCL_TESTS_149,
              "12 NVLinks x ~20 GB/s effective = 240 GB/s, other bottlenecks limit it to ~230 GB/s busbw, "
              "reached at large sizes (8 GiB; still rising at 512 MiB)"),
    Published("dgx-b200", "allreduce", "ring", 695.0, NCCL_2140,
              "8 x B300 (NVLink5, as B200), NCCL 2.30.4, NVLS off: busbw 695 GB/s, algbw 397 (size not stated)"),
    Published("dgx-b200", "allreduce", "nvls", 845.0, NCCL_2140,
              "8 x B300, NVLS on: busbw 845 GB/s, algbw 483 (size not stated)"),
)


def _named(table: dict[str, P], name: str, key: str, what: str) -> P:
    """table[name]; ConfigError naming `key`, the unknown `what` and the known names otherwise."""
    try:
        return table[name]
    except KeyError:
        raise ConfigError(f"{key}: unknown {what} {name!r}; known: {', '.join(table)}") from None


def link_profile(name: str) -> LinkProfile:
    """The profile called `name`; ConfigError naming the known profiles otherwise."""
    return _named(PROFILES, name, "link", "link profile")


# -- GPU compute profiles ------------------------------------------------------------------------------

@dataclass(frozen=True)
class GpuProfile:
    """One GPU's compute roofline: dense peak throughput per dtype and HBM bandwidth.

    peak_tflops: dense (no 2:4 sparsity) peak, TFLOP/s (1e12 per s) per compute dtype of
    COMPUTE_DTYPES; a dtype missing has no such units (e.g. FP8 on A100). hbm_gbytes_per_s: peak
    memory bandwidth, GB/s (1e9 bytes/s = bytes per ns).
    """

    name: str
    peak_tflops: dict[str, float]
    hbm_gbytes_per_s: float
    description: str
    source: str


# The dtypes gpu.compute(dtype=...) takes: float64/float32 run on the FP64/FP32 units (FP64 on the
# FP64 tensor cores where the GPU has them, as cuBLAS DGEMM does); tf32, bfloat16, float16, fp8, int8
# on the tensor cores. Vendors quote tensor-core peaks "with sparsity"; dense is half of that.
COMPUTE_DTYPES = ("float64", "float32", "tf32", "bfloat16", "float16", "fp8", "int8")

GPU_PROFILES: dict[str, GpuProfile] = {
    g.name: g
    for g in (
        GpuProfile(
            "a100-sxm", dict(float64=19.5, float32=19.5, tf32=156.0, bfloat16=312.0, float16=312.0, int8=624.0),
            2039.0, "A100 SXM4 80 GB (HBM2e)",
            "NVIDIA A100 Tensor Core GPU datasheet (2021, nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf): "
            "FP64 Tensor Core 19.5 TFLOPS, FP32 19.5, TF32 156, BF16/FP16 312, INT8 624 TOPS (dense), "
            "2,039 GB/s HBM2e (80 GB SXM)",
        ),
        GpuProfile(
            "a100-pcie", dict(float64=19.5, float32=19.5, tf32=156.0, bfloat16=312.0, float16=312.0, int8=624.0),
            1935.0, "A100 PCIe 80 GB (HBM2e)",
            "NVIDIA A100 Tensor Core GPU datasheet (2021): the PCIe 80 GB card has the SXM4's peaks and "
            "1,935 GB/s HBM2e",
        ),
        GpuProfile(
            "h100-sxm", dict(float64=67.0, float32=67.0, tf32=494.7, bfloat16=989.4, float16=989.4, fp8=1978.9,
                             int8=1978.9),
            3350.0, "H100 SXM5 80 GB (HBM3)",
            "NVIDIA H100 Tensor Core GPU datasheet (2022-2023): FP64 Tensor Core 67 TFLOPS, FP32 67, "
            "TF32 989 / BF16 and FP16 1,979 / FP8 and INT8 3,958 with sparsity (half dense), 3.35 TB/s HBM3 (SXM)",
        ),
        GpuProfile(
            "h100-pcie", dict(float64=51.0, float32=51.0, tf32=378.0, bfloat16=756.0, float16=756.0, fp8=1513.0,
                              int8=1513.0),
            2000.0, "H100 PCIe 80 GB (HBM2e)",
            "NVIDIA H100 Tensor Core GPU datasheet (2022-2023): PCIe card FP64 Tensor Core 51 TFLOPS, FP32 51, "
            "TF32 756 / BF16 and FP16 1,513 / FP8 and INT8 3,026 with sparsity (half dense), 2 TB/s HBM2e",
        ),
        GpuProfile(
            "b200", dict(float64=37.0, float32=75.0, tf32=1125.0, bfloat16=2250.0, float16=2250.0, fp8=4500.0,
                         int8=4500.0),
            8000.0, "B200 (HGX B200, HBM3e)",
            "NVIDIA HGX platform specifications (2024-2025), HGX B200 with 8 GPUs: FP64 296 TFLOPS, FP32 600, "
            "TF32 18 / BF16 and FP16 36 / FP8 and INT8 72 PFLOPS with sparsity; per GPU an eighth, dense half of "
            "sparse. HBM3e: NVIDIA DGX B200 datasheet (2024), 64 TB/s for 8 GPUs = 8 TB/s per GPU",
        ),
    )
}


def gpu_profile(name: str) -> GpuProfile:
    """The GPU profile called `name`; ConfigError naming the known profiles otherwise."""
    return _named(GPU_PROFILES, name, "gpu", "GPU profile")


# -- multi-node systems (issue 10): the figures the SuperPOD presets are built from --------------------

@dataclass(frozen=True)
class SystemProfile:
    """One multi-node system as published: nodes of GPUs behind the node's NVSwitch chips (one leaf
    switch in fabric.topology) and the scale-out network above them (the spines).

    nodes_max: nodes the source describes in one such system; gpus_per_node; gpu_link and gpu: the
    LinkProfile and GpuProfile inside a node; mode: "network" or "classic" (FabricConfig.mode);
    uplinks_per_node x uplink_gbytes_per_s_each = uplink_gbytes_per_s_per_node, per direction, GB/s
    (Topology.multi_node's uplink, split over the spines); spine_link: the LinkProfile of the scale-out
    links; in_network_reduction: whether the preset reduces in the spines; uplink_latency_ns: a
    published latency of a leaf <-> spine link, None where none was found; sources: (figure, source)
    pairs, each source "title", publisher, year, URL; notes: what the sources do not say.
    """

    name: str
    description: str
    nodes_max: int
    gpus_per_node: int
    gpu_link: str
    gpu: str
    mode: str
    uplinks_per_node: int
    uplink_gbytes_per_s_each: float
    uplink_gbytes_per_s_per_node: float
    spine_link: str
    in_network_reduction: bool
    uplink_latency_ns: float | None
    sources: tuple[tuple[str, str], ...]
    notes: str

    @property
    def node_gbytes_per_s(self) -> float:
        """What a node's GPUs can send to their leaf, per direction: gpus_per_node x gpu_link's GB/s."""
        return self.gpus_per_node * link_profile(self.gpu_link).bandwidth_gbytes_per_s

    @property
    def taper(self) -> float:
        """node_gbytes_per_s / uplink_gbytes_per_s_per_node (2.0 is a 2:1 taper)."""
        return self.node_gbytes_per_s / self.uplink_gbytes_per_s_per_node


NVSWITCH3_BLOG = ("\"Upgrading Multi-GPU Interconnectivity with the Third-Generation NVIDIA NVSwitch\", NVIDIA Technical "
                  "Blog, NVIDIA, 2022 (Hot Chips 34 week, August 2022), https://developer.nvidia.com/blog/"
                  "upgrading-multi-gpu-interconnectivity-with-the-third-generation-nvidia-nvswitch/")
HC34_REPORT = ("\"NVIDIA Networks NVLink\" (on NVIDIA's NVSwitch talk at Hot Chips 34), Wheeler's Network, B. Wheeler, "
               "August 2022, https://www.wheelersnetwork.com/2022/08/")
SUPERPOD_TAPER = ("\"From H100, GH200 to GB200: How NVIDIA Builds AI Supercomputers with SuperPod\", NADDOD blog, "
                  "2024-09-25, https://naddod.com/blog/how-nvidia-builds-ai-supercomputers-with-superpod")
SUPERPOD_H100_RA = ("\"NVIDIA DGX SuperPOD: Next Generation Scalable Infrastructure for AI Leadership, Reference "
                    "Architecture Featuring NVIDIA DGX H100 Systems\", RA-11333-001, NVIDIA, 2023, https://docs.nvidia.com/"
                    "dgx-superpod/reference-architecture-scalable-infrastructure-h100/latest/dgx-superpod-components.html")
BASEPOD_RA = ("\"NVIDIA DGX BasePOD: The Infrastructure Foundation for Enterprise AI, Reference Architecture\", Core "
              "Components, NVIDIA, 2024, https://docs.nvidia.com/dgx-basepod/"
              "reference-architecture-infrastructure-foundation-enterprise-ai/latest/core-components.html")
SUPERPOD_A100_RA = ("\"NVIDIA DGX SuperPOD: Scalable Infrastructure for AI Leadership, NVIDIA DGX A100 System Reference "
                    "Architecture\", RA-09950-001, NVIDIA, November 2020 (read through a mirror: https://vdocuments.net/"
                    "nvidia-dgx-superpod-scalable-infrastructure-for-ai-nvidia-ngca-optimized-software.html)")
NVLINK4_LINK = ("\"H100 and H200 NVLink Cluster Scaling: Maximum Configurations and Performance\", Petronella "
                "Technology Group, 2025, https://petronellatech.com/hardware/h100-h200-nvlink-cluster-scaling/ (third "
                "party; NVIDIA's own figure, 18 NVLinks = 900 GB/s bidirectional, is PROFILES['nvlink4']'s source)")
IB_NDR = ("\"NVIDIA MMS4X00-NS400 400Gb/s Single-port OSFP Single Mode DR4 Transceivers Product Specifications\", "
          "Overview, NVIDIA, 2023, https://docs.nvidia.com/networking/display/mms4x00ns400/overview")
IB_HDR = ("\"Building a SuperPod with 256 GPUs based on H100\" (the DGX A100 part), FiberMall blog, 2024, "
          "https://www.fibermall.com/blog/supercomputer-superpod.htm (third party)")

DGX_GH200_BLOG = ("\"Announcing NVIDIA DGX GH200: The First 100 Terabyte GPU Memory System\", NVIDIA Technical Blog, "
                  "NVIDIA, May 2023 (COMPUTEX 2023), https://developer.nvidia.com/blog/"
                  "announcing-nvidia-dgx-gh200-first-100-terabyte-gpu-memory-system/")
HOPPER_PAGE = ("\"NVIDIA Hopper Architecture\", NVIDIA technologies page (read in its German edition), NVIDIA, 2024, "
               "https://nvidia.com/de-de/technologies/hopper-architecture")
GH200_WHITEPAPER_SUMMARY = ("\"How NVIDIA Grace Hopper Superchip Redefines HPC and AI Performance\", Architects' Tech "
                            "Alliance via besthub.dev, 2024 (a summary of NVIDIA's \"NVIDIA Grace Hopper Superchip "
                            "Architecture\" whitepaper, 2023; third party), https://www.besthub.dev/articles/"
                            "how-nvidia-grace-hopper-superchip-redefines-hpc-and-ai-performance-2b92ffc76799")
GH200_TOPOLOGY_FIGURE = ("\"GraceHopper_ibsim.pdf\", a DGX GH200 NVLink topology drawing attached to a GitHub issue, "
                         "2024, https://github.com/user-attachments/files/17306259/GraceHopper_ibsim.pdf (third party)")
GB200_SUPERPOD_RA = ("\"NVIDIA DGX SuperPOD: Next Generation Scalable Infrastructure for AI Leadership, Reference "
                     "Architecture Featuring NVIDIA DGX GB200\", Network Fabrics, NVIDIA, 2024-2025, https://docs.nvidia.com/"
                     "dgx-superpod/reference-architecture-scalable-infrastructure-gb200/latest/network-fabrics.html")
GB200_BCM = ("\"NVLink Switch Integration\", NVIDIA Base Command Manager 11 / Mission Control manual, NVIDIA, 2025, "
             "https://docs.nvidia.com/base-command-manager/product-manuals/nvidia-mission-control/nvlink")

# GB200 NVL72 (issue 28 part 5): one NVLink domain of 72 GPUs, each with one NVLink5 link to each of the
# rack's 18 NVLink switch chips, so every GPU reaches every other through one switch stage: the emulator
# shows the 18 chips as one switch (as dgx-h100 shows its 4), at the nvlink5 profile's 900 GB/s per direction.
NVL72_GPUS = 72              # GPUs in one GB200 NVL72 NVLink domain (GB200_SUPERPOD_RA: 18 compute trays x 4)
NVL72_SWITCH_TRAYS = 9       # NVLink switch trays a rack (GB200_SUPERPOD_RA; GB200_BCM: "9 NVLink switch trays per rack")
NVL72_CHIPS_PER_TRAY = 2     # NVLink switch chips a tray (GB200_SUPERPOD_RA)
NVL72_LINKS_PER_GPU = 18     # NVLink5 links a GPU, one to each switch chip (GB200_SUPERPOD_RA): 1.8 TB/s
NVL72_SOURCES = (
    ("each DGX GB200 rack: 18 compute trays and 9 NVLink switch trays of 2 NVLink switch chips; each B200 GPU has 18 "
     "NVLink5 links, one to each of the 18 switch chips, 1.8 TB/s in total (= 900 GB/s per direction, the nvlink5 "
     "profile)", GB200_SUPERPOD_RA),
    ("the GB200 server platforms have 9 NVLink switch trays per rack", GB200_BCM),
)

SYSTEMS: dict[str, SystemProfile] = {
    s.name: s
    for s in (
        SystemProfile(
            "superpod-h100-nvlink", "DGX H100 nodes on the NVLink Switch System: NVLink4 inside, 72 NVLink4 links "
            "per node to the second-level NVLink switches (2:1 taper), NVLink SHARP in the switches",
            nodes_max=32, gpus_per_node=8, gpu_link="nvlink4", gpu="h100-sxm", mode="network",
            uplinks_per_node=72, uplink_gbytes_per_s_each=25.0, uplink_gbytes_per_s_per_node=1800.0,
            spine_link="nvlink4", in_network_reduction=True, uplink_latency_ns=None,
            sources=(
                ("up to 256 H100 GPUs (32 DGX H100 x 8) on the NVLink Switch System, 57.6 TB/s all-to-all bandwidth "
                 "(= 32 nodes x 1.8 TB/s); the NVSwitch does multicast and NVLink SHARP in-network reductions",
                 NVSWITCH3_BLOG),
                ("the pod: 18 NVLink Switch systems (two NVSwitch chips each) in a central rack connect 32 DGX H100 in "
                 "a two-level fat tree, 460.8 Tb/s bisection bandwidth (= 57.6 TB/s)", HC34_REPORT),
                ("a node's four NVSwitch chips leave 72 NVLink links to the NVLink Switches: 3.6 TB/s bidirectional "
                 "against 7.2 TB/s of the 8 GPUs inside, not non-blocking (2:1)", SUPERPOD_TAPER),
                ("an NVLink4 link carries 25 GB/s per direction: 18 links = 900 GB/s bidirectional per GPU",
                 NVLINK4_LINK),
            ),
            notes="The Hopper whitepaper's NVLink Switch System section and the Hot Chips 34 slides themselves were "
                  "not found in the searchable sources: the 72-link 2:1 figure is from a third-party analysis (and "
                  "issue 10), consistent with NVIDIA's 57.6 TB/s for 32 nodes. The 18 NVLink Switch systems are "
                  "more than a Topology's spines (at most gpus_per_node): a preset keeps 1800 GB/s per node and "
                  "chooses its spines. No published latency of an NVLink Network hop or of the second-level switch "
                  "was found: uplink_latency_ns is None, the preset must state its assumption.",
        ),
        SystemProfile(
            "superpod-h100-ib", "DGX H100 nodes over NDR InfiniBand: one ConnectX-7 400 Gb/s NIC per GPU, an "
            "InfiniBand spine modeled without in-network reduction",
            nodes_max=32, gpus_per_node=8, gpu_link="nvlink4", gpu="h100-sxm", mode="network",
            uplinks_per_node=8, uplink_gbytes_per_s_each=50.0, uplink_gbytes_per_s_per_node=400.0,
            spine_link="ib-ndr", in_network_reduction=False, uplink_latency_ns=None,
            sources=(
                ("NDR 400 Gb/s InfiniBand with ConnectX-7; scalable units of 32 DGX H100 systems each (a fully tested "
                 "system: four SUs)", SUPERPOD_H100_RA),
                ("DGX H100: four OSFP ports serving eight single-port ConnectX-7 VPI, up to 400 Gb/s "
                 "InfiniBand/Ethernet, four NVSwitch chips", BASEPOD_RA),
                ("NDR: a 400 Gb/s port to a ConnectX-7 (400 Gb/s = 50 GB/s per direction)", IB_NDR),
            ),
            notes="nodes_max 32 is one scalable unit (the RA's SuperPOD scales to four SUs and beyond). NDR Quantum-2 "
                  "switches do offer SHARP; issue 10 models this spine without in-network reduction, a choice of the "
                  "preset, not a property of the hardware. No published per-hop latency of this system was found: "
                  "uplink_latency_ns is None; the preset takes the ib-ndr LinkProfile's 600 ns, the ConnectX-6 "
                  "adapter's published 'sub-600ns' (IB_HOP_SOURCE; no ConnectX-7 figure found).",
        ),
        SystemProfile(
            "superpod-a100-ib", "DGX A100 nodes (classic NVLink3 inside) over HDR InfiniBand: one 200 Gb/s NIC per GPU",
            nodes_max=32, gpus_per_node=8, gpu_link="nvlink3", gpu="a100-sxm", mode="classic",
            uplinks_per_node=8, uplink_gbytes_per_s_each=25.0, uplink_gbytes_per_s_per_node=200.0,
            spine_link="ib-hdr", in_network_reduction=False, uplink_latency_ns=None,
            sources=(
                ("the DGX A100 SuperPOD's compute fabric is HDR InfiniBand", SUPERPOD_A100_RA),
                ("the NVLink Switch System's 57.6 TB/s is 9x the bisection bandwidth of HDR InfiniBand on Ampere GPUs "
                 "(256 GPUs x 25 GB/s = 6.4 TB/s: one 200 Gb/s link per GPU)", NVSWITCH3_BLOG),
                ("DGX A100 nodes are joined by 200 Gb/s HDR InfiniBand (200 Gb/s = 25 GB/s per direction)", IB_HDR),
            ),
            notes="The RA's own pages on the per-node NIC count and the scalable-unit size were not readable in the "
                  "searchable sources; one NIC per GPU rests on NVIDIA's 9x comparison (and issue 10). nodes_max 32 "
                  "is that comparison's 256 GPUs, not a published SuperPOD limit. No published per-hop latency of this "
                  "system was found: uplink_latency_ns is None; the preset takes the ib-hdr LinkProfile's 600 ns, "
                  "the ConnectX-6 adapter's published 'sub-600ns' (IB_HOP_SOURCE).",
        ),
        SystemProfile(
            "dgx-gh200", "DGX GH200: 256 GH200 Grace Hopper Superchips on a two-level NVLink Switch System (NVLink4), "
            "a non-blocking fat tree: the shipped form of the H100-era NVLink Network; 8 superchips a node behind its "
            "first-level NVLink switches, second-level NVLink switches above, NVLink SHARP in the switches",
            nodes_max=32, gpus_per_node=8, gpu_link="nvlink4", gpu="h100-sxm", mode="network",
            uplinks_per_node=144, uplink_gbytes_per_s_each=25.0, uplink_gbytes_per_s_per_node=3600.0,
            spine_link="nvlink4", in_network_reduction=True, uplink_latency_ns=None,
            sources=(
                ("up to 256 GPUs (Grace Hopper Superchips) in one DGX GH200 on the NVLink Switch System, a two-level "
                 "NVLink fabric; 144 TB of memory reachable over NVLink", DGX_GH200_BLOG),
                ("the NVLink Switch System connects up to 256 Grace Hopper superchips with up to 115.2 TB/s of aggregate "
                 "bandwidth (= 256 x 450 GB/s per direction: every GPU's whole NVLink4 bandwidth, no taper)",
                 GH200_WHITEPAPER_SUMMARY),
                ("DGX GH200 with the NVLink Switch System: up to 256 connected GPUs, 57.6 TB/s of all-to-all bandwidth "
                 "(= 128 x 450 GB/s: the bisection, per direction, of 256 GPUs at full NVLink4 bandwidth)", HOPPER_PAGE),
                ("8 Grace Hopper superchips per group on 3 first-level NVSwitch (NVSwitch(0)..(2) for the first 8), "
                 "second-level NVSwitch numbered from 96 (= 32 nodes x 3)", GH200_TOPOLOGY_FIGURE),
                ("an NVLink4 link carries 25 GB/s per direction: 18 links = 900 GB/s bidirectional per GPU",
                 NVLINK4_LINK),
            ),
            notes="NVIDIA publishes the size (256), the two levels and the aggregate bandwidths, not a node's uplink: "
                  "144 x 25 GB/s = 3.6 TB/s per node is derived from the no-taper figures (115.2 TB/s = 256 x 450 GB/s; "
                  "8 GPUs x 18 NVLink4 links), against the 72 links (2:1) of superpod-h100-nvlink, the Hopper "
                  "whitepaper's projected DGX H100 configuration. The 8-superchip node and the 3 first-level switches a "
                  "node come from a third-party drawing; the emulator shows a node's first-level switches as one leaf and "
                  "the second-level ones as at most gpus_per_node spines. The GPU is GH200's H100 (96 GB HBM3 at 4 TB/s, "
                  "later 144 GB HBM3e); its compute profile is h100-sxm's (3.35 TB/s HBM3), which matters only to "
                  "gpu.compute with bytes. No published NVLink Switch System latency was found: uplink_latency_ns is "
                  "None, the preset's is the nvlink4 profile's assumption.",
        ),
    )
}


def system_profile(name: str) -> SystemProfile:
    """The system called `name`; ConfigError naming the known systems otherwise."""
    return _named(SYSTEMS, name, "system", "system profile")
