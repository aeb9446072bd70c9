"""Multi-rank: MPI.Win of the mpi4py layer on the fabric's windows: data and link bytes of Put/Get,
accumulates and atomics served by the target GPU, locks and PSCW, and the switch refusing a window's
access from outside its group."""

import numpy as np
import pytest

from nvlink_emu.fabric.errors import AccessViolation, UnsupportedOperation
from nvlink_emu.ranks.mpi4py_layer import installed

from mpi_helpers import gpus, run

pytestmark = pytest.mark.mpi(min_size=4)  # 3 GPUs + the switch at least


def test_a_put_moves_exactly_its_bytes_and_fence_makes_it_visible_in_the_users_buffer():
    """GPU 0 puts 1000 bytes into the last GPU's window (Win.Create over a numpy array of the program's
    own memory: the separate model): exactly 1000 payload bytes on GPU 0's uplink and the owner's
    downlink, and after Fence the owner's own array holds them; Get reads them back."""
    owner, nbytes = gpus() - 1, 1000

    def main(gpu):
        with installed(gpu) as MPI:
            comm = MPI.COMM_WORLD
            buf = np.zeros(nbytes, np.uint8)
            win = MPI.Win.Create(buf, 1, None, comm)
            assert win.Get_attr(MPI.WIN_SIZE) == nbytes and win.Get_attr(MPI.WIN_DISP_UNIT) == 1
            assert win.Get_attr(MPI.WIN_MODEL) == MPI.WIN_SEPARATE
            assert MPI.Group.Compare(win.Get_group(), comm.Get_group()) == MPI.IDENT
            win.Fence()
            before = gpu.link_counters()
            comm.Barrier()
            if gpu.rank == 0:
                win.Put(np.arange(nbytes, dtype=np.uint8), owner)
            win.Fence()
            after = gpu.link_counters()
            seen = buf.copy()
            back = np.zeros(nbytes, np.uint8)
            if gpu.rank == 1:
                win.Get(back, owner)
            win.Fence()
            win.Free()
            return {k: after[k] - before[k] for k in ("tx_bytes", "rx_bytes")}, seen, back

    result = run(main)
    if result.role == "gpu":
        delta, seen, back = result.value
        expected = np.arange(nbytes, dtype=np.uint8)
        assert delta == {"tx_bytes": nbytes if result.rank == 0 else 0,
                         "rx_bytes": nbytes if result.rank == owner else 0}
        if result.rank == owner:
            assert np.array_equal(seen, expected)
        if result.rank == 1:
            assert np.array_equal(back, expected)


def test_accumulates_and_atomics_are_read_modify_writes_at_the_target():
    """Every GPU accumulates into GPU 0's window (Win.Allocate) with each predefined op; the results are
    numpy's, in any order; Fetch_and_op increments hand out distinct values (atomic), Compare_and_swap
    has exactly one winner; Get_accumulate returns the values before."""
    def main(gpu):
        with installed(gpu) as MPI:
            comm = MPI.COMM_WORLD
            rank, size = comm.Get_rank(), comm.Get_size()
            ops = [MPI.SUM, MPI.PROD, MPI.MAX, MPI.MIN, MPI.BAND, MPI.BOR, MPI.BXOR, MPI.LAND, MPI.LOR, MPI.LXOR]
            win = MPI.Win.Allocate(8 * (len(ops) + 2), 8, None, comm)
            mem = np.frombuffer(win.tomemory(), np.int64)
            assert win.Get_attr(MPI.WIN_MODEL) == MPI.WIN_UNIFIED
            if rank == 0:
                mem[:len(ops)] = 3
            win.Fence()
            for i, op in enumerate(ops):
                win.Accumulate(np.array([rank + 2], np.int64), 0, i, op)
            win.Fence()
            accumulated = mem[:len(ops)].copy()
            fetched = []
            for _ in range(5):
                got = np.zeros(1, np.int64)
                win.Lock(0, MPI.LOCK_SHARED)
                win.Fetch_and_op(np.array([1], np.int64), got, 0, len(ops))
                win.Unlock(0)
                fetched.append(int(got[0]))
            comm.Barrier()
            old = np.zeros(1, np.int64)
            win.Lock_all()
            win.Compare_and_swap(np.array([100 + rank], np.int64), np.array([0], np.int64), old, 0, len(ops) + 1)
            win.Unlock_all()
            comm.Barrier()
            before = np.zeros(2, np.int64)
            win.Lock(0)
            win.Get_accumulate(np.array([1, 1], np.int64), before, 0, len(ops), MPI.NO_OP)
            win.Unlock(0)
            all_fetched = comm.allgather(fetched)
            winners = comm.allgather(int(old[0]) == 0)
            win.Fence()
            win.Free()
            solo = MPI.Win.Allocate(8)  # mpi4py's default communicator: COMM_SELF
            assert solo.group_size == 1 and solo.group_rank == 0
            solo.Free()
            return accumulated, all_fetched, winners, before, size

    result = run(main)
    if result.role == "gpu":
        accumulated, all_fetched, winners, before, size = result.value
        contributions = [r + 2 for r in range(size)]
        expected = []
        for fold in (np.add, np.multiply, np.maximum, np.minimum, np.bitwise_and, np.bitwise_or, np.bitwise_xor):
            expected.append(int(fold.reduce([3] + contributions)))
        expected += [1, 1, int(np.logical_xor.reduce([True] * (size + 1)))]
        if result.rank == 0:
            assert accumulated.tolist() == expected
        assert sorted(sum(all_fetched, [])) == list(range(5 * size))  # each increment saw its own value
        assert sum(winners) == 1
        assert before[0] == 5 * size and before[1] == 100 + winners.index(True)


