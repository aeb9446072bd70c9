"""Multi-rank, several nodes: leaf and spine switch ranks, exact bytes on every link of every level,
modeled time along routes, isolation across nodes (issue 10)."""

import numpy as np
import pytest

from nvlink_emu.fabric import cost_nodes
from nvlink_emu.fabric.errors import AccessViolation, UnsupportedOperation
from nvlink_emu.fabric.packets import raw_bytes

from nodes_helpers import PRESETS, config, run, shape

pytestmark = pytest.mark.mpi(min_size=7)

S = 3 * 4096 + 8  # bytes of every call below: blocks of unequal size, several MTU packets each


def flat_calls(gpu, n):
    """The flat collectives, each checked against numpy; returns (collective, algorithm, bytes, root,
    counts) of each call, for fabric.cost_nodes."""
    calls, rank, count = [], gpu.rank, S // 4
    base = np.arange(count, dtype=np.float32)
    for algorithm in ("ring", "direct"):
        x = gpu.alloc(count, "float32")
        x[:] = base + rank
        gpu.world.allreduce(x, algorithm=algorithm)
        assert np.array_equal(x, n * base + n * (n - 1) / 2)
        calls.append(("allreduce", algorithm, S, 0, None))
        parts = np.array_split(np.arange(count), n)
        out = gpu.alloc(len(parts[rank]), "float32")
        x[:] = base * (rank + 1)
        gpu.world.reduce_scatter(x, out, algorithm=algorithm)
        assert np.array_equal(out, base[parts[rank]] * (n * (n + 1) / 2))
        calls.append(("reduce_scatter", algorithm, S, 0, None))
        mine = gpu.alloc(len(parts[rank]), "float32")
        mine[:] = rank
        gathered = gpu.alloc(count, "float32")
        gpu.world.allgather(mine, gathered, algorithm=algorithm)
        assert np.array_equal(gathered, np.concatenate([np.full(len(p), r, np.float32) for r, p in enumerate(parts)]))
        calls.append(("allgather", algorithm, S, 0, None))
    root = n - 1
    x = gpu.alloc(count, "float32")
    x[:] = base if rank == root else -1
    gpu.world.broadcast(x, root=root, algorithm="direct")
    assert np.array_equal(x, base)
    calls.append(("broadcast", "direct", S, root, None))
    send, recv = gpu.alloc(n * 64, "int32"), gpu.alloc(n * 64, "int32")
    send[:] = rank * 1000 + np.arange(n * 64)
    gpu.world.all2all(send, recv)
    expect = np.concatenate([r * 1000 + np.arange(rank * 64, (rank + 1) * 64) for r in range(n)])
    assert np.array_equal(recv, expect)
    calls.append(("all2all", "direct", n * 64 * 4, 0, None))
    counts = np.array([[(i + 2 * j) % 5 * 3 for j in range(n)] for i in range(n)])  # elements i sends j
    send = gpu.alloc(int(counts[rank].sum()), "int32")
    send[:] = rank
    recv = gpu.alloc(int(counts[:, rank].sum()), "int32")
    gpu.world.all2allv(send, list(counts[rank]), recv, list(counts[:, rank]))
    assert np.array_equal(recv, np.repeat(np.arange(n), counts[:, rank]))
    calls.append(("all2allv", "all2allv", 0, 0, counts * 4))
    return calls


@pytest.mark.both_sizes  # flat traffic crosses leaf-spine links in proportion to the node count and spreads over 2 spines or 1
@pytest.mark.parametrize("base", PRESETS)
def test_flat_collectives_are_exact_and_put_their_bytes_on_every_level(base):
    result = run(lambda gpu: flat_calls(gpu, gpu.size), base)
    if result.role != "gpu":
        return
    topo = config(base).topology
    expected = {link.name: 0 for link in topo.links}
    for collective, algorithm, nbytes, root, counts in result.value:
        for name, value in cost_nodes.link_bytes(collective, algorithm, topo, nbytes, 4, root, counts).items():
            expected[name] += value
    got = {name: result.report["links"].get(name, {}).get("payload_bytes", 0) for name in expected}
    assert got == expected
    assert set(result.report["links"]) == set(expected)  # nothing on a link the topology does not have
    levels = topo.totals_by_level(got)
    assert levels["leaf-spine"]["up"] == levels["leaf-spine"]["down"] > 0


