"""fabric.switch.SwitchLogic, NVLink SHARP paths (pure, no MPI): groups, REDUCE, MCAST, LOAD_REDUCE, counting."""

import numpy as np
import pytest

from nvlink_emu.fabric.config import preset
from nvlink_emu.fabric.counters import downlink, uplink
from nvlink_emu.fabric.errors import ProtocolError
from nvlink_emu.fabric.packets import GroupInfo, Kind, LoadInfo, McastInfo, Packet, ReduceInfo, raw_bytes, segments
from nvlink_emu.fabric.reduction import reduce_in_order
from nvlink_emu.fabric.switch import SwitchLogic
from switch_helpers import group_call, mcast_packet, only_nack, ready_group, reduce_packet


def h100(gpus=4, **kw):
    return SwitchLogic(preset("dgx-h100", gpus=gpus, **kw))


def link(sw, payload, times=1):
    """Counters of one link that carried `times` transfers of `payload` bytes, with the switch's MTU and header."""
    mtu, header = sw.config.mtu_bytes, sw.config.header_bytes
    return {"payload_bytes": payload * times, "raw_bytes": raw_bytes(payload, mtu, header) * times,
            "packets": segments(payload, mtu) * times, "busy_ns": 0.0}  # busy time is kept by the GPU end


# -- GROUP control packets ------------------------------------------------------------------------------------

def test_group_create_bind_release_replies():
    sw = h100()
    assert group_call(sw, 1, req=5, action="create", members=[1, 2, 3], name="world") == {"group": 1}
    for gpu in (3, 1, 2):
        assert group_call(sw, gpu, req=6, action="bind", group=1) == {"group": 1}
    assert sw.groups.groups[1].ready and sw.groups.groups[1].members == (1, 2, 3)
    assert sw.groups.groups[1].name == "world" and sw.groups.groups[1].partition == 0
    assert group_call(sw, 2, req=7, action="release", group=1) == {"group": 1}
    assert sw.groups.groups == {}
    assert (sw.groups.created, sw.groups.released) == (1, 1)
    assert sw.counters.snapshot() == {}  # the control plane is never counted
    assert sw.violations == [0, 0, 0, 0]


def test_group_errors_are_replies():
    sw = h100()
    gid = group_call(sw, 0, action="create", members=[0, 1], name="world")["group"]
    bad_bind = group_call(sw, 2, action="bind", group=gid)
    assert bad_bind["error"] == "AccessViolation" and "not a member" in bad_bind["message"]
    assert "group" not in bad_bind
    dead = group_call(sw, 0, action="bind", group=99)
    assert dead["error"] == "AccessViolation" and "no live group 99" in dead["message"]
    not_me = group_call(sw, 3, action="create", members=[0, 1], name="world")
    assert not_me["error"] == "FabricError" and "GPU 3" in not_me["message"]
    unknown = group_call(sw, 0, action="explode", group=gid)
    assert unknown["error"] == "ProtocolError" and "'explode'" in unknown["message"]
    assert sw.violations == [0, 0, 0, 0]  # control-plane refusals are replies, not data-plane violations
    assert sw.refused == [2, 0, 1, 1]     # ... but each is counted on the caller's port


def test_group_create_without_communicator_name_refused():
    sw = h100()
    reply = group_call(sw, 0, action="create", members=[0, 1], name="")
    assert reply["error"] == "ProtocolError" and "communicator's name" in reply["message"]
    assert sw.groups.groups == {} and sw.refused == [1, 0, 0, 0]


