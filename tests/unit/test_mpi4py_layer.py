"""The mpi4py layer's pure parts, without MPI: message specifications, datatype layouts, which
reductions the fabric does itself, and the fixed rank order of the ones combined on the GPUs' host."""

import array
import pickle

import numpy as np
import pytest

from nvlink_emu.fabric.errors import UnsupportedOperation
from nvlink_emu.ranks.mpi4py_layer import MPI
from nvlink_emu.ranks.mpi4py_layer.buffers import IN_PLACE, as_array, is_in_place, message_simple, message_vector


def test_a_plain_buffer_is_a_message_of_its_own_type_and_length():
    buf = np.arange(6, dtype=np.int16)
    message = message_simple(buf, readonly=True)
    assert (message.count, message.datatype) == (6, MPI.SHORT)
    assert message.pack().tolist() == list(range(6))
    assert message_simple(array.array("d", [1.0, 2.0]), True).datatype == MPI.DOUBLE


def test_count_displacement_and_datatype_forms_select_the_items_mpi4py_selects():
    buf = np.arange(10, dtype=np.intc)
    assert message_simple([buf, MPI.INT], True).count == 10
    assert message_simple([buf, 4], True).pack().tolist() == [0, 1, 2, 3]
    assert message_simple([buf, (3, 2), MPI.INT], True).pack().tolist() == [2, 3, 4]
    assert message_simple([buf, 3, 5, MPI.INT], True).pack().tolist() == [5, 6, 7]
    assert message_simple(buf, True, blocks=5).count == 2  # per block, as a Gather's receive buffer
    with pytest.raises(ValueError, match="multiple of required number of blocks 3"):
        message_simple(buf, True, blocks=3)
    with pytest.raises(ValueError, match="expecting 2 to 4 items"):
        message_simple([buf, 1, 2, 3, 4], True)


def test_a_vector_message_takes_counts_and_displacements_as_mpi4py():
    buf = np.arange(10, dtype=np.float32)
    v = message_vector([buf, ([1, 2, 3], [0, 4, 7]), MPI.FLOAT], True, 3)
    assert (v.counts, v.displs) == ([1, 2, 3], [0, 4, 7])
    assert message_vector([buf, 2], True, 3).displs == [0, 2, 4]  # contiguous blocks of 2
    assert message_vector([buf, (2, 3)], True, 3).displs == [0, 3, 6]  # an int displacement is a stride
    assert message_vector(buf, True, 3).counts == [4, 3, 3]  # the length split as evenly as possible


def test_derived_types_pack_and_unpack_the_elements_they_name():
    base = np.arange(10, dtype=np.int64)
    every_other = MPI.LONG.Create_indexed_block(1, [0, 2, 4, 6, 8]).Commit()
    assert every_other.Get_size() == 5 * 8 and every_other.Get_extent() == (0, 9 * 8)
    message = message_simple([base, 1, every_other], True)
    assert message.pack().tolist() == [0, 2, 4, 6, 8]
    out = np.full(10, -1, np.int64)
    message_simple([out, 1, every_other], False).unpack(np.array([5, 6, 7, 8, 9]))
    assert out.tolist() == [5, -1, 6, -1, 7, -1, 8, -1, 9, -1]
    vector = MPI.INT.Create_vector(2, 2, 3)  # [x x . x x]
    assert message_simple([np.arange(5, dtype=np.intc), 1, vector], True).pack().tolist() == [0, 1, 3, 4]
    with pytest.raises(UnsupportedOperation, match="Create_struct"):
        MPI.INT.Create_struct([1], [0], [MPI.INT])


def test_buffers_are_views_of_the_users_memory():
    data = bytearray(8)
    as_array(data, readonly=False)[:] = 7
    assert data == bytearray([7] * 8)
    with pytest.raises(BufferError):
        as_array(b"abc", readonly=False)
    assert is_in_place(None) and is_in_place(IN_PLACE) and not is_in_place(data)


def test_the_fabric_reduces_what_the_switch_reduces_and_nothing_else():
    assert MPI.native_reduction(MPI.SUM, np.float32) == ("sum", np.dtype(np.float32))
    assert MPI.native_reduction(MPI.PROD, np.int8) == ("prod", np.dtype(np.int8))
    assert MPI.native_reduction(MPI.SUM, np.complex64) == ("sum", np.dtype(np.float32))  # its real view
    assert MPI.native_reduction(MPI.LOR, np.bool_) == ("max", np.dtype(np.uint8))
    assert MPI.native_reduction(MPI.LAND, np.bool_) == ("min", np.dtype(np.uint8))
    for op, dtype in ((MPI.PROD, np.complex64), (MPI.SUM, np.longdouble), (MPI.BAND, np.int32),
                      (MPI.LXOR, np.bool_), (MPI.MAXLOC, MPI.FLOAT_INT.base)):
        assert MPI.native_reduction(op, dtype) is None


