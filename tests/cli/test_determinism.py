"""CLI tier: modeled time does not depend on the host. The test hook $NVLINK_EMU_TEST_SEND_DELAY delays
every rank's sends at random, so the host delivers messages in other orders; the modeled times,
every link's counters and busy time, and every call's modeled start and end stay identical."""

import json
import os

import pytest

from cli_helpers import command, run, script
from nvlink_emu.fabric.config import preset
from nvlink_emu.fabric.cost import modeled_ns, payload_bytes
from nvlink_emu.fabric.software import call_latency_ns

ONE_NODE = """
import numpy as np

def main(gpu):
    window = gpu.alloc(1 << 16, "uint8")
    handles = gpu.world.allgather_object(gpu.export(window))
    x = np.arange(3 * 4096, dtype=np.float32)
    for algorithm in ("ring", "direct", "sharp", "nvls"):
        gpu.world.allreduce(x, algorithm=algorithm)
    gpu.world.all2all(np.ones(gpu.size * 2048, np.float32), np.empty(gpu.size * 2048, np.float32))
    gpu.put(handles[(gpu.rank + 1) % gpu.size], np.ones(1 << 15, np.uint8))  # puts of every GPU at once
    gpu.fence()
    gpu.world.barrier()
    got = gpu.alloc(1 << 15, "uint8")
    gpu.get(handles[(gpu.rank + 2) % gpu.size], got)
"""

# Across nodes: flows of every GPU meeting on the cables between switches (all2all, direct), rings, a single
# transfer, one-sided puts and gets to another node's GPU, and sharp's two-level allreduce (partials on the
# group's shares up to both spines, results down) on the world and on a communicator of one GPU per node,
# sharp's multicast stores across nodes (allgather, broadcast: every member's store at once),
# and nvls's load-reduces (requests through a spine, partials up, results to the requester's leaf), and a put
# beside a channelled non-blocking allreduce (docs/model/time.md, "A put beside a collective")
NODES = """
import numpy as np

def main(gpu):
    x = np.arange((64 << 10) // 4 + 1024, dtype=np.float32)  # two chunks of chunk_bytes: one to each spine
    gpu.world.allreduce(x, algorithm="sharp")
    rail = gpu.world.split(gpu.rank % 2)
    rail.allreduce(x[:3000].astype(np.float16), algorithm="sharp")
    gpu.world.allgather(x, np.empty(x.size * gpu.size, np.float32), algorithm="sharp")  # stores of 2 chunks
    gpu.world.broadcast(x.copy(), root=3, algorithm="sharp")
    y = np.arange(4 * 20000, dtype=np.float32)  # nvls: two chunks a block, one to each spine
    gpu.world.reduce_scatter(y, np.empty(20000, np.float32), algorithm="nvls")
    gpu.world.allreduce(x, algorithm="nvls")  # load-reduces through both levels, then the stores
    window = gpu.alloc(1 << 16, "uint8")
    handles = gpu.world.allgather_object(gpu.export(window))
    x = np.arange(3 * 4096, dtype=np.float32)
    for algorithm in ("ring", "direct"):
        gpu.world.allreduce(x, algorithm=algorithm)
    z = np.arange(3 * 16384, dtype=np.float32)  # 192 KiB: ring's 2 channels, each with its clock and lanes
    gpu.world.allreduce(z, algorithm="ring")
    gpu.world.reduce_scatter(z, np.empty(z.size // gpu.size, np.float32), algorithm="ring")
    gpu.world.broadcast(z, root=1, algorithm="ring")
    gpu.world.reduce(z, z.copy(), root=2, algorithm="ring")
    gpu.world.all2all(np.ones(gpu.size * 4096, np.float32), np.empty(gpu.size * 4096, np.float32))
    gpu.compute(5000)
    gpu.world.allgather(x[:1024], np.empty(1024 * gpu.size, np.float32), algorithm="ring")
    gpu.world.barrier()  # one-sided traffic is served as the host delivers it: not while a collective runs
    gpu.put(handles[(gpu.rank + gpu.size // 2) % gpu.size], np.ones(1 << 15, np.uint8))  # to the other node
    gpu.fence()
    gpu.world.barrier()
    got = gpu.alloc(1 << 15, "uint8")
    gpu.get(handles[(gpu.rank + gpu.size // 2 + 1) % gpu.size], got)
    if gpu.rank == 0:
        gpu.world.send(np.ones(1 << 16, np.uint8), gpu.size - 1)
    if gpu.rank == gpu.size - 1:
        gpu.world.recv(np.empty(1 << 16, np.uint8), 0)
    gpu.world.barrier()
    pending = gpu.world.iallreduce(z.copy(), algorithm="ring")  # 2 channels still sending when the put books:
    gpu.put(handles[(gpu.rank + gpu.size // 2) % gpu.size], np.ones(1 << 14, np.uint8))  # it goes beside them
    gpu.fence()
    pending.wait()
"""


