"""Fault plans (fabric.faults): parsing and validation, the deterministic BER replay model, lanes, down and flap."""

import math

import pytest

from nvlink_emu.fabric.errors import ConfigError, FabricError
from nvlink_emu.fabric.faults import (FULL_LANES, LinkDown, LinkFaultState, corrupted, load_plan,
                                      packet_error_probability, parse_plan, splitmix64)
from nvlink_emu.fabric.packets import raw_bytes

KNOWN = {"gpu0->sw0", "sw0->gpu0", "gpu1->sw0", "sw0->gpu1", "sw0->sw2", "sw2->sw0"}


def test_splitmix64_reference_values():
    # SplittableRandom(0).nextLong() sequence: splitmix64 of 0, then of the golden gamma, ...
    assert splitmix64(0) == 0xE220A8397B1DCDAF
    assert splitmix64(0x9E3779B97F4A7C15) == 0x6E789E6AA1B965F4


def test_packet_error_probability_closed_form():
    assert packet_error_probability(1e-6, 272) == pytest.approx(1 - (1 - 1e-6) ** (8 * 272), rel=1e-12)


def test_cable_name_covers_both_directions_and_table_names_are_checked():
    plan = parse_plan([{"link": "gpu0<->sw0", "kind": "down"}], "t", KNOWN)
    assert plan.links() == ("gpu0->sw0", "sw0->gpu0")
    with pytest.raises(ConfigError, match=r"t: faults\[0\]: link: 'gpu9->sw0': no link 'gpu9->sw0'"):
        parse_plan([{"link": "gpu9->sw0", "kind": "down"}], "t", KNOWN)
    with pytest.raises(ConfigError, match="link: 'gpu0-sw0' is not"):
        parse_plan([{"link": "gpu0-sw0", "kind": "down"}], "t", KNOWN)


@pytest.mark.parametrize("entry, message", [
    ({"link": "gpu0->sw0", "kind": "melt"}, "kind: must be one of ber, degraded, down, flap, got 'melt'"),
    ({"link": "gpu0->sw0", "kind": "ber"}, "ber: kind 'ber' needs"),
    ({"link": "gpu0->sw0", "kind": "ber", "ber": 0.5}, r"ber: must be a number in \[0, 0.001\], got 0.5"),
    ({"link": "gpu0->sw0", "kind": "ber", "ber": 0}, "ber: must be above 0, got 0"),
    ({"link": "gpu0->sw0", "kind": "ber", "ber": 1e-6, "seed": -1}, "seed: must be an integer"),
    ({"link": "gpu0->sw0", "kind": "ber", "ber": 1e-6, "seed": True}, "seed: must be an integer"),
    ({"link": "gpu0->sw0", "kind": "degraded", "lanes": 0}, "lanes: must be an integer in"),
    ({"link": "gpu0->sw0", "kind": "degraded", "lanes": 9.0}, "lanes: must be an integer in"),
    ({"link": "gpu0->sw0", "kind": "degraded"}, "lanes: kind 'degraded' needs"),
    ({"link": "gpu0->sw0", "kind": "flap"}, "period_ns: kind 'flap' needs"),
    ({"link": "gpu0->sw0", "kind": "down", "lanes": 3}, "lanes: not a key of kind 'down'"),
    ({"link": "gpu0->sw0", "kind": "down", "at_ns": 5, "until_ns": 5}, "until_ns: must be after at_ns = 5"),
    ({"link": "gpu0->sw0", "kind": "down", "at_ns": math.nan}, "at_ns: must be a number"),
    ({"link": "gpu0->sw0", "kind": "down", "at_ns": "1"}, "at_ns: must be a number"),
    ({"link": "gpu0->sw0", "kind": "down", "colour": 1}, "unknown key.s. colour"),
    ("down", "each fault must be a table"),
])
def test_every_value_is_validated(entry, message):
    with pytest.raises(ConfigError, match=message):
        parse_plan([entry], "plan.toml", KNOWN)


def test_lanes_above_the_fabrics_full_count_are_refused():
    with pytest.raises(ConfigError, match="lanes: 40 on 'gpu0->sw0', but a link of this fabric has 36 lanes"):
        parse_plan([{"link": "gpu0->sw0", "kind": "degraded", "lanes": 40}], "t", KNOWN, FULL_LANES["nvlink4"])


