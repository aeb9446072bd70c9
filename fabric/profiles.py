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