def test_group_create_limit_replies_resource_exhausted():
    sw = h100(gpus=2)
    ids = [group_call(sw, 0, action="create", members=[0, 1], name="world")["group"] for _ in range(128)]
    full = group_call(sw, 1, action="create", members=[0, 1], name="world")
    assert full["error"] == "ResourceExhausted" and "limit is 128" in full["message"]
    unbound = group_call(sw, 0, action="release", group=ids[0])
    assert unbound["error"] == "AccessViolation" and "has not bound group" in unbound["message"]
    group_call(sw, 0, action="bind", group=ids[0])  # only a bound member releases
    group_call(sw, 0, action="release", group=ids[0])
    assert "group" in group_call(sw, 1, action="create", members=[0, 1], name="world")


def test_group_create_across_partitions_refused():
    sw = h100(partitions=((0, 1), (2, 3)))
    reply = group_call(sw, 0, action="create", members=[0, 1, 2], name="world")
    assert reply["error"] == "AccessViolation"
    assert "GPUs [2] are in another partition" in reply["message"] and "GPU 0" in reply["message"]
    assert sw.groups.groups == {}
    # inside its own partition it works
    assert group_call(sw, 3, action="create", members=[2, 3], name="world") == {"group": 1}


@pytest.mark.parametrize("members", [[0, 9], [0, -1]])
def test_group_create_with_non_gpu_member_is_error_reply(members):
    sw = h100()
    reply = group_call(sw, 0, action="create", members=members, name="world")
    assert reply["error"] in ("FabricError", "AccessViolation")
    assert sw.groups.groups == {}


def test_group_create_with_non_integer_member_does_not_decode():
    # a member that is not an integer no longer reaches the switch's logic: the typed record refuses it
    wire = Packet(Kind.GROUP, 0, -1, info=GroupInfo("create", 0, (0, "x"), "world")).to_wire()
    with pytest.raises(ProtocolError, match="'members' must be a list"):
        Packet.from_wire(wire)


# -- REDUCE ---------------------------------------------------------------------------------------------------

def test_reduce_waits_for_last_then_multicasts_to_dest():
    sw = h100()
    gid = ready_group(sw)
    data = {g: np.arange(100, dtype=np.float32) * (g + 1) for g in range(4)}   # 400 bytes each
    key = ("world", 3, 0, 0)
    for gpu in (2, 0, 3):
        packet, payload = reduce_packet(gid, (3, 0), "sum", "float32", [0, 1, 2, 3], key, data[gpu])
        assert sw.on_packet(gpu, packet, payload) == []
    assert sw.groups.held_bytes == 1200
    packet, payload = reduce_packet(gid, (3, 0), "sum", "float32", [0, 1, 2, 3], key, data[1])
    sends = sw.on_packet(1, packet, payload)
    assert [s.port for s in sends] == [0, 1, 2, 3]
    expected = reduce_in_order([data[g] for g in range(4)], "sum")
    for send in sends:
        out = send.packet
        assert out.kind is Kind.MCAST and out.src == -1 and out.dst == sw.route_key(send.port)
        assert out.nbytes == 400 and out.info == McastInfo(gid, key) and out.address == 0
        assert send.payload.dtype == np.uint8 and send.payload.tobytes() == expected.tobytes()
    assert sw.groups.held_bytes == 0 and sw.groups.reduced_bytes == 1600
    # each contribution on its uplink, each delivery on its downlink, nothing else
    assert sw.counters.snapshot() == {**{uplink(g): link(sw, 400) for g in range(4)},
                                      **{downlink(g): link(sw, 400) for g in range(4)}}
    assert sw.violations == [0, 0, 0, 0]


def test_reduce_counters_exact_numbers():
    sw = h100()
    assert (sw.config.mtu_bytes, sw.config.header_bytes) == (256, 16)
    gid = ready_group(sw, (0, 1), name="k")
    data = np.ones(250, np.float64)  # 2000 bytes: 8 packets of at most 256 bytes
    for gpu in (0, 1):
        sw.on_packet(gpu, *reduce_packet(gid, (0,), "sum", "float64", [0, 1], ["k"], data))
    expected = {"payload_bytes": 2000, "raw_bytes": 2000 + 8 * 16, "packets": 8, "busy_ns": 0.0}
    assert sw.counters.snapshot() == {uplink(0): expected, uplink(1): expected,
                                      downlink(0): expected, downlink(1): expected}


