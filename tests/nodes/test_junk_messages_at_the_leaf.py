"""Multi-rank, several nodes: an attacker's review of what a GPU's own messages can make its
leaf keep. GPU 0 is alone in partition 0, every other GPU is partition 1. The attacks shown in one
process are in tests/unit/test_switch_span_order_and_costs.py."""

import time

import numpy as np
import pytest
from mpi4py import MPI

from nodes_helpers import run, shape

pytestmark = pytest.mark.mpi(min_size=7)

JUNK_TAG = 99  # a tag the fabric never uses


def _spin(gpu, seconds: float) -> None:
    """Keep this GPU's own sends moving for `seconds` without reading anything its leaf sends it."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        gpu.raw_port().transport.progress()
        time.sleep(1e-3)


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def test_a_gpu_cannot_pile_junk_messages_up_at_its_leaf(monkeypatch):
    """GPU 0 sends itself 256 KiB messages it does not receive until its port's share of forwarded bytes
    is in flight (switch_buffer_bytes 4 MiB: share 1 MiB at 8 ranks, 1.33 MiB at 10), so its leaf holds
    its next transfer, whose payload message stays unread in the leaf's MPI queue; then it sends its
    leaf JUNK messages of 1 KiB under tag 99, which the fabric never uses. The leaf dropped messages
    under other tags every 1,024 steps, but only from the front of its queue (transport.drop_other_tags
    stopped at the first message with a fabric tag), so none behind the held payload: they stayed, with
    their bytes, until GPU 0 let the payload go. Meanwhile partition 1's GPU 1 (node 0) and the first
    GPU of node 1 time message round trips through leaf 0. Honest GPUs never send under another tag.
    Before (this shared machine): 5,000 junk messages, none swept while the transfer was held (8 and
    10 ranks; at 8 all 5,000 once it went, at 10 none all run), leaf 0's RSS 73 -> 99 MiB (8 ranks),
    74 -> 101 (10); 10,000: none swept all run, RSS 73 -> 119 MiB; 20,000: none swept all run, RSS 72 ->
    184 MiB (5.6 KiB of the leaf's memory per 1 KiB message, without bound: what a GPU keeps unread
    bounds nothing it sends behind). Partition 1's round trips through leaf 0: within this machine's noise
    at 5,000 (medians 5-24 ms either way), 3.1 -> 5.4 ms at 20,000 (one run). The smallest fix: the leaf
    reads a GPU's messages of any tag in order with matched probes (MPI_Improbe(source, ANY_TAG)), keeping the handles of its payload
    messages (at most MAX_QUEUED + 1: they wait for their headers' turn, as now unread) and dropping
    everything else, so that nothing a GPU sends stays unread in MPI's queue behind a message it holds.
    After (that fix: transport.drop_other_tags walks each GPU's messages with Iprobe(source, ANY_TAG),
    dropping other tags' and, for a GPU the leaf does not read now, keeping the fabric's matched, in order,
    MAX_KEPT at most; SwitchRank._sweep_other_tags; GPU 0 now spins 0.5 s before the junk, the
    victims time 4 s, not 5): all 5,000 swept while the transfer was held at 8 and 10 ranks, leaf 0's
    RSS 73 -> 88 MiB (8), 74 -> 87 (10) at its sweeps; partition 1's round trips, median before / with
    the junk queued (the longest): 4.2 / 11.6 ms (0.52 s) at 8, 7.7 / 5.2 ms (0.45 s) at 10 (one run
    each: the sweep's drops take the leaf's time while they last)."""
    from nvlink_emu.ranks.transport import Transport

    nodes, per_node, _ = shape()
    victim = (1, per_node)
    junk = 5000
    drops, base, peak = [], [0], [0]
    drop_other_tags = Transport.drop_other_tags

    def recorded(self, *args):
        base[0] = base[0] or _rss_bytes()
        peak[0] = max(peak[0], _rss_bytes())
        n = drop_other_tags(self, *args)
        drops.append((time.monotonic(), n))
        return n

    monkeypatch.setattr(Transport, "drop_other_tags", recorded)

    def main(gpu):
        gpu.world.barrier()
        out = {}
        if gpu.rank == 0:
            data = np.zeros(256 << 10, np.uint8)
            for k in range(12):  # more than its port's share: the last ones are held at the leaf
                gpu.send_message(0, ("self", k), data)
            _spin(gpu, 0.5)
            out["held_at"] = time.monotonic()
            buf = np.zeros(1024, np.uint8)
            requests = [gpu.raw_port().transport.comm.Isend([buf, MPI.BYTE], gpu.raw_port().switch, JUNK_TAG) for _ in range(junk)]
            while not MPI.Request.Testall(requests):  # eager: in the leaf's queue, unread
                gpu.raw_port().transport.progress()
            out["junk_at"] = time.monotonic()
            _spin(gpu, 3.0)
            out["drain_at"] = time.monotonic()
            for k in range(12):
                gpu.receive_message(("self", k), np.empty(256 << 10, np.uint8), 0)
        elif gpu.rank in victim:
            comm = gpu.partition
            peer = comm.members.index(victim[1 - victim.index(gpu.rank)])
            buf = np.zeros(64, np.uint8)
            times = []
            end = time.monotonic() + 4.0
            while True:  # GPU 1 says when to stop (the first byte), so that the two end together
                start = time.monotonic()
                if gpu.rank == victim[0]:
                    buf[0] = start < end
                    comm.send(buf, peer)
                    comm.recv(buf, peer)
                else:
                    comm.recv(buf, peer)
                    comm.send(buf, peer)
                if not buf[0]:
                    break
                times.append((start, time.monotonic() - start))
            out["trips"] = times
        gpu.world.barrier()
        return out

    result = run(main, partitions=((0,), tuple(range(1, nodes * per_node))), timeout_s=60.0,
                 switch_buffer_bytes=4 << 20, chunk_bytes=1 << 20)
    world = MPI.COMM_WORLD
    attacker = world.bcast(result.value if result.role == "gpu" and result.rank == 0 else None,
                           root=0)
    trips = world.bcast(result.value.get("trips") if result.role == "gpu" and result.rank == victim[0] else None,
                        root=1)
    leaf0 = result.role == "switch" and result.rank == nodes * per_node  # leaf 0's fabric rank
    mine = (sum(n for t, n in drops if t < attacker["drain_at"]), sum(n for t, n in drops), base[0], peak[0]) \
        if leaf0 else None
    during, total, base_rss, peak_rss = [x for x in world.allgather(mine) if x is not None][0]
    before = [d for t, d in trips if t + d < attacker["held_at"]]
    overlapping = [(t, d) for t, d in trips if t + d > attacker["junk_at"] and t < attacker["drain_at"]]
    longest = max((d for _, d in overlapping), default=0.0)
    after = [d for t, d in trips if t > attacker["drain_at"]]
    med = lambda xs: sorted(xs)[len(xs) // 2] * 1e3 if xs else float("nan")
    assert during >= junk, (f"leaf 0 swept {during} of {junk} junk messages while GPU 0's transfer was held "
                            f"({total} in all); its RSS went from {base_rss / 2**20:.0f} to {peak_rss / 2**20:.0f} "
                            f"MiB; partition 1's round trips: median {med(before):.2f} ms before ({len(before)}); "
                            f"{len(overlapping)} in the {attacker['drain_at'] - attacker['junk_at']:.1f} s with the "
                            f"junk queued, median {med([d for _, d in overlapping]):.2f} ms, the longest "
                            f"{longest:.2f} s; median {med(after):.2f} ms after ({len(after)})")
