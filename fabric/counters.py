"""Per-link counters (payload bytes, raw bytes, packets), byte conservation and the link table."""

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from .addressing import assign_network_addresses
from .errors import FabricError
from .packets import segments

if TYPE_CHECKING:  # for annotations only
    from .faults import FaultPlan

FIELDS = ("payload_bytes", "raw_bytes", "packets")
Snapshot = dict[str, dict[str, float]]  # link name -> its counters (LinkStats.as_dict: counts, busy_ns)


def uplink(gpu: int, switch: int = 0) -> str:
    """Name of the link from GPU `gpu` into the switch."""
    return f"gpu{gpu}->sw{switch}"


def downlink(gpu: int, switch: int = 0) -> str:
    """Name of the link from the switch out to GPU `gpu`."""
    return f"sw{switch}->gpu{gpu}"


@dataclass
class LinkStats:
    payload_bytes: int = 0
    raw_bytes: int = 0
    packets: int = 0
    busy_ns: float = 0.0  # modeled time the link spent transmitting (kept by the GPU end)

    def as_dict(self) -> dict[str, float]:
        return {name: getattr(self, name) for name in (*FIELDS, "busy_ns")}


class LinkCounters:
    """What one end of some links has seen cross them; both ends keep their own and must agree."""

    def __init__(self, mtu_bytes: int, header_bytes: int):
        self.mtu_bytes = mtu_bytes
        self.header_bytes = header_bytes
        self.links: dict[str, LinkStats] = {}

    def record(self, link: str, payload_bytes: int) -> int:
        """Count one transfer of `payload_bytes` (segmented at the MTU) on `link`; returns its raw bytes."""
        stats = self.links.get(link)
        if stats is None:
            stats = self.links[link] = LinkStats()
        packets = segments(payload_bytes, self.mtu_bytes)
        raw = payload_bytes + packets * self.header_bytes  # raw_bytes(), its segments counted once
        stats.payload_bytes += payload_bytes
        stats.raw_bytes += raw
        stats.packets += packets
        return raw


    def get(self, link: str) -> LinkStats:
        return self.links.get(link, LinkStats())

    def snapshot(self) -> Snapshot:
        return {link: stats.as_dict() for link, stats in sorted(self.links.items())}


def gpu_view(snapshot: Snapshot, gpu: int, switch: int = 0) -> dict[str, float]:
    """A GPU's own link counters as tx_*/rx_* keys (tx on its uplink, rx on its downlink; `switch`:
    the leaf it is attached to)."""
    up = snapshot.get(uplink(gpu, switch), {})
    down = snapshot.get(downlink(gpu, switch), {})
    view = {}
    for field_name, key in (("payload_bytes", "bytes"), ("raw_bytes", "raw_bytes"), ("packets", "packets"),
                            ("busy_ns", "busy_ns")):
        view[f"tx_{key}"] = up.get(field_name, 0)
        view[f"rx_{key}"] = down.get(field_name, 0)
    return view


def check_conservation(switch_side: Snapshot,
                       gpu_sides: list[Snapshot]) -> None:
    """Every link's sender and receiver counted the same; FabricError naming the link otherwise."""
    for gpu, gpu_side in enumerate(gpu_sides):
        check_gpu_links(switch_side, gpu, gpu_side)


def check_gpu_links(switch_side: Snapshot, gpu: int, gpu_side: Snapshot,
                    switch: int = 0) -> None:
    """GPU `gpu`'s two links (to and from leaf `switch`) were counted the same at both ends;
    FabricError naming the link otherwise. Each GPU checks its own links (a GPU's word is not
    trusted about any other's)."""
    for link in (uplink(gpu, switch), downlink(gpu, switch)):
        check_link(link, switch_side, gpu_side, "switch", f"GPU {gpu}")


