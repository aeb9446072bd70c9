"""Bounds of a fabric's figures, bandwidths and latencies, and the checks that name the key, the value and
the range (fabric.config's keys and profiles, fabric.topology's links: both take them from here)."""

import math

from .errors import ConfigError

# A value outside them has no physical reading and breaks honest runs: modeled times of inf (packets
# refused, waits that run to the deadline)
MIN_GBYTES_PER_S = 1e-3  # 1 MB/s, 25,000x below the slowest link profile (ib-hdr, 25 GB/s): 1 TiB at it is
#                          about 13 modeled days, still finite (1e-305 GB/s made every modeled time inf)
MAX_GBYTES_PER_S = 1e6   # 1 PB/s, 1,000x NVLink 5's 900 GB/s per GPU: no link comes near it
MAX_LATENCY_NS = 1e9     # 1 s per hop, switch or reduction: 10^6x any profile's; 1e308 made modeled times inf


def check_range(key: str, value: float, least: float, most: float, unit: str = "", why: str = "",
                prefix: str = "") -> None:
    """ConfigError "{prefix}{key}: must be in least..most unit (why), got value" unless least <= value <= most
    (value already known to be a finite number)."""
    if not least <= value <= most:
        unit = f" {unit}" if unit else ""
        why = f" ({why})" if why else ""
        raise ConfigError(f"{prefix}{key}: must be in {least:g}..{most:g}{unit}{why}, got {value!r}"
                          if isinstance(least, float) or isinstance(most, float)
                          else f"{prefix}{key}: must be in {least}..{most}{unit}{why}, got {value!r}")


def check_figure(key: str, value: object, prefix: str = "", scale: int = 1) -> None:
    """ConfigError unless `value` is a finite number within the bounds of its kind: a bandwidth (a key
    naming gbytes_per_s, GB/s: MIN_GBYTES_PER_S..MAX_GBYTES_PER_S, times `scale` for a figure of `scale`
    GPUs together) or a latency (ns: 0..MAX_LATENCY_NS)."""
    rate = "gbytes_per_s" in key
    # nan passes every comparison and inf would make every modeled time inf or 0
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value < 0 or (rate and value == 0):
        raise ConfigError(f"{prefix}{key}: must be a finite {'positive' if rate else 'non-negative'} number, "
                          f"got {value!r}")
    if rate:
        check_range(key, value, MIN_GBYTES_PER_S * scale, MAX_GBYTES_PER_S * scale, "GB/s",
                    "1 MB/s .. 1 PB/s per GPU", prefix)
    else:
        check_range(key, value, 0.0, MAX_LATENCY_NS, "ns", "at most 1 s", prefix)