def test_load_plan_reads_faults_tables_only(tmp_path):
    path = tmp_path / "f.toml"
    path.write_text('[[faults]]\nlink = "gpu0<->sw0"\nkind = "ber"\nber = 1e-6\nseed = 7\n')
    plan = load_plan(path, KNOWN)
    assert plan.faults[0].seed == 7 and plan.faults[0].ber == 1e-6
    path.write_text('[[fault]]\nlink = "gpu0<->sw0"\nkind = "down"\n')
    with pytest.raises(ConfigError, match=r"unknown key\(s\) fault; a fault plan holds \[\[faults\]\]"):
        load_plan(path, KNOWN)
    with pytest.raises(ConfigError, match="no such fault plan"):
        load_plan(tmp_path / "missing.toml")


def state(plan, link="gpu0->sw0"):
    return LinkFaultState(plan, link, mtu_bytes=256, header_bytes=16)


def test_no_fault_books_exactly_the_raw_bytes():
    link = state(parse_plan([{"link": "sw0->gpu0", "kind": "down"}], "t", KNOWN))
    for payload in (0, 1, 255, 256, 257, 1 << 20):
        assert link.book(payload, 0.0) == raw_bytes(payload, 256, 16)
    assert link.crc_errors == link.replays == 0


def test_ber_replays_each_corrupted_packet_and_matches_the_hash():
    ber, seed, payload = 1e-4, 7, 256 * 1000
    link = state(parse_plan([{"link": "gpu0->sw0", "kind": "ber", "ber": ber, "seed": seed}], "t", KNOWN))
    booked = link.book(payload, 0.0)
    # closed form: k replays of 272-byte packets add k x 272 bytes of link time
    p = packet_error_probability(ber, 272)
    expected = 0
    for index in range(1000):
        attempt = 0
        while corrupted(seed, "gpu0->sw0", index, attempt, p):
            attempt += 1
        expected += attempt
    assert expected > 100  # p = 0.196: about 240 replays, so the check is not vacuous
    assert link.replays == link.crc_errors == expected
    assert booked == raw_bytes(payload, 256, 16) + expected * 272
    assert link.packets == 1000


def test_ber_is_deterministic_for_a_seed_and_differs_between_seeds():
    def replays(seed):
        link = state(parse_plan([{"link": "gpu0->sw0", "kind": "ber", "ber": 1e-5, "seed": seed}], "t", KNOWN))
        for size in (4096, 100, 1 << 16):
            link.book(size, 0.0)
        return link.replays, link.packets

    assert replays(3) == replays(3)
    assert len({replays(s) for s in range(6)}) > 1


def test_ber_only_inside_its_window():
    link = state(parse_plan([{"link": "gpu0->sw0", "kind": "ber", "ber": 1e-3, "at_ns": 100, "until_ns": 200}],
                            "t", KNOWN))
    assert link.book(2560, 0.0) == raw_bytes(2560, 256, 16) and link.replays == 0
    assert link.book(2560, 150.0) > raw_bytes(2560, 256, 16) and link.replays > 0


def test_degraded_scales_link_time_by_full_over_lanes():
    plan = parse_plan([{"link": "gpu0->sw0", "kind": "degraded", "lanes": 9, "at_ns": 10}], "t", KNOWN, 36)
    link = state(plan)
    assert link.book(1024, 0.0) == raw_bytes(1024, 256, 16)
    assert link.book(1024, 10.0) == raw_bytes(1024, 256, 16) * 4
    assert plan.state("gpu0->sw0", 10.0) == "degraded" and plan.state("gpu0->sw0", 0.0) == "up"


def test_down_raises_linkdown_naming_link_and_times():
    plan = parse_plan([{"link": "gpu0->sw0", "kind": "down", "at_ns": 1000, "until_ns": 5000}], "t", KNOWN)
    link = state(plan)
    link.book(100, 999.0)
    with pytest.raises(LinkDown, match="link gpu0->sw0 is down at 1500 ns .down since 1000 ns, up at 5000 ns") as info:
        link.book(100, 1500.0)
    assert isinstance(info.value, FabricError)
    assert (info.value.link, info.value.at_ns, info.value.up_at_ns) == ("gpu0->sw0", 1000.0, 5000.0)
    link.book(100, 5000.0)


def test_flap_alternates_down_and_up():
    plan = parse_plan([{"link": "sw0->sw2", "kind": "flap", "at_ns": 100, "period_ns": 50, "until_ns": 400}],
                      "t", KNOWN)
    states = [plan.state("sw0->sw2", t) for t in (99, 100, 149, 150, 199, 200, 260, 399, 400)]
    assert states == ["up", "down", "down", "up", "up", "down", "up", "up", "up"]
    assert plan.down("sw0->sw2", 210) == (200.0, 250.0)
    assert plan.down("sw2->sw0", 210) is None