def test_pscw_and_exclusive_locks_order_the_accesses():
    """Post/Start/Complete/Wait: the origins' Puts are in the target's own array after Wait; exclusive
    locks: every GPU's read-increment-write of a counter under Lock(0) loses nothing."""
    def main(gpu):
        with installed(gpu) as MPI:
            comm = MPI.COMM_WORLD
            rank, size = comm.Get_rank(), comm.Get_size()
            buf = np.zeros(size, np.int32)
            win = MPI.Win.Create(buf, 4, None, comm)
            group = win.Get_group()
            if rank == 0:
                win.Post(group.Excl([0]))
                win.Wait()
                posted = buf.copy()
            else:
                win.Start(group.Incl([0]))
                win.Put(np.array([rank * 7], np.int32), 0, rank)
                win.Complete()
                posted = None
            # MPI (4.0, 12.5): locking a window whose target is in an exposure epoch (between its Post and
            # Wait) is erroneous; without this barrier an origin's Lock, granted while GPU 0 still waited
            # for another origin's Complete, wrote the counter before GPU 0's Wait read `posted` (seen once)
            comm.Barrier()
            cell = np.zeros(1, np.int32)
            for _ in range(3):
                win.Lock(0, MPI.LOCK_EXCLUSIVE)
                win.Get(cell, 0, 0)
                win.Put(cell + 1, 0, 0)
                win.Unlock(0)
            comm.Barrier()
            win.Lock(0, MPI.LOCK_SHARED)
            win.Get(cell, 0, 0)
            win.Unlock(0)
            win.Free()
            return posted, int(cell[0]), size

    result = run(main)
    if result.role == "gpu":
        posted, counter, size = result.value
        if result.rank == 0:
            assert posted.tolist() == [0] + [r * 7 for r in range(1, size)]
        assert counter == 3 * size


def test_a_window_access_from_outside_its_group_is_refused_by_the_switch_and_counted():
    """A window of GPUs 0 and 1 (a Split communicator): the last GPU, outside it, takes the members'
    handles and drives the layer's own Put and Accumulate with them; the switch refuses both
    (AccessViolation at Flush, and at once for the accumulate's operand), counted on that GPU's port,
    and the window is unchanged. Win.Allocate_shared is refused with the reason."""
    outsider = gpus() - 1

    def main(gpu):
        with installed(gpu) as MPI:
            world = MPI.COMM_WORLD
            inside = gpu.rank in (0, 1)
            sub = world.Split(0 if inside else MPI.UNDEFINED, gpu.rank)
            win = MPI.Win.Create(np.zeros(16, np.uint8), 1, None, sub) if inside else None
            stolen = world.allgather(
                (win._members, win._targets, win._inboxes, win._sizes, win._units, win._slots) if gpu.rank == 0 else None)[0]
            errors = []
            with pytest.raises(UnsupportedOperation, match="does not merge GPU memories"):
                MPI.Win.Allocate_shared(8, 1, None, MPI.COMM_SELF)
            if gpu.rank == outsider:
                forged = MPI.Win.Create(np.zeros(16, np.uint8), 1, None, MPI.COMM_SELF)
                own = (forged._members, forged._targets, forged._inboxes, forged._sizes, forged._units, forged._slots)
                forged._members, forged._targets, forged._inboxes, forged._sizes, forged._units, forged._slots = stolen
                forged._rank = 0
                forged.Put(np.full(16, 9, np.uint8), 1)
                with pytest.raises(AccessViolation) as put:
                    forged.Flush(1)
                with pytest.raises(AccessViolation) as acc:
                    forged.Accumulate(np.full(16, 9, np.uint8), 1, None, MPI.SUM)
                errors = [str(put.value), str(acc.value)]
                forged._members, forged._targets, forged._inboxes, forged._sizes, forged._units, forged._slots = own
                forged.Free()
            world.Barrier()
            data = None
            if inside:
                win.Fence()
                data = bytes(win.tomemory())
                win.Free()
                sub.Free()
            return errors, data

    result = run(main)
    if result.role == "gpu":
        errors, data = result.value
        if result.rank in (0, 1):
            assert data == bytes(16)
        if result.rank == outsider:
            assert len(errors) == 2 and all(f"GPU {outsider}" in e for e in errors)
    else:
        ports = result.report["ports"]
        assert ports[outsider]["violations"] == 2
        assert [ports[g]["violations"] for g in range(gpus()) if g != outsider] == [0] * (gpus() - 1)


