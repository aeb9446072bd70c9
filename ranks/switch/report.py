"""A switch rank's share of the run's report, at the end of the run."""

import dataclasses
from collections.abc import Sequence

from nvlink_emu.fabric.config import FabricConfig
from nvlink_emu.fabric.counters import LinkStats, check_gpu_links, downlink, uplink
from nvlink_emu.fabric.errors import FabricError


def report_part(config: FabricConfig, index: int, logic, gpus: Sequence[int], counters: dict) -> dict:
    """This switch's share of the run's report (merged by fabric.counters.merge_reports): its links,
    its ports, and its GPUs' records. Byte conservation is checked link by link against what each GPU
    says it counted: a GPU's word is not trusted, so a mismatch is reported against that GPU's links
    (an emulator bug, or a GPU that lies) and never fails the others' run. index: the switch's; logic: its
    SwitchLogic or SpineLogic; gpus: the GPUs attached here; counters: GPU -> its COUNTERS (CountersInfo)."""
    spine = index >= config.nodes
    links = logic.counters.snapshot()
    for name, row in links.items():  # a cable between switches, sent on here: its raw bytes at its bandwidth
        link = logic.topology.link(name)
        if link.level == "leaf-spine" and link.src == f"sw{index}":
            row["busy_ns"] = row["raw_bytes"] / link.bandwidth_gbytes_per_s
    conservation = {}
    for gpu in gpus:
        try:
            check_gpu_links(links, gpu, counters[gpu].links, index)
        except FabricError as exc:
            conservation[gpu] = str(exc)
        for link in (uplink(gpu, index), downlink(gpu, index)):  # busy time: kept at the GPU end
            busy = counters[gpu].links.get(link, {}).get("busy_ns", 0.0)
            links.setdefault(link, LinkStats().as_dict())["busy_ns"] = float(busy)
            for key in ("crc_errors", "replays"):  # the GPU end's count of its faulted links' replays:
                # taken only for links the launcher's fault plan names (a GPU cannot make up faults)
                value = counters[gpu].links.get(link, {}).get(key)
                if type(value) is int and value >= 0 and config.fault_plan.on(link):
                    links[link][key] = value
    part = {"switch": index, "links": links, "conservation": conservation,
            "now_ns": {g: float(counters[g].now_ns) for g in gpus},
            "unconsumed": {g: counters[g].unconsumed for g in gpus if counters[g].unconsumed},
            "collectives": {g: [dataclasses.asdict(c) for c in counters[g].calls] for g in gpus},
            "collectives_unrecorded": {g: counters[g].calls_unrecorded for g in gpus}}
    if not spine:
        part.update(ports=logic.port_stats(), stats={
            "peak_held_bytes": logic.peak_held_bytes, "groups_created": logic.groups.created,
            "groups_released": logic.groups.released, "reduced_bytes": logic.groups.reduced_bytes,
            "unanswered_requests": logic.awaited_replies})
    return part
