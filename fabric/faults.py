"""Fault plans: bit errors with link-level replay, links trained down to fewer lanes, down and flapping links.

A plan is data the launcher reads from `--faults FILE.toml` or a config's `[[faults]]` tables, never
from a GPU's packets. Every fault is in modeled time (ns) and deterministic for its seed: whether a
packet is corrupted is a splitmix64 hash of (seed, link, packet index, attempt), never a host RNG.

Entry keys: link (a directional name as the end-of-run table prints it, "gpu3->sw0", or a cable
"gpu3<->sw0" for both directions), kind ("ber" | "degraded" | "down" | "flap"), at_ns (default 0),
until_ns (default: for ever), ber (bit-error rate, kind ber), lanes (kind degraded), period_ns (kind
flap: down for period_ns, then up for period_ns, from at_ns), seed (kind ber, default 0).
"""

import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from .errors import ConfigError, LinkDown

KINDS = ("ber", "degraded", "down", "flap")
KEYS = {"link", "kind", "at_ns", "until_ns", "ber", "lanes", "period_ns", "seed"}
# keys each kind takes besides link, kind, at_ns, until_ns
KIND_KEYS = {"ber": {"ber", "seed"}, "degraded": {"lanes"}, "down": set(), "flap": {"period_ns"}}
MAX_BER = 1e-3        # above it a 256-byte packet fails more often than not (1-(1-1e-3)^2176 = 0.89);
#                       NVLink specifies a raw BER of 1e-12 or better, so 1e-3 is far past any working link
MAX_REPLAYS = 16      # replays of one packet before the model calls the link down (an assumption: a link
#                       layer retries a bounded number of times, then retrains; the count is not published)
MAX_NS = 1e18         # 11.6 modeled days: beyond any run; keeps every time finite
MAX_FAULTS = 4096     # entries in one plan

# Full lane count of one emulated link of each link profile (fabric.profiles), per direction: the
# emulator's GPU <-> switch link is all of a GPU's links together, so lanes = links x lanes per link.
# A leaf <-> spine link is given the same count (an assumption: a fraction lanes/full is what the model uses).
FULL_LANES = {
    # NVIDIA A100 Tensor Core GPU Architecture whitepaper (2020): 12 NVLinks, each 4 differential pairs
    # (lanes) per direction at 50 Gbit/s = 25 GB/s per link per direction
    "nvlink3": 48, "nvlink3-nccl": 48,
    # NVIDIA H100 Tensor Core GPU Architecture whitepaper (2022): 18 NVLink4 links, each 2 lanes per
    # direction at 100 Gbit/s (PAM4) = 25 GB/s per link per direction
    "nvlink4": 36, "nvlink4-nccl": 36,
    # NVIDIA Blackwell technical brief (2024): 18 NVLink5 links, each 2 lanes of 200 Gbit/s per direction
    "nvlink5": 36,
    # InfiniBand Trade Association: HDR and NDR ports are 4X (4 lanes of 50 / 100 Gbit/s)
    "ib-hdr": 4, "ib-ndr": 4,
    # PCI-SIG base specifications: x16
    "pcie-gen4": 16, "pcie-gen5": 16,
}

MASK64 = (1 << 64) - 1


def splitmix64(x: int) -> int:
    """Steele, Lea, Flood, "Fast splittable pseudorandom number generators" (OOPSLA 2014), the
    finaliser Java's SplittableRandom uses: a 64-bit word to a well-mixed 64-bit word."""
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def name_hash(name: str) -> int:
    """FNV-1a 64 of a link name: stable across processes (Python's hash() is salted per process)."""
    h = 0xCBF29CE484222325
    for byte in name.encode():
        h = ((h ^ byte) * 0x100000001B3) & MASK64
    return h


def packet_error_probability(ber: float, packet_bytes: int) -> float:
    """Probability that a packet of `packet_bytes` (payload + header) has at least one bit error: 1-(1-ber)^bits."""
    return -math.expm1(8 * packet_bytes * math.log1p(-ber))


def corrupted(seed: int, link: str, index: int, attempt: int, probability: float) -> bool:
    """Whether attempt `attempt` (0: the first transmission) of packet `index` on `link` is corrupted."""
    x = splitmix64(seed & MASK64)
    x = splitmix64(x ^ name_hash(link))
    x = splitmix64(x ^ (index & MASK64))
    x = splitmix64(x ^ (attempt & MASK64))
    return x < probability * 2.0 ** 64


