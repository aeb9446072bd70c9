"""The switch rank: executes a leaf's (fabric.switch.SwitchLogic) or a spine's (SpineLogic) decisions over MPI.

`rank`: SwitchRank, its intake, flow control and end of run; `queues`: its limits per GPU and a GPU's waiting
packets; `credits`: credits between leaves; `tracing`: its records (Records) and the GPUs' words about them; `report`:
its share of the run's report.
"""

from .queues import (ANSWERS, MAX_KEPT, MAX_PARKED, MAX_PARKED_BYTES, MAX_QUEUED, MAX_QUEUED_BYTES, MAX_UNREAD,
                     MAX_WANTED, SPANNING)
from .rank import SwitchRank
from .tracing import TRACE_RELAY_S

__all__ = ["ANSWERS", "MAX_KEPT", "MAX_PARKED", "MAX_PARKED_BYTES", "MAX_QUEUED", "MAX_QUEUED_BYTES", "MAX_UNREAD",
           "MAX_WANTED", "SPANNING", "TRACE_RELAY_S", "SwitchRank"]
