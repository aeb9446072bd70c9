"""Per-link counters (payload bytes, raw bytes, packets), byte conservation and the link table."""

from dataclasses import dataclass

from .errors import FabricError
from .packets import raw_bytes, segments

FIELDS = ("payload_bytes", "raw_bytes", "packets")


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

    def as_dict(self) -> dict:
        return {name: getattr(self, name) for name in (*FIELDS, "busy_ns")}


class LinkCounters:
    """What one end of some links has seen cross them; both ends keep their own and must agree."""

    def __init__(self, mtu_bytes: int, header_bytes: int):
        self.mtu_bytes = mtu_bytes
        self.header_bytes = header_bytes
        self.links: dict[str, LinkStats] = {}

    def record(self, link: str, payload_bytes: int) -> int:
        """Count one transfer of `payload_bytes` (segmented at the MTU) on `link`; returns its raw bytes."""
        stats = self.links.setdefault(link, LinkStats())
        raw = raw_bytes(payload_bytes, self.mtu_bytes, self.header_bytes)
        stats.payload_bytes += payload_bytes
        stats.raw_bytes += raw
        stats.packets += segments(payload_bytes, self.mtu_bytes)
        return raw


    def get(self, link: str) -> LinkStats:
        return self.links.get(link, LinkStats())

    def snapshot(self) -> dict[str, dict[str, int]]:
        return {link: stats.as_dict() for link, stats in sorted(self.links.items())}


def gpu_view(snapshot: dict[str, dict[str, int]], gpu: int) -> dict[str, int]:
    """A GPU's own link counters as tx_*/rx_* keys (tx on its uplink, rx on its downlink)."""
    up = snapshot.get(uplink(gpu), {})
    down = snapshot.get(downlink(gpu), {})
    view = {}
    for field_name, key in (("payload_bytes", "bytes"), ("raw_bytes", "raw_bytes"), ("packets", "packets"),
                            ("busy_ns", "busy_ns")):
        view[f"tx_{key}"] = up.get(field_name, 0)
        view[f"rx_{key}"] = down.get(field_name, 0)
    return view


def check_conservation(switch_side: dict[str, dict[str, int]],
                       gpu_sides: list[dict[str, dict[str, int]]]) -> None:
    """Every link's sender and receiver counted the same; FabricError naming the link otherwise."""
    for gpu, gpu_side in enumerate(gpu_sides):
        check_gpu_links(switch_side, gpu, gpu_side)


def check_gpu_links(switch_side: dict[str, dict[str, int]], gpu: int, gpu_side: dict[str, dict[str, int]]) -> None:
    """GPU `gpu`'s two links were counted the same at both ends; FabricError naming the link otherwise.
    Each GPU checks its own links (a GPU's word is not trusted about any other's)."""
    for link in (uplink(gpu), downlink(gpu)):
        a = {k: switch_side.get(link, {}).get(k, 0) for k in FIELDS}
        b = {k: gpu_side.get(link, {}).get(k, 0) for k in FIELDS}
        if a != b:
            raise FabricError(f"byte conservation broken on {link}: switch counted {a}, GPU {gpu} counted {b}")


def format_table(snapshot: dict[str, dict], gpus: int, extra: dict[int, dict[str, int]] | None = None,
                 elapsed_ns: float = 0.0) -> str:
    """The per-link table printed at the end of a run: one row per GPU, both directions, with modeled
    busy time and utilization (busy / elapsed modeled time) per direction."""
    extra = extra or {}
    extra_keys = sorted({k for row in extra.values() for k in row})
    head = (f"{'link':<14}{'tx payload B':>14}{'tx raw B':>14}{'tx pkts':>10}"
            f"{'rx payload B':>14}{'rx raw B':>14}{'rx pkts':>10}"
            f"{'tx busy us':>12}{'tx util':>8}{'rx busy us':>12}{'rx util':>8}" + "".join(f"{k:>12}" for k in extra_keys))
    lines = [f"# per-link counters (tx = GPU -> switch, rx = switch -> GPU; modeled elapsed "
             f"{elapsed_ns / 1e3:.3f} us)", head]
    totals = [0] * 6
    for gpu in range(gpus):
        up, down = snapshot.get(uplink(gpu), {}), snapshot.get(downlink(gpu), {})
        values = [up.get(f, 0) for f in FIELDS] + [down.get(f, 0) for f in FIELDS]
        totals = [t + v for t, v in zip(totals, values)]
        row = f"{'gpu' + str(gpu) + '<->sw0':<14}" + _counts(values)
        for link in (up, down):
            busy = link.get("busy_ns", 0.0)
            row += f"{busy / 1e3:>12.3f}{busy / elapsed_ns if elapsed_ns else 0.0:>8.3f}"
        row += "".join(f"{extra.get(gpu, {}).get(k, 0):>12}" for k in extra_keys)
        lines.append(row)
    lines.append(f"{'total':<14}" + _counts(totals))
    return "\n".join(lines)


def _counts(values: list[int]) -> str:
    return "".join(f"{v:>14}" if i % 3 != 2 else f"{v:>10}" for i, v in enumerate(values))