def test_a_transfer_to_another_node_takes_its_route_s_unloaded_time():
    nodes, per_node, spines = shape()
    src, dst, nbytes = 0, nodes * per_node - 1, 1 << 20

    def main(gpu):
        data = gpu.alloc(nbytes, "uint8")
        if gpu.rank == src:
            gpu.world.send(data, dst)
        elif gpu.rank == dst:
            gpu.world.recv(data, src)
        return gpu.now_ns

    result = run(main, "superpod-h100-ib")
    if result.role == "gpu" and result.rank == dst:
        cfg = config("superpod-h100-ib")
        raw = raw_bytes(nbytes, cfg.mtu_bytes, cfg.header_bytes)
        # cut-through: every link's latency, every switch's, and the bytes at the slowest stage: the two GPUs'
        # shares of their nodes' uplinks, a NIC each (50 GB/s), whatever the spines
        route = cfg.topology.route(src, dst)
        assert [link.level for link in route] == ["gpu-leaf", "leaf-spine", "leaf-spine", "gpu-leaf"]
        expected = 2 * 150.0 + 2 * 600.0 + 2 * 250.0 + 130.0 + raw / 50.0  # nvlink4 a, ib-ndr u, nvlink4 s, ib-ndr spine
        assert result.value == pytest.approx(expected, rel=1e-12)
        assert result.value == pytest.approx(cfg.topology.unloaded_ns(src, dst, raw), rel=1e-12)


