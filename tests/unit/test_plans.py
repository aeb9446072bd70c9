"""fabric.plans: the validator's refusals (each naming GPU, step, chunk), the MSCCL-IR loader and its
bounds, the replay interpreter against fabric.replay's ring and hand-computed closed forms."""

import copy
import dataclasses
import math
import pickle
import time
from pathlib import Path

import numpy as np
import pytest

from nvlink_emu.fabric import cost, cost_nodes, plans, replay
from nvlink_emu.fabric.plans import chunks, registry, timing
from nvlink_emu.fabric.plans.catalog import call_plan
from nvlink_emu.fabric.config import preset, resolve
from nvlink_emu.fabric.errors import PlanError
from nvlink_emu.fabric.packets import raw_bytes
from nvlink_emu.fabric.reduction import blocks, channel_rings, ring_channel_count
from nvlink_emu.fabric.plans.format import Op, Plan, Ref
from nvlink_emu.fabric.programs import Flush, Recv, Send
from nvlink_emu.fabric.topology import Topology

HERE = Path(__file__).parent / "plans"


def _with_ops(plan: Plan, g: int, ops) -> Plan:
    programs = list(plan.programs)
    programs[g] = dataclasses.replace(programs[g], ops=tuple(ops))
    return dataclasses.replace(plan, programs=tuple(programs))


# -- the registry's plans ------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["dgx-h100", "dgx-a100", "dgx-h100-line"])
@pytest.mark.parametrize("gpus", [2, 3, 5, 8])
def test_the_ring_plan_times_exactly_as_the_replayed_ring(name, gpus):
    config = preset(name, gpus=gpus)
    topo = Topology.single(config)
    for collective in ("allreduce", "reduce_scatter", "allgather"):
        plan = plans.build("ring", gpus, collective)
        for size in (gpus * 1024, gpus << 20, gpus * 3 << 20, gpus * 4096 + 12):  # one chunk, several, uneven
            got = plans.plan_ns(plan, topo, size, config)
            assert got == replay.replay_ns(collective, "ring", topo, size, config), (collective, size)
            if size % (4 * gpus) == 0:  # fabric.cost's one-node closed form, the oracle
                assert math.isclose(got, cost.links_ns(collective, "ring", size, gpus, config), rel_tol=1e-12)