def modeled(tmp_path, body, fabric, delay):
    """The run's report JSON without what is wall time or host order."""
    out = tmp_path / f"report-{delay}.json"
    env = dict(os.environ)
    if delay:
        env["NVLINK_EMU_TEST_SEND_DELAY"] = delay
    done, _ = run([command("nvlink-emu"), "run", script(tmp_path, body), *fabric, "--report-json", str(out)],
                  env=env, timeout_s=300)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    return {key: report[key] for key in ("elapsed_ns", "links", "collectives")}

NODES_TOML = 'base = "superpod-h100-nvlink"\nnodes = 2\ngpus = 4\nchunk_bytes = 65536\n'  # 2 spines


@pytest.mark.slow  # emulated runs, each repeated with random host delays
@pytest.mark.parametrize("body, fabric", [
    (ONE_NODE, ["--preset", "dgx-h100", "--gpus", "4"]),
    (NODES, ["--config", NODES_TOML]),
], ids=["one-node", "two-nodes"])
def test_random_host_delays_change_no_modeled_time_and_no_counter(tmp_path, body, fabric):
    if fabric[0] == "--config":
        (tmp_path / "fabric.toml").write_text(fabric[1])
        fabric = ["--config", str(tmp_path / "fabric.toml")]
    reference = modeled(tmp_path, body, fabric, None)
    assert reference["elapsed_ns"] > 0 and reference["collectives"]
    for delay in ("1:2", "2:2"):  # seeds 1 and 2, up to 2 ms before every send of every rank
        assert modeled(tmp_path, body, fabric, delay) == reference


# GPU 1 serves GPU 0's put (modeled at 100 us) while it waits in its allreduce with GPU 2 (from 0 ns), in
# every host order: GPU 2 joins only after GPU 0's fence, which needs GPU 1's PUT_ACK
SERVED = """
import numpy as np

def main(gpu):
    window = gpu.alloc(1 << 16, "uint8")
    handles = gpu.world.allgather_object(gpu.export(window))
    pair02 = gpu.world.split(0 if gpu.rank in (0, 2) else 1)
    pair12 = gpu.world.split(0 if gpu.rank in (1, 2) else 1)
    x = np.ones(3 * 4096, np.float32)
    if gpu.rank == 0:
        gpu.compute(100_000)
        gpu.put(handles[1], np.ones(1 << 15, np.uint8))
        gpu.fence()
        pair02.allgather_object(None)  # no modeled time: lets GPU 2 in
    elif gpu.rank == 1:
        pair12.allreduce(x, algorithm="direct")
    else:
        pair02.allgather_object(None)
        pair12.allreduce(x, algorithm="direct")
"""