def test_reduce_to_one_destination_reduce_scatter_style():
    sw = h100()
    gid = ready_group(sw, name="w")
    data = {g: np.full(64, g + 1, np.int32) for g in range(4)}  # 256 bytes each
    sends = []
    for gpu in (3, 2, 1, 0):
        sends += sw.on_packet(gpu, *reduce_packet(gid, (0, 2, 0), "max", "int32", [2], ["w", 0, 1, 2, 0], data[gpu]))
    assert len(sends) == 1
    assert sends[0].port == 2 and sends[0].packet.info == McastInfo(gid, ("w", 0, 1, 2, 0))
    np.testing.assert_array_equal(sends[0].payload.view(np.int32), np.full(64, 4, np.int32))
    assert sw.counters.snapshot() == {**{uplink(g): link(sw, 256) for g in range(4)}, downlink(2): link(sw, 256)}


def test_reduce_combines_in_member_order_not_arrival():
    sw = h100()
    members = (2, 0, 3, 1)  # communicator rank order, not GPU order
    gid = ready_group(sw, members)
    rng = np.random.default_rng(3)
    data = {g: (rng.standard_normal(512) * 10.0 ** rng.integers(-3, 4, 512)).astype(np.float32) for g in members}
    expected = reduce_in_order([data[g] for g in members], "sum")
    naive = ((data[1] + data[3]) + data[0]) + data[2]  # arrival order below
    assert expected.tobytes() != naive.tobytes()
    results = []
    for slot, order in enumerate([(1, 3, 0, 2), (2, 0, 3, 1), (0, 1, 2, 3)]):
        sends = []
        for gpu in order:
            sends += sw.on_packet(gpu, *reduce_packet(gid, (slot,), "sum", "float32", [0], ["world", slot], data[gpu]))
        results.append(sends[0].payload.tobytes())
    assert results == [expected.tobytes()] * 3


def test_reduce_float16_in_the_switch_accumulates_in_float32():
    sw = h100()
    gid = ready_group(sw, name="k")
    data = {0: np.array([2048.0], np.float16), 1: np.array([1.0], np.float16), 2: np.array([1.0], np.float16),
            3: np.array([1.0], np.float16)}
    sends = []
    for gpu in (3, 2, 1, 0):
        sends += sw.on_packet(gpu, *reduce_packet(gid, (0,), "sum", "float16", [0, 1, 2, 3], ["k"], data[gpu]))
    assert len(sends) == 4
    assert float(sends[0].payload.view(np.float16)[0]) == 2052.0  # not 2048 from per-step float16 rounding


def test_reduce_avg_in_the_switch():
    sw = h100()
    gid = ready_group(sw, (0, 1, 2), name="k")
    sends = []
    for gpu, v in ((0, [3, -5]), (1, [4, 0]), (2, [5, 0])):
        sends += sw.on_packet(gpu, *reduce_packet(gid, (0,), "avg", "int64", [1], ["k"], np.array(v, np.int64)))
    np.testing.assert_array_equal(sends[0].payload.view(np.int64), [4, -2])  # 12 // 3, -5 // 3 (floor)


def test_reduce_from_non_member_nacked():
    sw = h100()
    gid = ready_group(sw, (0, 1, 2), name="k")
    packet, payload = reduce_packet(gid, (0,), "sum", "float32", [0, 1, 2], ["k"], np.ones(8, np.float32), req=77)
    nack = only_nack(sw.on_packet(3, packet, payload), 3, 77)
    assert nack.dst == sw.route_key(3) and nack.src == -1
    assert nack.info.error == "AccessViolation" and nack.info.kind == "REDUCE"
    assert "GPU 3" in nack.info.message and "not a member" in nack.info.message
    assert sw.violations == [0, 0, 0, 1]
    assert sw.groups.held_bytes == 0
    # the REDUCE was counted on the way in; only the header-only NACK went out, to GPU 3
    assert sw.counters.snapshot() == {uplink(3): link(sw, 32), downlink(3): link(sw, 0)}