def check_link(link: str, sender: Snapshot, receiver: Snapshot, sender_name: str, receiver_name: str) -> None:
    """Both ends of `link` counted the same (sender and receiver snapshots); FabricError naming it otherwise."""
    a = {k: sender.get(link, {}).get(k, 0) for k in FIELDS}
    b = {k: receiver.get(link, {}).get(k, 0) for k in FIELDS}
    if a != b:
        raise FabricError(f"byte conservation broken on {link}: {sender_name} counted {a}, {receiver_name} "
                          f"counted {b}")


def switch_pairs(snapshot: Snapshot) -> list[tuple[str, str]]:
    """The (lower, upper) switch names of every cable between two switches in `snapshot`, leaves'
    side first: ("sw0", "sw2") for links "sw0->sw2" / "sw2->sw0"."""
    pairs: set[tuple[str, str]] = set()
    for link in snapshot:
        a, _, b = link.partition("->")
        if a.startswith("sw") and b.startswith("sw"):
            pairs.add(tuple(sorted((a, b), key=lambda name: int(name[2:]))))  # type: ignore[arg-type]  # two: a pair
    return sorted(pairs, key=lambda pair: (int(pair[0][2:]), int(pair[1][2:])))


def format_table(snapshot: Snapshot, gpus: int, extra: dict[int, dict[str, int]] | None = None,
                 elapsed_ns: float = 0.0, gpus_per_node: int | None = None) -> str:
    """The per-link table printed at the end of a run: one row per GPU, both directions, with modeled
    busy time and utilization (busy / elapsed modeled time) per direction; on several nodes
    (gpus_per_node), GPU g's leaf is switch g // gpus_per_node, and a second level of rows follows,
    one per leaf-spine cable (tx = up, leaf -> spine)."""
    per_node = gpus_per_node or gpus
    extra = extra or {}
    extra_keys = sorted({k for row in extra.values() for k in row})
    head = (f"{'link':<14}{'tx payload B':>14}{'tx raw B':>14}{'tx pkts':>10}"
            f"{'rx payload B':>14}{'rx raw B':>14}{'rx pkts':>10}"
            f"{'tx busy us':>12}{'tx util':>8}{'rx busy us':>12}{'rx util':>8}" + "".join(f"{k:>12}" for k in extra_keys))
    lines = [f"# per-link counters (tx = GPU -> switch, rx = switch -> GPU; modeled elapsed "
             f"{elapsed_ns / 1e3:.3f} us)", head]
    totals: list[float] = [0] * 6

    def row(label: str, up: dict[str, float], down: dict[str, float]) -> tuple[str, list[float]]:
        values = [up.get(f, 0) for f in FIELDS] + [down.get(f, 0) for f in FIELDS]
        text = f"{label:<14}" + _counts(values)
        for link in (up, down):
            busy = link.get("busy_ns", 0.0)
            text += f"{busy / 1e3:>12.3f}{busy / elapsed_ns if elapsed_ns else 0.0:>8.3f}"
        return text, values

    for gpu in range(gpus):
        leaf = gpu // per_node
        text, values = row(f"gpu{gpu}<->sw{leaf}", snapshot.get(uplink(gpu, leaf), {}),
                           snapshot.get(downlink(gpu, leaf), {}))
        totals = [t + v for t, v in zip(totals, values)]
        lines.append(text + "".join(f"{extra.get(gpu, {}).get(k, 0):>12}" for k in extra_keys))
    lines.append(f"{'total':<14}" + _counts(totals))
    pairs = switch_pairs(snapshot)
    if pairs:
        lines.append("# leaf-spine links (tx = leaf -> spine, rx = spine -> leaf)")
        totals = [0] * 6
        for low, high in pairs:
            text, values = row(f"{low}<->{high}", snapshot.get(f"{low}->{high}", {}), snapshot.get(f"{high}->{low}", {}))
            totals = [t + v for t, v in zip(totals, values)]
            lines.append(text)
        lines.append(f"{'total':<14}" + _counts(totals))
    return "\n".join(lines)


