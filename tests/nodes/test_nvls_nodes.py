"""Multi-rank, several nodes: `nvls` reduce_scatter by load-reduce through both levels of switches
(fabric.switch, Spanning groups; ranks/collectives/nvls.py) on superpod-h100-nvlink - against the numpy
oracle of the two-level combine order for every op and dtype, bitwise the same run to run, exact bytes
on every link of both levels, modeled time equal to fabric.replay's (cost_nodes.modeled_ns), and a
member's attacks on it. World size 8 has two spines, 10 one."""

import numpy as np
import pytest

from nvlink_emu.fabric import cost_nodes
from nvlink_emu.fabric.plans.catalog import call_plan
from nvlink_emu.fabric.budget import buffer_share_bytes, in_switch_chunk, nvls_streams
from nvlink_emu.fabric.errors import AccessViolation
from nvlink_emu.fabric.packets import Kind, LoadInfo, Packet, ReduceInfo, segments
from nvlink_emu.fabric.reduction import blocks

from nodes_helpers import (check_bytes_and_times, config, contribution, dtype_of, every_op_and_dtype, run, shape,
                           timed, two_level)
from trust_helpers import refusals

pytestmark = pytest.mark.mpi(min_size=7)

COUNT = 4000 + 7  # elements: blocks of several 1 KiB chunks (the last one short) for 4 and 6 GPUs


def test_nvls_across_nodes_is_the_two_level_order_for_every_op_and_dtype():
    """reduce_scatter and allreduce, every op and dtype, on the world and on a communicator of one GPU per
    node, bitwise equal to the oracle (its block for reduce_scatter): chunk c of block j load-reduced
    through spine (j + c) mod P, allreduce's reduced chunks multicast back. The 30 cases run back to back
    on each communicator, so every call reuses the switches' slots of the calls before it (each case ran
    twice until issue 29, half of the test's time; no slot is fresher on a second run of one case)."""
    _, per_node, _ = shape()

    def main(gpu):
        for comm, members, name, op in every_op_and_dtype(gpu):
            lo, hi = blocks(COUNT, comm.size)[comm.rank]
            want = two_level(members, per_node, name, op, COUNT)
            out = np.empty(hi - lo, dtype_of(name))
            comm.reduce_scatter(contribution(gpu.rank, name, op, COUNT), out, op=op, algorithm="nvls")
            assert out.tobytes() == want[lo:hi].tobytes(), (comm.size, name, op)
            x = contribution(gpu.rank, name, op, COUNT)
            comm.allreduce(x, op=op, algorithm="nvls")
            assert x.tobytes() == want.tobytes(), (comm.size, name, op)
        return True

    result = run(main, chunk_bytes=1024, timeout_s=120)
    if result.role == "gpu":
        assert result.value is True
    assert all(port["refused"] == 0 for port in result.report["ports"].values())


