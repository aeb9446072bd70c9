"""Link profiles: per-GPU, per-direction bandwidth and latencies of each interconnect, with sources.

Bandwidths are public figures (sources below). Latencies and the in-switch reduction figures are
documented assumptions of this emulator, of the order vendors and measurements report; a TOML config
may override every number (see FabricConfig).
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
    )
}


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