def test_reduce_to_unknown_group_nacked():
    sw = h100()
    packet, payload = reduce_packet(12, (0,), "sum", "float32", [0], ["k"], np.ones(2, np.float32), req=4)
    nack = only_nack(sw.on_packet(0, packet, payload), 0, 4)
    assert nack.info.error == "AccessViolation" and "no live group 12" in nack.info.message
    assert sw.violations == [1, 0, 0, 0]


def test_reduce_before_all_bound_nacked():
    sw = h100()
    gid = group_call(sw, 0, action="create", members=[0, 1], name="k")["group"]
    group_call(sw, 0, action="bind", group=gid)
    packet, payload = reduce_packet(gid, (0,), "sum", "float32", [0, 1], ["k"], np.ones(2, np.float32), req=9)
    nack = only_nack(sw.on_packet(0, packet, payload), 0, 9)
    assert nack.info.error == "AccessViolation" and "not bound by all members" in nack.info.message
    assert sw.violations == [1, 0, 0, 0]


def test_release_drops_held_reduction_later_reduce_nacked():
    sw = h100()
    gid = ready_group(sw, (0, 1), name="k")
    assert sw.on_packet(0, *reduce_packet(gid, (0,), "sum", "int32", [0, 1], ["k"], np.ones(4, np.int32))) == []
    assert sw.groups.held_bytes == 16
    group_call(sw, 1, action="release", group=gid)
    assert sw.groups.held_bytes == 0
    packet, payload = reduce_packet(gid, (0,), "sum", "int32", [0, 1], ["k"], np.ones(4, np.int32), req=3)
    nack = only_nack(sw.on_packet(1, packet, payload), 1, 3)
    assert "no live group" in nack.info.message


def test_reduce_with_non_member_dest_nacked_on_arrival():
    sw = h100()
    gid = ready_group(sw, (0, 1, 2), name="k")
    packet, payload = reduce_packet(gid, (0,), "sum", "float32", [0, 3], ["k"], np.ones(4, np.float32), req=8)
    nack = only_nack(sw.on_packet(0, packet, payload), 0, 8)  # GPU 3 is not a member: refuse GPU 0's request
    assert nack.info.error == "AccessViolation" and "GPU 3" in nack.info.message
    assert sw.violations == [1, 0, 0, 0]
    assert sw.groups.held_bytes == 0


@pytest.mark.parametrize("second", ["duplicate", "op"])
def test_reduce_mismatch_nacked_to_sender(second):
    sw = h100()
    gid = ready_group(sw, (0, 1, 2), name="k")
    sw.on_packet(0, *reduce_packet(gid, (0,), "sum", "float32", [0, 1, 2], ["k"], np.ones(4, np.float32)))
    gpu, op = (0, "sum") if second == "duplicate" else (1, "max")
    packet, payload = reduce_packet(gid, (0,), op, "float32", [0, 1, 2], ["k"], np.ones(4, np.float32), req=6)
    nack = only_nack(sw.on_packet(gpu, packet, payload), gpu, 6)
    assert nack.info.error == "CollectiveMismatch"


# -- MCAST ----------------------------------------------------------------------------------------------------

