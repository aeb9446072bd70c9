"""fabric.plans' credit kinds (credit, credit_wait: out of band, no modeled time) and sharp's reduce, the plan
that uses them: its shape, and the validator's refusals of credits out of order, missing or never taken; and the
switch's rules for in-switch slots the validator keeps (a load-reduce's requester, a leaf plan's reductions)."""

import dataclasses

import pytest

from nvlink_emu.fabric import plans, replay
from nvlink_emu.fabric.config import preset
from nvlink_emu.fabric.errors import FabricError, PlanError
from nvlink_emu.fabric.plans import catalog, in_switch
from nvlink_emu.fabric.plans.format import GpuProgram, Op, Plan, Ref


def _with_ops(plan: Plan, g: int, ops) -> Plan:
    programs = list(plan.programs)
    programs[g] = dataclasses.replace(programs[g], ops=tuple(ops))
    return dataclasses.replace(plan, programs=tuple(programs))


def _reduce(count=40, piece=4, window=3, root=1, gpus=3) -> Plan:
    return plans.build("sharp", gpus, "reduce", root, shape=(count, piece, window))


def test_sharp_reduce_is_a_plan_paced_by_the_roots_credits():
    plan = _reduce()  # 10 chunks, window 3: a credit after every result (step 1) up to the 7th
    root = [(op.kind, op.slot) for op in plan.programs[1].ops]
    assert root[:6] == [("switch_contribute", (0,)), ("switch_contribute", (1,)), ("switch_contribute", (2,)),
                        ("switch_recv", (0,)), ("credit", ()), ("switch_contribute", (3,))]
    assert [kind for kind, _ in root].count("credit") == 7 and root[-1] == ("switch_recv", (9,))
    other = [op.kind for op in plan.programs[0].ops]
    # chunk c waits for results 0..c-3: a credit before each of chunks 3..9
    assert other == ["switch_contribute"] * 3 + ["credit_wait", "switch_contribute"] * 7
    assert {op.recv_from for op in plan.programs[2].ops if op.kind == "credit_wait"} == {1}
    assert {op.send_to for op in plan.programs[0].ops if op.kind == "switch_contribute"} == {1}


def test_sharp_reduce_credits_every_half_window():
    plan = _reduce(count=40, piece=4, window=4, root=0)  # 10 chunks, window 4: credits at 2, 4, 6 (the last)
    assert [op.kind for op in plan.programs[0].ops].count("credit") == 3
    other = [op.kind for op in plan.programs[2].ops]
    # chunk 4 needs result 1 (credit 2 covers it), chunk 6 result 3 (credit 4), chunk 8 result 5 (credit 6)
    assert other == (["switch_contribute"] * 4 + ["credit_wait"] + ["switch_contribute"] * 2 + ["credit_wait"]
                     + ["switch_contribute"] * 2 + ["credit_wait"] + ["switch_contribute"] * 2)


@pytest.mark.parametrize("count", [0, 1, 8])
def test_sharp_reduce_within_its_window_needs_no_credit(count):
    plan = _reduce(count=count, piece=4, window=3)
    assert not any(op.kind.startswith("credit") for _, _, op in plan.ops())


def test_the_validator_refuses_credits_that_would_hang_or_linger():
    plan = _reduce()
    ops = list(plan.programs[0].ops)
    # GPU 0 waits for a credit before its first contribution: the root waits for slot 0, which needs it
    early = _with_ops(plan, 0, [Op("credit_wait", recv_from=1)] + [op for op in ops if op.kind != "credit_wait"])
    with pytest.raises(PlanError, match=r"deadlocks: GPU 0 step 0 waits for a credit from GPU 1; GPU 1 step 3 "
                                        r"waits for in-switch slot \[0\]"):
        plans.validate(early)
    fewer = _with_ops(plan, 0, [op for op in ops if op.kind != "credit_wait"])
    with pytest.raises(PlanError, match=r"GPU 1 step \d+: 7 credit\(s\) never received by GPU 0 \(credit_wait\)"):
        plans.validate(fewer)
    for bad, what in ((Op("credit_wait"), r"recv_from None is not another GPU"),
                      (Op("credit_wait", recv_from=0), r"recv_from 0 is not another GPU"),
                      (Op("credit", send_to=1), r"a credit has no send_to"),
                      (Op("credit", src=Ref("i", 0)), r"a credit takes no src"),
                      (Op("credit", slot=(0,)), r"a credit has no slot")):
        with pytest.raises(PlanError, match=what):
            plans.validate(_with_ops(plan, 0, [bad] + ops))