def test_host_combined_reductions_run_in_rank_order():
    rows = np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    assert MPI.reduce_rows(MPI.REPLACE, rows).tolist() == [5.0, 6.0]  # the last rank's
    assert MPI.reduce_rows(MPI.NO_OP, rows).tolist() == [1.0, 2.0]    # the first rank's
    assert MPI.reduce_rows(MPI.PROD, rows).tolist() == [15.0, 48.0]
    pairs = np.zeros(3, MPI.DOUBLE_INT.base)
    pairs["v"], pairs["i"] = [2.0, 7.0, 7.0], [0, 2, 1]
    best = MPI.reduce_rows(MPI.MAXLOC, pairs.reshape(3, 1))[0]
    assert (best["v"], best["i"]) == (7.0, 1)  # ties to the lower index, as MPI_MAXLOC
    assert MPI.MAXLOC((1, 3), (1, 2)) == (1, 2) and MPI.MINLOC((0, 5), (1, 0)) == (0, 5)


def test_reduce_local_checks_counts_and_types_as_mpi4py():
    inout = np.array([1, 2, 3], np.intc)
    MPI.SUM.Reduce_local(np.array([10, 20, 30], np.intc), inout)
    assert inout.tolist() == [11, 22, 33]
    with pytest.raises(ValueError):
        MPI.SUM.Reduce_local([np.zeros(3, np.intc), 2], [inout, 3])
    with pytest.raises(MPI.Exception):
        MPI.MAX.combine(np.zeros(1, np.complex64), np.zeros(1, np.complex64))  # complex has no order


def test_the_algorithm_variable_names_a_registered_algorithm():
    assert MPI.check_algorithm("ring") == "ring"
    with pytest.raises(UnsupportedOperation, match="NVLINK_EMU_MPI4PY_ALGORITHM='torus'"):
        MPI.check_algorithm("torus")


def test_the_shim_is_mpi4py_only_while_the_program_runs():
    import sys
    import types

    import mpi4py  # the real package, as the emulator's transport has it

    from nvlink_emu.ranks.mpi4py_layer import MPI as layer, installed
    from nvlink_emu.ranks.mpi4py_layer.comm import Solo

    fake = types.SimpleNamespace(rank=0, world=Solo("world"))
    with installed(fake):
        from mpi4py import MPI as seen  # noqa: F811 - what the program imports

        assert seen is layer and seen.COMM_WORLD.Get_size() == 1 and sys.modules["mpi4py"] is not mpi4py
    assert sys.modules["mpi4py"] is mpi4py and not layer.COMM_WORLD


def test_a_call_mpi4py_has_and_the_layer_lacks_is_unsupported_by_name():
    import types

    from nvlink_emu.ranks.mpi4py_layer.comm import Solo

    real = types.SimpleNamespace(Intracomm=type("Intracomm", (), {"Split_type": None}), Open_port=None)
    comm = MPI.Intracomm()
    MPI.bind(types.SimpleNamespace(rank=0, world=Solo("world")), real)  # real: the names mpi4py has
    try:
        with pytest.raises(UnsupportedOperation, match=r"MPI\.Intracomm\.Split_type: mpi4py has it"):
            comm.Split_type(0)
        with pytest.raises(UnsupportedOperation, match=r"MPI\.Open_port: mpi4py has it"):
            MPI.Open_port()
        assert not hasattr(MPI, "Open_port") and getattr(comm, "Split_type", None) is None
        with pytest.raises(AttributeError) as info:
            comm.Spilt
        assert not isinstance(info.value, UnsupportedOperation)  # a misspelt name is only an AttributeError
    finally:
        MPI.unbind()


def test_mpi4py_modules_other_than_mpi_are_refused_while_the_layer_is_installed():
    import types

    from nvlink_emu.ranks.mpi4py_layer import installed
    from nvlink_emu.ranks.mpi4py_layer.comm import Solo

    with installed(types.SimpleNamespace(rank=0, world=Solo("world"))):
        with pytest.raises(UnsupportedOperation, match="import mpi4py.util: the mpi4py layer provides mpi4py.MPI only"):
            import mpi4py.util  # noqa: F401
    import mpi4py.util  # noqa: F401,F811 - the real one again afterwards