def _counts(values: list[float]) -> str:
    return "".join(f"{v:>14}" if i % 3 != 2 else f"{v:>10}" for i, v in enumerate(values))


REPORT_STATS = ("peak_held_bytes", "groups_created", "groups_released", "reduced_bytes", "unanswered_requests")


class _Fabric(Protocol):  # what merge_reports reads of a fabric.config.FabricConfig (config imports topology,
    @property                # which imports this module: no import back)
    def gpus(self) -> int: ...
    @property
    def nodes(self) -> int: ...
    @property
    def spines(self) -> int | None: ...
    @property
    def name(self) -> str: ...
    @property
    def mode(self) -> str: ...
    @property
    def fault_plan(self) -> "FaultPlan": ...


def merge_reports(config: _Fabric, parts: list[dict[str, Any]]) -> dict[str, Any]:
    """The run's report from every switch's share (ranks/switch/report.py's report_part): the links of every
    level, each link between switches as its sender counted it (and checked against its receiver's
    count: a mismatch is reported under the link's name in "conservation"), every port's statistics
    summed over the leaves that saw that GPU, and the GPUs' own records."""
    by_switch = {part["switch"]: part for part in parts}
    links: dict[str, dict[str, Any]] = {}  # + a faulted link's state
    conservation: dict[str, Any] = {}
    ports: dict[int, dict[str, int]] = {}
    report_keys = ("now_ns", "unconsumed", "collectives", "collectives_unrecorded")
    merged: dict[str, dict[int, Any]] = {key: {} for key in report_keys}  # key -> GPU -> its value
    stats = dict.fromkeys(REPORT_STATS, 0)
    for part in parts:
        here = f"sw{part['switch']}"
        for link, row in part["links"].items():
            src, _, dst = link.partition("->")
            if not (src.startswith("sw") and dst.startswith("sw")):
                links[link] = row
            elif src == here:  # a link between switches: the sender's count, checked at the receiver
                links[link] = row
                receiver = by_switch.get(int(dst[2:]))
                if receiver is not None:
                    try:
                        check_link(link, part["links"], receiver["links"], f"switch {src[2:]}", f"switch {dst[2:]}")
                    except FabricError as exc:
                        conservation[link] = str(exc)
        conservation.update(part["conservation"])
        for gpu, row in part.get("ports", {}).items():
            total = ports.setdefault(int(gpu), {})
            for key, value in row.items():
                total[key] = total.get(key, 0) + value
        for key in report_keys:
            merged[key].update({int(g): v for g, v in part[key].items()})
        for key, value in part.get("stats", {}).items():
            stats[key] = max(stats[key], value) if key == "peak_held_bytes" else stats[key] + value
    gpus = config.gpus
    elapsed_ns = max(merged["now_ns"].values(), default=0.0)
    plan = config.fault_plan
    for link in plan.links():  # a faulted link's state at the end of the run (the plan is the config's)
        row = links.setdefault(link, LinkStats().as_dict())
        row.setdefault("crc_errors", 0)
        row.setdefault("replays", 0)
        row["state"] = plan.state(link, elapsed_ns)
    return {
        "fabric": config.name,
        "mode": config.mode,
        "gpus": gpus,
        "nodes": config.nodes,
        "spines": config.spines,
        "elapsed_ns": elapsed_ns,
        "links": dict(sorted(links.items())),
        "ports": {g: ports[g] for g in sorted(ports)},
        "network_addresses": list(assign_network_addresses(gpus)) if config.mode == "network" else [],
        "switch": stats,
        "unconsumed": dict(sorted(merged["unconsumed"].items())),
        "conservation": conservation,
        # each GPU's own record of its collective calls, in call order (its word, like its clock)
        "collectives": dict(sorted(merged["collectives"].items())),
        "collectives_unrecorded": dict(sorted(merged["collectives_unrecorded"].items())),
    }