def test_a_reduce_plan_is_built_only_for_sharp_and_for_a_root_of_the_plan():
    with pytest.raises(PlanError, match="root 3 is not one of its 3 GPUs"):
        _reduce(root=3)
    with pytest.raises(PlanError, match="no in-switch plan for reduce with 'nvls'"):
        in_switch.shape("nvls", 3, "reduce", 1, None, 40, 4)


# -- what the switch requires of an in-switch slot (the review of issue 26's last steps found each let through) ------

def test_a_load_reduce_names_its_requester_first_in_its_slot():
    """The switch files a slot's LOADs under the slot alone and refuses a request that does not name its
    requester's rank first (fabric.switch.ingress.check_requester): the validator refuses it before a byte moves."""
    config = preset("dgx-h100", gpus=3)
    plan, _ = catalog.call_plan("reduce_scatter", "nvls", 1, 3, 3 * 4096, config)
    swap = {0: 1, 1: 0}  # GPUs 0 and 1 ask for each other's slots

    def swapped(op):
        return dataclasses.replace(op, slot=(swap.get(op.slot[0], op.slot[0]), *op.slot[1:])) if op.slot else op

    programs = tuple(dataclasses.replace(p, ops=tuple(swapped(op) for op in p.ops)) for p in plan.programs)
    with pytest.raises(PlanError, match=r"GPU 0 step \d+ \(load_reduce, channel 0\): slot \[1, 0, 0\]: a load-reduce "
                                        r"names its requester's rank 0 in the group first in its slot"):
        plans.validate(dataclasses.replace(plan, programs=programs))


def test_a_leaf_plan_reduces_only_what_a_member_asked_for():
    """In a leaf plan the leaf's group reduces the answers to a load-reduce; a plain contribution (sharp's push) would
    go to the communicator's whole group: refused."""
    programs = []
    for g in range(4):
        a, peer = g // 2, (g + 2) % 4
        programs.append(GpuProgram(g, (Op("switch_contribute", src=Ref("i", 0), slot=(a, 0)),
                                       Op("switch_recv", dst=Ref("s", 0), slot=(a, 0)),
                                       Op("send", src=Ref("s", 0), send_to=peer),
                                       Op("recv", dst=Ref("s", 1), recv_from=peer),
                                       Op("reduce", src=Ref("s", 1), dst=Ref("s", 0)),
                                       Op("copy", src=Ref("s", 0), dst=Ref("i", 0))), 1, 1, 2))
    plan = Plan("leafred", "allreduce", 4, tuple(programs), inplace=True, fabrics=("network",), leaf=((0, 1), (2, 3)))
    with pytest.raises(PlanError, match=r"GPU 0 step 0 \(switch_contribute, channel 0\): slot \[0, 0\]: in a leaf plan "
                                        r"a switch_contribute answers a load_reduce"):
        plans.validate(plan)


def test_sharp_reduce_is_not_timed_across_nodes_where_the_switches_do_not_run_it():
    config = preset("superpod-h100-nvlink", nodes=2, gpus=4, spines=2)
    with pytest.raises(FabricError, match="no schedule for reduce with 'sharp' across nodes"):
        replay.replay_ns("reduce", "sharp", config.topology, 1 << 20, config, root=1)
    one = preset("dgx-h100", gpus=3)
    assert replay.replay_ns("reduce", "sharp", one.topology, 3 << 20, one, root=1) > 0
