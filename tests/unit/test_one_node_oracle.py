"""fabric.cost's closed forms as the oracle of the plans' replay on one node (fabric.cost_nodes.modeled_ns, what
`nvlink-emu model` reports and tests/mpi/test_one_node_replay.py checks emulated runs against): over a grid of
sizes and GPU counts, the replay equals the closed form where the form is exact (to float rounding: the same
bookings summed in another order, 1e-13 relative) and is within the tolerance the form is documented to hold
elsewhere (docs/model/time.md, tests/mpi/test_modeled_time.py: 1%; NVLS allreduce on an engine slower than the
link, a lower bound: -1% to +10%)."""

import pytest

from nvlink_emu.fabric import cost, cost_nodes
from nvlink_emu.fabric.config import PRESETS, preset

PROFILES = ["nvlink4", "ib-ndr", "pcie-gen5", "nvlink4-nccl"]  # tests/mpi/test_modeled_time.py's; the last calibrated
EXACT = 1e-13  # relative: the replay and the form sum the same link times in another order


def base_of(algorithm):
    """In-switch algorithms need NVLink Network with SHARP; the rest run on a forwarding switch (as
    tests/mpi/test_modeled_time.py)."""
    return "dgx-h100" if algorithm in ("sharp", "nvls") else "h100-ib"


def pairs():
    return [(c, a) for a in cost.ALGORITHMS for c in cost.IMPLEMENTS[a]]


@pytest.mark.parametrize("link", PROFILES)
@pytest.mark.parametrize("n", [3, 4, 5, 8])
def test_the_replay_is_the_closed_form_where_it_is_documented(link, n):
    """The closed forms' documented grid (docs/model/time.md): N KiB to 4N MiB, whole MTU packets a block, a
    switch buffer that never shrinks in-switch messages. Exact for every pair but NVLS allreduce, which is
    exact where it is link-bound and pipelined (fabric.cost.nvls_pipelined), within 1% in one piece a block,
    and a lower bound, +10% at most, where the engine is slower than the link."""
    unit = n * 4 * 256
    for collective, algorithm in pairs():
        config = preset(base_of(algorithm), gpus=n, link=link, switch_buffer_bytes=1 << 30)
        t = config.timing
        for S in (unit, 64 * unit, 1024 * unit, 4096 * unit):
            got = cost_nodes.modeled_ns(collective, algorithm, config.topology, S, config, 4)
            want = cost.modeled_ns(collective, algorithm, S, n, config, 4)
            case = (collective, algorithm, link, n, S, got, want)
            if (collective, algorithm) != ("allreduce", "nvls"):
                assert got == pytest.approx(want, rel=EXACT), case
            elif t.reduction_gbytes_per_s < t.bandwidth_gbytes_per_s and S >= 64 * unit:
                assert want * 0.99 <= got <= want * 1.10, case
            elif cost.nvls_pipelined(S, n, config):
                assert got == pytest.approx(want, rel=EXACT), case
            else:
                assert got == pytest.approx(want, rel=0.01), case


EXACT_PAIRS = [("allreduce", "ring"), ("reduce_scatter", "ring"), ("allgather", "ring"), ("broadcast", "ring"),
               ("allreduce", "direct"), ("reduce_scatter", "direct"), ("allgather", "direct"), ("broadcast", "direct"),
               ("all2all", "direct"), ("allreduce", "sharp"), ("allgather", "sharp"), ("broadcast", "sharp"),
               ("allgather", "nvls"), ("broadcast", "nvls")]


@pytest.mark.parametrize("name", [p for p in PRESETS if not p.startswith(("superpod", "dgx-gh200"))])
def test_the_replay_is_the_exact_closed_forms_on_every_one_node_preset(name):
    """Where the form is exact whatever the size (ring, direct, sharp's push allreduce and the multicast
    stores), the replay is it on every one-node preset at its own switch buffer, 2 to 8 GPUs, sizes from a
    few elements to 4N MiB, uneven blocks included, 4- and 2-byte elements."""
    for n in (2, 3, 5, 8):
        config = preset(name, gpus=n)
        in_switch = config.mode == "network" and config.sharp
        for collective, algorithm in EXACT_PAIRS:
            if algorithm in ("sharp", "nvls") and not in_switch:
                continue
            for S in (3 * n * 4, n * 4 * 1000 + 4 * n, n * 4 * 256 * 64, n * (4 << 20)):
                for item in (4, 2):
                    got = cost_nodes.modeled_ns(collective, algorithm, config.topology, S, config, item)
                    want = cost.modeled_ns(collective, algorithm, S, n, config, item)
                    assert got == pytest.approx(want, rel=EXACT), (collective, algorithm, name, n, S, item, got, want)