@pytest.mark.both_sizes  # the spine level's bytes and time depend on 3 leaves meeting at 1 spine vs 2 at 2
def test_nvls_across_nodes_puts_exact_bytes_on_both_levels_and_takes_the_replayed_time():
    """reduce_scatter and allreduce of one chunk a block and several, float32 and float16 (partials up in
    float32), and nvls's allgather and broadcast (sharp's stores): every link's payload is
    cost_nodes.link_bytes', each call's modeled time is cost_nodes.modeled_ns' (the replay) exactly, and
    the packets on the cables are those the docstring counts (the header-only requests too)."""
    cfg = config(chunk_bytes=1 << 12)
    calls = [("reduce_scatter", "float32", 4096, 1), ("reduce_scatter", "float32", 5 * (1 << 14) + 40, 1),
             ("reduce_scatter", "float16", 3 * (1 << 14) + 2 * 6, 1), ("allreduce", "float32", 5 * (1 << 14) + 40, 1),
             ("allreduce", "float16", 3 * (1 << 14) + 2 * 6, 1), ("allgather", "float32", 3 * (1 << 14), 1),
             ("broadcast", "float32", 3 * (1 << 14) + 8, 1)]

    def one(gpu, collective, name, nbytes, root):
        x = np.ones(nbytes // dtype_of(name).itemsize, dtype_of(name))
        lo, hi = blocks(x.size, gpu.size)[gpu.rank]
        if collective == "reduce_scatter":
            out = np.empty(hi - lo, x.dtype)
            gpu.world.reduce_scatter(x, out, algorithm="nvls")
        elif collective == "allreduce":
            out = x
            gpu.world.allreduce(x, algorithm="nvls")
        elif collective == "allgather":
            out = np.zeros_like(x)
            gpu.world.allgather(x[lo:hi], out, algorithm="nvls")
        else:
            out = x if gpu.rank == root else np.zeros_like(x)
            gpu.world.broadcast(out, root=root, algorithm="nvls")
        assert np.all(out == (gpu.size if collective in ("reduce_scatter", "allreduce") else 1)), collective

    result = run(timed(calls, one), timeout_s=120, chunk_bytes=cfg.chunk_bytes)
    if result.role != "gpu":
        return
    topo = cfg.topology
    N = topo.nodes
    check_bytes_and_times(result, cfg, "nvls", calls, rel=1e-9, abs_ns=1e-6)
    want_packets = 0
    for collective, name, nbytes, _ in calls:
        if collective not in ("reduce_scatter", "allreduce"):
            continue
        item = dtype_of(name).itemsize
        wide = 4 if name == "float16" else item
        # packets on the cables per chunk of GPU j's block: header-only, the request up from j's leaf, on
        # to the N - 1 other leaves; with data, each leaf's partial up,
        # the result down (MTU segments each); allreduce: the store up once, down to the N - 1 others
        for span in cost_nodes.replay.nvls_chunks(topo, nbytes // item, cfg, item, wide):
            for lo, hi in span:
                data = segments((hi - lo) * item, cfg.mtu_bytes)
                want_packets += 1 + (N - 1) + N * segments((hi - lo) * wide, cfg.mtu_bytes) + data
                want_packets += N * data if collective == "allreduce" else 0
    links = result.report["links"]
    # by hand for the first call (4 KiB of float32, one chunk a block, block j's at spine j mod P): every
    # uplink S, every downlink its block; each leaf -> spine i the blocks j = i mod P, spine i -> leaf k
    # those of them that are node k's
    first = cost_nodes.link_bytes("reduce_scatter", "nvls", topo, 4096, 4, config=cfg)
    G, P, parts = topo.gpus_per_node, topo.spines, [4 * (b - a) for a, b in blocks(1024, topo.gpus)]
    assert all(first[f"gpu{g}->sw{g // G}"] == 4096 and first[f"sw{g // G}->gpu{g}"] == parts[g] for g in range(topo.gpus))
    for i in range(P):
        mine = [j for j in range(topo.gpus) if j % P == i]
        assert [first[f"sw{k}->sw{N + i}"] for k in range(N)] == [sum(parts[j] for j in mine)] * N
        assert [first[f"sw{N + i}->sw{k}"] for k in range(N)] == [sum(parts[j] for j in mine if j // G == k)
                                                                  for k in range(N)]
    for collective, name, nbytes, _ in calls[5:]:  # sharp's stores: each chunk up once, down to the N - 1 others
        plan, _ = call_plan(collective, "sharp", topo.nodes, topo.gpus_per_node, nbytes, cfg, 4, 1)
        stores = cost_nodes.plans.in_switch.stores(plan, nbytes, 4)
        want_packets += sum(N * segments(b, cfg.mtu_bytes) for sent in stores.values() for b, _ in sent)
    assert sum(links[link.name]["packets"] for link in topo.links if link.level == "leaf-spine") == want_packets


def test_a_member_s_attacks_on_nvls_across_nodes_harm_nobody_else():
    """Partition 0 is GPU 0 and the first GPU of the last node, partition 1 every other GPU (spanning
    every node), which runs nvls reduce_scatters meanwhile: right results, nothing of theirs refused.
    GPU 0, in turn: a LOAD_REDUCE of partition 1's spanning group (refused at its leaf, AccessViolation);
    a reduce_scatter whose load-reduces ask for a range past the bound buffers (each member refuses to
    serve it: AccessViolation naming GPU 0 in both nodes); a forged partial sent straight to a spine's rank
    (dropped unread: the pair's next reduce_scatter is exact); a LOAD_REDUCE of its released group
    (refused at its leaf). Nothing of partition 1's is refused, though the switch buffer is small."""
    nodes, per_node, _ = shape()
    pair = (0, (nodes - 1) * per_node)
    victims = tuple(g for g in range(nodes * per_node) if g not in pair)

    def exact(comm, count=5000):
        lo, hi = blocks(count, comm.size)[comm.rank]
        out = np.empty(hi - lo, np.float32)
        comm.reduce_scatter(np.arange(count, dtype=np.float32) * (gpu_rank[0] + 1), out, algorithm="nvls")
        members = [comm.members[r] for r in range(comm.size)]
        assert np.array_equal(out, np.arange(lo, hi, dtype=np.float32) * sum(m + 1 for m in members))

    gpu_rank = [0]

    def main(gpu):
        raw = gpu.raw_port()
        gpu_rank[0] = gpu.rank
        comm = gpu.partition
        gid = comm.group_id()
        theirs = np.array([gid if gpu.rank in victims else 0], np.int64)
        gpu.native("allreduce", theirs.copy(), theirs, op="max")  # out of band: partition 1's group id
        if gpu.rank in victims:
            for _ in range(3):
                exact(comm)
            return "victim"
        if gpu.rank == 0:  # another partition's group
            info = LoadInfo(int(theirs[0]), (1, 0, 0), "sum", "float32", (0,), (comm.name, 1, 4, 0, 0),
                            (comm.name, 1, "nvls-bound"))
            gpu.switch_request(Kind.LOAD_REDUCE, info, None, 0, 64, stamp=gpu.reserve_uplink(0, gpu.now_ns))
            (error,) = refusals(gpu, 1)
            assert type(error).__name__ == "AccessViolation" and "not a member" in str(error)
            honest = gpu.switch_request

            def past_the_end(kind, info, payload=None, address=0, nbytes=None, **kwargs):
                if kind is Kind.LOAD_REDUCE:
                    address += 1 << 20
                return honest(kind, info, payload, address, nbytes, **kwargs)
            gpu.switch_request = past_the_end
        # every member refuses GPU 0's first range (its own serve_load included): the error names the GPU,
        # the requester, the slot (seq, r, c, r + c) and the bytes
        with pytest.raises(AccessViolation, match=rf"GPU {gpu.rank}: GPU 0's load-reduce \(slot \[\d+, 0, 0, 0\]\) "
                                                  r"reads bytes 1048576\+\d+ of a bound buffer of \d+; not served"):
            exact(comm)
        assert raw.bound == {} and raw.loads == {}  # the buffer given up, its LOADs answered "unserved"
        if gpu.rank == 0:
            gpu.switch_request = honest
            spine = gpu.config.gpus + gpu.config.nodes  # the first spine's rank
            forged = np.full(8, 1e6, np.float32)
            for seq in range(8):  # a partial for chunk 0 of GPU 0's block of the pair's next calls, as a leaf sends it
                raw.transport.send(spine, Packet(Kind.REDUCE, -1, -1, 0, forged.nbytes, info=ReduceInfo(
                    gid, (seq, 0, 0), "sum", "float32", (0,), (comm.name, seq, 4, 0, 0))), forged.view(np.uint8))
        comm.barrier()
        exact(comm)
        exact(comm)
        comm.release_group()
        if gpu.rank == 0:
            info = LoadInfo(gid, (9, 0, 0), "sum", "float32", (0,), (comm.name, 9, 4, 0, 0), (comm.name, 9, "nvls-bound"))
            gpu.switch_request(Kind.LOAD_REDUCE, info, None, 0, 64, stamp=gpu.reserve_uplink(0, gpu.now_ns))
            (error,) = refusals(gpu, 1)
            assert type(error).__name__ == "AccessViolation" and f"no live group {gid}" in str(error)
        comm.barrier()
        exact(comm)  # on a new group
        assert raw.bound == {} and raw.loads == {}
        return "pair"

    # a small switch buffer (32 KiB a partition): the windows keep honest calls within every share
    result = run(main, partitions=(pair, victims), chunk_bytes=1024, switch_buffer_bytes=1 << 16, timeout_s=60)
    if result.role == "gpu":
        assert result.value == ("pair" if result.rank in pair else "victim")
    ports = result.report["ports"]
    assert ports[0]["refused"] == ports[0]["violations"] == 2
    assert all(ports[g]["refused"] == 0 for g in ports if g != 0)


def test_a_load_reduce_refused_again_and_again_exhausts_nothing():
    """GPU 0 asks every load-reduce of a reduce_scatter past the bound buffers, again and again: each time
    every member refuses it (AccessViolation), leaving at each leaf each of its members' requests in
    flight (window x chunks: `per_call`) unanswered. Measured before: those entries stayed until the
    group's release, so after `tries` calls the partition's budget (partial_share_parts: `limit`) was
    gone and the next, honest reduce_scatter was refused (ResourceExhausted). Now each member answers
    the LOADs it gives up with the notice "unserved", which gives each request's place back: the next
    reduce_scatter is exact, and no member holds a bound buffer or a LOAD."""
    nodes, per_node, _ = shape()
    cfg = config(chunk_bytes=1024, switch_buffer_bytes=4 << 20)
    n = cfg.gpus
    limit = max(4096, buffer_share_bytes(cfg) // 1024) // nodes  # fabric.switch's partial_share_parts
    streams = nvls_streams(n, nodes, nodes, np.float32)  # ranks/collectives/nvls.py's window, chunk
    chunk = in_switch_chunk(cfg, n, streams, 2, cfg.nvls_chunk_bytes, 4)
    window = max(2, buffer_share_bytes(cfg) // (streams * (n - 1)) // chunk)
    count = n * 64 * chunk // 4  # 64 chunks a block
    per_call = per_node * min(window, 64)
    tries = limit // per_call + 1

    def main(gpu):
        lo, hi = blocks(count, gpu.size)[gpu.rank]
        out = np.empty(hi - lo, np.float32)
        honest = gpu.switch_request

        def past_the_end(kind, info, payload=None, address=0, nbytes=None, **kwargs):
            return honest(kind, info, payload, address + (1 << 20) if kind is Kind.LOAD_REDUCE else address, nbytes,
                          **kwargs)
        for _ in range(tries):
            gpu.switch_request = past_the_end if gpu.rank == 0 else honest
            with pytest.raises(AccessViolation, match="GPU 0's load-reduce .* not served"):
                gpu.world.reduce_scatter(np.ones(count, np.float32), out, algorithm="nvls")
        gpu.switch_request = honest
        gpu.world.barrier()
        gpu.world.reduce_scatter(np.ones(count, np.float32), out, algorithm="nvls")
        assert np.all(out == gpu.size)
        gpu.world.barrier()
        assert gpu.raw_port().bound == {} and gpu.raw_port().loads == {}
        return True

    assert (limit, per_call, tries) == ((2048, 128, 17) if nodes == 2 else (1365, 128, 11))
    result = run(main, chunk_bytes=cfg.chunk_bytes, switch_buffer_bytes=cfg.switch_buffer_bytes, timeout_s=120)
    if result.role == "gpu":
        assert result.value is True
    assert all(port["refused"] == 0 for port in result.report["ports"].values())