def test_a_dynamic_window_reaches_attached_gpu_memory_by_address_and_nothing_else():
    """Win.Create_dynamic + Attach of MPI.Alloc_mem memory: Put, Accumulate and Get by the owner's
    absolute address (MPI.Get_address) land in the attached block; an address nothing covers is an
    MPI error naming the rank."""
    def main(gpu):
        with installed(gpu) as MPI:
            comm = MPI.COMM_WORLD
            rank, size = comm.Get_rank(), comm.Get_size()
            win = MPI.Win.Create_dynamic(MPI.INFO_NULL, comm)
            assert win.Get_attr(MPI.WIN_CREATE_FLAVOR) == MPI.WIN_FLAVOR_DYNAMIC and win.Get_attr(MPI.WIN_SIZE) == 0
            mem = MPI.Alloc_mem(64)
            mem[:] = 0
            win.Attach(mem)
            addresses = comm.allgather(MPI.Get_address(mem))
            right = (rank + 1) % size
            win.Fence()
            win.Put(np.array([rank + 100], np.int64), right, addresses[right] + 8)
            win.Accumulate(np.array([1], np.int64), 0, addresses[0], MPI.SUM)
            win.Fence()
            values = np.frombuffer(mem, np.int64)[:2].tolist()
            with pytest.raises(MPI.Exception, match=f"not attached at rank {right}"):
                win.Get(np.zeros(1, np.int64), right, addresses[right] + 4096)
            win.Fence()
            win.Detach(mem)
            win.Free()
            MPI.Free_mem(mem)
            return values, size

    result = run(main)
    if result.role == "gpu":
        values, size = result.value
        assert values == [size if result.rank == 0 else 0, (result.rank - 1) % size + 100]


def test_more_atomics_than_a_mailbox_bound_are_served_and_credited():
    """The target serves accumulate requests (messages) in its progress loop; each served one is taken
    from the mailbox bound (transport.MAILBOX_PEER_MESSAGES) and credited back to the switch. Found when
    the two met: served requests were never credited, so after 1,024 of one origin's the switch held its
    next request and both GPUs waited to their deadlines. GPU 1 adds to GPU 0's counter past it, all
    requests in flight at once (one round trip each, 1,124 of them, outlasted the 30 s deadline on a
    loaded CI machine), then fetch-and-adds it once."""
    from nvlink_emu.ranks.transport.packets import MAILBOX_PEER_MESSAGES
    count = MAILBOX_PEER_MESSAGES + 100

    def main(gpu):
        with installed(gpu) as MPI:
            comm = MPI.COMM_WORLD
            win = MPI.Win.Allocate(8, 8, None, comm)
            counter = np.frombuffer(win.tomemory(), np.int64)
            counter[:] = 0
            win.Fence()
            if gpu.rank == 1:
                one, old = np.ones(1, np.int64), np.zeros(1, np.int64)
                win.Lock(0)
                for _ in range(count):
                    win.Accumulate(one, 0, None, MPI.SUM)
                win.Flush(0)
                win.Fetch_and_op(one, old, 0, 0, MPI.SUM)
                win.Flush(0)
                assert old[0] == count
                win.Unlock(0)
            win.Fence()
            total = int(counter[0])
            win.Free()
            return total

    result = run(main)
    if result.role == "gpu" and result.rank == 0:
        assert result.value == count + 1
