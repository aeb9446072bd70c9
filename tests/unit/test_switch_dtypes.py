"""The switch's in-switch reduction and its dtypes: every reduction dtype reduces as the GPUs'
reference does; any other dtype name a GPU sends (bool, complex, aliases, strings numpy would parse)
is refused before anything is held, and the switch keeps serving."""

import numpy as np
import pytest

from nvlink_emu.fabric.counters import downlink, uplink
from nvlink_emu.fabric.packets import Kind
from nvlink_emu.fabric.reduction import DTYPES, OPS, reduce_in_order, switch_accumulator

from switch_helpers import export, handle_of, network, only_nack, ready_group, reduce_packet
from switch_helpers import serves_put


def inputs(dtype, gpus, op):
    rng = np.random.default_rng(7)
    if dtype.kind in "iu":
        top = 3 if op == "prod" else 100
        return [rng.integers(0 if dtype.kind == "u" else -top, top, 64).astype(dtype) for _ in range(gpus)]
    return [rng.uniform(-2.0, 2.0, 64).astype(dtype) for _ in range(gpus)]


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("name", list(DTYPES))
def test_every_reduction_dtype_reduces_in_the_switch_as_the_reference(name, op):
    sw = network()
    gid = ready_group(sw)
    dtype = DTYPES[name]
    data = inputs(dtype, 4, op)
    sends = []
    for gpu in (3, 1, 0, 2):  # arrival order does not matter: members 0..3 are combined in order
        sends = sw.on_packet(gpu, *reduce_packet(gid, (0,), op, name, (1,), ("world", 0), data[gpu]))
    assert [s.port for s in sends] == [1] and sends[0].packet.kind is Kind.MCAST
    expected = reduce_in_order(data, op, switch_accumulator(dtype), dtype)
    assert sends[0].payload.tobytes() == expected.tobytes()
    assert sw.groups.held_bytes == 0 and sw.refused == [0, 0, 0, 0]


@pytest.mark.parametrize("name", ["bool", "complex64", "complex128", "float", "int", "f4", "<f4", ">f4", "uint",
                                  "(1000000000,)f8", "O", "V4", "S4", "datetime64[ns]", "", "x" * 4000])
def test_a_dtype_name_outside_the_reduction_set_is_refused_before_anything_is_held(name):
    sw = network()
    h = handle_of(export(sw, 1))
    gid = ready_group(sw, (0, 1))
    data = np.ones(4, np.float32)
    packet, payload = reduce_packet(gid, (0,), "sum", name, (0, 1), ("world", 0), data, req=5)
    nack = only_nack(sw.on_packet(0, packet, payload), 0, 5)
    assert nack.info.error == "FabricError" and "reductions support int8, uint8" in nack.info.message
    assert len(nack.info.message) < 1500  # a long hostile name is not echoed whole
    assert sw.groups.reductions == {} and sw.groups.held_bytes == 0
    assert sw.refused == [1, 0, 0, 0]
    # the contribution was counted on its uplink (it crossed it), the NACK on the downlink; no delivery
    assert set(sw.counters.snapshot()) == {uplink(0), downlink(0)}
    # the other member's honest contribution to a slot of its own still goes through
    ok = reduce_packet(gid, (1,), "max", "uint16", (1,), ("world", 1), np.arange(4, dtype=np.uint16))
    assert sw.on_packet(0, *ok) == []
    done = sw.on_packet(1, *reduce_packet(gid, (1,), "max", "uint16", (1,), ("world", 1),
                                          np.full(4, 2, np.uint16)))
    assert done[0].payload.view(np.uint16).tolist() == [2, 2, 2, 3]
    serves_put(sw, 2, h)
