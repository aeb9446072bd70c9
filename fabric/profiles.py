"""Link profiles: per-GPU, per-direction bandwidth of each interconnect, with its public source."""

from dataclasses import dataclass

from .errors import ConfigError


@dataclass(frozen=True)
class LinkProfile:
    """One interconnect as seen from one GPU: aggregate bandwidth per direction.

    bandwidth_gbytes_per_s is in GB/s (1e9 bytes per second), per GPU, per direction.
    """

    name: str
    bandwidth_gbytes_per_s: float
    description: str
    source: str


PROFILES: dict[str, LinkProfile] = {
    p.name: p
    for p in (
        LinkProfile(
            "nvlink3", 300.0, "NVLink 3 (A100): 12 links x 25 GB/s",
            "NVIDIA A100 Tensor Core GPU Architecture whitepaper (2020): 12 NVLinks, 600 GB/s bidirectional",
        ),
        LinkProfile(
            "nvlink4", 450.0, "NVLink 4 (H100): 18 links x 25 GB/s",
            "NVIDIA H100 Tensor Core GPU Architecture whitepaper (2022): 18 NVLinks, 900 GB/s bidirectional",
        ),
        LinkProfile(
            "nvlink5", 900.0, "NVLink 5 (B200): 18 links x 50 GB/s",
            "NVIDIA Blackwell architecture technical brief (2024): 1.8 TB/s bidirectional per GPU",
        ),
        LinkProfile(
            "ib-hdr", 25.0, "InfiniBand HDR, 200 Gb/s per GPU",
            "InfiniBand Trade Association roadmap: HDR = 200 Gb/s per 4x port",
        ),
        LinkProfile(
            "ib-ndr", 50.0, "InfiniBand NDR, 400 Gb/s per GPU",
            "InfiniBand Trade Association roadmap: NDR = 400 Gb/s per 4x port",
        ),
        LinkProfile(
            "pcie-gen4", 32.0, "PCIe Gen4 x16, ~32 GB/s",
            "PCI-SIG PCIe 4.0 base specification: 16 GT/s per lane, 128b/130b, x16 ~31.5 GB/s",
        ),
        LinkProfile(
            "pcie-gen5", 64.0, "PCIe Gen5 x16, ~64 GB/s",
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