def test_ring_time_is_within_the_cost_model_s_bounds():
    nbytes = 1 << 20

    def main(gpu):
        x = gpu.alloc(nbytes // 4, "float32")
        gpu.world.allreduce(x, algorithm="ring")
        return gpu.now_ns

    result = run(main, "superpod-h100-ib")
    if result.role == "gpu":
        cfg = config("superpod-h100-ib")
        lower = cost_nodes.lower_bound_ns("allreduce", "ring", cfg.topology, nbytes, cfg)
        assert lower <= result.report["elapsed_ns"] <= 1.5 * cost_nodes.modeled_ns("allreduce", "ring", cfg.topology,
                                                                                   nbytes, cfg)


def partitions_across_nodes():
    """Two partitions, each with a GPU of every node: even local indices in one, odd in the other,
    except that the last node swaps them (so a partition's members are not all local index 0)."""
    nodes, per_node, _ = shape()
    last = nodes - 1
    a = tuple(g for g in range(nodes * per_node) if (g % per_node + (g // per_node == last)) % 2 == 0)
    b = tuple(g for g in range(nodes * per_node) if g not in a)
    return a, b


def test_isolation_holds_across_nodes():
    a, b = partitions_across_nodes()
    owner = a[-1]                      # in the last node
    friend = a[0]                      # the same partition, in node 0
    strangers = [g for g in b if g // shape()[1] in (0, owner // shape()[1])]  # in node 0 and in the owner's node

    def main(gpu):
        window = gpu.alloc(4096, "uint8")
        window[:] = 7
        handle = gpu.export(window) if gpu.rank == owner else None
        handle = gpu.world.allgather_object(handle)[owner]
        if gpu.rank == friend:
            data = gpu.alloc(4096, "uint8")
            data[:] = 42
            gpu.put(handle, data)
            gpu.fence()
            back = gpu.alloc(4096, "uint8")
            gpu.get(handle, back)
            assert np.all(back == 42)
        if gpu.rank in strangers:
            with pytest.raises(AccessViolation, match="partition"):
                gpu.get(handle, gpu.alloc(16, "uint8"))
            gpu.put(handle, gpu.alloc(16, "uint8"))
            with pytest.raises(AccessViolation):
                gpu.fence()
        gpu.world.barrier()
        if gpu.rank == owner:
            assert np.all(window == 42)  # the friend's bytes, and nobody else's
            gpu.revoke(handle)
        gpu.world.barrier()
        if gpu.rank == friend:
            with pytest.raises(AccessViolation):
                gpu.get(handle, gpu.alloc(16, "uint8"))
        # messages across partitions are refused at the sender's leaf, wherever the receiver is
        if gpu.rank == strangers[0]:
            gpu.send_message(friend, ("hello",), gpu.alloc(8, "uint8"))
            with pytest.raises(AccessViolation, match="partitions are isolated"):
                gpu.wait(lambda: False, "refusal", "the switch")
        gpu.world.barrier()

    report = run(main, partitions=(a, b)).report
    for stranger in strangers:
        assert report["ports"][stranger]["violations"] == (3 if stranger == strangers[0] else 2)
    # a stranger in the owner's node is refused by the owner's Link TLB; one in another node by its own
    # leaf, before the request leaves its node (the window is another partition's)
    near = [g for g in strangers if g // shape()[1] == owner // shape()[1]]
    assert near and len(near) < len(strangers)
    assert report["ports"][owner]["tlb_faults"] == 2 * len(near) + 1  # + the friend's get after the revoke


def test_in_switch_collectives_across_nodes_are_refused_but_sharp_allreduce_and_work_within_a_node():
    nodes, per_node, _ = shape()

    def main(gpu):
        x = gpu.alloc(1024, "float32")
        x[:] = 1
        with pytest.raises(UnsupportedOperation, match="in 2 nodes|in 3 nodes"):
            gpu.world.reduce(x, x.copy(), root=0, algorithm="sharp")
        node = gpu.world.split(gpu.rank // per_node)
        node.allreduce(x, algorithm="sharp")  # a group behind one leaf
        assert np.all(x == per_node)
        gpu.world.allreduce(x)  # auto: a flat algorithm across nodes
        assert np.all(x == per_node * nodes * per_node)

    run(main)


def test_a_classic_physical_address_names_a_gpu_of_the_same_node_only():
    nodes, per_node, _ = shape()
    neighbour, remote = 1, per_node  # GPU 0's neighbour in node 0, and the first GPU of node 1

    def main(gpu):
        buffer = gpu.alloc(256, "uint8")
        buffer[:] = 0
        addresses = gpu.world.allgather_object(gpu.physical_address(buffer))
        gpu.world.barrier()
        if gpu.rank == 0:
            data = gpu.alloc(256, "uint8")
            data[:] = 9
            gpu.put(addresses[neighbour], data)
            gpu.fence()
            gpu.put(addresses[remote], data)
            with pytest.raises(UnsupportedOperation, match="same node only"):
                gpu.fence()
        gpu.world.barrier()
        return int(buffer[0])

    result = run(main, "superpod-a100-ib")
    if result.role == "gpu":
        assert result.value == (9 if result.rank == neighbour else 0)


def test_classic_nodes_reach_each_other_through_registered_windows():
    """superpod-a100-ib: DGX A100 nodes (classic NVLink inside) on InfiniBand: a GPU of another node
    reaches memory through a registered window (export, then the handle), as RDMA does, within its
    bounds and allowed set; inside the node the physical address still works."""
    nodes, per_node, _ = shape()
    owner, reader, stranger = 0, per_node, nodes * per_node - 1  # node 0; node 1; the last GPU (another node)

    def main(gpu):
        window = gpu.alloc(1024, "float64")
        window[:] = np.arange(1024) + 100 * gpu.rank
        handle = gpu.world.allgather_object(gpu.export(window, to=[reader]) if gpu.rank == owner else None)[owner]
        assert handle.network_address == owner  # classic: the owner's GPU index
        if gpu.rank == reader:
            got = gpu.alloc(1024, "float64")
            gpu.get(handle, got)
            assert np.array_equal(got, np.arange(1024))
            data = gpu.alloc(8, "float64")
            data[:] = -1
            gpu.put(handle, data, offset=8 * 1016)
            gpu.fence()
            with pytest.raises(AccessViolation):
                gpu.get(handle, gpu.alloc(16, "float64"), offset=8 * 1016)  # past the window's end
        if gpu.rank == stranger and stranger != reader:
            with pytest.raises(AccessViolation, match="not in the allowed set"):
                gpu.get(handle, gpu.alloc(8, "float64"))
        gpu.world.barrier()
        if gpu.rank == owner:
            assert np.array_equal(window[-8:], np.full(8, -1.0)) and np.array_equal(window[:-8], np.arange(1016))

    run(main, "superpod-a100-ib")


def test_an_mpi_window_on_another_node_is_reached_through_its_leaf_and_only_by_its_group():
    """MPI.Win of the mpi4py layer across nodes: a window of the first GPU and the last one (another
    node); the first Puts S bytes into it (exactly S on its uplink, on the owner's downlink after Fence),
    Gets them back, and both Fetch_and_op a counter there under Lock; a GPU outside the window's group
    driving the layer's Put with the members' handles is refused by the switch and counted on its port."""
    from nvlink_emu.ranks.mpi4py_layer import installed

    nodes, per_node, _ = shape()
    n = nodes * per_node
    first, last, outsider = 0, n - 1, 1
    nbytes = 3000

    def main(gpu):
        with installed(gpu) as MPI:
            world = MPI.COMM_WORLD
            member = gpu.rank in (first, last)
            pair = world.Split(0 if member else MPI.UNDEFINED, gpu.rank)
            win = MPI.Win.Allocate(nbytes + 8, 1, None, pair) if member else None
            stolen = world.allgather((win._members, win._targets, win._inboxes, win._sizes, win._units, win._slots)
                                     if gpu.rank == first else None)[0]
            out, moved, refused = None, None, None
            if member:
                win.Fence()
                before = gpu.link_counters()
                if gpu.rank == first:
                    win.Put(np.arange(nbytes, dtype=np.uint8), 1)
                win.Fence()
                after = gpu.link_counters()
                moved = (after["tx_bytes"] - before["tx_bytes"], after["rx_bytes"] - before["rx_bytes"])
                got = np.zeros(nbytes, np.uint8)
                win.Get(got, 1)
                assert np.array_equal(got, np.arange(nbytes, dtype=np.uint8))
                old = np.zeros(1, np.int64)
                win.Lock(1)
                win.Fetch_and_op(np.array([5], np.int64), old, 1, nbytes)
                win.Unlock(1)
                out = int(old[0])
            if gpu.rank == outsider:
                forged = MPI.Win.Create(np.zeros(8, np.uint8), 1, None, MPI.COMM_SELF)
                own = (forged._members, forged._targets, forged._inboxes, forged._sizes, forged._units, forged._slots)
                forged._members, forged._targets, forged._inboxes, forged._sizes, forged._units, forged._slots = stolen
                forged.Put(np.full(8, 9, np.uint8), 1)
                with pytest.raises(AccessViolation, match=f"GPU {outsider}"):
                    forged.Flush(1)
                refused = True
                forged._members, forged._targets, forged._inboxes, forged._sizes, forged._units, forged._slots = own
                forged.Free()
            world.Barrier()
            if member:
                win.Fence()
                if gpu.rank == last:
                    memory = np.asarray(win.tomemory())
                    assert np.array_equal(memory[:nbytes], np.arange(nbytes, dtype=np.uint8))
                    assert memory[nbytes:].view(np.int64)[0] == 10
                win.Free()
                pair.Free()
            return out, moved, refused

    result = run(main)
    if result.role == "gpu":
        out, moved, refused = result.value
        if result.rank == first:
            assert moved == (nbytes, 0)
        if result.rank == last:
            assert moved == (0, nbytes)
        if result.rank in (first, last):
            assert out in (0, 5)
        if result.rank == outsider:
            assert refused
    if result.role == "gpu" or "ports" in result.report:
        ports = result.report["ports"]
        assert ports[outsider]["violations"] == 1
        assert sum(ports[g]["violations"] for g in range(n)) == 1
