"""An attacker's second look (attack5) at the trust fixes of trust4 and fix4, in one process: a switch
driven directly (fabric.switch.SwitchLogic), as the other test_switch_attack* files do."""

import numpy as np
import pytest

from nvlink_emu.fabric.cost import in_switch_chunk
from nvlink_emu.fabric.config import FabricConfig
from nvlink_emu.fabric.packets import Kind
from nvlink_emu.fabric.replay import sharp_streams
from nvlink_emu.fabric.switch import SwitchLogic, buffer_share_bytes, honest_loads

from switch_helpers import network, ready_group, reduce_packet

MiB = 1 << 20


def _honest_sharp_window(config, n: int, itemsize: int = 4) -> tuple[int, int]:
    """(window, chunk bytes) of ranks/collectives/sharp.py's allreduce by `n` members on one node:
    Call.in_switch_window(sharp_streams) with fabric.cost.in_switch_chunk, the same rule."""
    streams = sharp_streams(n, 1, config.nodes, 1)
    budget = buffer_share_bytes(config) // (streams * max(1, n - 1))
    chunk = in_switch_chunk(config, n, streams, 1, None, itemsize)
    return max(1, budget // chunk), chunk


def _fill_window(sw, n: int, window: int, chunk: int):
    """Members 0 .. n-2 of a bound group each send their `window` first chunks of an allreduce (slots
    0 .. window-1, sharp.py's (c,), result to everyone under (AR, c)); member n-1 is late (slower host:
    an honest member may be a whole window behind). The first NACK's message, or None."""
    gid = ready_group(sw, members=tuple(range(n)))
    data = np.ones(chunk // 4, np.float32)
    for c in range(window):
        for gpu in range(n - 1):
            packet, payload = reduce_packet(gid, (c,), "sum", "float32", tuple(range(n)), ("world", 0, "AR", c), data, req=c)
            for send in sw.on_packet(gpu, packet, payload):
                if send.packet.kind is Kind.NACK:
                    return f"GPU {gpu} chunk {c}: {send.packet.info.error}: {send.packet.info.message}"
    return None


@pytest.mark.xfail(strict=True, reason="attack5 finding 1: the honest in-switch window ignores the per-slot "
                                       "minimum (slot_bytes) and the held-contributions bound")
@pytest.mark.parametrize("chunk_bytes", [1000, 512], ids=["1000B", "512B"])
def test_an_honest_sharp_window_of_small_chunks_fits_its_share(chunk_bytes):
    """Found in this review. The credit window of an in-switch reduction (Call.in_switch_window, the cost
    model's in_switch_chunk) lets window x streams x (n - 1) chunks be held, so that their *bytes* fit the
    partition's share; the switch also counts each held contribution at least slot_bytes (share /
    held_parts_share: 1 KiB on shares of 4 MiB and more, fix4) and bounds them to held_parts_share. A
    chunk under slot_bytes - a config's chunk_bytes of 1000 or 512 bytes (config accepts any >= 1), or
    a chunk shrunk by in_switch_chunk on a small share - gives a window the switch refuses. Measured:
    4 GPUs, one partition, switch_buffer_bytes 4 MiB (share 4 MiB, slot_bytes 1024, held_parts_share
    4096): chunk 1000 B -> window 1,398 (4,194 contributions held at most, 4,194,000 bytes: within the
    share), refused at GPU 1's chunk 1,365, the 4,097th held ("ResourceExhausted: ... each counted at least
    1024 bytes; 4096000 bytes in 4096 held, counted 4194304"); chunk 512 B -> window 2,730 (8,190 held,
    4,193,280 bytes), refused at GPU 1's chunk 1,365 too (2,097,152 bytes held, counted 4,194,304), half its
    window. An honest member that is a window behind (a slower host) makes its tenant's allreduce fail with
    ResourceExhausted: no attacker needed, but it is the bound fix4 added (and held_parts_share before it)
    against what the honest rule allows. Proposed fix: the window rule counts each contribution at
    max(chunk, share // held_parts_share) bytes (in_switch_chunk and Call.in_switch_window alike), or the
    config refuses chunk_bytes / nvls_chunk_bytes under 1 KiB and in_switch_chunk never shrinks below it."""
    n = 4
    config = FabricConfig(gpus=n, mode="network", sharp=True, mtu_bytes=256, header_bytes=16, page_size_bytes=4096,
                          memory_capacity_bytes=MiB, switch_buffer_bytes=4 * MiB, chunk_bytes=chunk_bytes)
    sw = SwitchLogic(config)
    window, chunk = _honest_sharp_window(config, n)
    assert chunk == chunk_bytes
    # what the honest rule lets the switch hold fits the share in bytes
    assert window * (n - 1) * chunk <= sw.buffer_share_bytes
    assert _fill_window(sw, n, window, chunk) is None


def test_an_honest_sharp_window_of_1_kib_chunks_fits_its_share():
    """The path that holds (no test covered it at the bound's edge): chunks of exactly slot_bytes (1 KiB on
    a 4 MiB share) fill the window, 1,365 chunks x 3 members = 4,095 held contributions, without a refusal."""
    n = 4
    config = FabricConfig(gpus=n, mode="network", sharp=True, mtu_bytes=256, header_bytes=16, page_size_bytes=4096,
                          memory_capacity_bytes=MiB, switch_buffer_bytes=4 * MiB, chunk_bytes=1024)
    sw = SwitchLogic(config)
    window, chunk = _honest_sharp_window(config, n)
    assert (window, chunk, sw.groups.slot_bytes, sw.held_parts_share) == (1365, 1024, 1024, 4096)
    assert _fill_window(sw, n, window, chunk) is None
    assert sw.groups.held_bytes == window * (n - 1) * chunk