@dataclass(frozen=True)
class Fault:
    """One entry of a plan; `links`: the directional link names it covers."""

    link: str
    kind: str
    links: tuple[str, ...]
    at_ns: float = 0.0
    until_ns: float = math.inf
    ber: float = 0.0
    lanes: int = 0
    period_ns: float = 0.0
    seed: int = 0

    def entry(self) -> dict[str, Any]:
        """The TOML table this fault was read from (its defaults left out)."""
        table = {"link": self.link, "kind": self.kind, "at_ns": self.at_ns}
        if self.until_ns != math.inf:
            table["until_ns"] = self.until_ns
        table.update({key: getattr(self, key) for key in sorted(KIND_KEYS[self.kind])})
        return table

    def active(self, t_ns: float) -> bool:
        """Whether the fault holds at modeled time t_ns (flap: only in its down phases)."""
        if not self.at_ns <= t_ns < self.until_ns:
            return False
        if self.kind == "flap":
            return int((t_ns - self.at_ns) // self.period_ns) % 2 == 0
        return True

    def down_window(self, t_ns: float) -> tuple[float, float] | None:
        """(went down, comes back up) in modeled ns of the down phase holding at t_ns, or None."""
        if self.kind not in ("down", "flap") or not self.active(t_ns):
            return None
        if self.kind == "down":
            return self.at_ns, self.until_ns
        phase = int((t_ns - self.at_ns) // self.period_ns)
        start = self.at_ns + phase * self.period_ns
        return start, min(start + self.period_ns, self.until_ns)


def _number(source: str, key: str, value: Any, least: float, most: float,
            integer: bool = False) -> Any:  # `value`, checked
    kind_ok = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not kind_ok or not (least <= value <= most):
        what = "an integer" if integer else "a number"
        raise ConfigError(f"{source}: {key}: must be {what} in [{least:g}, {most:g}], got {value!r}")
    return value


def _links(source: str, name: object, known: set[str] | None) -> tuple[str, ...]:
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{source}: link: must be a link name like 'gpu3->sw0' or 'gpu3<->sw0', got {name!r}")
    if "<->" in name:
        a, _, b = name.partition("<->")
        links: tuple[str, ...] = (f"{a}->{b}", f"{b}->{a}")
    elif "->" in name:
        links = (name,)
    else:
        raise ConfigError(f"{source}: link: {name!r} is not 'A->B' (one direction) or 'A<->B' (the cable)")
    if known is not None:
        missing = [link for link in links if link not in known]
        if missing:
            raise ConfigError(f"{source}: link: {name!r}: no link {missing[0]!r} in this fabric; "
                              f"links are named as the end-of-run table prints them, e.g. {min(known)!r}")
    return links


def parse_fault(entry: object, source: str, known: set[str] | None = None) -> Fault:
    """One validated Fault from a TOML table; ConfigError naming the key and value otherwise."""
    if not isinstance(entry, dict):
        raise ConfigError(f"{source}: each fault must be a table, got {entry!r}")
    unknown = sorted(set(entry) - KEYS)
    if unknown:
        raise ConfigError(f"{source}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(KEYS))}")
    kind = entry.get("kind")
    if kind not in KINDS:
        raise ConfigError(f"{source}: kind: must be one of {', '.join(KINDS)}, got {kind!r}")
    stray = sorted(set(entry) - {"link", "kind", "at_ns", "until_ns"} - KIND_KEYS[kind])
    if stray:
        raise ConfigError(f"{source}: {stray[0]}: not a key of kind {kind!r} (it takes "
                          f"{', '.join(sorted(KIND_KEYS[kind])) or 'only link, at_ns, until_ns'})")
    links = _links(source, entry.get("link"), known)
    at_ns = float(_number(source, "at_ns", entry.get("at_ns", 0.0), 0.0, MAX_NS))
    until = entry.get("until_ns")
    until_ns = math.inf if until is None else float(_number(source, "until_ns", until, 0.0, MAX_NS))
    if until_ns <= at_ns:
        raise ConfigError(f"{source}: until_ns: must be after at_ns = {at_ns:g}, got {until!r}")
    values: dict[str, Any] = {}  # Fault's fields of this kind: floats, and ints (seed, lanes)
    if kind == "ber":
        if "ber" not in entry:
            raise ConfigError(f"{source}: ber: kind 'ber' needs a bit-error rate")
        values["ber"] = float(_number(source, "ber", entry["ber"], 0.0, MAX_BER))
        if values["ber"] <= 0:
            raise ConfigError(f"{source}: ber: must be above 0, got {entry['ber']!r}")
        values["seed"] = _number(source, "seed", entry.get("seed", 0), 0, MASK64, integer=True)
    elif kind == "degraded":
        if "lanes" not in entry:
            raise ConfigError(f"{source}: lanes: kind 'degraded' needs a lane count")
        values["lanes"] = _number(source, "lanes", entry["lanes"], 1, max(FULL_LANES.values()), integer=True)
    elif kind == "flap":
        if "period_ns" not in entry:
            raise ConfigError(f"{source}: period_ns: kind 'flap' needs a period (down, then up, each period_ns)")
        values["period_ns"] = float(_number(source, "period_ns", entry["period_ns"], 1.0, MAX_NS))
    return Fault(entry["link"], kind, links, at_ns, until_ns, **values)


@dataclass(frozen=True)
class FaultPlan:
    """Every fault of a run; `full_lanes`: the full lane count of a link of this fabric (FULL_LANES)."""

    faults: tuple[Fault, ...] = ()
    full_lanes: int = 0
    # set by __post_init__ (link -> its faults); None only before it runs
    _by_link: dict[str, tuple[Fault, ...]] = field(default=None, compare=False, repr=False)  # type: ignore[arg-type]

    def __post_init__(self) -> None:
        by_link: dict[str, list[Fault]] = {}
        for fault in self.faults:
            for link in fault.links:
                by_link.setdefault(link, []).append(fault)
            if fault.kind == "degraded" and self.full_lanes and fault.lanes > self.full_lanes:
                raise ConfigError(f"faults: lanes: {fault.lanes} on {fault.link!r}, but a link of this "
                                  f"fabric has {self.full_lanes} lanes")
        object.__setattr__(self, "_by_link", {k: tuple(v) for k, v in by_link.items()})

    def __bool__(self) -> bool:
        return bool(self.faults)

    def on(self, link: str) -> tuple[Fault, ...]:
        """The faults on directional link `link`."""
        return self._by_link.get(link, ())

    def links(self) -> tuple[str, ...]:
        """Every directional link with a fault, sorted."""
        return tuple(sorted(self._by_link))

    def between_switches(self) -> bool:
        """Whether any fault is on a link between two switches (leaf <-> spine)."""
        return any(a.startswith("sw") and b.startswith("sw")
                   for a, _, b in (link.partition("->") for link in self._by_link))

    def lane_fraction(self, link: str, t_ns: float) -> float:
        """The fraction of its bandwidth `link` runs at, at modeled time t_ns (the fewest lanes active)."""
        lanes = [f.lanes for f in self.on(link) if f.kind == "degraded" and f.active(t_ns)]
        return min(lanes) / self.full_lanes if lanes and self.full_lanes else 1.0

    def down(self, link: str, t_ns: float) -> tuple[float, float] | None:
        """(went down, comes back) of `link` at t_ns, or None if it is up."""
        for fault in self.on(link):
            window = fault.down_window(t_ns)
            if window is not None:
                return window
        return None

    def state(self, link: str, t_ns: float) -> str:
        """"down", "degraded", "ber" (errors expected) or "up": what `link` is at modeled time t_ns."""
        if self.down(link, t_ns):
            return "down"
        active = {f.kind for f in self.on(link) if f.active(t_ns)}
        return "degraded" if "degraded" in active else "ber" if "ber" in active else "up"


def parse_plan(entries: object, source: str, known: set[str] | None = None, full_lanes: int = 0) -> FaultPlan:
    """A FaultPlan from a list of tables (`[[faults]]`); `known`: the fabric's link names to check against."""
    if not isinstance(entries, (list, tuple)):
        raise ConfigError(f"{source}: faults: must be a list of tables ([[faults]]), got {entries!r}")
    if len(entries) > MAX_FAULTS:
        raise ConfigError(f"{source}: faults: at most {MAX_FAULTS} entries, got {len(entries)}")
    return FaultPlan(tuple(parse_fault(e, f"{source}: faults[{i}]", known) for i, e in enumerate(entries)),
                     full_lanes)


def load_plan(path: str | Path, known: set[str] | None = None, full_lanes: int = 0) -> FaultPlan:
    """A FaultPlan from a TOML file of `[[faults]]` tables (nothing else at its top level)."""
    return parse_plan(load_entries(path), str(path), known, full_lanes)


def load_entries(path: str | Path) -> list[Any]:
    """The `[[faults]]` tables of a fault plan file, unchecked (FabricConfig checks them against its links)."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such fault plan") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read the fault plan: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    unknown = sorted(set(data) - {"faults"})
    if unknown:
        raise ConfigError(f"{path}: unknown key(s) {', '.join(unknown)}; a fault plan holds [[faults]] tables")
    entries = data.get("faults", [])
    if not isinstance(entries, list):
        raise ConfigError(f"{path}: faults: must be [[faults]] tables, got {entries!r}")
    return entries


@dataclass
class LinkFaultState:
    """The booking end of one faulted link: turns a transfer into the raw bytes its link is busy for
    (replayed packets added, scaled by full/lanes when degraded) and counts crc_errors and replays.

    Packets are numbered in the order this end books them (program order on an uplink, consumption
    order on a downlink), so the same run gives the same corrupted packets whatever the host does."""

    plan: FaultPlan
    link: str
    mtu_bytes: int
    header_bytes: int
    packets: int = 0
    crc_errors: int = 0
    replays: int = 0

    def book(self, payload_bytes: int, t_ns: float) -> float:
        """Raw bytes worth of link time (float: scaled when degraded) for a transfer of `payload_bytes`
        whose first byte is ready at t_ns; LinkDown if the link is down then or a packet exhausts its replays."""
        window = self.plan.down(self.link, t_ns)
        if window is not None:
            back = f"up at {window[1]:.0f} ns" if math.isfinite(window[1]) else "not coming back up"
            raise LinkDown(f"link {self.link} is down at {t_ns:.0f} ns (down since {window[0]:.0f} ns, {back})",
                           self.link, window[0], window[1])
        full, rest = divmod(payload_bytes, self.mtu_bytes)
        sizes = [self.mtu_bytes + self.header_bytes] * full + ([rest + self.header_bytes] if rest else [])
        if not sizes:
            sizes = [self.header_bytes]
        raw = float(sum(sizes))
        for fault in self.plan.on(self.link):
            if fault.kind != "ber" or not fault.active(t_ns):
                continue
            probability: dict[int, float] = {}
            for i, size in enumerate(sizes):
                p = probability.get(size)
                if p is None:
                    p = probability[size] = packet_error_probability(fault.ber, size)
                attempt = 0
                while corrupted(fault.seed, self.link, self.packets + i, attempt, p):
                    self.crc_errors += 1
                    attempt += 1
                    if attempt > MAX_REPLAYS:
                        raise LinkDown(f"link {self.link}: packet {self.packets + i} failed its CRC "
                                       f"{attempt} times at {t_ns:.0f} ns (ber {fault.ber:g}); the link "
                                       f"layer gives up", self.link, t_ns, math.inf)
                    self.replays += 1
                    raw += size  # step: the link layer sends the packet again
        self.packets += len(sizes)
        return raw / self.plan.lane_fraction(self.link, t_ns)

    def counters(self, t_ns: float) -> dict[str, Any]:
        """crc_errors, replays and state (at t_ns) of this link."""
        return {"crc_errors": self.crc_errors, "replays": self.replays, "state": self.plan.state(self.link, t_ns)}


def spine_route(plan: FaultPlan, leaf: int, dst_leaf: int, default: int, nodes: int, spines: int,
                t_ns: float) -> int:
    """The spine (0..spines-1) a transfer from leaf `leaf` to leaf `dst_leaf` takes at t_ns: the routing
    rule's `default`, or, if its leaf -> spine or spine -> leaf link is down, the next spine (in index
    order, wrapping) whose two links are up, as a fabric manager reroutes; LinkDown naming the default
    route's down link if no spine is left."""
    first = None
    for j in range(spines):
        spine = (default + j) % spines
        for link in (f"sw{leaf}->sw{nodes + spine}", f"sw{nodes + spine}->sw{dst_leaf}"):
            window = plan.down(link, t_ns)
            if window is not None:
                first = first or (link, window)
                break
        else:
            return spine
    # every spine broke out of the loop at a down link, so first holds the default route's
    link, (since, back) = cast(tuple[str, tuple[float, float]], first)
    when = f"up at {back:.0f} ns" if math.isfinite(back) else "not coming back up"
    raise LinkDown(f"no path from switch {leaf} to switch {dst_leaf} at {t_ns:.0f} ns: every spine's link is down "
                   f"({link} down since {since:.0f} ns, {when})", link, since, back)


def spine_links_scale(plan: FaultPlan, leaf: int, nodes: int, spines: int, t_ns: float, up: bool = True) -> float:
    """How much longer a GPU's share of its node's uplink takes at t_ns when d of the leaf's `spines`
    links (up: leaf -> spine; else spine -> leaf) are down: spines / (spines - d), the node's uplink
    having lost d / spines of its capacity, shared evenly by its GPUs (an assumption of this model);
    1 with none down (and when all are: no route is left, spine_route raises)."""
    links = [f"sw{leaf}->sw{nodes + s}" if up else f"sw{nodes + s}->sw{leaf}" for s in range(spines)]
    down = sum(plan.down(link, t_ns) is not None for link in links)
    return spines / (spines - down) if down < spines else 1.0