# -- a peer's malformed messages (issue 25, item 9): the layer's own error, naming sender and communicator --

class _Pending:
    def wait(self):
        pass


class _World:
    """A two-member world (GPUs 4 and 5; this one is member 0) whose collectives fill the receive
    buffers with what the test queued, as a peer that sends what it likes would."""

    size, rank, members, name = 2, 0, (4, 5), "world"

    def __init__(self, fills):
        self.fills = list(fills)

    def ibroadcast(self, array, root=0, algorithm="auto"):
        if self.rank != root:
            array[:] = self.fills.pop(0)
        return _Pending()

    def iall2allv(self, send, send_counts, recv, recv_counts):
        recv[:] = self.fills.pop(0)
        return _Pending()


class _Gpu:
    """What the layer calls on its GPU: messages from the `mailbox` {(key, peer GPU): bytes}, host arrays."""

    rank = 4

    def __init__(self, mailbox=(), fills=()):
        self.world, self.mailbox = _World(fills), dict(mailbox)

    def has_message(self, key, peer):
        return (tuple(key), peer) in self.mailbox

    def take_message(self, key, peer, op, waiting_for):
        return np.frombuffer(self.mailbox.pop((tuple(key), peer)), np.uint8)

    def peek_message(self, key, peer):
        got = self.mailbox.get((tuple(key), peer))
        return None if got is None else np.frombuffer(got, np.uint8)

    def poll(self):
        return False

    def wait(self, done, what, whom):
        assert done(), f"the test queued no message for {what} ({whom})"

    def alloc(self, count, dtype):
        assert count >= 0
        return np.zeros(count, dtype)

    def free(self, array):
        pass


def _from_peer(*payloads) -> dict:
    """Messages 0, 1, ... of member 1 (GPU 5) to member 0 on the world communicator."""
    return {(("world", "mpi4py", n), 5): payload for n, payload in enumerate(payloads)}


def _tagged(tag: int, data: bytes) -> bytes:
    return np.array([tag], np.int64).tobytes() + data


WHO = r"rank 1 \(GPU 5\) of communicator 'MPI_COMM_WORLD'"


@pytest.mark.parametrize("payload, error", [
    (b"abc", rf"^MPI: a message of 3 bytes from {WHO} is shorter than the layer's 8-byte tag header$"),
    (b"", rf"^MPI: a message of 0 bytes from {WHO} is shorter than the layer's 8-byte tag header$"),
    (_tagged(-5, b"x"), rf"^MPI: a message from {WHO} carries tag -5, not 0..2147483647$"),
    (_tagged(2 ** 40, b""), rf"^MPI: a message from {WHO} carries tag 1099511627776, not 0..2147483647$"),
    (_tagged(0, b"\x80\x05junk"), rf"^MPI: the pickled object of 6 bytes from {WHO} does not load: "),
])
def test_a_malformed_message_is_the_layers_error_naming_the_sender(payload, error):
    """A 3-byte message where the 8-byte tag header belongs made recv raise numpy's ValueError. Now:
    MPI.Exception (ERR_OTHER) that is also the fabric's ProtocolError; the next message still arrives."""
    from nvlink_emu.fabric.errors import ProtocolError
    from nvlink_emu.ranks.mpi4py_layer import installed

    with installed(_Gpu(_from_peer(payload, _tagged(7, pickle.dumps("after"))))):
        with pytest.raises(MPI.Exception, match=error) as info:
            MPI.COMM_WORLD.recv(source=1)
        assert isinstance(info.value, ProtocolError) and info.value.Get_error_class() == MPI.ERR_OTHER
        status = MPI.Status()
        assert MPI.COMM_WORLD.recv(source=1, status=status) == "after" and status.Get_tag() == 7


