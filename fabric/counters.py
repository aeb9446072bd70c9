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

    def as_dict(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in FIELDS}


class LinkCounters:
    """What one end of some links has seen cross them; both ends keep their own and must agree."""

    def __init__(self, mtu_bytes: int, header_bytes: int):
        self.mtu_bytes = mtu_bytes
        self.header_bytes = header_bytes
        self.links: dict[str, LinkStats] = {}

    def record(self, link: str, payload_bytes: int) -> None:
        """Count one transfer of `payload_bytes` (segmented at the MTU) on `link`."""
        stats = self.links.setdefault(link, LinkStats())
        stats.payload_bytes += payload_bytes
        stats.raw_bytes += raw_bytes(payload_bytes, self.mtu_bytes, self.header_bytes)
        stats.packets += segments(payload_bytes, self.mtu_bytes)

    def get(self, link: str) -> LinkStats:
        return self.links.get(link, LinkStats())

    def snapshot(self) -> dict[str, dict[str, int]]:
        return {link: stats.as_dict() for link, stats in sorted(self.links.items())}


def gpu_view(snapshot: dict[str, dict[str, int]], gpu: int) -> dict[str, int]:
    """A GPU's own link counters as tx_*/rx_* keys (tx on its uplink, rx on its downlink)."""
    up = snapshot.get(uplink(gpu), {})
    down = snapshot.get(downlink(gpu), {})
    view = {}
    for field_name, key in (("payload_bytes", "bytes"), ("raw_bytes", "raw_bytes"), ("packets", "packets")):
        view[f"tx_{key}"] = up.get(field_name, 0)
        view[f"rx_{key}"] = down.get(field_name, 0)
    return view


def check_conservation(switch_side: dict[str, dict[str, int]],
                       gpu_sides: list[dict[str, dict[str, int]]]) -> None:
    """Every link's sender and receiver counted the same; FabricError naming the link otherwise."""
    for gpu, gpu_side in enumerate(gpu_sides):
        for link in (uplink(gpu), downlink(gpu)):
            a = switch_side.get(link, LinkStats().as_dict())
            b = gpu_side.get(link, LinkStats().as_dict())
            if a != b:
                raise FabricError(f"byte conservation broken on {link}: switch counted {a}, GPU {gpu} counted {b}")


def format_table(snapshot: dict[str, dict[str, int]], gpus: int, extra: dict[int, dict[str, int]] | None = None) -> str:
    """The per-link table printed at the end of a run: one row per GPU, both directions."""
    head = (f"{'link':<14}{'tx payload B':>14}{'tx raw B':>14}{'tx pkts':>10}"
            f"{'rx payload B':>14}{'rx raw B':>14}{'rx pkts':>10}")
    extra_keys = sorted({k for row in (extra or {}).values() for k in row})
    head += "".join(f"{k:>12}" for k in extra_keys)
    lines = ["# per-link counters (tx = GPU -> switch, rx = switch -> GPU)", head]
    totals = [0] * 6
    for gpu in range(gpus):
        up, down = snapshot.get(uplink(gpu), {}), snapshot.get(downlink(gpu), {})
        values = [up.get(f, 0) for f in FIELDS] + [down.get(f, 0) for f in FIELDS]
        totals = [t + v for t, v in zip(totals, values)]
        row = f"{'gpu' + str(gpu) + '<->sw0':<14}" + "".join(
            f"{v:>14}" if i % 3 != 2 else f"{v:>10}" for i, v in enumerate(values))
        row += "".join(f"{(extra or {}).get(gpu, {}).get(k, 0):>12}" for k in extra_keys)
        lines.append(row)
    lines.append(f"{'total':<14}" + "".join(f"{v:>14}" if i % 3 != 2 else f"{v:>10}" for i, v in enumerate(totals)))
    return "\n".join(lines)
