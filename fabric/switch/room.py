"""What the leaf's rooms of groups spanning nodes read of the leaf (fabric.switch.leaf.SwitchLogic builds each
with itself): its config, topology, switch index, local GPUs, link counters, groups and timing, taken once."""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # for annotations only
    from ..config import FabricConfig, Timing
    from ..counters import LinkCounters
    from ..groups import GroupTable
    from ..topology import Topology


class LeafRoom:
    """A room of a leaf switch: the leaf and the parts of it the room reads."""

    leaf: Any  # the SwitchLogic (fabric.switch.leaf, which imports the rooms: no import back)
    config: "FabricConfig"
    topology: "Topology"
    switch: int
    local: range
    counters: "LinkCounters"
    groups: "GroupTable"
    timing: "Timing"

    def __init__(self, leaf: Any) -> None:
        self.leaf = leaf
        self.config, self.topology, self.switch, self.local = leaf.config, leaf.topology, leaf.switch, leaf.local
        self.counters, self.groups, self.timing = leaf.counters, leaf.groups, leaf.timing