@pytest.mark.parametrize("data, datatype, error", [
    (b"abc", None, r"the 3 bytes from {who}, tag 2, are not whole items of 4 bytes \(int32 elements\)"),
    (bytes(12), "vector", r"the 12 bytes from {who}, tag 2, are not whole items of 8 bytes \(int32 elements\)"),
    (bytes(40), None, r"message of 40 bytes from {who}, tag 2, truncated: the buffer holds 16"),
])
def test_a_buffer_receive_of_a_wrong_length_names_the_sender(data, datatype, error):
    from nvlink_emu.ranks.mpi4py_layer import installed

    out = np.zeros(4 if datatype is None else 8, np.int32)
    buf = [out, 2, MPI.INT.Create_vector(2, 1, 2).Commit()] if datatype else out  # 2 items of 2 int32 each
    with installed(_Gpu(_from_peer(_tagged(2, data)))):
        with pytest.raises(MPI.Exception, match="^MPI recv: " + error.format(who=WHO) + "$"):
            MPI.COMM_WORLD.Recv(buf, source=1)
    assert not out.any()


MINE = np.frombuffer(pickle.dumps(0, pickle.HIGHEST_PROTOCOL), np.uint8)  # member 0's allgather piece


@pytest.mark.parametrize("call, fills, error", [
    ("bcast", [[-7]], rf"^MPI bcast: {WHO} announces -7 bytes$"),
    ("bcast", [[4], np.frombuffer(b"\x80\x05no", np.uint8)],
     rf"^MPI: the pickled object of 4 bytes from {WHO} does not load: "),
    ("allgather", [[MINE.size, -3]], rf"^MPI allgather: {WHO} announces -3 bytes$"),
    ("allgather", [[MINE.size, 2], np.concatenate([MINE, np.frombuffer(b"\x80\x05", np.uint8)])],
     rf"^MPI: the pickled object of 2 bytes from {WHO} does not load: "),
])
def test_the_pickle_based_collectives_check_what_a_peer_announces_and_sends(call, fills, error):
    """A length no member sends (one below 0) or bytes that do not unpickle: the layer's error naming
    the member, not numpy's or pickle's."""
    from nvlink_emu.ranks.mpi4py_layer import installed

    with installed(_Gpu(fills=fills)):
        with pytest.raises(MPI.MalformedMessage, match=error):
            MPI.COMM_WORLD.bcast(None, root=1) if call == "bcast" else MPI.COMM_WORLD.allgather(0)


def test_a_probe_of_a_malformed_message_raises_it_and_the_next_message_is_probed_after():
    from nvlink_emu.ranks.mpi4py_layer import installed

    with installed(_Gpu(_from_peer(b"abc", _tagged(3, bytes(8))))):
        with pytest.raises(MPI.MalformedMessage, match=f"^MPI: a message of 3 bytes from {WHO} is shorter"):
            MPI.COMM_WORLD.Probe(source=MPI.ANY_SOURCE, tag=3)
        status = MPI.Status()
        MPI.COMM_WORLD.Probe(source=1, tag=3, status=status)
        assert (status.Get_source(), status.Get_tag(), status.Get_count(MPI.BYTE)) == (1, 3, 8)


def test_an_error_on_a_one_member_communicator_names_this_gpu():
    """COMM_SELF's emulator side (Solo) has no member list: its one member is this GPU (4)."""
    from nvlink_emu.ranks.mpi4py_layer import installed

    with installed(_Gpu()):
        MPI.COMM_SELF.Send(np.arange(4, dtype=np.int32), dest=0, tag=1)
        with pytest.raises(MPI.Exception, match=r"^MPI recv: message of 16 bytes from rank 0 \(GPU 4\) of communicator "
                                                r"'MPI_COMM_SELF', tag 1, truncated: the buffer holds 4$"):
            MPI.COMM_SELF.Recv(np.zeros(1, np.int32), source=0, tag=1)



@pytest.mark.parametrize("count, size, left", [
    (MPI.KEPT_MESSAGES + 300, 1, 300),         # the count bound leaves the last 300
    ((MPI.KEPT_BYTES >> 20) + 3, 1 << 20, 3),  # 1 MiB messages: the byte bound leaves the last 3
])
def test_the_unexpected_queue_keeps_a_bounded_backlog_and_leaves_the_rest_in_the_mailbox(count, size, left):
    """Issue 25.8: a receive moved every arrived message of a communicator into the layer's unexpected queue,
    taking it from the GPU's mailbox (which credits it to the switch as taken): a program that receives one
    tag while a member sends it another held all of them, and the switch's mailbox bound never held the
    sender. Now the queue takes KEPT_MESSAGES or KEPT_BYTES of a member's unmatched messages at most and
    lists later ones by their envelope, left in the mailbox until a receive matches one; order is kept."""
    from nvlink_emu.ranks.mpi4py_layer import installed

    gpu = _Gpu(_from_peer(*[_tagged(1, bytes([i % 251]) * size) for i in range(count)], _tagged(2, b"last")))
    with installed(gpu):
        out = np.zeros(4, np.uint8)
        MPI.COMM_WORLD.Recv(out, source=1, tag=2)  # behind every tag-1 message
        assert out.tobytes() == b"last"
        assert len(gpu.mailbox) == left  # not taken: the switch holds the sender past its mailbox bound
        status = MPI.Status()
        MPI.COMM_WORLD.Probe(source=1, tag=1, status=status)
        assert status.Get_count(MPI.BYTE) == size
        got = np.zeros(size, np.uint8)
        for i in range(count):
            MPI.COMM_WORLD.Recv(got, source=1, tag=1)
            assert (got == i % 251).all(), i
        assert not gpu.mailbox