def test_a_reply_served_during_a_collective_does_not_move_its_end(tmp_path):
    """The cause of issue 28's one-node flake, forced: a call's end is when its own sends left, not
    when a one-sided reply its GPU served meanwhile did (the host decides when the request comes).
    Before the fix GPU 1's allreduce ended at its PUT_ACK, 100,705.1 ns, and GPU 2's at 101,255.1."""
    fabric = ["--preset", "dgx-h100", "--gpus", "3"]
    report = modeled(tmp_path, SERVED, fabric, None)
    alone = modeled_ns("allreduce", "direct", 3 * 4096 * 4, 2, preset("dgx-h100", gpus=3))  # 1,232.9 ns
    ends = {call["gpu"]: (call["m_start_ns"], call["m_end_ns"]) for call in report["collectives"]}
    assert ends.keys() == {1, 2}
    for gpu, (start, end) in ends.items():
        assert start == 0.0 and end == pytest.approx(alone, rel=1e-12), gpu


# GPU 0 puts 32 KiB into GPU 1 and gets 16 KiB back at modeled 0 ns, when GPU 1's allreduce with GPU 2 uses
# both of GPU 1's links; the workload forces the host order: "during", GPU 2 joins the allreduce only after
# GPU 0's get, so GPU 1 serves both while it waits in the call; "after", GPU 0 starts once the allreduce is over
OVERLAP = """
import numpy as np

def main(gpu):
    window = gpu.alloc(1 << 16, "uint8")
    handles = gpu.world.allgather_object(gpu.export(window))
    pair02 = gpu.world.split(0 if gpu.rank in (0, 2) else 1)
    pair12 = gpu.world.split(0 if gpu.rank in (1, 2) else 1)
    x = np.ones(3 * 4096, np.float32)
    got = gpu.alloc(1 << 14, "uint8")
    during = {during}
    if gpu.rank == 0:
        if not during:
            gpu.world.allgather_object(None)  # no modeled time: GPU 1's allreduce is over on the host
        gpu.put(handles[1], np.ones(1 << 15, np.uint8))
        gpu.fence()
        gpu.get(handles[1], got)
        if during:
            pair02.allgather_object(None)  # lets GPU 2 in
            gpu.world.allgather_object(None)
    elif gpu.rank == 1:
        pair12.allreduce(x, algorithm="direct")
        gpu.world.allgather_object(None)
    else:
        if during:
            pair02.allgather_object(None)
        pair12.allreduce(x, algorithm="direct")
        gpu.world.allgather_object(None)
"""


# The same across nodes (superpod-h100-ib, 2 x 2): GPU 0 (node 0) puts into and gets from GPU 2 (node 1) while
# GPU 2 allreduces with GPU 1 (node 0), so the one-sided transfers also cross GPU 2's inbound and outbound shares
OVERLAP_NODES = """
import numpy as np

def main(gpu):
    window = gpu.alloc(1 << 16, "uint8")
    handles = gpu.world.allgather_object(gpu.export(window))
    pair01 = gpu.world.split(0 if gpu.rank in (0, 1) else 1)
    pair12 = gpu.world.split(0 if gpu.rank in (1, 2) else 1)
    x = np.ones(3 * 4096, np.float32)
    got = gpu.alloc(1 << 14, "uint8")
    during = {during}
    if gpu.rank == 0:
        if not during:
            gpu.world.allgather_object(None)
        gpu.put(handles[2], np.ones(1 << 15, np.uint8))
        gpu.fence()
        gpu.get(handles[2], got)
        if during:
            pair01.allgather_object(None)  # lets GPU 1 in
            gpu.world.allgather_object(None)
    elif gpu.rank == 1:
        if during:
            pair01.allgather_object(None)
        pair12.allreduce(x, algorithm="direct")
        gpu.world.allgather_object(None)
    elif gpu.rank == 2:
        pair12.allreduce(x, algorithm="direct")
        gpu.world.allgather_object(None)
    else:
        gpu.world.allgather_object(None)
"""