def test_mcast_copy_to_every_member_sender_included():
    sw = h100()
    gid = ready_group(sw, (3, 1, 2))
    payload = (np.arange(700) % 251).astype(np.uint8)
    key = ("world", 1, 2, 1, 0)
    sends = sw.on_packet(1, *mcast_packet(gid, key, payload, req=2))
    assert [s.port for s in sends] == [3, 1, 2]  # member order, the sender (1) included
    for send in sends:
        assert send.payload is payload  # the same bytes go out of every port, no copy in the logic
        out = send.packet
        assert out.kind is Kind.MCAST and out.dst == sw.route_key(send.port) and out.src == -1
        assert out.nbytes == 700 and out.info == McastInfo(gid, key)  # deliveries name the group
    assert sw.counters.snapshot() == {uplink(1): link(sw, 700), downlink(1): link(sw, 700),
                                      downlink(2): link(sw, 700), downlink(3): link(sw, 700)}
    assert sw.counters.get(downlink(0)).packets == 0
    assert sw.groups.held_bytes == 0


def test_mcast_counts_add_up_over_several_senders():
    sw = h100()
    gid = ready_group(sw)
    for gpu in range(4):
        payload = np.full(300, gpu, np.uint8)
        sw.on_packet(gpu, *mcast_packet(gid, ("world", gpu), payload))
    for gpu in range(4):
        assert sw.counters.snapshot()[uplink(gpu)] == link(sw, 300)
        assert sw.counters.snapshot()[downlink(gpu)] == link(sw, 300, times=4)


def test_mcast_from_non_member_nacked():
    sw = h100()
    gid = ready_group(sw, (0, 1))
    payload = np.zeros(64, np.uint8)
    nack = only_nack(sw.on_packet(2, *mcast_packet(gid, ("world", 0), payload, req=5)), 2, 5)
    assert nack.info.error == "AccessViolation" and nack.info.kind == "MCAST"
    assert sw.violations == [0, 0, 1, 0]
    assert sw.counters.snapshot() == {uplink(2): link(sw, 64), downlink(2): link(sw, 0)}


# -- LOAD_REDUCE (NVLS) ---------------------------------------------------------------------------------------

def load_reduce_info(gid, gpu, slot, key, source):
    """The record Call.load_reduce sends (LoadInfo); the REDUCE answers carry its contribution()."""
    return LoadInfo(gid, tuple(slot), "sum", "float32", (gpu,), tuple(key), tuple(source))


def test_load_reduce_sends_header_only_load_to_every_member():
    sw = h100()
    gid = ready_group(sw, (1, 3, 0), name="w")
    info = load_reduce_info(gid, 3, (0, 1, 0), ["w", 0, 4, 0], ["w", 0, "nvls-bound"])
    request = Packet(Kind.LOAD_REDUCE, src=0, dst=-1, address=1024, nbytes=512, req=11, info=info)
    sends = sw.on_packet(3, request)
    assert [s.port for s in sends] == [1, 3, 0]
    for send in sends:
        assert send.payload is None
        load = send.packet
        assert load.kind is Kind.LOAD and load.src == -1 and load.dst == sw.route_key(send.port)
        assert (load.address, load.nbytes, load.req) == (1024, 512, 11)
        assert load.info == info
        assert load.payload_bytes == 0
    header_only = link(sw, 0)
    assert header_only == {"payload_bytes": 0, "raw_bytes": sw.config.header_bytes, "packets": 1, "busy_ns": 0.0}
    assert sw.counters.snapshot() == {uplink(3): header_only, downlink(1): header_only,
                                      downlink(3): header_only, downlink(0): header_only}
    assert sw.groups.held_bytes == 0


