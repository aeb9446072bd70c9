"""The switch's decisions as pure code: validate, route, translate, authorise, reduce, multicast, count;
the switch rank (ranks/switch.py) only moves bytes. A leaf (`SwitchLogic`, one node's switch) is a facade
over rooms that each keep their own state: ingress checks, point-to-point and Link TLB, in-switch
reduction, groups spanning nodes, multicast stores and NVLS loads, the control plane; a spine
(`SpineLogic`) holds what spans nodes. Why it decides as it does: docs/model/trust.md (authority and
isolation) and docs/design/architecture.md (the rooms; its sections Spanning groups, Multicast stores and
Load-reduce, which other modules cite as "fabric.switch, Spanning groups": time and budgets across nodes)."""

from .ingress import FROM_GPU
from .leaf import SwitchLogic
from .multicast import MAX_LOADS
from .p2p import MAX_AWAITED, REPLY_OF, SERVED_REPLIES
from .send import Send
from .spanning import GONE_KEPT
from .spine import SpineLogic

__all__ = ["FROM_GPU", "GONE_KEPT", "MAX_AWAITED", "MAX_LOADS", "REPLY_OF", "SERVED_REPLIES", "Send", "SpineLogic",
           "SwitchLogic"]