@pytest.mark.slow  # a few seconds or more: an MPI job (docs/develop/testing.md, Markers)
def test_across_nodes_one_sided_traffic_served_during_a_call_moves_neither_its_time_nor_its_record(tmp_path):
    """Before the lanes (GPU links and the leaves' shares): in the "during" order GPU 1's allreduce ended at
    6,240.8 ns instead of 5,544.48, GPU 2's record counted 81,920 bytes received and 65,536 sent, and the run's
    elapsed time was 10,045.12 ns against 10,567.36 in the "after" order."""
    fabric = ["--preset", "superpod-h100-ib", "--nodes", "2", "--gpus-per-node", "2"]
    reports = {}
    for during in (True, False):
        case = tmp_path / str(during)
        case.mkdir()
        reports[during] = modeled(case, OVERLAP_NODES.format(during=during), fabric, None)
    assert reports[True] == reports[False]
    config, S = preset("superpod-h100-ib", nodes=2, gpus=4), 3 * 4096 * 4
    calls = {call["gpu"]: call for call in reports[True]["collectives"]}
    assert calls.keys() == {1, 2}
    assert {(c["tx_bytes"], c["rx_bytes"]) for c in calls.values()} == {payload_bytes("allreduce", "direct", S, 2)}
    # alone, as measured on the links (5,544.48 ns before the IB spines took their own 130 ns switch latency, not the
    # leaves' 250: two crossings on the call's path), and NCCL's software latency on top (fabric.software: LL, a
    # network step a round, 17,644.48 ns here)
    software = call_latency_ns("allreduce", "direct", 2, 2, S, config)
    assert calls[1]["m_end_ns"] == calls[2]["m_end_ns"] == pytest.approx(5304.48 + software, rel=1e-12)
    tx, rx = payload_bytes("allreduce", "direct", S, 2)  # the links still count the one-sided bytes
    assert reports[True]["links"]["sw1->gpu2"]["payload_bytes"] == rx + (1 << 15)
    assert reports[True]["links"]["gpu2->sw1"]["payload_bytes"] == tx + (1 << 14)
    assert config.topology.share_gbytes_per_s == 50.0  # GPU 2's NIC: both one-sided transfers cross it


def test_one_sided_traffic_served_during_a_call_moves_neither_its_time_nor_its_record(tmp_path):
    """Issue 28's one-node flake, both halves forced: a put and a get that the host delivers in the middle
    of GPU 1's allreduce, overlapping it in modeled time. Before the fix, in the "during" order the call
    record of GPU 1 counted them (rx 81,920 and tx 65,536 bytes instead of 49,152 each: the link counters'
    difference around the call), and the get's reply, booked on GPU 1's uplink in host order, delayed its
    allreduce sends, so GPU 2's allreduce ended at 1,321.5 ns instead of 1,232.9 (elapsed 2,399.4 ns
    against 2,333.0 in the "after" order). One-sided traffic now takes the links' served lane."""
    fabric = ["--preset", "dgx-h100", "--gpus", "3"]
    reports = {}
    for during in (True, False):
        case = tmp_path / str(during)
        case.mkdir()
        reports[during] = modeled(case, OVERLAP.format(during=during), fabric, None)
    assert reports[True] == reports[False]
    S = 3 * 4096 * 4
    alone = modeled_ns("allreduce", "direct", S, 2, preset("dgx-h100", gpus=3))
    tx, rx = payload_bytes("allreduce", "direct", S, 2)
    calls = {call["gpu"]: call for call in reports[True]["collectives"]}
    assert calls.keys() == {1, 2}
    for gpu, call in calls.items():
        assert (call["m_start_ns"], call["tx_bytes"], call["rx_bytes"]) == (0.0, tx, rx), gpu
        assert call["m_end_ns"] == pytest.approx(alone, rel=1e-12), gpu
    links = reports[True]["links"]  # the links still count the one-sided bytes
    assert links["sw0->gpu1"]["payload_bytes"] == rx + (1 << 15) and links["gpu1->sw0"]["payload_bytes"] == tx + (1 << 14)


def test_a_malformed_delay_is_an_error_before_any_traffic(tmp_path):
    done, _ = run([command("nvlink-emu"), "run", script(tmp_path, "def main(gpu):\n    pass\n"), "--gpus", "2"],
                  env=dict(os.environ, NVLINK_EMU_TEST_SEND_DELAY="soon"))
    assert done.returncode != 0 and "NVLINK_EMU_TEST_SEND_DELAY='soon': must be SEED:MAX_MS" in done.stderr