def test_load_reduce_round_trip():
    sw = h100()
    gid = ready_group(sw, name="w")
    info = load_reduce_info(gid, 2, (0, 2, 0), ["w", 0, 4, 0], ["w", 0, "nvls-bound"])
    loads = sw.on_packet(2, Packet(Kind.LOAD_REDUCE, 0, -1, address=0, nbytes=40, req=1, info=info))
    buffers = {g: np.arange(10, dtype=np.float32) + 10 * g for g in range(4)}
    results = []
    for load in reversed(loads):  # each GPU answers a LOAD with a REDUCE of the LOAD's contribution() (serve_load)
        gpu = load.port
        data = buffers[gpu].view(np.uint8)[load.packet.address:load.packet.address + load.packet.nbytes]
        answer = Packet(Kind.REDUCE, src=sw.route_key(gpu), dst=-1, nbytes=load.packet.nbytes,
                        req=load.packet.req, info=load.packet.info.contribution())
        assert answer.info == ReduceInfo(gid, (0, 2, 0), "sum", "float32", (2,), ("w", 0, 4, 0))
        results += sw.on_packet(gpu, answer, data)
    assert len(results) == 1
    send = results[0]
    assert send.port == 2 and send.packet.kind is Kind.MCAST and send.packet.info == McastInfo(gid, ("w", 0, 4, 0))
    np.testing.assert_array_equal(send.payload.view(np.float32), sum(buffers[g] for g in range(4)))
    header = link(sw, 0)
    assert sw.counters.snapshot() == {
        uplink(0): link(sw, 40), uplink(1): link(sw, 40), uplink(3): link(sw, 40),
        uplink(2): {k: header[k] + link(sw, 40)[k] for k in header},            # LOAD_REDUCE + its REDUCE
        downlink(0): header, downlink(1): header, downlink(3): header,
        downlink(2): {k: header[k] + link(sw, 40)[k] for k in header},          # its LOAD + the result
    }


def test_load_reduce_from_non_member_nacked():
    sw = h100()
    gid = ready_group(sw, (0, 1), name="k")
    info = load_reduce_info(gid, 3, (0,), ["k"], ["k", "s"])
    nack = only_nack(sw.on_packet(3, Packet(Kind.LOAD_REDUCE, 0, -1, nbytes=16, req=2, info=info)), 3, 2)
    assert nack.info.error == "AccessViolation" and nack.info.kind == "LOAD_REDUCE"
    assert sw.violations == [0, 0, 0, 1]


# -- fabrics without SHARP ------------------------------------------------------------------------------------

NO_SHARP = [pytest.param(lambda: SwitchLogic(preset("dgx-a100", gpus=4)), "dgx-a100", id="dgx-a100"),
            pytest.param(lambda: h100(sharp=False), "dgx-h100", id="h100-sharp-false")]


@pytest.mark.parametrize("make, name", NO_SHARP)
@pytest.mark.parametrize("action", [{"action": "create", "members": [0, 1], "name": "world"},
                                    {"action": "bind", "group": 1}, {"action": "release", "group": 1}])
def test_group_calls_unsupported_without_sharp(make, name, action):
    sw = make()
    reply = group_call(sw, 1, req=3, **action)
    assert reply["error"] == "UnsupportedOperation"
    assert repr(name) in reply["message"] and "GPU 1" in reply["message"]
    assert "group" not in reply
    assert sw.groups.groups == {}


IN_SWITCH_INFO = {Kind.REDUCE: ReduceInfo(1, (0,), "sum", "float32", (0,), ("k",)),
                  Kind.MCAST: McastInfo(1, ("k",)),
                  Kind.LOAD_REDUCE: LoadInfo(1, (0,), "sum", "float32", (0,), ("k",), ("s",))}


@pytest.mark.parametrize("make, name", NO_SHARP)
@pytest.mark.parametrize("kind", [Kind.REDUCE, Kind.MCAST, Kind.LOAD_REDUCE])
def test_in_switch_data_unsupported_without_sharp_nacked(make, name, kind):
    sw = make()
    payload = np.zeros(16, np.uint8) if kind.has_payload else None
    sends = sw.on_packet(2, Packet(kind, src=0, dst=-1, nbytes=16, req=4, info=IN_SWITCH_INFO[kind]), payload)
    nack = only_nack(sends, 2, 4)
    assert nack.info.error == "UnsupportedOperation" and nack.info.kind == kind.name
    assert repr(name) in nack.info.message and "GPU 2" in nack.info.message