def test_config_toml_faults_are_checked_against_the_fabric(tmp_path):
    import dataclasses

    from nvlink_emu.fabric.config import load_toml, preset
    path = tmp_path / "pod.toml"
    path.write_text('base = "superpod-h100-nvlink"\n[[faults]]\nlink = "gpu12<->sw1"\nkind = "flap"\nperiod_ns = 1000\n'
                    '[[faults]]\nlink = "gpu3->sw0"\nkind = "degraded"\nlanes = 9\n')
    config = load_toml(path)
    plan = config.fault_plan
    assert plan.links() == ("gpu12->sw1", "gpu3->sw0", "sw1->gpu12") and plan.full_lanes == 36
    assert plan.lane_fraction("gpu3->sw0", 0.0) == 0.25
    # the faults survive a resize (the bench sizes memory with dataclasses.replace) and keep the digest stable
    assert dataclasses.replace(config, memory_capacity_bytes=1 << 30).faults == config.faults
    assert config.digest() != preset("superpod-h100-nvlink").digest()
    path.write_text('base = "superpod-h100-nvlink"\n[[faults]]\nlink = "gpu3->sw1"\nkind = "down"\n')
    with pytest.raises(ConfigError, match=r"pod.toml: faults: faults\[0\]: link: 'gpu3->sw1': no link 'gpu3->sw1'"):
        load_toml(path)
    path.write_text('base = "superpod-h100-nvlink"\n[[faults]]\nlink = "sw0<->sw2"\nkind = "ber"\nber = 1e-6\n')
    with pytest.raises(ConfigError, match="pod.toml: faults: kind: 'ber' on 'sw0<->sw2', a link between switches; "
                                          "this version models ber and degraded on a GPU's links only"):
        load_toml(path)
    path.write_text('base = "superpod-h100-nvlink"\n[[faults]]\nlink = "sw0<->sw2"\nkind = "down"\n')
    assert load_toml(path).fault_plan.links() == ("sw0->sw2", "sw2->sw0")


def test_a_config_without_faults_hashes_as_before():
    from nvlink_emu.fabric.config import PRESETS, build_config, preset
    # digests of main before faults existed (fabric.config.FabricConfig.digest), of the preset as it was
    # then: line-rate NVLink, now superpod-h100-nvlink-line under the old name
    then = build_config({**PRESETS["superpod-h100-nvlink-line"], "name": "superpod-h100-nvlink"}, "test")
    assert then.digest() == "2ac3c91f2b5d8288"
    assert not preset("dgx-h100").fault_plan


def test_spine_route_goes_around_down_links_in_index_order_and_raises_when_none_is_left():
    from nvlink_emu.fabric.faults import spine_links_scale, spine_route
    # 2 nodes (leaves sw0, sw1), 3 spines (sw2, sw3, sw4)
    known = {f"sw{a}->sw{b}" for a in (0, 1) for b in (2, 3, 4)} | {f"sw{b}->sw{a}" for a in (0, 1) for b in (2, 3, 4)}
    plan = parse_plan([{"link": "sw0->sw3", "kind": "down", "at_ns": 100, "until_ns": 200},
                       {"link": "sw4->sw1", "kind": "flap", "at_ns": 0, "period_ns": 1000}], "t", known)
    assert spine_route(plan, 0, 1, 1, 2, 3, 50.0) == 1       # the default, sw3: both its links up
    assert spine_route(plan, 0, 1, 1, 2, 3, 150.0) == 0      # sw0->sw3 down, sw4->sw1 down (flapping): wrap to sw2
    assert spine_route(plan, 0, 1, 2, 2, 3, 1500.0) == 2     # the flap's up phase: sw4 is the default again
    assert spine_route(plan, 0, 1, 2, 2, 3, 2500.0) == 0     # its next down phase: on to sw2
    assert spine_route(plan, 1, 0, 2, 2, 3, 150.0) == 2      # the other direction uses none of those links
    assert spine_links_scale(plan, 0, 2, 3, 150.0) == 1.5    # 1 of 3 uplinks down: 3/2 the share's time
    assert spine_links_scale(plan, 1, 2, 3, 150.0, up=False) == 1.5
    assert spine_links_scale(plan, 0, 2, 3, 250.0) == 1.0
    every = parse_plan([{"link": f"sw0->sw{s}", "kind": "down", "at_ns": 10, "until_ns": 20} for s in (2, 3, 4)],
                       "t", known)
    with pytest.raises(LinkDown, match=r"no path from switch 0 to switch 1 at 15 ns: every spine's link is down "
                                       r"\(sw0->sw3 down since 10 ns, up at 20 ns\)") as info:
        spine_route(every, 0, 1, 1, 2, 3, 15.0)
    assert (info.value.link, info.value.at_ns, info.value.up_at_ns) == ("sw0->sw3", 10.0, 20.0)