def test_a_separate_window_merges_the_programs_stores_and_the_remote_writes():
    """Win.Create over the program's memory: at a synchronisation the bytes the program stored since the
    last one go to the GPU region (the public copy), and the region's other bytes (Puts, accumulates)
    come back into the program's buffer."""
    from nvlink_emu.ranks.mpi4py_layer import win as rma

    window = rma.Win()
    window._user = np.array([1, 2, 3, 4], np.uint8)
    window._snapshot = window._user.copy()
    window._region = window._user.copy()
    window._user[0] = 10  # a local store
    window._region[3] = 40  # a remote Put
    window._merge()
    assert window._user.tolist() == window._region.tolist() == window._snapshot.tolist() == [10, 2, 3, 40]


def test_runs_of_a_target_datatype_are_its_contiguous_stretches():
    from nvlink_emu.ranks.mpi4py_layer.rma_ops import runs

    assert runs(None, 5) == [(0, 5, 0)]
    assert runs(np.array([0, 2, 3, 4, 9]), 5) == [(0, 1, 0), (1, 4, 2), (4, 5, 9)]
    assert runs(np.zeros(0, np.int64), 0) == []


def test_a_shared_window_is_refused_with_the_reason_and_as_mpi4py_probes_for_it():
    with pytest.raises(NotImplementedError, match="NVLink does not merge GPU memories"):
        MPI.Win.Allocate_shared(8, 1, None, None)
    with pytest.raises(UnsupportedOperation, match="does not merge GPU memories"):
        MPI.Win.Allocate_shared(8, 1, None, None)
    assert MPI.Win() == MPI.WIN_NULL and not MPI.WIN_NULL


def test_a_window_serves_only_its_members_and_never_raises_into_the_targets_wait():
    """The target's server of window requests (run inside whatever wait the target is in): a request of a
    GPU outside the group, or malformed, is dropped and counted; one naming no predefined op or a type of
    Python objects is answered with a refusal; a good one is applied and answered with the old values."""
    import types

    from nvlink_emu.ranks.mpi4py_layer import win as rma

    rma.reset()
    window = rma.Win()
    window._wid, window._members, window._gpu = "w", (0, 1), types.SimpleNamespace(rank=0)
    window._flavor, window._slot = rma.WIN_FLAVOR_ALLOCATE, 64
    window._region, window._attached = np.zeros(16, np.uint8), [(0, np.zeros(8, np.uint8), None)]
    window._inbox = np.zeros(128, np.uint8)
    window._inbox[64:68] = np.array([7], np.int32).view(np.uint8)  # GPU 1's slot: its operand
    rma.open_windows["w"] = window
    nothing = np.zeros(0, np.uint8)
    assert rma.serve(5, ("rma", "w", "rmw", 1, "SUM", "<i4", 0, 1, 1, 1), nothing) == []
    assert rma.serve(1, ("rma", "w", "where", 2, "x", "y"), nothing) == []
    assert rma.refused == {"not a member": 1, "malformed": 1}
    for opname, dtype in (("Finalize", "<i4"), ("SUM", "|O")):
        [(peer, key, _)] = rma.serve(1, ("rma", "w", "rmw", 3, opname, dtype, 0, 1, 1, 1), nothing)
        assert (peer, key[4]) == (1, 1)  # refused, in an answer
    [(peer, key, old)] = rma.serve(1, ("rma", "w", "rmw", 4, "SUM", "<i4", 4, 1, 1, 1), nothing)
    assert (peer, key[4], old.view(np.int32).tolist()) == (1, 0, [0])
    assert window._region[4:8].view(np.int32).tolist() == [7]
    rma.reset()