@pytest.mark.parametrize("gpus", [3, 8])
def test_the_ring_plans_link_bytes_are_the_rings(gpus):
    config = preset("dgx-h100", gpus=gpus)
    topo = Topology.single(config)
    S = gpus << 20
    per = {"allreduce": 2 * (gpus - 1) * S // gpus, "reduce_scatter": (gpus - 1) * S // gpus,
           "allgather": (gpus - 1) * S // gpus}
    for collective, payload in per.items():
        links = plans.plan_link_bytes(plans.build("ring", gpus, collective), topo, S, config)
        assert len(links) == 2 * gpus  # every uplink and downlink
        messages = payload // (1 << 20)  # 1 MiB blocks, each one message (chunk_bytes: 4 MiB)
        assert config.chunk_bytes >= 1 << 20
        assert all(v == (payload, messages * raw_bytes(1 << 20, config.mtu_bytes, config.header_bytes))
                   for v in links.values()), (collective, links)


@pytest.mark.parametrize("name", ["dgx-h100", "dgx-a100"])
@pytest.mark.parametrize("gpus", [2, 3, 5, 8])
def test_the_direct_plan_has_the_closed_forms_time_and_the_cost_models_bytes(name, gpus):
    config = preset(name, gpus=gpus)
    topo = Topology.single(config)
    for collective in ("allreduce", "reduce_scatter", "allgather", "broadcast", "all2all"):
        for size in (gpus * 1024, gpus << 20, gpus * 3 << 20, gpus * 4096 + 12):  # one chunk, several, uneven
            for root in ((0, gpus - 1) if collective == "broadcast" else (0,)):
                plan = plans.build("direct", gpus, collective, root)
                links = plans.plan_link_bytes(plan, topo, size, config)
                want = cost_nodes.link_bytes(collective, "direct", topo, size, root=root)
                assert {k: v[0] for k, v in links.items()} == {k: v for k, v in want.items() if v}, (collective, size)
                if size % (4 * gpus) == 0 and root == 0:  # fabric.cost's one-node closed form, the oracle
                    got = plans.plan_ns(plan, topo, size, config)
                    assert math.isclose(got, cost.links_ns(collective, "direct", size, gpus, config),
                                        rel_tol=1e-12), (collective, size)


def test_the_direct_plan_folds_in_member_order():
    # GPU 2's block: GPU 0's part first, then 1's, its own at its turn (direct.py's combine order)
    ops = plans.build("direct", 4, "reduce_scatter").programs[2].ops
    folds = [(op.kind, op.src, op.dst) for op in ops if op.kind in ("copy", "reduce")]
    assert folds == [("copy", Ref("s", 0), Ref("o", 0)), ("reduce", Ref("s", 1), Ref("o", 0)),
                     ("reduce", Ref("i", 2), Ref("o", 0)), ("reduce", Ref("s", 3), Ref("o", 0))]
    ops = plans.build("direct", 4, "allreduce").programs[2].ops  # in place: its own part saved first
    folds = [(op.kind, op.src, op.dst) for op in ops if op.kind in ("copy", "reduce")]
    assert folds == [("copy", Ref("o", 2), Ref("s", 2)), ("copy", Ref("s", 0), Ref("o", 2)),
                     ("reduce", Ref("s", 1), Ref("o", 2)), ("reduce", Ref("s", 2), Ref("o", 2)),
                     ("reduce", Ref("s", 3), Ref("o", 2))]


@pytest.mark.parametrize("gpus", [2, 4, 8])
def test_recursive_doubling_is_log2_n_exchanges(gpus):
    # one message a step (S <= chunk_bytes): uplink R/B + a, the leaf s, the downlink's latency a;
    # each exchange starts when the last one's message is in: log2(n) (R/B + 2a + s)
    config = preset("dgx-h100", gpus=gpus)
    topo = Topology.single(config)
    S = 64 * 1024
    R = raw_bytes(S, config.mtu_bytes, config.header_bytes)
    a, s, B = topo.gpu_latency_ns, topo.switch_latency_ns, topo.gpu_gbytes_per_s
    want = int(math.log2(gpus)) * (R / B + 2 * a + s)
    got = plans.plan_ns(plans.build("recursive_doubling", gpus, "allreduce"), topo, S, config)
    assert got == pytest.approx(want, rel=1e-12)
    links = plans.plan_link_bytes(plans.build("recursive_doubling", gpus, "allreduce"), topo, S, config)
    assert set(links.values()) == {(int(math.log2(gpus)) * S, int(math.log2(gpus)) * R)}


def test_the_registry_keeps_its_plans_by_what_they_cost(monkeypatch):
    # at most KEPT_OPERATIONS operations over every kept plan (hier's at 256 GPUs and 1 GiB holds ~1 GB a
    # size), the least recently used dropped first, the newest always kept; a kept plan is the same object
    def cost(plan):
        return sum(len(program.ops) for program in plan.programs)

    monkeypatch.setattr(registry, "_kept", {})
    first = plans.build("ring", 8, "allreduce")
    assert first is plans.build("ring", 8, "allreduce")
    scatter = plans.build("ring", 8, "reduce_scatter")
    gather = registry.ALGORITHMS["ring"](8, "allgather", 0, None)  # not built through the registry: its cost
    monkeypatch.setattr(registry, "KEPT_OPERATIONS", cost(first) + cost(scatter) + cost(gather) - 1)
    assert first is plans.build("ring", 8, "allreduce")  # now the most recently used
    plans.build("ring", 8, "allgather")  # over the budget: reduce_scatter's goes, allreduce's stays
    assert first is plans.build("ring", 8, "allreduce")
    assert [key[2] for key in registry._kept] == ["allgather", "allreduce"]
    monkeypatch.setattr(registry, "KEPT_OPERATIONS", 1)  # a plan over the whole budget: the newest, alone
    newest = plans.build("direct", 8, "allgather")
    assert list(registry._kept.values()) == [(newest, cost(newest))]
    again = plans.build("ring", 8, "allreduce")
    assert again is not first and again == first


def test_a_tuple_of_operations_gpus_share_is_checked_for_every_gpu_it_names():
    # the validator passes a shared tuple once for the GPUs it does not name; GPU 1 sending to itself in
    # GPU 0's program, shared by every GPU, is still refused at GPU 1 (and GPU 2's receive from itself)
    plan = plans.build("direct", 3, "allgather")
    shared = plan.programs[0].ops
    bad = dataclasses.replace(plan, programs=tuple(dataclasses.replace(p, ops=shared) for p in plan.programs))
    with pytest.raises(PlanError, match=r"^GPU 1 step 1 \(send, channel 0\): send_to 1 is not another GPU"):
        plans.validate(bad)
    programs = (plan.programs[0], plan.programs[0], dataclasses.replace(plan.programs[2], ops=shared))
    bad = dataclasses.replace(plan, programs=tuple(dataclasses.replace(p, gpu=g) for g, p in enumerate(programs)))
    with pytest.raises(PlanError, match=r"^GPU 1 step 1 \(send, channel 0\): send_to 1"):
        plans.validate(bad)


def test_the_registry_refuses_what_it_cannot_build():
    with pytest.raises(PlanError, match="6 GPUs is not a power of two"):
        plans.build("recursive_doubling", 6, "allreduce")
    with pytest.raises(PlanError, match="no plan algorithm 'bogus'"):
        plans.build("bogus", 4, "allreduce")
    with pytest.raises(PlanError, match="hier_nvls plan: it is built for a call's size and the leaf's buffer share"):
        plans.build("hier_nvls", 4, "allreduce")
    with pytest.raises(PlanError, match="hier_nvls plan: its node stages run in the leaf on N > 1 nodes of G > 1"):
        plans.build("hier_nvls", 4, "allreduce", layout=((0, 1, 2, 3),), shape=(16, 4, 4, 4, 1 << 20))
    with pytest.raises(PlanError, match="nvls plan: it is built for a call's size and the fabric's switch buffer"):
        plans.build("nvls", 4, "allreduce")
    with pytest.raises(PlanError, match="nvls plan: no allgather"):
        plans.build("nvls", 4, "allgather", shape=(16, 4, 2))
    with pytest.raises(PlanError, match="sharp plan: it is built for a call's size and the fabric's switch buffer"):
        plans.build("sharp", 4, "allreduce")
    with pytest.raises(PlanError, match="tree plan: it is built for a call's size"):
        plans.build("tree", 4, "allreduce", layout=registry.grid(2, 2))
    with pytest.raises(PlanError, match="tree plan: no broadcast"):
        plans.build("tree", 4, "broadcast", layout=registry.grid(2, 2), nbytes=1 << 20, chunk_bytes=1 << 20)
    with pytest.raises(PlanError, match="ring plan: no all2all"):
        plans.build("ring", 4, "all2all")


def test_a_plan_runs_only_on_its_gpu_count_and_fabrics():
    config = preset("dgx-h100", gpus=4)
    with pytest.raises(PlanError, match="for 8 GPUs, the fabric has 4"):
        plans.plan_ns(plans.build("ring", 8, "allreduce"), Topology.single(config), 1 << 20, config)
    plan = dataclasses.replace(plans.build("ring", 4, "allreduce"), fabrics=("classic",))
    with pytest.raises(PlanError, match="runs on classic fabrics, not 'network'"):
        plans.plan_ns(plan, Topology.single(config), 1 << 20, config)


# -- the validator's refusals ---------------------------------------------------------------------

def test_a_reduction_counting_a_contribution_twice_is_refused():
    plan = plans.build("ring", 4, "allreduce")
    ops = list(plan.programs[2].ops)
    ops.insert(0, Op("reduce", src=Ref("i", 1), dst=Ref("o", 1)))  # in place: chunk 1 += itself
    with pytest.raises(PlanError, match=r"GPU 2 step 0 \(reduce, channel 0\) chunk 1: the reduction would count "
                                        r"GPU 2's input chunk 1 twice"):
        plans.validate(_with_ops(plan, 2, ops))


def test_a_missing_contribution_is_refused_naming_the_gpu_and_chunk():
    plan = plans.build("ring", 3, "allreduce")
    # drop GPU 1's last all-gather receive (chunk 2) and GPU 0's matching send: GPU 1 keeps the partial
    # its reduce-scatter left there, GPU 0's and its own
    ops1 = [op for op in plan.programs[1].ops]
    del ops1[-2]  # GPU 1's last recv (before the flush)
    ops0 = list(plan.programs[0].ops)
    del ops0[-3]  # GPU 0's last send
    bad = _with_ops(_with_ops(plan, 1, ops1), 0, ops0)
    with pytest.raises(PlanError, match=r"GPU 1 output chunk 2: misses GPU 2's input chunk 2 \(at the end"):
        plans.validate(bad)


def test_a_chunk_out_of_range_is_refused():
    plan = plans.build("ring", 4, "allreduce")
    ops = list(plan.programs[3].ops)
    ops[3] = dataclasses.replace(ops[3], src=Ref("o", 3, 2))  # step 3: reduce-scatter step 1's send
    with pytest.raises(PlanError, match=r"GPU 3 step 3 \(send, channel 0\) chunk 3: src chunks \[3, 5\) of buffer 'o' "
                                        r"out of its 4"):
        plans.validate(_with_ops(plan, 3, ops))


def test_a_dependency_on_a_later_step_is_a_cycle():
    plan = plans.build("recursive_doubling", 2, "allreduce")
    ops = list(plan.programs[1].ops)
    ops[0] = dataclasses.replace(ops[0], deps=(2,))
    with pytest.raises(PlanError, match=r"GPU 1 step 0 \(send, channel 0\): depends on step 2, not an earlier step"):
        plans.validate(_with_ops(plan, 1, ops))


def test_a_deadlock_is_refused_naming_who_waits_for_whom():
    plan = plans.build("recursive_doubling", 2, "allreduce")
    bad = plan
    for g in (0, 1):
        send, recv, add = plan.programs[g].ops
        bad = _with_ops(bad, g, [recv, send, add])  # both receive before they send
    with pytest.raises(PlanError, match=r"deadlocks: GPU 0 step 0 waits for GPU 1 on channel 0; GPU 1 step 0 waits "
                                        r"for GPU 0 on channel 0"):
        plans.validate(bad)


def test_reading_an_unwritten_chunk_and_unreceived_messages_are_refused():
    plan = plans.build("recursive_doubling", 2, "allreduce")
    ops = list(plan.programs[0].ops)
    with pytest.raises(PlanError, match=r"GPU 0 step 0 \(send, channel 0\) chunk 0: reads chunk 0 of buffer 's', "
                                        r"which nothing wrote"):
        plans.validate(_with_ops(plan, 0, [dataclasses.replace(ops[0], src=Ref("s", 0))] + ops[1:]))
    extra = _with_ops(plan, 0, ops + [Op("send", src=Ref("o", 0), send_to=1, channel=3)])
    with pytest.raises(PlanError, match=r"GPU 0 step 3: 1 message\(s\) to GPU 1 on channel 3 never received"):
        plans.validate(extra)


def test_a_load_reduce_reads_the_input():
    plan = plans.build("ring", 2, "allreduce")
    bad = _with_ops(plan, 1, (Op("load_reduce", src=Ref("o", 0), slot=(0,)),) + plan.programs[1].ops)
    with pytest.raises(PlanError, match=r"GPU 1 step 0 \(load_reduce, channel 0\) chunk 0: a load-reduce reads the "
                                        r"GPUs' input \('i'\), not 'o'"):
        plans.validate(bad)


def test_nvls_is_a_plan_of_load_reduces_answers_and_stores():
    plan = plans.build("nvls", 2, "allreduce", shape=(16, 4, 2))  # blocks of 8: 2 chunks of 4, window 2
    assert [(op.kind, op.slot) for op in plan.programs[1].ops] == [
        ("load_reduce", (1, 0, 1)), ("load_reduce", (1, 1, 2)),
        ("switch_contribute", (0, 0, 0)), ("switch_contribute", (1, 0, 1)),  # round 0: answer every block's chunk 0
        ("switch_contribute", (0, 1, 1)), ("switch_contribute", (1, 1, 2)),  # round 1: chunk 1
        ("switch_recv", (1, 0, 1)), ("multicast_store", (1, 0)),  # its reduced chunk 0 back, stored
        ("switch_recv", (1, 1, 2)), ("multicast_store", (1, 1)),
        ("switch_recv", (0, 0)), ("switch_recv", (1, 0)), ("switch_recv", (0, 1)), ("switch_recv", (1, 1)),
        ("copy", ())]
    ops = list(plan.programs[0].ops)
    early = [ops[2]] + ops[:2] + ops[3:]  # GPU 0 answers its own read before it asked for it
    with pytest.raises(PlanError, match=r"deadlocks: GPU 0 step 0 waits|GPU 0 step 0 \(switch_contribute"):
        plans.validate(_with_ops(plan, 0, early))
    other = [dataclasses.replace(ops[2], src=Ref("i", 1)) if k == 2 else op for k, op in enumerate(ops)]
    with pytest.raises(PlanError, match=r"GPU 0 step 2 \(switch_contribute, channel 0\) chunk 1: answers GPU 0 step 0's "
                                        r"load-reduce of slot \[0, 0, 0\] with chunks \[1, 2\)"):
        plans.validate(_with_ops(plan, 0, other))
    silent = [op for op in plan.programs[1].ops if op.slot != (0, 0, 0)]  # GPU 1 never answers GPU 0's first read
    with pytest.raises(PlanError, match=r"slot \[0, 0, 0\] is a load-reduce, answered by GPUs \[0\]"):
        plans.validate(_with_ops(plan, 1, silent))


def test_sharp_multicast_stores_are_plans():
    config = resolve("superpod-h100-nvlink", None, None, 2, 2)
    plan, _ = call_plan("allgather", "sharp", 2, 2, 16, config, 4)  # one element a block
    assert [(op.kind, op.slot) for op in plan.programs[2].ops] == [
        ("multicast_store", (2, 0)), ("switch_recv", (2, 0)), ("switch_recv", (3, 0)), ("switch_recv", (0, 0)),
        ("switch_recv", (1, 0))]  # its own node's blocks first
    assert plans.in_switch.stores(plan, 16, 4) == {0: [(4, 0)], 1: [(4, 1)], 2: [(4, 2)], 3: [(4, 3)]}
    ops = list(plan.programs[1].ops)
    with pytest.raises(PlanError, match=r"GPU 1 step 0 \(multicast_store\) puts into slot \[0, 0\], GPU 0 step 0's "
                                        r"multicast store"):
        plans.validate(_with_ops(plan, 1, [dataclasses.replace(ops[0], slot=(0, 0))] + ops[1:]))
    root, _ = call_plan("broadcast", "sharp", 2, 2, 16, config, 4, root=3)
    assert [op.kind for op in root.programs[3].ops] == ["multicast_store", "switch_recv"]
    assert root.programs[3].ops[1].dst == Ref("s", 0)  # the root's own copy, into scratch


def _sharp(gpus=3, count=10, piece=4, window=2):
    return plans.build("sharp", gpus, "allreduce", shape=(count, piece, window))


def test_sharp_allreduce_is_a_plan_of_in_switch_operations():
    plan = _sharp()  # 3 chunks of 4, 4 and 2 elements; two contributed before the first result is taken
    assert [(op.kind, op.slot) for op in plan.programs[0].ops] == [
        ("switch_contribute", (0,)), ("switch_contribute", (1,)), ("switch_recv", (0,)), ("switch_contribute", (2,)),
        ("switch_recv", (1,)), ("switch_recv", (2,))]
    assert chunks.spans(plan, 40, 4, 1)["o"] == [(0, 4), (4, 8), (8, 10)]
    assert _sharp(count=0).programs[0].i_chunks == 1  # no element: one empty chunk


def test_the_validator_proves_in_switch_reductions():
    plan = _sharp()
    ops = list(plan.programs[1].ops)
    # GPU 1 contributes chunk 1 to slot 0 as well: chunk 0's result would miss GPU 1's chunk 0 and hold its chunk 1
    wrong = _with_ops(plan, 1, [dataclasses.replace(ops[0], src=Ref("i", 1))] + ops[1:])
    with pytest.raises(PlanError, match=r"GPU 0 output chunk 0: misses GPU 1's input chunk 0; holds GPU 1's input "
                                        r"chunk 1 too"):
        plans.validate(wrong)
    twice = _with_ops(plan, 1, ops[:1] + [dataclasses.replace(ops[0])] + ops[1:])  # slot 0 twice from GPU 1
    with pytest.raises(PlanError, match=r"the reduction would count GPU 1's input chunk 0 twice"):
        plans.validate(twice)
    never = _with_ops(plan, 2, [op for op in plan.programs[2].ops if op.slot != (2,) or op.kind != "switch_recv"])
    with pytest.raises(PlanError, match=r"GPU 2: never takes in-switch slot \[2\]"):
        plans.validate(never)
    again = _with_ops(plan, 0, list(plan.programs[0].ops) + [Op("switch_recv", dst=Ref("o", 0), slot=(0,))])
    with pytest.raises(PlanError, match=r"GPU 0 step 6 \(switch_recv, channel 0\): takes slot \[0\] a second time"):
        plans.validate(again)
    early = _with_ops(plan, 0, [Op("switch_recv", dst=Ref("o", 0), slot=(0,))] + list(plan.programs[0].ops))
    with pytest.raises(PlanError, match=r"deadlocks: GPU 0 step 0 waits for in-switch slot \[0\]"):
        plans.validate(early)
    to_one = _with_ops(plan, 2, [dataclasses.replace(ops[0], send_to=0)] + ops[1:])
    with pytest.raises(PlanError, match=r"GPU 2 step 0 \(switch_contribute\) sends slot \[0\]'s result to GPU 0, "
                                        r"GPU 0 step 0 to every GPU"):
        plans.validate(to_one)
    for slot, what in (((), r"slot \(\) is not a non-empty tuple"), ((-1,), r"slot \(-1,\) is not")):
        with pytest.raises(PlanError, match=what):
            plans.validate(_with_ops(plan, 1, [dataclasses.replace(ops[0], slot=slot)] + ops[1:]))
    with pytest.raises(PlanError, match="a copy has no slot"):
        plans.validate(_with_ops(plan, 1, ops + [Op("copy", src=Ref("i", 0), dst=Ref("o", 0), slot=(0,))]))


def test_sharp_reduce_scatter_pads_short_blocks_with_empty_chunks():
    plan = plans.build("sharp", 3, "reduce_scatter", shape=(25, 4, 2))  # blocks of 9, 8, 8: 3, 2, 2 chunks
    assert [p.elements[1] for p in plan.programs] == [(4, 4, 1), (4, 4, 0), (4, 4, 0)]
    assert plan.programs[0].elements[0] == (4, 4, 1, 4, 4, 0, 4, 4, 0)
    ops = plan.programs[1].ops  # window 2: its own chunk c - 1 back before round c is contributed
    assert [(op.kind, op.slot) for op in ops[2:5]] == [
        ("switch_contribute", (2, 0, 2)), ("switch_recv", (1, 0, 1)), ("switch_contribute", (0, 1, 1))]
    assert [(op.kind, op.slot) for op in ops[7:9]] == [("switch_recv", (1, 1, 2)), ("switch_contribute", (0, 2, 2))]
    assert [(op.kind, op.slot) for op in ops[-1:]] == [("switch_recv", (1, 2, 3))]  # its empty chunk, last
    assert {op.send_to for op in ops if op.kind == "switch_contribute"} == {0, 1, 2}
    wrong = _with_ops(plan, 2, [dataclasses.replace(op, send_to=1) if op.slot == (0, 0, 0) else op
                                for op in plan.programs[2].ops])
    with pytest.raises(PlanError, match=r"sends slot \[0, 0, 0\]'s result to GPU 1, GPU 0 step 0 to GPU 0"):
        plans.validate(wrong)


def test_sharp_allreduce_times_as_the_switches_book_it():
    """The plan's timing is the two-level reduction sharp.py's replay booked: figures of the old
    fabric.replay.sharp_allreduce_ns (branch point e1f0133) on 2 x 2 superpod-h100-ib."""
    config = resolve("superpod-h100-ib", None, None, 2, 2)
    got = replay.replay_ns("allreduce", "sharp", config.topology, 1024, config, 4)
    assert got == 2351.76
    plan = plans.build("sharp", 4, "allreduce", shape=(256, 256, 1))
    with pytest.raises(PlanError, match="the link bytes of in-switch operations are the switches'"):
        plans.plan_link_bytes(plan, config.topology, 1024, config)
    # one node: the leaf's engine and ports (fabric.switch_clocks.OneSwitch), whose time here is the closed form's
    one = preset("dgx-h100", gpus=4)
    assert replay.replay_ns("allreduce", "sharp", Topology.single(one), 1024, one, 4) == 653.7260273972603
    assert cost.links_ns("allreduce", "sharp", 1024, 4, one, 4) == 653.7260273972603


def test_buffers_must_fit_the_collective():
    plan = plans.build("ring", 4, "allgather")
    bad = dataclasses.replace(plan, programs=tuple(dataclasses.replace(p, o_chunks=3) for p in plan.programs))
    with pytest.raises(PlanError, match="GPU 0: 1 input and 3 output chunks do not fit allgather on 4 GPUs"):
        plans.validate(bad)


def test_ops_and_refs_built_by_their_quick_init_are_the_dataclasses():
    # format._quick_init stores each field through its slot: the same signature, defaults, equality, hash,
    # frozenness; pickled and copied as the dataclass
    op = plans.Op("send", 2, plans.format.Ref("i", 3), None, 1)
    same = plans.Op(kind="send", channel=2, src=plans.format.Ref(buf="i", off=3, cnt=1), send_to=1)
    assert op == same and hash(op) == hash(same) and op.deps == () and op.incoming_first is False
    assert type(op) is plans.Op and type(op.src) is plans.format.Ref
    assert pickle.loads(pickle.dumps(op)) == op and copy.copy(op) == op and copy.deepcopy(op) == op
    assert dataclasses.replace(op, channel=5).channel == 5
    with pytest.raises(dataclasses.FrozenInstanceError):
        op.kind = "recv"
    with pytest.raises(TypeError):
        plans.Op()
    with pytest.raises(TypeError):
        plans.Op("send", bogus=1)


# -- MSCCL-IR ------------------------------------------------------------------------------------

def test_the_msccl_fixtures_load_validate_and_move_the_expected_bytes():
    config = preset("dgx-h100", gpus=4)
    topo = Topology.single(config)
    ring = plans.load(HERE / "ring_allreduce_4.xml")
    assert (ring.name, ring.collective, ring.gpus, ring.inplace) == ("ring_allreduce_4", "allreduce", 4, True)
    S = 4 << 20
    assert set(plans.plan_link_bytes(ring, topo, S, config).values()) == set(
        plans.plan_link_bytes(plans.build("ring", 4, "allreduce"), topo, S, config).values())
    assert plans.plan_ns(ring, topo, S, config) > 0
    pairs = plans.load(HERE / "allpairs_allreduce_3.xml")
    config3 = preset("dgx-h100", gpus=3)
    links = plans.plan_link_bytes(pairs, Topology.single(config3), 3 << 20, config3)
    assert {v[0] for v in links.values()} == {4 << 20}  # 2 chunks out for the reduction, 2 results: 4 x S/3


def test_the_two_step_all2all_crosses_nodes_only_on_its_rail():
    config = preset("superpod-h100-ib", nodes=2, gpus=4, spines=1)
    topo = config.topology
    plan = plans.load(HERE / "two_step_alltoall_2x2.xml")
    S = 4 << 20  # each GPU's send buffer: 4 chunks of 1 MiB
    links = plans.plan_link_bytes(plan, topo, S, config)
    by_level = {}
    for link in topo.links:
        by_level.setdefault(link.level, []).append(links.get(link.name, (0, 0))[0])
    # every GPU sends 4 chunks (its node peer's, the one it relays, its rail's, its rail's peer's): S each way;
    # two chunks of each GPU cross: 2 MiB up and 2 MiB down through the spine per GPU
    assert sorted(set(by_level["gpu-leaf"])) == [S]
    assert sum(by_level["leaf-spine"]) == 4 * 2 * (2 << 20)
    assert plans.plan_ns(plan, topo, S, config) > replay.replay_ns("all2all", "direct", Topology.single(
        preset("dgx-h100", gpus=4)), S, preset("dgx-h100", gpus=4))


@pytest.mark.parametrize("data, message", [
    (b"<algo/>" + b" " * (16 << 20), "more than the 16777216 bytes"),
    (b"<algo \xff/>", "not UTF-8"),
    (b'<?xml version="1.0"?><!DOCTYPE algo [<!ENTITY x "y">]><algo/>', "DOCTYPE and entity declarations are refused"),
    (b"<plan/>", "the root element is <plan>, not <algo>"),
    (b"<algo ngpus='2' coll='allreduce'", "not well-formed XML"),
    (b"<algo ngpus='2' coll='gather'/>", "coll='gather' unknown"),
    (b"<algo ngpus='1' coll='allreduce'><gpu id='0' i_chunks='1' o_chunks='1'><tb id='0' send='-1' recv='-1' chan='0'>"
     b"<step s='0' type='zz'/></tb></gpu></algo>", r"GPU 0 tb 0 step 0: type='zz' unknown"),
    (b"<algo ngpus='2' coll='allreduce'><gpu id='0' i_chunks='1' o_chunks='1'><tb id='0' send='1' recv='1' chan='0'>"
     b"<step s='0' type='r' dstbuf='o' dstoff='0' cnt='1'/></tb></gpu><gpu id='1' i_chunks='1' o_chunks='1'>"
     b"<tb id='0' send='0' recv='0' chan='0'><step s='0' type='r' dstbuf='o' dstoff='0' cnt='1'/></tb></gpu></algo>",
     r"no step can go on \(a deadlock\): GPU 0 tb 0 step 0; GPU 1 tb 0 step 0"),
    # a tiny file may not take the host's memory, nor give the ranks a number msgpack cannot pack (review)
    (b"<algo ngpus='300000000' coll='allreduce'/>", r"ngpus='300000000' is out of range \(-1 to 16777216\)"),
    (b"<algo ngpus='2000' coll='allreduce'/>", "ngpus=2000, a plan is for 1 to 1024 GPUs"),
    (b"<algo ngpus='1' coll='allreduce'><gpu id='0' i_chunks='9000000' o_chunks='9000000'/></algo>",
     "GPU 0: the GPUs so far have 18000000 chunks in all, more than the 1048576"),
    (b"<algo ngpus='1' coll='allreduce'><gpu id='0' i_chunks='1' o_chunks='1'><tb id='0' send='-1' recv='-1' "
     b"chan='1180591620717411303424'/></gpu></algo>", r"GPU 0 tb 0: attribute chan='1180591620717411303424' is out of range"),
])
def test_the_loader_refuses_bad_input(data, message):
    with pytest.raises(PlanError, match=message):
        plans.loads(data)


def test_the_loader_reads_msccl_tools_newer_op_elements():
    # <op step type buf off>: buf/off is a send's source, a receive's destination
    xml = ("<algo name='x' ngpus='2' coll='allgather' inplace='0'>"
           + "".join(f"<gpu id='{g}' i_chunks='1' o_chunks='2' s_chunks='0'>"
                     f"<tb id='0' send='-1' recv='-1' chan='0'><op step='0' type='cpy' srcbuf='i' srcoff='0' dstbuf='o' "
                     f"dstoff='{g}'/></tb>"
                     f"<tb id='1' send='{1 - g}' recv='{1 - g}' chan='0'><op step='0' type='s' buf='i' off='0'/>"
                     f"<op step='1' type='r' buf='o' off='{1 - g}'/></tb></gpu>" for g in range(2)) + "</algo>")
    plan = plans.loads(xml)
    assert [op.kind for op in plan.programs[0].ops] == ["copy", "send", "recv"]
    assert plan.programs[1].ops[2].dst == Ref("o", 0)


def test_the_timeline_of_a_replayed_plan_books_every_message_once_and_leaves_the_time_alone():
    config = preset("dgx-h100", gpus=4)
    topo, plan, S = Topology.single(config), plans.build("ring", 4, "allreduce"), (1 << 20) + 12
    events = []
    ns = plans.plan_ns(plan, topo, S, config, events=events)
    assert ns == plans.plan_ns(plan, topo, S, config)
    sends = [e for e in events if e[1] == "send"]
    recvs = [e for e in events if e[1] == "recv"]
    chunk = config.chunk_bytes // 4
    pieces = sum(1 for program in timing.messages(plan, S, 4, chunk).values() for op in program
                 if isinstance(op, Send))
    assert len(sends) == len(recvs) == pieces
    # an uplink carries one message at a time, each for its raw bytes' serialisation time
    for g in range(4):
        mine = sorted((start, end) for who, what, _, start, end in sends if who == g)
        assert all(a[1] <= b[0] + 1e-9 for a, b in zip(mine, mine[1:]))
    assert max(end for *_, end in events) <= ns
    assert all(start < end for *_, start, end in events)


@pytest.mark.parametrize("gpus", [2, 3, 5])
def test_the_ring_broadcast_plan_is_a_pipelined_chain(gpus):
    # several pieces (chunk_bytes 64 KiB): every middle GPU passes piece k on before piece k+1 is in,
    # so the time is fabric.cost's pipelined chain, not (n-1) whole-buffer hops
    config = dataclasses.replace(preset("dgx-h100", gpus=gpus), chunk_bytes=1 << 16)
    topo = Topology.single(config)
    for root in range(gpus):
        plan = plans.build("ring", gpus, "broadcast", root)
        for size in (1024, 1 << 20, (1 << 20) + 12):
            got = plans.plan_ns(plan, topo, size, config)
            assert got == replay.replay_ns("broadcast", "ring", topo, size, config, root=root)
            if root == 0:
                assert math.isclose(got, cost.links_ns("broadcast", "ring", size, gpus, config), rel_tol=1e-12)
    program = timing.messages(plans.build("ring", gpus, "broadcast", 0), 1 << 20, 4, (1 << 16) // 4)[1]
    kinds = [type(op) for op in program]
    if gpus > 2:  # a middle GPU: recv, send, recv, send, ..., flush
        assert kinds == [Recv, Send] * 16 + [Flush]


@pytest.mark.parametrize("nodes, per_node", [(2, 2), (3, 2), (2, 3)])
def test_the_pxn_plan_moves_the_cost_models_bytes_on_every_link(nodes, per_node):
    config = resolve("superpod-h100-ib", None, None, nodes, per_node)
    n, topo = config.gpus, config.topology
    plan = plans.build("pxn", n, "all2all", layout=registry.grid(nodes, per_node))
    for S in (n * 1024, n * (3 << 20) + n * 8):  # one piece a block; several
        links = {k: v[0] for k, v in plans.plan_link_bytes(plan, topo, S, config).items()}
        assert links == {k: v for k, v in cost_nodes.link_bytes("all2all", "pxn", topo, S).items() if v}
    # a communicator's grid need not be node-major: members 0, 2 on one node, 1, 3 on the other
    odd = plans.build("pxn", 4, "all2all", layout=((0, 2), (1, 3)))
    assert [op.send_to for op in odd.programs[0].ops if op.kind == "send"] == [1, 2, 2]  # 3 via 2, its rail's


def test_a_pxn_layout_that_is_no_grid_is_refused():
    with pytest.raises(PlanError, match=r"pxn plan: layout \(\(0, 1\), \(2,\)\) is not a grid of the 3 GPUs"):
        plans.build("pxn", 3, "all2all", layout=((0, 1), (2,)))


# -- the rooted collectives: gather and scatter ---------------------------------------------------

@pytest.mark.parametrize("gpus", [2, 3, 5])
def test_the_direct_gather_and_scatter_plans_move_each_part_once_through_the_root(gpus):
    # s = each GPU's part: gather, the root takes (n-1) s in and every other GPU sends s; scatter the reverse
    config = preset("dgx-h100", gpus=gpus)
    topo = Topology.single(config)
    part = 3000 * 4
    for root in range(gpus):
        for collective, out_of_root in (("gather", False), ("scatter", True)):
            plan = plans.build("direct", gpus, collective, root)
            links = {k: v[0] for k, v in plans.plan_link_bytes(plan, topo, gpus * part, config).items()}
            want = {}
            for g in range(gpus):
                if g != root:
                    want[f"gpu{root}->sw0" if out_of_root else f"gpu{g}->sw0"] = (gpus - 1) * part if out_of_root else part
                    want[f"sw0->gpu{g}" if out_of_root else f"sw0->gpu{root}"] = part if out_of_root else (gpus - 1) * part
            assert links == want, (collective, root)


def test_gathers_coverage_needs_only_the_roots_output_and_scatters_every_gpus():
    plan = plans.build("direct", 3, "gather", 1)
    assert [op.kind for op in plan.programs[1].ops] == ["copy", "recv", "recv"]  # from GPU 2, then GPU 0
    assert [op.recv_from for op in plan.programs[1].ops[1:]] == [2, 0]
    wrong = _with_ops(plan, 1, plan.programs[1].ops[:2] + (Op("recv", dst=Ref("o", 2), recv_from=0),))
    with pytest.raises(PlanError, match=r"GPU 1 output chunk 0: never written \(needs GPU 0's input chunk 0\)"):
        plans.validate(wrong)
    plan = plans.build("direct", 3, "scatter", 0)
    wrong = _with_ops(plan, 0, [Op("send", src=Ref("i", 2), send_to=1), Op("send", src=Ref("i", 1), send_to=2),
                                Op("copy", src=Ref("i", 0), dst=Ref("o", 0))])
    with pytest.raises(PlanError, match=r"GPU 1 output chunk 0: misses GPU 0's input chunk 1; holds GPU 0's input "
                                        r"chunk 2 too"):
        plans.validate(wrong)
    with pytest.raises(PlanError, match=r"root 3 is not one of its 3 GPUs"):
        plans.validate(dataclasses.replace(plan, root=3))
    with pytest.raises(PlanError, match=r"GPU 0: 3 input and 3 output chunks do not fit scatter on 3 GPUs"):
        plans.validate(dataclasses.replace(plan, programs=tuple(dataclasses.replace(p, o_chunks=3)
                                                                for p in plan.programs)))


# -- ring's reduce chain: an operand order on the reducing kinds -------------------------------------

@pytest.mark.parametrize("gpus", [1, 2, 3, 5])
def test_the_ring_reduce_plan_is_broadcasts_chain_from_the_roots_successor_folding_partial_first(gpus):
    # the chain root+1, ..., root moves the bytes, and takes the time, of the broadcast chain from root+1
    config = dataclasses.replace(preset("dgx-h100", gpus=gpus), chunk_bytes=1 << 16)
    topo = Topology.single(config)
    for root in range(gpus):
        plan, chain = plans.build("ring", gpus, "reduce", root), plans.build("ring", gpus, "broadcast", (root + 1) % gpus)
        for size in (1024, (1 << 20) + 12):
            assert plans.plan_ns(plan, topo, size, config) == plans.plan_ns(chain, topo, size, config)
            assert plans.plan_link_bytes(plan, topo, size, config) == plans.plan_link_bytes(chain, topo, size, config)
        folds = [op for _, _, op in plan.ops() if op.kind in ("recv_reduce", "recv_reduce_send")]
        assert len(folds) == gpus - 1 and all(op.incoming_first for op in folds)  # partial (op) own, as ring.py


@pytest.mark.parametrize("nodes, per_node", [(2, 2), (3, 2), (2, 4)])
def test_the_ring_reduce_plan_across_nodes_folds_partial_first_up_each_channels_chain(nodes, per_node):
    # part c goes up ring c from the root's successor on it to the root, each member folding its own
    # input into the partial (incoming_first), channel c on its lane; its messages are the broadcast
    # chains' reversed: every hop of ring c but the one into its first member, each part's bytes once
    layout, n = registry.grid(nodes, per_node), nodes * per_node
    item, chunk = 4, 4096
    for nbytes in (4 * 1000, 2 * 32 * 1024 + 12, 1 << 20):
        rings = channel_rings([list(row) for row in layout])[:ring_channel_count(nbytes, per_node)]
        for root in (0, n - 1, per_node):
            plan = plans.build("ring", n, "reduce", root, layout=layout, nbytes=nbytes, itemsize=item, chunk_bytes=chunk)
            assert plan.lanes == plan.groups == len(rings) and plan.piece == chunk // item
            folds = [op for _, _, op in plan.ops() if op.kind in ("recv_reduce", "recv_reduce_send")]
            assert folds and all(op.incoming_first for op in folds)
            want = np.zeros((n, n), np.int64)
            for (lo, hi), ring in zip(blocks(nbytes // item, len(rings)), rings):
                q = ring.index(root)
                for i in range(1, n):  # root+1 -> root+2 -> ... -> root along ring c
                    want[ring[(q + i) % n], ring[(q + i + 1) % n]] += (hi - lo) * item
            assert np.array_equal(timing.plan_traffic(plan, nbytes, item), want)
    # no element: the one chain, which sends nothing (no plan of no chunk)
    plan = plans.build("ring", n, "reduce", 0, layout=layout, nbytes=0, itemsize=item, chunk_bytes=chunk)
    assert plan.lanes == 0 and not timing.plan_traffic(plan, 0, item).any()


def test_an_operand_order_is_only_for_the_kinds_that_fold():
    plan = plans.build("ring", 3, "reduce", 0)
    ops = list(plan.programs[1].ops)  # GPU 1, the chain's start: one send
    ops[0] = dataclasses.replace(ops[0], incoming_first=True)
    with pytest.raises(PlanError, match=r"GPU 1 step 0 \(send, channel 0\): incoming_first=True: an operand order "
                                        r"is True or False, and only for the kinds that fold"):
        plans.validate(_with_ops(plan, 1, ops))
    ops = list(plan.programs[2].ops)
    ops[0] = dataclasses.replace(ops[0], incoming_first=1)
    with pytest.raises(PlanError, match=r"GPU 2 step 0 \(recv_reduce_send, channel 0\): incoming_first=1"):
        plans.validate(_with_ops(plan, 2, ops))


def test_combine_incoming_first_puts_the_incoming_operand_on_the_left(monkeypatch):
    import numpy as np

    from nvlink_emu.fabric import reduction
    monkeypatch.setitem(reduction._COMBINE, "sum", np.subtract)  # an order that shows: acc - x or x - acc
    acc = np.array([10.0])
    reduction.combine("sum", acc, np.array([3.0]))
    assert acc[0] == 7.0
    reduction.combine_incoming_first("sum", acc, np.array([3.0]))
    assert acc[0] == -4.0


# -- all2allv: a plan per call, its chunks sized by the counts ----------------------------------------

def test_the_all2allv_plan_is_sized_by_the_counts_and_moves_them_exactly():
    config = resolve("superpod-h100-ib", None, None, 2, 2)
    topo = config.topology
    counts = [[0, 5, 1030, 0], [7, 3, 0, 2048], [1, 1, 1, 1], [4096, 0, 9, 100]]  # elements; the diagonal stays
    plan = registry.all2allv(counts)
    assert plan is registry.all2allv(tuple(map(tuple, counts)))  # one plan per count matrix
    assert plan.programs[1].elements == ((7, 3, 0, 2048), (5, 3, 1, 0), ())  # its row in, its column out
    assert chunks.spans(plan, 0, 4, 3)["i"] == [(0, 4096), (4096, 4096), (4096, 4105), (4105, 4205)]
    links = {k: v[0] for k, v in plans.plan_link_bytes(plan, topo, 0, config).items()}
    assert links == {k: v for k, v in cost_nodes.link_bytes("all2allv", "all2allv", topo,
                                                            counts=[[4 * x for x in row] for row in counts]).items() if v}
    assert plans.plan_ns(plan, topo, 0, config) == replay.replay_ns(
        "all2allv", "all2allv", topo, 0, config, counts=[[4 * x for x in row] for row in counts])


def test_a_plan_that_gives_chunk_sizes_is_checked_exactly():
    plan = registry.all2allv([[2, 3], [5, 7]])
    programs = list(plan.programs)
    programs[1] = dataclasses.replace(programs[1], elements=((4, 7), (3, 7), ()))  # GPU 1 sends 4, GPU 0 takes 5
    with pytest.raises(PlanError, match=r"GPU 0 step 2 \(recv, channel 0\) chunk 1: receives chunks of \[5\] elements, "
                                        r"GPU 1 step 0 sent \[4\]"):
        plans.validate(dataclasses.replace(plan, programs=tuple(programs)))
    programs[1] = dataclasses.replace(programs[1], elements=((5, 7), (3, 6), ()))  # its own block: 7 copied into 6
    with pytest.raises(PlanError, match=r"GPU 1 step 1 \(copy, channel 0\) chunk 1: copy of chunks of \[7\] elements "
                                        r"into chunks of \[6\]"):
        plans.validate(dataclasses.replace(plan, programs=tuple(programs)))
    programs[1] = dataclasses.replace(programs[1], elements=None)
    with pytest.raises(PlanError, match=r"GPU 1 does not give its chunks' element counts and GPU 0 does"):
        plans.validate(dataclasses.replace(plan, programs=tuple(programs)))
    programs[1] = dataclasses.replace(programs[1], elements=((5, -7), (3, 7), ()))
    with pytest.raises(PlanError, match=r"GPU 1: chunk element counts \(\(5, -7\), \(3, 7\), \(\)\) are not one "
                                        r"non-negative integer per chunk of its 2 input, 2 output and 0 scratch"):
        plans.validate(dataclasses.replace(plan, programs=tuple(programs)))
    with pytest.raises(PlanError, match=r"all2allv plan: counts must be a square matrix"):
        registry.all2allv([[1, 2], [3]])


# -- the known gaps of the loader and the validator (docs/design/plans.md), each closed ----------------

def test_chunks_that_do_not_line_up_at_a_size_are_refused_before_anything_runs():
    # a per-chunk allgather: GPU g's two input chunks into output chunks 2g, 2g+1; at 6 elements GPU 0's
    # input (3) is cut 2 + 1 while output chunks 0, 1 hold 2 + 2: it cannot run at that size, it can at 7 or 8
    plan = plans.load(HERE / "allgather_by_chunk_2.xml")
    for size in (28, 32):
        chunks.check_sizes(plan, size, 4)
    with pytest.raises(PlanError, match=r"GPU 0 step 1 \(copy, channel 0\) chunk 0: at 24 bytes \(4-byte elements\) "
                                        r"a copy of 3 elements into chunks of 4 \(the chunks of the GPUs' buffers do "
                                        r"not line up at this size\)"):
        chunks.check_sizes(plan, 24, 4)
    # the replay times a misfit; where it waits for ever, it says where, not "validate the plan": at 514 1-byte
    # elements in 257-byte messages GPU 0 sends its 257 elements in one piece, GPU 1 takes 258 in two
    config = dataclasses.replace(preset("dgx-h100", gpus=2), chunk_bytes=257)
    with pytest.raises(PlanError, match=r"at 514 bytes \(1-byte elements\) a copy of 257 elements into chunks of 258"):
        plans.plan_ns(plan, Topology.single(config), 514, config, itemsize=1)


def test_a_recv_reduce_send_names_no_destination():
    plan = plans.build("ring", 3, "reduce", 0)
    ops = [dataclasses.replace(plan.programs[2].ops[0], dst=Ref("x", 0))]  # GPU 2: the chain's middle
    with pytest.raises(PlanError, match=r"GPU 2 step 0 \(recv_reduce_send, channel 0\): a recv_reduce_send takes no dst"):
        plans.validate(_with_ops(plan, 2, ops))


def test_a_dependency_on_a_step_that_does_not_exist_is_named_not_called_a_deadlock():
    data = (b"<algo ngpus='1' coll='allreduce' inplace='1'><gpu id='0' i_chunks='1' o_chunks='0'>"
            b"<tb id='0' send='-1' recv='-1' chan='0'><step s='0' type='nop' depid='0' deps='5' hasdep='0'/></tb>"
            b"</gpu></algo>")
    with pytest.raises(PlanError, match=r"GPU 0 tb 0 step 0: depends on step 5 of tb 0, which has 1 steps \(0 to 0\)"):
        plans.loads(data)


def test_a_path_that_is_no_readable_file_is_a_plan_error(tmp_path):
    with pytest.raises(PlanError, match=r"MSCCL-IR .*: cannot be read \(Is a directory\)"):
        plans.load(tmp_path)
    with pytest.raises(PlanError, match=r"MSCCL-IR .*missing.xml: cannot be read \(No such file or directory\)"):
        plans.load(tmp_path / "missing.xml")


def test_the_loader_orders_many_threadblocks_in_linear_time():
    # tb k's one step waits for tb k+1's: a full pass over every threadblock advances one (the last first), so
    # the pass-by-pass loader took T passes of T threadblocks (49 s of CPU at 3,000); it visits only those woken
    T = 3000
    tbs = "".join(f"<tb id='{k}' send='-1' recv='-1' chan='0'><step s='0' type='nop' "
                  + (f"depid='{k + 1}' deps='0'" if k + 1 < T else "depid='-1' deps='-1'") + " hasdep='0'/></tb>"
                  for k in range(T))
    text = f"<algo ngpus='1' coll='allreduce' inplace='1'><gpu id='0' i_chunks='1' o_chunks='0'>{tbs}</gpu></algo>"
    start = time.process_time()
    plan = plans.loads(text)
    assert time.process_time() - start < 10.0  # 0.5 s here
    assert [op.deps for op in plan.programs[0].ops[:3]] == [(), (0,), (1,)]  # tb T-1's step first, then T-2's, ...


# -- ring's channels across nodes (Plan.groups, Plan.lanes) ------------------------------------------------

@pytest.mark.parametrize("N,G,nbytes", [(2, 2, 1 << 20), (3, 2, 96 << 10), (2, 4, 200 << 10)])
def test_the_channel_plan_cuts_each_members_range_of_each_channel_as_rail_ranges(N, G, nbytes):
    from nvlink_emu.fabric.reduction import rail_ranges, ring_channel_count
    n, count = N * G, (nbytes + 4 * 7) // 4  # an uneven count
    C = ring_channel_count(count * 4, G)
    plan = registry.build("ring", n, "allreduce", layout=registry.grid(N, G), nbytes=count * 4)
    assert (plan.groups, plan.lanes) == (n, C) and C > 1
    table = chunks.spans(plan, count * 4, 4, 0)["o"]
    assert [[table[m * C + c] for c in range(C)] for m in range(n)] == rail_ranges(count, n, C)


def test_the_registry_keeps_one_channel_plan_per_channel_count_not_per_size():
    layout = registry.grid(2, 4)
    one = registry.build("ring", 8, "allreduce", layout=layout, nbytes=1 << 20)
    assert registry.build("ring", 8, "allreduce", layout=layout, nbytes=16 << 20) is one  # both 4 channels
    assert registry.build("ring", 8, "allreduce", layout=layout, nbytes=64 << 10).lanes == 2
    assert registry.build("ring", 8, "allreduce", layout=layout, nbytes=1 << 10).lanes == 1  # the node-major ring


def test_a_channel_outside_the_plans_lanes_is_refused():
    plan = registry.build("ring", 4, "allgather", layout=registry.grid(2, 2), nbytes=1 << 20)
    ops = list(plan.programs[0].ops)
    ops[1] = dataclasses.replace(ops[1], channel=2)
    bad = dataclasses.replace(plan, programs=(dataclasses.replace(plan.programs[0], ops=tuple(ops)),)
                              + plan.programs[1:])
    with pytest.raises(PlanError, match="GPU 0 step 1 .*channel 2 has no lane; the plan runs its channels on lanes 0..1"):
        plans.validate(bad)


@pytest.mark.parametrize("layout", [None, registry.grid(2, 2)])
def test_a_rings_all_gather_steps_are_a_round_each(layout):
    n = 4
    plan = registry.build("ring", n, "allreduce", layout=layout, nbytes=1 << 20)
    rounds = plans.plan_rounds(plan, 1 << 20, 4)
    assert len(rounds) == 2 * (n - 1)
    assert all(int(t.sum()) == n * (1 << 20) // n for t in rounds)  # every GPU sends one block a step


def test_an_operation_with_deps_that_are_no_tuple_or_an_unhashable_kind_is_refused_by_name():
    # the validator's quick test and its rule-by-rule check agree (the second review of issue 26: deps=None
    # passed the quick test, a list as kind raised TypeError there)
    plan = plans.build("ring", 3, "allreduce")
    for change, words in ((dict(deps=None), r"GPU 0 step 0 \(send, channel 0\): deps None are not a tuple"),
                          (dict(kind=["send"]), r"GPU 0 step 0: kind \['send'\] unknown")):
        ops = (dataclasses.replace(plan.programs[0].ops[0], **change),) + plan.programs[0].ops[1:]
        with pytest.raises(PlanError, match=words):
            plans.validate(_with_ops(plan, 0, ops))


# -- hier: fabric.hier_plan's schedule as a plan -----------------------------------------------------

@pytest.mark.parametrize("N, G", [(1, 3), (3, 1), (2, 2), (2, 4), (3, 2)])
def test_the_hier_plan_is_hier_plans_program_matched_in_order(N, G):
    # every phase a channel: the n-th send of a pair on it meets the n-th receive, which is the message
    # hier_plan's keys name; no flush is added (hier's own flushes keep sent data unwritten); each
    # operation is one message of at most a chunk
    from nvlink_emu.fabric import hier_plan
    from nvlink_emu.fabric.plans.hier import CHANNELS
    n, chunk = N * G, 100
    for collective in hier_plan.STAGES:
        for count in (0, 1, n + 1, 1001, 20003):
            for root in ((0, n - 1) if collective == "broadcast" else (0,)):
                plan = plans.build("hier", n, collective, root, layout=registry.grid(N, G), nbytes=4 * count,
                                   itemsize=4, chunk_bytes=4 * chunk)
                sent, taken = {}, {}
                for g in range(n):
                    a, j = divmod(g, G)
                    for op in hier_plan.program(collective, N, G, a, j, count, chunk, 4, divmod(root, G)):
                        if op[0] in ("send", "recv"):
                            peer = op[1][0] * G + op[1][1]
                            pair = (g, peer) if op[0] == "send" else (peer, g)
                            (sent if op[0] == "send" else taken).setdefault((*pair, CHANNELS[op[2][0]]), []).append(
                                (op[2], op[3], op[4]))
                    assert len(timing.with_flushes(plan, g)) == len(plan.programs[g].ops)
                    table = chunks.spans(plan, 4 * count, 4, g)
                    for op in plan.programs[g].ops:
                        if op.kind in ("send", "recv", "recv_reduce"):
                            lo, hi = chunks.span(table, op.src or op.dst)
                            assert 0 < hi - lo <= chunk
                assert sent == taken, (collective, count, root)
                traffic = np.zeros((n, n), np.int64)
                for (g, peer, _), messages in sent.items():
                    traffic[g, peer] += sum(4 * (hi - lo) for _, lo, hi in messages)
                assert np.array_equal(timing.plan_traffic(plan, 4 * count, 4), traffic)


# -- hier_nvls: fabric.hier_plan's schedule with its node stages in the leaf, a leaf plan -----------------

_LEAF_KINDS = {"load_reduce": "load_reduce", "serve": "switch_contribute", "mcast": "multicast_store",
               "take": "switch_recv", "send": "send", "flush": "flush"}


@pytest.mark.parametrize("N, G", [(2, 2), (2, 4), (3, 2)])
def test_the_hier_nvls_plan_is_hier_plans_leaf_program_in_order(N, G):
    # op for op hier_plan's program with the share (its "finish" none), each leaf op's slot its node and
    # hier_plan.leaf_slot of its key, its chunks the op's range, an own store's copy taken into scratch of its
    # sizes; no flush added; Plan.leaf the grid's nodes; several slices (a small share)
    from nvlink_emu.fabric import hier_plan
    from nvlink_emu.fabric.plans.hier import hier_nvls_pieces
    n, chunk, share = N * G, 100, 2 * (G - 1) * N * G * 4 * 60  # a slice's piece: 60 elements
    layout = registry.grid(N, G)
    for collective in hier_plan.STAGES:
        for count in (0, 1, n + 1, 1001, 3 * 60 * n + 7):
            for root in ((0, n - 1) if collective == "broadcast" else (0,)):
                shape = hier_nvls_pieces(n, layout, 4 * count, 4, 4 * chunk, share)
                plan = plans.build("hier_nvls", n, collective, root, layout, shape=shape)
                assert plan.leaf == layout and plan.fabrics == ("network",)
                for g in range(n):
                    a, j = divmod(g, G)
                    table = chunks.spans(plan, 4 * count, 4, g)
                    ops = [op for op in plan.programs[g].ops if op.kind != "copy"]  # allgather's, reduce_scatter's
                    want = [op for op in hier_plan.program(collective, N, G, a, j, count, chunk, 4, divmod(root, G),
                                                           None, share) if op[0] != "finish"]
                    assert [op.kind for op in ops] == [_LEAF_KINDS.get(op[0], "recv_reduce" if op[0] == "recv" and
                                                                       op[5] else "recv") for op in want]
                    for op, old in zip(ops, want):
                        if op.kind in ("load_reduce", "switch_contribute", "multicast_store", "switch_recv"):
                            key = old[2] if old[0] == "serve" else old[1]
                            assert op.slot == (a, *hier_plan.leaf_slot(key))
                            ref = op.dst if op.kind == "switch_recv" else op.src
                            lo, hi = chunks.span(table, ref)
                            assert hi - lo == old[-2 if old[0] == "take" else -1] - old[-3 if old[0] == "take" else -2]
                            if op.kind == "switch_recv" and old[4]:  # my own store's copy
                                assert ref.buf == "s"
                            elif op.kind == "switch_recv":
                                assert (lo, hi) == (old[2], old[3])
                    assert len(timing.with_flushes(plan, g)) == len(plan.programs[g].ops)


def test_the_validator_keeps_a_leaf_plan_s_slots_in_their_node():
    from nvlink_emu.fabric.plans.hier import hier_nvls_pieces
    layout = registry.grid(2, 2)
    plan = plans.build("hier_nvls", 4, "allreduce", 0, layout, shape=hier_nvls_pieces(4, layout, 4096, 4, 1024, 1 << 20))
    ops = list(plan.programs[0].ops)
    first = next(step for step, op in enumerate(ops) if op.kind == "load_reduce")
    ops[first] = dataclasses.replace(ops[first], slot=(1, *ops[first].slot[1:]))
    with pytest.raises(PlanError, match=r"GPU 0 step \d+ \(load_reduce, channel 0\): slot \[1, .*names node 1's leaf, "
                                        r"GPU 0 is at node 0"):
        plans.validate(_with_ops(plan, 0, ops))
    # GPU 1 does not answer GPU 0's first load-reduce: the leaf's sum would miss it
    ops = list(plan.programs[1].ops)
    answer = next(step for step, op in enumerate(ops) if op.kind == "switch_contribute" and op.send_to == 0)
    with pytest.raises(PlanError, match=r"is a load-reduce, answered by GPUs \[0\], not every GPU of the node's \[0, 1\]"):
        plans.validate(_with_ops(plan, 1, ops[:answer] + ops[answer + 1:]))
    with pytest.raises(PlanError, match="leaf .* is not its 4 GPUs in nodes"):
        plans.validate(dataclasses.replace(plan, leaf=((0, 1), (2,))))


def test_an_output_chunk_of_no_element_needs_no_contribution_only_where_the_plan_sizes_its_chunks():
    # direct allgather on 2 GPUs without GPU 0's send to GPU 1 and GPU 1's receive of it
    plan = plans.build("direct", 2, "allgather")
    cut = _with_ops(_with_ops(plan, 0, [op for op in plan.programs[0].ops if op.kind != "send"]), 1,
                    [op for op in plan.programs[1].ops if op.kind != "recv"])
    with pytest.raises(PlanError, match="GPU 1 output chunk 0: never written"):
        plans.validate(cut)
    # GPU 0's input holds no element (a plan sized per call): GPU 1's chunk 0 of it needs nothing
    sized = dataclasses.replace(cut, programs=tuple(
        dataclasses.replace(p, elements=((3 * p.gpu,), (0, 3), ())) for p in cut.programs))
    plans.validate(sized)
    with pytest.raises(PlanError, match="GPU 0 output chunk 1: never written"):  # 3 elements: needed
        plans.validate(_with_ops(_with_ops(sized, 0, [plan.programs[0].ops[0]]), 1, [plan.programs[1].ops[0]]))
