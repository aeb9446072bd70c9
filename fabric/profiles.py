"""Link profiles: per-GPU, per-direction bandwidth and latencies of each interconnect, with sources.

Line-rate profiles (nvlink3, nvlink4, ...): bandwidths are the public line rates (sources below).
Calibrated profiles (nvlink3-nccl, nvlink4-nccl): effective figures chosen so that the cost model
(fabric.cost) gives the bus bandwidths NCCL measures on 8-GPU DGX A100 / DGX H100 (PUBLISHED, below).
Latencies and, in the line-rate profiles, the in-switch reduction figures are documented assumptions
of this emulator, of the order vendors and measurements report; a TOML config may override every
number (see FabricConfig).
"""

from dataclasses import dataclass

from .errors import ConfigError


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


# Latency assumptions (not measured here): NVLink hop ~150 ns and NVSwitch traversal ~250 ns;
# InfiniBand: HCA + cable ~600 ns per hop, switch port-to-port ~130 ns; PCIe: ~250 ns per hop
# (root/endpoint logic), PCIe switch ~150 ns. In-switch reduction: at line rate, +100 ns.
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
            "InfiniBand Trade Association roadmap: HDR = 200 Gb/s per 4x port",
        ),
        LinkProfile(
            "ib-ndr", 50.0, 600.0, 130.0, 50.0, 100.0, "InfiniBand NDR, 400 Gb/s per GPU",
            "InfiniBand Trade Association roadmap: NDR = 400 Gb/s per 4x port",
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
    )
}


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
# against each within 10% at every size from 64 MiB to 1 GiB). All are peak figures at large sizes (the
# sources measured 256 MiB .. 8 GiB and say bandwidth still grows up to about 1 GiB and beyond); no
# published per-size table for 64 MiB was found, nor an 8-GPU DGX A100 All2All figure, nor a small-size
# latency figure for either system, so the latencies stay the documented assumptions above.
NCCL_TESTS_212 = ("\"H100 all reduce performance is poor\", NVIDIA/nccl-tests issue #212, GitHub, comment by "
                  "S. Jeaugey (NVIDIA), 2024-05-06, https://github.com/NVIDIA/nccl-tests/issues/212")
NCCL_1455 = ("\"[SHArP] about the intranode allreduce performance with SHArP\", NVIDIA/nccl issue #1455, "
             "GitHub, 2024-09-19, https://github.com/NVIDIA/nccl/issues/1455")
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
)


def link_profile(name: str) -> LinkProfile:
    """The profile called `name`; ConfigError naming the known profiles otherwise."""
    try:
        return PROFILES[name]
    except KeyError:
        raise ConfigError(f"link: unknown link profile {name!r}; known: {', '.join(PROFILES)}") from None


# -- GPU compute profiles ------------------------------------------------------------------------------

@dataclass(frozen=True)
class GpuProfile:
    """One GPU's compute roofline: dense peak throughput per dtype and HBM bandwidth.

    peak_tflops: dense (no 2:4 sparsity) peak, TFLOP/s (1e12 per s) per compute dtype of
    COMPUTE_DTYPES; a dtype missing has no such units (e.g. FP8 on A100). hbm_gbytes_per_s: peak
    memory bandwidth, GB/s (1e9 bytes/s = bytes per ns).
    """

    name: str
    peak_tflops: dict
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
    try:
        return GPU_PROFILES[name]
    except KeyError:
        raise ConfigError(f"gpu: unknown GPU profile {name!r}; known: {', '.join(GPU_PROFILES)}") from None
